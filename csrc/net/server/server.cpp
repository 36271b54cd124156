#include "server.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "serving.h"
#include "shard_checkpoints.h"
#include "store/disk_dir.h"
#include "store/errors.h"

namespace recdev::net {

using store::ErrorCode;
using store::StoreError;

namespace {

// A new connection has this long to send its whole HELLO, and at most this many wait for theirs at a
// time: a client that has not authenticated holds a few KiB for a few seconds, no thread, and no slot
// an authenticated connection could take.
constexpr auto kHelloTimeout = std::chrono::seconds(5);
constexpr uint32_t kMaxWaitingForHello = 16;
constexpr auto kPayloadTimeout = std::chrono::seconds(30);
constexpr auto kWriteTimeout = std::chrono::seconds(30);
// Request buffers past this size are freed after their request, and a kept response buffer past it
// after kBufferIdle without a request, so that an idle connection holds little.
constexpr size_t kKeptBufferBytes = size_t{1} << 20;
constexpr auto kBufferIdle = std::chrono::seconds(1);
// How often an idle connection and the accept loop look at the stop flag.
constexpr auto kStopPoll = std::chrono::milliseconds(200);
// After a stop signal, how long a connection keeps answering requests that had already arrived.
constexpr auto kStopGrace = std::chrono::seconds(5);

// Set by the signal handler; the self-pipe wakes the accept loop at once.
// How often a serving shard looks for a new version: a version is served within about this long of
// its completion, plus its load.
constexpr auto kFollowEvery = std::chrono::milliseconds(200);

std::atomic<bool> stop_requested{false};
int stop_pipe[2] = {-1, -1};

extern "C" void on_stop_signal(int) {
  stop_requested.store(true);
  const char byte = 1;
  [[maybe_unused]] const ssize_t ignored = ::write(stop_pipe[1], &byte, 1);
}

// Installs the SIGTERM / SIGINT handlers for the life of the server and restores the previous ones.
class StopSignals {
 public:
  StopSignals() {
    stop_requested.store(false);
    if (::pipe2(stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
      throw StoreError(ErrorCode::Io, "cannot create the server's signal pipe");
    }
    struct sigaction action{};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGTERM, &action, &previous_term_);
    ::sigaction(SIGINT, &action, &previous_int_);
  }
  ~StopSignals() {
    ::sigaction(SIGTERM, &previous_term_, nullptr);
    ::sigaction(SIGINT, &previous_int_, nullptr);
    ::close(stop_pipe[0]);
    ::close(stop_pipe[1]);
    stop_pipe[0] = stop_pipe[1] = -1;
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction previous_term_{};
  struct sigaction previous_int_{};
};

// Counts the authenticated connections' threads, so that shutdown can wait for all of them.
class ConnectionCount {
 public:
  bool try_add(uint32_t cap) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (count_ >= cap) return false;
    ++count_;
    return true;
  }
  uint32_t count() {
    std::lock_guard<std::mutex> lock(mutex_);
    return count_;
  }
  void remove() {
    std::lock_guard<std::mutex> lock(mutex_);
    --count_;
    changed_.notify_all();
  }
  void wait_for_none() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return count_ == 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  uint32_t count_ = 0;
};

void log(const std::string& line) {
  std::fprintf(stderr, "recdev-server: %s\n", line.c_str());
  std::fflush(stderr);
}

bool send_response(Socket& socket, const Response& response) {
  try {
    write_frame(socket, response.frame, Clock::now() + kWriteTimeout);
    return !response.close_after;
  } catch (const StoreError&) {
    return false;  // the peer is gone or stopped reading
  }
}

// Sends a short frame only if the socket takes it at once: for connections the server drops, whose
// peer may never read.
void send_now(Socket& socket, const std::vector<uint8_t>& frame) {
  try {
    write_frame(socket, frame, Clock::now());
  } catch (const StoreError&) {}
}

std::vector<uint8_t> refusal(ErrorCode code, uint64_t request_id, const std::string& reason) {
  return encode_frame(Opcode::Hello, request_id, ErrorResponse{code, reason}, kFlagError);
}

// What one connection's buffers hold, kept in the service's memory figure.
class BufferCount {
 public:
  explicit BufferCount(ShardService& service) : service_(service) {}
  ~BufferCount() { set(0); }
  BufferCount(const BufferCount&) = delete;
  BufferCount& operator=(const BufferCount&) = delete;
  void set(uint64_t bytes) {
    service_.buffers_changed(bytes_, bytes);
    bytes_ = bytes;
  }

 private:
  ShardService& service_;
  uint64_t bytes_ = 0;
};

// An authenticated connection, from its WELCOME to its close. Never throws.
void serve_connection(Socket socket, ShardService& service, std::shared_ptr<Session> session, const Response& welcome,
                      Clock::duration idle_timeout, double idle_timeout_seconds) {
  {
    BufferCount buffers(service);
    try {
      Frame frame;
      Clock::time_point stopping_since{};
      Clock::time_point last_request = Clock::now();
      bool open = send_response(socket, welcome);
      while (open) {
        if (stop_requested.load()) {
          // Requests that had already arrived when the stop came are still answered, for a while.
          if (stopping_since == Clock::time_point{}) stopping_since = Clock::now();
          if (Clock::now() - stopping_since > kStopGrace || !socket.wait_readable(std::chrono::milliseconds(0))) break;
        } else if (!socket.wait_readable(kStopPoll)) {
          const Clock::duration idle = Clock::now() - last_request;
          if (idle > kBufferIdle && service.response_buffer_bytes() > kKeptBufferBytes) {
            service.release_response_buffer();
            buffers.set(frame.payload.capacity());
          }
          if (idle > idle_timeout) {
            char seconds[32];
            std::snprintf(seconds, sizeof(seconds), "%g", idle_timeout_seconds);
            send_now(socket, refusal(ErrorCode::Unavailable, 0,
                                     std::string("connection closed after ") + seconds +
                                         " s without a request (--idle-timeout); open a new one"));
            break;
          }
          continue;
        }
        try {
          if (!read_header(socket, frame, Clock::now() + kPayloadTimeout)) break;
        } catch (const BadFrame& error) {
          send_response(socket, service.refuse_frame(error));
          break;
        }
        std::optional<ShardService::Reservation> payload;
        try {
          payload.emplace(service.admit_payload(frame.header));
        } catch (const StoreError& full) {
          // Past --max-memory: the request is refused whole, its bytes read and dropped, never held.
          skip_payload(socket, frame.header, kPayloadTimeout);
          open = send_response(socket, service.refuse_request(frame.header, full));
          last_request = Clock::now();
          continue;
        }
        read_payload(socket, frame, kPayloadTimeout);
        buffers.set(frame.payload.capacity() + service.response_buffer_bytes());
        payload->keep(frame.header.payload_bytes);  // the frame is this connection's buffer from here
        Response response = service.handle(*session, frame);
        payload.reset();
        open = send_response(socket, response);
        service.recycle(std::move(response.frame));
        if (frame.payload.capacity() > kKeptBufferBytes) std::vector<uint8_t>().swap(frame.payload);
        buffers.set(frame.payload.capacity() + service.response_buffer_bytes());
        last_request = Clock::now();
      }
    } catch (const std::exception&) {
      // A broken or timed-out connection, or memory exhausted while reading a frame: end this one only.
    }
  }
  service.end_connection(*session);
  service.connection_closed();
}

// A new connection until its first frame is whole, read by the accept loop without blocking.
struct Waiting {
  Socket socket;
  Clock::time_point deadline;
  uint8_t header[kHeaderBytes];
  size_t header_have = 0;
  Frame frame;
  size_t payload_have = 0;
  bool done = false;  // handed off or closed: to be removed
};

// Reads what has arrived of a waiting connection's first frame; true once it is whole. Throws
// BadFrame for a header decode_header refuses or a frame too large to come before HELLO, and
// StoreError(Unavailable) when the peer closed or broke the connection.
bool read_first_frame(Waiting& waiting) {
  while (true) {
    const bool in_header = waiting.header_have < kHeaderBytes;
    if (!in_header && waiting.payload_have == waiting.frame.payload.size()) return true;
    uint8_t* into =
        in_header ? waiting.header + waiting.header_have : waiting.frame.payload.data() + waiting.payload_have;
    const size_t want =
        in_header ? kHeaderBytes - waiting.header_have : waiting.frame.payload.size() - waiting.payload_have;
    const ssize_t got = ::recv(waiting.socket.fd(), into, want, MSG_DONTWAIT);
    if (got == 0) throw StoreError(ErrorCode::Unavailable, "closed before HELLO");
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      throw StoreError(ErrorCode::Unavailable, std::string("reading HELLO: ") + std::strerror(errno));
    }
    if (!in_header) {
      waiting.payload_have += size_t(got);
      continue;
    }
    if ((waiting.header_have += size_t(got)) < kHeaderBytes) continue;
    waiting.frame.header = decode_header_or_refuse(waiting.header);
    if (waiting.frame.header.payload_bytes > kMaxHelloPayloadBytes) {
      throw BadFrame(
          StoreError(ErrorCode::Protocol, "a first frame of " + std::to_string(waiting.frame.header.payload_bytes) +
                                              " bytes; before HELLO the server reads at most " +
                                              std::to_string(kMaxHelloPayloadBytes) + " (a HELLO is far smaller)"),
          waiting.frame.header.request_id, uint8_t(waiting.frame.header.opcode));
    }
    waiting.frame.payload.resize(waiting.frame.header.payload_bytes);
  }
}

// Frees lapsed sessions and writes periodic checkpoints until stop_requested.
void housekeeping(const ServerOptions& options, ShardService& service) {
  const auto tick = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(std::clamp(options.service.lease_seconds / 4, 0.05, 1.0)));
  const auto checkpoint_every =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.checkpoint_every));
  const bool checkpoints = !options.checkpoint_dir.empty() && options.checkpoint_every > 0;
  Clock::time_point next_checkpoint = Clock::now() + checkpoint_every;
  while (!stop_requested.load()) {
    // Woken for the next checkpoint too, so that --checkpoint-every shorter than the tick holds.
    const Clock::duration wait =
        checkpoints ? std::clamp<Clock::duration>(next_checkpoint - Clock::now(), Clock::duration::zero(), tick) : tick;
    pollfd entry{stop_pipe[0], POLLIN, 0};
    ::poll(&entry, 1, int(std::chrono::ceil<std::chrono::milliseconds>(wait).count()));
    if (stop_requested.load()) break;
    service.reap_lapsed_sessions();
    if (checkpoints && Clock::now() >= next_checkpoint) {
      write_shard_checkpoint(options.checkpoint_dir, service, log);
      next_checkpoint = Clock::now() + checkpoint_every;
    }
  }
}

// A serving shard's: looks for a new version kFollowEvery until stop_requested.
void follow_versions(VersionFollower& follower) {
  while (!stop_requested.load()) {
    pollfd entry{stop_pipe[0], POLLIN, 0};
    ::poll(&entry, 1, int(std::chrono::duration_cast<std::chrono::milliseconds>(kFollowEvery).count()));
    if (stop_requested.load()) break;
    follower.check();
  }
}

void validate(const ServerOptions& options) {
  const ServiceOptions& service = options.service;
  const auto invalid = [](const std::string& message) { throw StoreError(ErrorCode::InvalidArgument, message); };
  if (service.num_shards < 1) invalid("--num-shards must be at least 1");
  if (service.shard >= service.num_shards) {
    invalid("--shard " + std::to_string(service.shard) + " is not below --num-shards " +
            std::to_string(service.num_shards) + " (shards are numbered 0 to N-1)");
  }
  if (!(service.lease_seconds > 0)) invalid("--lease-seconds must be positive");
  if (!(options.checkpoint_every >= 0)) invalid("--checkpoint-every must be 0 or positive");
  if (options.checkpoint_every > 0 && options.checkpoint_dir.empty())
    invalid("--checkpoint-every needs --checkpoint-dir");
  if (options.max_connections < 1) invalid("--max-connections must be at least 1");
  if (!service.serve_dir.empty() && !options.checkpoint_dir.empty()) {
    invalid("--serve and --checkpoint-dir do not go together: a serving shard is read-only and writes no checkpoints");
  }
  if (!(options.idle_timeout > 0)) invalid("--idle-timeout must be positive");
  if (service.token.size() > kMaxTokenBytes)
    invalid("the token is longer than " + std::to_string(kMaxTokenBytes) + " bytes");
}

// The accept loop: new connections wait, without a thread, until their HELLO is whole (at most
// kMaxWaitingForHello of them, each for kHelloTimeout); an authenticated one gets a thread of its own
// (serve_connection) while fewer than --max-connections are served. Runs until a stop signal.
class Acceptor {
 public:
  Acceptor(const ServerOptions& options, ShardService& service, Socket& listener, ConnectionCount& connections)
      : options_(options),
        service_(service),
        listener_(listener),
        connections_(connections),
        waiting_buffers_(service),
        idle_timeout_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.idle_timeout))),
        max_waiting_(std::min(kMaxWaitingForHello, options.max_connections)),
        too_many_("too many connections (--max-connections " + std::to_string(options.max_connections) +
                  "); try again later") {}

  void run() {
    std::vector<pollfd> entries;
    while (!stop_requested.load()) {
      entries.assign({{listener_.fd(), POLLIN, 0}, {stop_pipe[0], POLLIN, 0}});
      for (const Waiting& entry : waiting_) entries.push_back(pollfd{entry.socket.fd(), POLLIN, 0});
      auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(kStopPoll);
      if (!waiting_.empty()) {
        const auto until_deadline =
            std::chrono::duration_cast<std::chrono::milliseconds>(waiting_.front().deadline - Clock::now());
        wait = std::clamp(until_deadline + std::chrono::milliseconds(1), std::chrono::milliseconds(0), wait);
      }
      if (::poll(entries.data(), entries.size(), int(wait.count())) < 0 && errno != EINTR) continue;
      if (stop_requested.load()) break;
      // Connections already waiting are read before a new one may push the oldest out.
      for (size_t k = 0; k < waiting_.size(); ++k) {
        if (entries[2 + k].revents != 0) progress(waiting_[k]);
      }
      refuse_late_hellos();
      // One connection per round, so that a flood of new ones cannot outrun the reading of waiting ones.
      Socket socket((entries[0].revents & POLLIN) != 0 ? ::accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC)
                                                       : -1);
      if (socket.valid()) admit(std::move(socket));
      forget_done();
    }
    for (Waiting& entry : waiting_) close_waiting(entry);
  }

 private:
  void close_waiting(Waiting& entry) {
    entry.socket.close();
    entry.done = true;
    service_.connection_closed();
  }

  // The first frame is whole: the handshake, then a thread for the authenticated connection.
  void hand_off(Waiting& entry) {
    std::shared_ptr<Session> session;
    Response response = service_.handshake(entry.frame, session);
    if (session == nullptr) {
      send_now(entry.socket, response.frame);
      close_waiting(entry);
      return;
    }
    if (!connections_.try_add(options_.max_connections)) {
      send_now(entry.socket, refusal(ErrorCode::Unavailable, entry.frame.header.request_id, too_many_));
      service_.end_connection(*session);
      close_waiting(entry);
      return;
    }
    entry.done = true;
    try {
      std::thread([&connections = connections_, &service = service_, socket = std::move(entry.socket),
                   session = std::move(session), response = std::move(response), idle_timeout = idle_timeout_,
                   &options = options_]() mutable {
        serve_connection(std::move(socket), service, std::move(session), response, idle_timeout, options.idle_timeout);
        connections.remove();
      }).detach();
    } catch (const std::system_error&) {
      // No thread for it: the socket closed with the lambda.
      service_.end_connection(*session);
      service_.connection_closed();
      connections_.remove();
      log("cannot start a thread for a new connection");
    }
  }

  void progress(Waiting& entry) {
    try {
      if (read_first_frame(entry)) hand_off(entry);
    } catch (const BadFrame& error) {
      send_now(entry.socket, service_.refuse_frame(error).frame);
      close_waiting(entry);
    } catch (const std::exception&) {
      close_waiting(entry);
    }
  }

  void refuse_late_hellos() {
    const Clock::time_point now = Clock::now();
    for (Waiting& entry : waiting_) {
      if (!entry.done && now >= entry.deadline) {
        send_now(entry.socket, refusal(ErrorCode::Protocol, 0, "no HELLO within 5 s of connecting"));
        close_waiting(entry);
      }
    }
  }

  // A new connection waits for its HELLO, unless every slot is taken by authenticated ones. Every
  // slot a waiting connection holds can be taken back: the oldest gives way.
  void admit(Socket socket) {
    tune_connection(socket);
    const uint32_t authenticated = connections_.count();
    if (authenticated >= options_.max_connections) {
      send_now(socket, refusal(ErrorCode::Unavailable, 0, too_many_));
      return;
    }
    size_t live = 0;
    for (const Waiting& entry : waiting_) live += entry.done ? 0 : 1;
    if (live >= max_waiting_ || live + authenticated >= options_.max_connections) {
      for (Waiting& entry : waiting_) {
        if (entry.done) continue;
        send_now(entry.socket, refusal(ErrorCode::Unavailable, 0,
                                       "dropped for a newer connection: " + std::to_string(live) +
                                           " connections were waiting to send HELLO; send it as soon as you connect"));
        close_waiting(entry);
        break;
      }
    }
    service_.connection_opened();
    waiting_.push_back(Waiting{});
    waiting_.back().socket = std::move(socket);
    waiting_.back().deadline = Clock::now() + kHelloTimeout;
    progress(waiting_.back());  // the HELLO usually came with the connection
  }

  // Drops the handed-off and closed connections; the rest's buffers count in the shard's memory.
  void forget_done() {
    waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), [](const Waiting& entry) { return entry.done; }),
                   waiting_.end());
    uint64_t waiting_bytes = 0;
    for (const Waiting& entry : waiting_) waiting_bytes += entry.frame.payload.capacity();
    waiting_buffers_.set(waiting_bytes);
  }

  const ServerOptions& options_;
  ShardService& service_;
  Socket& listener_;
  ConnectionCount& connections_;
  std::vector<Waiting> waiting_;  // oldest first
  BufferCount waiting_buffers_;
  const Clock::duration idle_timeout_;
  const uint32_t max_waiting_;
  const std::string too_many_;
};

}  // namespace

void run_server(const ServerOptions& options, ServiceWatcher* watcher) {
  validate(options);
  ShardService service(options.service);
  // The flag only, not RECDEV_DISK_DIR: a shard's disk is what its command line says.
  const uint64_t left_behind = store::set_disk_dir(options.disk_dir);
  if (left_behind != 0) log("removed " + std::to_string(left_behind) + " disk-tier directories of dead processes");
  if (!options.checkpoint_dir.empty()) restore_shard_checkpoints(options.checkpoint_dir, service, log);
  std::optional<VersionFollower> follower;
  if (service.serving()) {
    follower.emplace(options.service.serve_dir, service, log);
    if (!follower->check()) log("no version of " + options.service.serve_dir + " to serve yet; waiting for one");
  }
  HostPort bound;
  Socket listener = listen_on(parse_host_port(options.listen), bound);
  StopSignals signals;
  if (watcher != nullptr) watcher->start(service);
  // Stopped on every way out, before the service it reads is gone (it may watch the final checkpoint).
  const std::unique_ptr<ServiceWatcher, void (*)(ServiceWatcher*)> watching(
      watcher, [](ServiceWatcher* stopping) { stopping->stop(); });
  std::printf("listening on %s\n", format_host_port(bound).c_str());
  std::fflush(stdout);

  // Accepting only waits on poll: a connection taken from the backlog is read at once.
  ::fcntl(listener.fd(), F_SETFL, ::fcntl(listener.fd(), F_GETFL) | O_NONBLOCK);
  ConnectionCount connections;
  std::thread housekeeper(housekeeping, std::cref(options), std::ref(service));
  std::thread following;
  if (follower) following = std::thread(follow_versions, std::ref(*follower));
  Acceptor(options, service, listener, connections).run();
  listener.close();
  service.stop_staged_steps();  // a part waiting for a dead rank would hold its thread up to its timeout
  connections.wait_for_none();
  housekeeper.join();
  if (following.joinable()) following.join();
  if (!options.checkpoint_dir.empty() && !write_shard_checkpoint(options.checkpoint_dir, service, log)) {
    throw StoreError(ErrorCode::Io, "stopped without writing the final checkpoint to " + options.checkpoint_dir);
  }
  log("stopped");
}

}  // namespace recdev::net
