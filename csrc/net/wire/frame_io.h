// Frames over a Socket: reading one whole frame (header checked before the payload is allocated) and
// writing one. Shared by the server's connections and the client.
#pragma once

#include <cstdint>
#include <vector>

#include "protocol.h"
#include "socket.h"

namespace recdev::net {

struct Frame {
  FrameHeader header;
  std::vector<uint8_t> payload;
};

// A header that decode_header refused, with what could still be read of it, so that the error
// response can carry the request id.
class BadFrame : public store::StoreError {
 public:
  BadFrame(const store::StoreError& error, uint64_t request_id, uint8_t opcode)
      : store::StoreError(error), request_id(request_id), opcode(opcode) {}
  uint64_t request_id;
  uint8_t opcode;
};

// decode_header, or BadFrame carrying what could be read of the refused header.
FrameHeader decode_header_or_refuse(const uint8_t raw[kHeaderBytes]);

// Reads one frame: its header by header_deadline, its payload by payload_deadline (when the header
// arrived). Returns false if the peer closed the connection cleanly before the frame. Throws BadFrame
// for a header that fails decode_header, StoreError(Unavailable) for a timeout or a broken connection.
bool read_frame(Socket& socket, Frame& frame, Clock::time_point header_deadline,
                std::chrono::milliseconds payload_timeout);
// read_frame in two steps, so that a server can decide about a payload before it holds it: the
// header (false: the peer closed cleanly before it), then the payload it announced, or those bytes
// read and dropped through a small buffer.
bool read_header(Socket& socket, Frame& frame, Clock::time_point header_deadline);
void read_payload(Socket& socket, Frame& frame, std::chrono::milliseconds payload_timeout);
void skip_payload(Socket& socket, const FrameHeader& header, std::chrono::milliseconds payload_timeout);
void write_frame(Socket& socket, const std::vector<uint8_t>& frame, Clock::time_point deadline);

}  // namespace recdev::net
