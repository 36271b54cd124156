// Bounded little-endian encoding of protocol payloads (docs/protocol.md).
//
// Writer appends to a byte vector. Reader walks a byte range and checks every read against what is
// left: a short read, a count whose elements would not fit in the remaining bytes, a string past its
// cap or a flag other than 0/1 throws StoreError(Protocol) naming what was being read — before
// anything is allocated, so a hostile count cannot make the reader allocate more than the frame's own
// size. Arrays are a u32 element count followed by the elements, bit-exact (floats keep nan payloads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "store/errors.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the wire format is little-endian and this code copies values as they are in memory"
#endif

namespace recdev::net {

// An array's element count as it goes on the wire.
inline uint32_t wire_count(size_t count) {
  if (count > UINT32_MAX) {
    throw store::StoreError(store::ErrorCode::InvalidArgument, "an array of more than 2^32-1 elements cannot be sent");
  }
  return uint32_t(count);
}

// Encodes an array of `count` elements of T at byte `at` of a buffer already large enough: writes its
// count and returns where its elements go, for the caller to fill. For a response sized up front, so
// that megabytes about to be overwritten are not zeroed first (as growing a vector would).
template <class T>
uint8_t* place_array(std::vector<uint8_t>& buffer, size_t at, size_t count) {
  static_assert(std::is_arithmetic_v<T>);
  const uint32_t count32 = wire_count(count);
  std::memcpy(buffer.data() + at, &count32, sizeof(count32));
  return buffer.data() + at + sizeof(count32);
}

class Writer {
 public:
  explicit Writer(std::vector<uint8_t>& out) : out_(out) {}

  template <class T>
  void put(T value) {
    static_assert(std::is_arithmetic_v<T>, "put() writes numbers; use put_string/put_array for the rest");
    append(&value, sizeof(T));
  }
  void put_bool(bool value) { put<uint8_t>(value ? 1 : 0); }
  void put_string(const std::string& text) {
    put_count(text.size());
    append(text.data(), text.size());
  }
  template <class T>
  void put_array(const T* values, size_t count) {
    static_assert(std::is_arithmetic_v<T>);
    put_count(count);
    append(values, count * sizeof(T));
  }
  template <class T>
  void put_array(const std::vector<T>& values) {
    put_array(values.data(), values.size());
  }

 private:
  void put_count(size_t count) { put<uint32_t>(wire_count(count)); }
  void append(const void* data, size_t size) {
    if (size == 0) return;
    const size_t at = out_.size();
    out_.resize(at + size);
    std::memcpy(out_.data() + at, data, size);
  }

  std::vector<uint8_t>& out_;
};

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  size_t remaining() const { return size_ - position_; }

  template <class T>
  T get(const char* what) {
    static_assert(std::is_arithmetic_v<T>);
    T value;
    std::memcpy(&value, take(sizeof(T), what), sizeof(T));
    return value;
  }
  bool get_bool(const char* what) {
    const uint8_t value = get<uint8_t>(what);
    if (value > 1) fail(std::string(what) + " must be 0 or 1, got " + std::to_string(value));
    return value == 1;
  }
  std::string get_string(const char* what, size_t max_bytes) {
    const uint32_t length = get<uint32_t>(what);
    if (length > max_bytes) {
      fail(std::string(what) + " of " + std::to_string(length) + " bytes is longer than the limit of " +
           std::to_string(max_bytes));
    }
    const uint8_t* bytes = take(length, what);
    return std::string(reinterpret_cast<const char*>(bytes), length);
  }
  template <class T>
  std::vector<T> get_array(const char* what) {
    static_assert(std::is_arithmetic_v<T>);
    const uint32_t count = get<uint32_t>(what);
    // Checked against the bytes present before allocating: count * sizeof(T) cannot overflow 64 bits.
    const uint8_t* bytes = take(uint64_t{count} * sizeof(T), what);
    std::vector<T> values(count);
    if (count != 0) std::memcpy(values.data(), bytes, size_t{count} * sizeof(T));
    return values;
  }
  // For a message of another protocol version: the bytes after the version are not this one's to read.
  void skip_rest() { position_ = size_; }
  // Throws unless every byte was read: trailing bytes mean the two sides disagree on the layout.
  void expect_end(const char* what) const {
    if (position_ != size_) {
      fail(std::to_string(size_ - position_) + " unexpected bytes after the end of " + std::string(what));
    }
  }

  [[noreturn]] static void fail(const std::string& problem) {
    throw store::StoreError(store::ErrorCode::Protocol, "malformed message: " + problem);
  }

 private:
  const uint8_t* take(uint64_t size, const char* what) {
    if (size > remaining()) {
      fail(std::string(what) + " needs " + std::to_string(size) + " bytes but only " + std::to_string(remaining()) +
           " remain");
    }
    const uint8_t* at = data_ + position_;
    position_ += size_t(size);
    return at;
  }

  const uint8_t* data_;
  size_t size_;
  size_t position_ = 0;
};

}  // namespace recdev::net
