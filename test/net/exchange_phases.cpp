// Unit tests of the client's Exchange (csrc/net/client/exchange.h), one phase at a time, over a socketpair
// whose other end plays the server. Built and run by test_exchange.py; prints "ok N" and exits 0, or
// names the first failed check and exits 1.
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "net/client/exchange.h"
#include "store/errors.h"

using namespace recdev::net;
using recdev::store::ErrorCode;
using recdev::store::StoreError;

namespace {

int checks = 0;

void check(bool ok, const std::string& what) {
  ++checks;
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what.c_str());
    std::exit(1);
  }
}

// A connection to shard 0 whose peer the test holds.
struct Pair {
  ShardConnection client;
  int server = -1;
  Pair() {
    int fds[2];
    check(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0, "socketpair");
    client.socket = Socket(fds[0]);
    server = fds[1];
  }
  ~Pair() { ::close(server); }
  void reply(const std::vector<uint8_t>& bytes) const {
    check(::write(server, bytes.data(), bytes.size()) == ssize_t(bytes.size()), "the peer writes");
  }
  size_t drain() const {
    std::vector<uint8_t> buffer(1 << 20);
    size_t total = 0;
    for (ssize_t got; (got = ::recv(server, buffer.data(), buffer.size(), MSG_DONTWAIT)) > 0;) total += size_t(got);
    return total;
  }
};

std::string error_text(const Exchange& exchange, size_t call, ErrorCode* code = nullptr) {
  try {
    if (exchange.error(call)) std::rethrow_exception(exchange.error(call));
  } catch (const StoreError& e) {
    if (code != nullptr) *code = e.code();
    return e.what();
  }
  return "";
}

std::string describe(size_t shard) { return "server " + std::to_string(shard); }

std::vector<Call> pings(size_t n) {
  std::vector<Call> calls;
  for (size_t k = 0; k < n; ++k) calls.push_back(make_call(0, Opcode::Ping, Empty{}));
  return calls;
}

void send_goes_as_far_as_the_socket_takes() {
  Pair pair;
  RowsRequest big;
  big.ids.assign(1 << 20, 1);  // 8 MiB: more than a socket buffer holds
  std::vector<Call> calls{make_call(0, Opcode::Write, big)};
  Exchange exchange({&pair.client}, calls, describe);
  Exchange::Channel& channel = exchange.channels()[0];
  check(exchange.send(channel), "send: progress on an empty socket");
  check(channel.send_index == 0 && channel.send_offset > 0, "send: part of a large frame is out, no more");
  size_t received = pair.drain();
  while (channel.sending()) {
    exchange.send(channel);
    received += pair.drain();
  }
  check(received == calls[0].frame.size(), "send: the whole frame arrives, once");
  check(!exchange.send(channel), "send: nothing left, no progress");
}

void receive_assembles_a_split_answer_and_deliver_hands_it_over() {
  Pair pair;
  std::vector<Call> calls = pings(1);
  size_t answered = SIZE_MAX;
  Exchange exchange({&pair.client}, calls, describe, [&](size_t call) { answered = call; });
  Exchange::Channel& channel = exchange.channels()[0];
  Welcome welcome;
  welcome.session_id = 77;
  const std::vector<uint8_t> answer = encode_frame(Opcode::Ping, exchange.request_id(0), welcome, 0);
  pair.reply({answer.begin(), answer.begin() + 5});
  check(exchange.receive(channel) && channel.header_have == 5, "receive: half a header is kept");
  check(!exchange.receive(channel), "receive: nothing new, no progress");
  pair.reply({answer.begin() + 5, answer.end()});
  check(exchange.receive(channel), "receive: the rest arrives");
  check(answered == 0 && !channel.receiving() && !exchange.error(0), "deliver: the call is answered, no error");
  check(answer_of<Welcome>(calls[0]).session_id == 77, "deliver: the response is the payload sent");
}

void an_error_frame_is_the_servers_reason_whatever_its_request_id() {
  Pair pair;
  std::vector<Call> calls = pings(1);
  Exchange exchange({&pair.client}, calls, describe);
  // A refusal sent before the server read any request: request id 0.
  pair.reply(encode_frame(Opcode::Ping, 0, ErrorResponse{ErrorCode::Unavailable, "too many connections"}, kFlagError));
  exchange.receive(exchange.channels()[0]);
  ErrorCode code{};
  const std::string text = error_text(exchange, 0, &code);
  check(code == ErrorCode::Unavailable, "deliver: the server's error code");
  check(text == "server 0, PING: too many connections", "deliver: the server's text, with server and op: " + text);
  check(pair.client.broken, "deliver: a refusal for no request leaves the connection unusable");
}

void an_answer_to_another_request_fails_the_connection() {
  Pair pair;
  std::vector<Call> calls = pings(2);
  Exchange exchange({&pair.client}, calls, describe);
  pair.reply(encode_frame(Opcode::Ping, exchange.request_id(0) + 5, Empty{}, 0));
  exchange.receive(exchange.channels()[0]);
  ErrorCode code{};
  check(error_text(exchange, 0, &code).find("the answer carries request id") != std::string::npos &&
            code == ErrorCode::Unavailable,
        "receive: a wrong request id fails the call");
  check(!error_text(exchange, 1).empty(), "fail: the calls behind it fail too");
  check(exchange.channels()[0].failed && pair.client.broken, "fail: the connection is not reused");
}

void a_closed_connection_fails_every_unanswered_call() {
  Pair pair;
  std::vector<Call> calls = pings(3);
  Exchange exchange({&pair.client}, calls, describe);
  pair.reply(encode_frame(Opcode::Ping, exchange.request_id(0), Empty{}, 0));
  ::shutdown(pair.server, SHUT_WR);
  check(exchange.receive(exchange.channels()[0]), "receive: an ended connection is progress");
  check(!exchange.error(0), "the answered call keeps its answer");
  for (size_t call : {1, 2}) {
    check(error_text(exchange, call) == "server 0, PING: the server closed the connection (did it stop or restart?)",
          "fail: call " + std::to_string(call) + " names the server, the op and the reason");
  }
}

void run_times_out_on_a_silent_server() {
  Pair pair;
  std::vector<Call> calls = pings(1);
  Exchange exchange({&pair.client}, calls, describe);
  try {
    exchange.run(std::chrono::milliseconds(200), "0.2 s");
    check(false, "run: a silent server must time out");
  } catch (const StoreError& e) {
    check(e.code() == ErrorCode::Unavailable && std::string(e.what()) == "server 0, PING: no answer within 0.2 s (timeout)",
          std::string("run: the timeout's message: ") + e.what());
  }
}

}  // namespace

int main() {
  send_goes_as_far_as_the_socket_takes();
  receive_assembles_a_split_answer_and_deliver_hands_it_over();
  an_error_frame_is_the_servers_reason_whatever_its_request_id();
  an_answer_to_another_request_fails_the_connection();
  a_closed_connection_fails_every_unanswered_call();
  run_times_out_on_a_silent_server();
  std::printf("ok %d\n", checks);
  return 0;
}
