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
  uint8_t raw[kHeaderBytes];
  if (!socket.read_exact(raw, kHeaderBytes, header_deadline, "a frame header")) return false;
  frame.header = decode_header_or_refuse(raw);
  // The payload grows as its bytes arrive, so a peer that announces 256 MiB and sends little holds
  // little memory.
  constexpr size_t kChunk = size_t{4} << 20;
  const Clock::time_point payload_deadline = Clock::now() + payload_timeout;
  frame.payload.clear();
  while (frame.payload.size() < frame.header.payload_bytes) {
    const size_t at = frame.payload.size();
    const size_t chunk = std::min<size_t>(kChunk, frame.header.payload_bytes - at);
    frame.payload.resize(at + chunk);
    if (!socket.read_exact(frame.payload.data() + at, chunk, payload_deadline, "a frame payload")) {
      throw store::StoreError(store::ErrorCode::Unavailable, "connection closed in the middle of a frame");
    }
  }
  return true;
}

void write_frame(Socket& socket, const std::vector<uint8_t>& frame, Clock::time_point deadline) {
  socket.write_all(frame.data(), frame.size(), deadline, "a frame");
}

}  // namespace recdev::net
