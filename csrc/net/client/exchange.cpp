#include "exchange.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "store/errors.h"

namespace recdev::net {

using store::ErrorCode;
using store::StoreError;

Exchange::Exchange(const std::vector<ShardConnection*>& connections, std::vector<Call>& calls,
                   std::function<std::string(size_t)> describe, std::function<void(size_t)> on_answer)
    : calls_(calls),
      describe_(std::move(describe)),
      on_answer_(std::move(on_answer)),
      request_ids_(calls.size()),
      errors_(calls.size()) {
  std::vector<size_t> channel_of_shard(connections.size(), SIZE_MAX);
  for (size_t i = 0; i < calls.size(); ++i) {
    Call& call = calls[i];
    size_t& channel = channel_of_shard[call.shard];
    if (channel == SIZE_MAX) {
      channel = channels_.size();
      channels_.emplace_back();
      channels_.back().shard = call.shard;
      channels_.back().connection = connections[call.shard];
    }
    request_ids_[i] = channels_[channel].connection->next_request_id++;
    finish_frame(call.frame, call.opcode, request_ids_[i]);
    channels_[channel].calls.push_back(i);
  }
}

std::string Exchange::failure_prefix(const Channel& channel, size_t call) const {
  return describe_(channel.shard) + ", " + opcode_name(uint8_t(calls_[call].opcode)) + ": ";
}

void Exchange::fail(Channel& channel, const std::string& reason) {
  for (size_t k = channel.receive_index; k < channel.calls.size(); ++k) {
    const size_t call = channel.calls[k];
    errors_[call] = std::make_exception_ptr(StoreError(ErrorCode::Unavailable, failure_prefix(channel, call) + reason));
  }
  channel.failed = true;
  channel.connection->broken = true;
  channel.range.end();
}

void Exchange::deliver(Channel& channel) {
  const size_t call = channel.calls[channel.receive_index++];
  if (channel.range.recorded()) {
    // The bytes received are known only now, after the range opened: an answer is a range of its own.
    trace::Range("recdev::remote_answer", {{"shard", channel.shard},
                                           {"opcode", std::string_view(opcode_name(uint8_t(calls_[call].opcode)))},
                                           {"bytes_received", kHeaderBytes + channel.payload.size()}});
    if (channel.receive_index == channel.calls.size()) channel.range.end();
  }
  if (channel.header.flags & kFlagError) {
    ErrorResponse error;
    try {
      error = decode_payload<ErrorResponse>(channel.payload.data(), channel.payload.size(), "an error response");
    } catch (const StoreError& e) {
      error.code = ErrorCode::Protocol;
      error.message = e.what();
    }
    errors_[call] = std::make_exception_ptr(StoreError(error.code, failure_prefix(channel, call) + error.message));
    // After these, and after a refusal not addressed to this request, the server closes the connection.
    if (error.code == ErrorCode::Protocol || error.code == ErrorCode::PermissionDenied ||
        channel.header.request_id != request_ids_[call]) {
      channel.connection->broken = true;
    }
  } else {
    calls_[call].response = std::move(channel.payload);
    if (on_answer_) {
      try {
        on_answer_(call);
      } catch (...) {
        errors_[call] = std::current_exception();
      }
    }
  }
  channel.payload = {};
  channel.header_have = 0;
  channel.payload_have = 0;
}

bool Exchange::send(Channel& channel) {
  bool progress = false;
  while (channel.sending()) {
    const std::vector<uint8_t>& frame = calls_[channel.calls[channel.send_index]].frame;
    const ssize_t sent = ::send(channel.connection->socket.fd(), frame.data() + channel.send_offset,
                                frame.size() - channel.send_offset, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        fail(channel, std::string("connection lost: ") + std::strerror(errno));
      break;
    }
    progress = true;
    channel.send_offset += size_t(sent);
    if (channel.send_offset == frame.size()) {
      ++channel.send_index;
      channel.send_offset = 0;
    }
  }
  return progress;
}

bool Exchange::start_payload(Channel& channel) {
  try {
    channel.header = decode_header(channel.header_bytes);
  } catch (const StoreError& e) {
    fail(channel, std::string("unreadable answer: ") + e.what());
    return false;
  }
  const size_t call = channel.calls[channel.receive_index];
  if (channel.header.request_id != request_ids_[call] && (channel.header.flags & kFlagError) == 0) {
    fail(channel, "the answer carries request id " + std::to_string(channel.header.request_id) + ", expected " +
                      std::to_string(request_ids_[call]));
    return false;
  }
  channel.payload = std::move(channel.connection->spare);
  channel.payload.resize(channel.header.payload_bytes);
  return true;
}

bool Exchange::receive(Channel& channel) {
  bool progress = false;
  while (channel.receiving()) {
    const bool in_header = channel.header_have < kHeaderBytes;
    uint8_t* into =
        in_header ? channel.header_bytes + channel.header_have : channel.payload.data() + channel.payload_have;
    const size_t want = in_header ? kHeaderBytes - channel.header_have : channel.payload.size() - channel.payload_have;
    if (want > 0) {
      const ssize_t got = ::recv(channel.connection->socket.fd(), into, want, MSG_DONTWAIT);
      if (got == 0) {
        fail(channel, "the server closed the connection (did it stop or restart?)");
        return true;
      }
      if (got < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return progress;
        fail(channel, std::string("connection lost: ") + std::strerror(errno));
        return true;
      }
      progress = true;
      if (!in_header) {
        channel.payload_have += size_t(got);
      } else if ((channel.header_have += size_t(got)) == kHeaderBytes && !start_payload(channel)) {
        return true;
      }
    }
    if (channel.header_have == kHeaderBytes && channel.payload_have == channel.payload.size()) deliver(channel);
  }
  return progress;
}

void Exchange::open_profiler_ranges() {
  if (!trace::active()) return;
  // Shards answer in parallel, in any order: their ranges overlap unless there is one.
  const trace::Nesting nesting = channels_.size() > 1 ? trace::Nesting::Overlapping : trace::Nesting::Nested;
  for (Channel& channel : channels_) {
    size_t bytes_sent = 0;
    for (size_t call : channel.calls) bytes_sent += calls_[call].frame.size();
    const std::string server = describe_(channel.shard);
    channel.range =
        trace::Range("recdev::remote",
                     {{"shard", channel.shard},
                      {"server", server},
                      {"opcode", std::string_view(opcode_name(uint8_t(calls_[channel.calls.front()].opcode)))},
                      {"requests", channel.calls.size()},
                      {"bytes_sent", bytes_sent}},
                     nesting);
  }
}

void Exchange::run(std::chrono::milliseconds timeout, const std::string& timeout_text) {
  open_profiler_ranges();
  // Requests sent earlier on the same connection (RemoteSession::send_answer_later) failed it: the
  // answers of these will not come either, and waiting for them would cost a timeout each.
  for (Channel& channel : channels_) {
    if (channel.connection->broken && channel.receiving()) {
      fail(channel, "not answered: the connection failed under a request sent before it");
    }
  }
  auto last_progress = Clock::now();
  std::vector<pollfd> fds;
  std::vector<Channel*> polled;
  while (true) {
    fds.clear();
    polled.clear();
    for (Channel& channel : channels_) {
      if (!channel.receiving()) continue;
      fds.push_back(pollfd{channel.connection->socket.fd(), short(POLLIN | (channel.sending() ? POLLOUT : 0)), 0});
      polled.push_back(&channel);
    }
    if (fds.empty()) break;
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - last_progress);
    if (waited >= timeout) {
      for (Channel* channel : polled) fail(*channel, "no answer within " + timeout_text + " (timeout)");
      break;
    }
    const int ready = ::poll(fds.data(), fds.size(), int((timeout - waited).count()) + 1);
    if (ready < 0) {
      if (errno == EINTR) continue;
      for (Channel* channel : polled) fail(*channel, std::string("poll failed: ") + std::strerror(errno));
      break;
    }
    bool progress = false;
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      Channel& channel = *polled[k];
      if (fds[k].revents & (POLLOUT | POLLERR | POLLHUP)) progress |= send(channel);
      if (fds[k].revents & (POLLIN | POLLERR | POLLHUP)) progress |= receive(channel);
    }
    if (progress) last_progress = Clock::now();
  }
  for (const std::exception_ptr& error : errors_) {
    if (error) std::rethrow_exception(error);
  }
}

}  // namespace recdev::net
