// Exchange: one round of requests on one open connection per shard, the client's hardest loop, in
// four phases a test can drive one at a time:
//
//   send     writes what each socket takes now of its calls' frames, in call order (pipelined);
//   receive  reads what has arrived: a header, then its payload into a recycled buffer;
//   deliver  hands a whole answer to its call: the response, or the server's error (code and text);
//   fail     ends a connection's unanswered calls with StoreError(Unavailable) and the reason.
//
// run() polls every connection until each call is answered or failed; a connection that makes no
// progress for the timeout fails. Answers must come in call order with the call's request id, except
// an error frame, which is read whatever its id: a server refuses a connection (too many connections,
// shutting down) with request id 0 before it reads any request, and that refusal is the reason the
// user must see.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "net/wire/protocol.h"
#include "net/wire/socket.h"
#include "store/trace_range.h"

namespace recdev::net {

// One request of an exchange and, after it, its answer.
struct Call {
  size_t shard = 0;
  Opcode opcode = Opcode::Ping;
  std::vector<uint8_t> frame;     // kHeaderBytes of room, then the encoded request
  std::vector<uint8_t> response;  // the answer's payload
};

template <class Message>
Call make_call(size_t shard, Opcode opcode, const Message& message) {
  Call call;
  call.shard = shard;
  call.opcode = opcode;
  call.frame.resize(kHeaderBytes);
  Writer out(call.frame);
  encode(out, message);
  return call;
}

template <class Message>
Message answer_of(const Call& call) {
  return decode_payload<Message>(call.response.data(), call.response.size(), opcode_name(uint8_t(call.opcode)));
}

struct ShardConnection {
  Socket socket;
  uint64_t epoch = 0;  // the shard's epoch when this connection said HELLO
  uint64_t next_request_id = 1;
  bool broken = false;  // not to be reused: a transport failure, or the server closes it
  // A used answer buffer, kept for the next answer: fresh buffers of megabytes cost a page fault per
  // page, more than reading the rows into them.
  std::vector<uint8_t> spare;
  void recycle(std::vector<uint8_t>&& buffer) {
    constexpr size_t kMaxSpareBytes = size_t{64} << 20;
    if (buffer.capacity() > spare.capacity() && buffer.capacity() <= kMaxSpareBytes) spare = std::move(buffer);
  }
};

class Exchange {
 public:
  // A connection's progress through its calls.
  struct Channel {
    size_t shard = 0;
    ShardConnection* connection = nullptr;
    std::vector<size_t> calls;  // indices into the exchange's calls, in send order
    size_t send_index = 0;      // the call being sent, and how much of its frame is out
    size_t send_offset = 0;
    size_t receive_index = 0;  // the call whose answer is being read
    uint8_t header_bytes[kHeaderBytes];
    size_t header_have = 0;
    FrameHeader header;
    std::vector<uint8_t> payload;
    size_t payload_have = 0;
    bool failed = false;
    trace::Range range;  // recdev::remote while a profiler records: until the last answer is in

    bool sending() const { return !failed && send_index < calls.size(); }
    bool receiving() const { return !failed && receive_index < calls.size(); }
  };

  // Numbers every call with its connection's next request id and finishes its frame. connections is
  // indexed by shard (null for shards no call goes to); describe(shard) names a server in errors;
  // on_answer(k), if given, runs as soon as call k's answer is in (an exception it throws becomes
  // call k's error).
  Exchange(const std::vector<ShardConnection*>& connections, std::vector<Call>& calls,
           std::function<std::string(size_t shard)> describe, std::function<void(size_t call)> on_answer = {});

  // Runs the phases until every call is answered or failed, then throws the first failed call's
  // error, in call order.
  void run(std::chrono::milliseconds timeout, const std::string& timeout_text);

  // The phases, on one channel. send and receive return whether any byte moved (or the connection
  // ended), which is what the timeout counts as progress.
  bool send(Channel& channel);
  bool receive(Channel& channel);
  void deliver(Channel& channel);
  void fail(Channel& channel, const std::string& reason);

  std::vector<Channel>& channels() { return channels_; }
  uint64_t request_id(size_t call) const { return request_ids_[call]; }
  // The error of a call, null while it has none.
  std::exception_ptr error(size_t call) const { return errors_[call]; }

 private:
  std::string failure_prefix(const Channel& channel, size_t call) const;
  void open_profiler_ranges();
  // After a header is read: checks it and readies the payload buffer; false if the channel failed.
  bool start_payload(Channel& channel);

  std::vector<Call>& calls_;
  std::function<std::string(size_t)> describe_;
  std::function<void(size_t)> on_answer_;
  std::vector<Channel> channels_;
  std::vector<uint64_t> request_ids_;
  std::vector<std::exception_ptr> errors_;
};

}  // namespace recdev::net
