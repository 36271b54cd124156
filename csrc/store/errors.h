// Errors raised by the store engine.
//
// Every failure the store reports is a StoreError carrying an ErrorCode, so that each caller can map
// it to its own vocabulary without parsing messages: the Python binding maps codes to exception types,
// the network server sends the code in its error frames. The numeric values are part of the wire
// protocol: never renumber, only append.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace recdev::store {

enum class ErrorCode : uint8_t {
  InvalidArgument = 1,   // a malformed request: bad config, bad init rule, inconsistent offsets, ...
  OutOfRange = 2,        // a row id or byte range outside the table
  NotFound = 3,          // an unknown table id or name
  Corrupt = 4,           // a checkpoint file that is damaged, truncated or does not match
  Io = 5,                // the operating system refused a file operation
  Full = 6,              // out of memory, or a shard reached its row capacity (--max-memory)
  Unavailable = 7,       // a server could not be reached or did not answer within the timeout
  PermissionDenied = 8,  // a wrong or missing token
  Protocol = 9,          // a malformed frame, a wrong protocol version, an unknown opcode
  ReadOnly = 10,         // a write to a read-only serving shard, or on a read-only connection
};

class StoreError : public std::runtime_error {
 public:
  StoreError(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

// A duration as error messages print it: "3 s", "2.5 s".
inline std::string seconds_text(double seconds) {
  std::string text = std::to_string(seconds);
  text.erase(text.find_last_not_of('0') + 1);
  if (text.back() == '.') text.pop_back();
  return text + " s";
}

}  // namespace recdev::store
