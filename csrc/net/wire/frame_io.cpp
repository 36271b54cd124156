#include "frame_io.h"

#include <algorithm>
#include <cstring>

namespace recdev::net {

FrameHeader decode_header_or_refuse(const uint8_t raw[kHeaderBytes]) {
  try {
    return decode_header(raw);
  } catch (const store::StoreError& error) {
    uint64_t request_id;
    std::memcpy(&request_id, raw + 8, sizeof(request_id));
    throw BadFrame(error, request_id, raw[4]);
  }
}

bool read_frame(Socket& socket, Frame& frame, Clock::time_point header_deadline,
                std::chrono::milliseconds payload_timeout) {
  if (!read_header(socket, frame, header_deadline)) return false;
  read_payload(socket, frame, payload_timeout);
  return true;
}

bool read_header(Socket& socket, Frame& frame, Clock::time_point header_deadline) {
  uint8_t raw[kHeaderBytes];
  if (!socket.read_exact(raw, kHeaderBytes, header_deadline, "a frame header")) return false;
  frame.header = decode_header_or_refuse(raw);
  return true;
}

namespace {

// Reads `bytes` of a payload in chunks of at most max_chunk, each into into(at, chunk).
template <class Into>
void read_chunks(Socket& socket, uint64_t bytes, size_t max_chunk, std::chrono::milliseconds payload_timeout,
                 Into into) {
  const Clock::time_point payload_deadline = Clock::now() + payload_timeout;
  for (uint64_t at = 0; at < bytes;) {
    const size_t chunk = size_t(std::min<uint64_t>(max_chunk, bytes - at));
    if (!socket.read_exact(into(at, chunk), chunk, payload_deadline, "a frame payload")) {
      throw store::StoreError(store::ErrorCode::Unavailable, "connection closed in the middle of a frame");
    }
    at += chunk;
  }
}

}  // namespace

void read_payload(Socket& socket, Frame& frame, std::chrono::milliseconds payload_timeout) {
  // The payload grows as its bytes arrive, so a peer that announces 256 MiB and sends little holds
  // little memory.
  frame.payload.clear();
  read_chunks(socket, frame.header.payload_bytes, size_t{4} << 20, payload_timeout, [&](uint64_t at, size_t chunk) {
    frame.payload.resize(size_t(at) + chunk);
    return frame.payload.data() + at;
  });
}

void skip_payload(Socket& socket, const FrameHeader& header, std::chrono::milliseconds payload_timeout) {
  std::vector<uint8_t> dropped(size_t{64} << 10);
  read_chunks(socket, header.payload_bytes, dropped.size(), payload_timeout,
              [&](uint64_t, size_t) { return dropped.data(); });
}

void write_frame(Socket& socket, const std::vector<uint8_t>& frame, Clock::time_point deadline) {
  socket.write_all(frame.data(), frame.size(), deadline, "a frame");
}

}  // namespace recdev::net
