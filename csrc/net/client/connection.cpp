#include "connection.h"

#include "store/errors.h"

namespace recdev::net {

using store::ErrorCode;
using store::StoreError;

Connection::Connection(const std::string& address, const std::string& token, std::chrono::milliseconds timeout,
                       uint64_t session_id)
    : address_(address), timeout_(timeout) {
  socket_ = connect_to(parse_host_port(address), timeout);
  Hello hello;
  hello.token = token;
  hello.session_id = session_id;
  welcome_ = call<Welcome>(Opcode::Hello, hello);
}

Frame Connection::round_trip(const std::vector<uint8_t>& request, Opcode opcode, uint64_t request_id) {
  const std::string operation = opcode_name(uint8_t(opcode));
  const auto fail = [&](ErrorCode code, const std::string& message) {
    throw StoreError(code, "recdev-server " + address_ + ", " + operation + ": " + message);
  };
  Frame frame;
  try {
    const Clock::time_point deadline = Clock::now() + timeout_;
    write_frame(socket_, request, deadline);
    if (!read_frame(socket_, frame, deadline, timeout_))
      fail(ErrorCode::Unavailable, "the server closed the connection");
  } catch (const BadFrame& error) {
    fail(ErrorCode::Protocol, error.what());
  } catch (const StoreError& error) {
    if (error.code() != ErrorCode::Unavailable) throw;
    fail(ErrorCode::Unavailable, error.what());
  }
  const bool error = (frame.header.flags & kFlagError) != 0;
  // A refusal sent before the server read anything (too many connections) carries request id 0.
  if (!(error && frame.header.request_id == 0) &&
      (frame.header.opcode != opcode || frame.header.request_id != request_id)) {
    fail(ErrorCode::Protocol, std::string("the response is for ") + opcode_name(uint8_t(frame.header.opcode)) +
                                  " request " + std::to_string(frame.header.request_id));
  }
  if (error) {
    const auto error = decode_payload<ErrorResponse>(frame.payload.data(), frame.payload.size(), "an error response");
    fail(error.code, error.message);
  }
  return frame;
}

}  // namespace recdev::net
