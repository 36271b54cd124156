// What the ShardService handlers share (service.cpp, service_transfer.cpp): memory estimates,
// argument checks, decoding a request and encoding its reply into the connection's reused buffer.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "net/wire/frame_io.h"
#include "net/wire/protocol.h"
#include "store/errors.h"
#include "store/frequency_sketch.h"
#include "store/table_policy.h"

namespace recdev::net::service_detail {

using store::ErrorCode;
using store::StoreError;

// An upper bound of what one materialized row costs beyond its record: its id in the arena (8 bytes)
// and its share of the index, whose capacity doubles as it grows: a 16-byte bucket at the lowest load
// factor, 0.4 (store/row_index.h), is 40 bytes.
constexpr uint64_t kRowOverheadBytes = 48;
// What a batch allocates per id while it runs, beyond its request and response: the decoded ids are
// counted with the payload; this is the store's own lists (store/table.cpp read_rows: the missing ids
// and their positions, 16 bytes, doubled while a vector grows, and their ShardRoute, 16 more).
constexpr uint64_t kBatchWorkingBytesPerId = 48;
// What an empty table holds (its sub-shards and their first index blocks), for the memory limit.
constexpr uint64_t kNewTableBytes = 64 * 1024;
// Room left in a response for everything but its bulk arrays.
constexpr uint64_t kResponseSlackBytes = 4096;

inline uint64_t row_cost(uint64_t record_words) { return record_words * sizeof(float) + kRowOverheadBytes; }

// What a policy's admission sketch holds (FrequencySketch::bytes_for), for the memory limit: a client
// choosing the width, or a budget that sizes it (width 0), must not make the shard allocate past
// --max-memory. A byte budget bounds the rows at max_bytes / kRowOverheadBytes, the least a row costs.
inline uint64_t sketch_bytes(const store::TablePolicyConfig& policy) {
  if (policy.admit_after <= 1) return 0;
  uint32_t width = policy.sketch_width;
  if (width == 0) {
    uint64_t rows = policy.max_rows != 0 ? policy.max_rows : UINT64_MAX;
    if (policy.max_bytes != 0) rows = std::min(rows, policy.max_bytes / store::TablePolicy::kRowOverheadBytes);
    width = store::auto_sketch_width(rows);
  }
  return store::FrequencySketch::bytes_for(width, policy.admit_after);
}

[[noreturn]] inline void invalid(const std::string& message) { throw StoreError(ErrorCode::InvalidArgument, message); }

// Throws unless a response carrying `bytes` of bulk data fits in one frame.
inline void check_response_size(uint64_t bytes, const char* what) {
  if (bytes > kMaxPayloadBytes - kResponseSlackBytes) {
    invalid(std::string(what) + " would answer " + std::to_string(bytes) + " bytes, past the frame limit of " +
            std::to_string(kMaxPayloadBytes) + " bytes; send fewer ids per request");
  }
}

inline std::string decimal(unsigned __int128 value) {
  std::string text;
  do {
    text.insert(text.begin(), char('0' + int(value % 10)));
    value /= 10;
  } while (value != 0);
  return text;
}

// What the server adds to store::validate_table_config for the tables it serves.
inline void check_table_shape(const store::TableConfig& config) {
  if (config.num_rows == 0) invalid("a table needs at least 1 row; num_rows is 0");
  if (config.row_words > kMaxDim) {
    invalid("dim " + std::to_string(config.row_words) + " is past the server's limit of " + std::to_string(kMaxDim) +
            " (one row with optimizer state must fit in a frame)");
  }
  // In 128 bits: the product of two 64-bit-sized factors wraps, and the message must be right.
  const unsigned __int128 bytes = static_cast<unsigned __int128>(config.num_rows) * config.row_words * sizeof(float);
  if (bytes > UINT64_MAX) {
    invalid("a table of " + std::to_string(config.num_rows) + " rows of dim " + std::to_string(config.row_words) +
            " is " + decimal(bytes) +
            " bytes, past the 2^64 bytes a byte offset (WRITE_BYTES) can address; use fewer rows");
  }
}

// The rows the request being handled on this thread named, for its opcode's counters
// (request_counters.h): ShardService::handle zeroes it, decode() adds the ids of the request and
// reply() the rows of a response that carries ids (DUMP), so that no handler counts by hand.
inline thread_local uint64_t request_rows = 0;

template <class Message>
uint64_t rows_named(const Message& message) {
  if constexpr (requires { message.ids.size(); }) return message.ids.size();
  if constexpr (requires { message.rows.ids.size(); }) return message.rows.ids.size();  // STAGE_UPDATE
  return 0;
}

template <class Message>
Message decode(const Frame& frame) {
  Message message =
      decode_payload<Message>(frame.payload.data(), frame.payload.size(), opcode_name(uint8_t(frame.header.opcode)));
  request_rows += rows_named(message);
  return message;
}

// The buffer of this connection thread's previous response, handed back by recycle(): large
// responses reuse its pages instead of faulting in fresh ones (tens of milliseconds for 32 MiB).
inline thread_local std::vector<uint8_t> spare_buffer;

inline std::vector<uint8_t> take_buffer() {
  std::vector<uint8_t> buffer = std::move(spare_buffer);
  buffer.clear();
  return buffer;
}

// The spare buffer resized to `size` bytes, contents unspecified. Shrinking writes nothing, so a
// connection answering gathers of similar sizes does not zero the rows it is about to overwrite (a
// vector zero-fills what it grows by).
inline std::vector<uint8_t> take_buffer_of_size(size_t size) {
  std::vector<uint8_t> buffer = std::move(spare_buffer);
  buffer.resize(size);
  return buffer;
}

template <class Message>
std::vector<uint8_t> reply(const Frame& frame, const Message& message) {
  std::vector<uint8_t> buffer = take_buffer();
  encode_frame_into(buffer, frame.header.opcode, frame.header.request_id, message);
  request_rows += rows_named(message);
  return buffer;
}

inline std::vector<uint8_t> reply_empty(const Frame& frame) { return reply(frame, Empty{}); }

}  // namespace recdev::net::service_detail
