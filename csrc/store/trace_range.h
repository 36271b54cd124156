// Named ranges of store work, for a profiler to show where a step's time goes. The store and the
// net layers know nothing of torch, so they open ranges through this hook; the device layer
// installs the tracer that turns them into torch.profiler ranges named recdev::<name>, their fields
// into the range's keyword inputs (csrc/device/profiler_ranges.cpp). Without a tracer (recdev-server,
// the test module), or while nothing records (no profiler on this thread), a range is one call that
// returns null: no allocation, no string, no lock.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <type_traits>

namespace recdev::trace {

// A field of a range: a number (a count of ids, rows, bytes) or a text (a server's address).
struct Field {
  template <class Number, std::enable_if_t<std::is_integral_v<Number>, int> = 0>
  Field(const char* key, Number number) : key(key), number(static_cast<int64_t>(number)) {}
  Field(const char* key, std::string_view text) : key(key), text(text), is_text(true) {}

  const char* key;
  int64_t number = 0;
  std::string_view text;  // read only while the range opens
  bool is_text = false;
};

// Nested: the range lies inside whatever range was open when it opened, and ends before it. Overlapping:
// ranges opened together that end in any order (a round trip per shard in parallel, on one thread);
// a profiler keeps them out of its tree of nested ranges.
enum class Nesting { Nested, Overlapping };

class Tracer {
 public:
  virtual ~Tracer() = default;
  // Whether anything may record a range now (fields that cost a string are built only then).
  virtual bool active() const = 0;
  // Opens a range named name (a string literal: the profiler keeps the pointer); null when nothing
  // records it.
  virtual void* begin(const char* name, const Field* fields, size_t count, Nesting nesting) = 0;
  virtual void end(void* range) = 0;
};

// The tracer, for the life of the process (the device layer's, installed when the extension loads).
void install_tracer(Tracer* tracer);
bool active();

// A range from construction to end() or destruction, on the thread that opened it.
class Range {
 public:
  Range(const char* name, std::initializer_list<Field> fields, Nesting nesting = Nesting::Nested);
  Range() = default;  // no range
  Range(Range&& other) noexcept : tracer_(other.tracer_), handle_(other.handle_) { other.handle_ = nullptr; }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;
  Range& operator=(Range&& other) noexcept {
    if (this != &other) {
      end();
      tracer_ = other.tracer_;
      handle_ = other.handle_;
      other.handle_ = nullptr;
    }
    return *this;
  }
  ~Range() { end(); }

  void end();
  // Whether a profiler records this range: worth computing fields for ranges nested in it.
  bool recorded() const { return handle_ != nullptr; }

 private:
  Tracer* tracer_ = nullptr;
  void* handle_ = nullptr;
};

}  // namespace recdev::trace
