// A blocking client connection to one recdev-server: connects, says HELLO, and sends requests one at
// a time, each answered within the timeout. An error response becomes a StoreError with the server's
// code and a message naming the server and the operation; a dead or silent server becomes
// StoreError(Unavailable) within the timeout, never a hang. Used by `recdev-server --stats`.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "net/wire/frame_io.h"
#include "net/wire/protocol.h"
#include "net/wire/socket.h"

namespace recdev::net {

class Connection {
 public:
  // session_id 0 starts a new session (see Hello).
  Connection(const std::string& address, const std::string& token, std::chrono::milliseconds timeout,
             uint64_t session_id = 0);

  const Welcome& welcome() const { return welcome_; }
  const std::string& address() const { return address_; }

  template <class Response, class Request>
  Response call(Opcode opcode, const Request& request) {
    const uint64_t request_id = next_request_id_++;
    const Frame frame = round_trip(encode_frame(opcode, request_id, request), opcode, request_id);
    return decode_payload<Response>(frame.payload.data(), frame.payload.size(), opcode_name(uint8_t(opcode)));
  }

 private:
  // Sends one request frame and returns its (non-error) response frame.
  Frame round_trip(const std::vector<uint8_t>& request, Opcode opcode, uint64_t request_id);

  std::string address_;
  std::chrono::milliseconds timeout_;
  Socket socket_;
  Welcome welcome_;
  uint64_t next_request_id_ = 1;
};

}  // namespace recdev::net
