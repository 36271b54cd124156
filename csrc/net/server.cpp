#include "server.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <cstdio>
#include <dirent.h>
#include <fcntl.h>
#include <mutex>
#include <poll.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

#include "store/checkpoint.h"
#include "store/errors.h"

namespace recdev::net {

using store::ErrorCode;
using store::StoreError;

namespace {

constexpr auto kHelloTimeout = std::chrono::seconds(10);
constexpr auto kPayloadTimeout = std::chrono::seconds(30);
constexpr auto kWriteTimeout = std::chrono::seconds(30);
// How often an idle connection and the accept loop look at the stop flag.
constexpr auto kStopPoll = std::chrono::milliseconds(200);
// After a stop signal, how long a connection keeps answering requests that had already arrived.
constexpr auto kStopGrace = std::chrono::seconds(5);

// Set by the signal handler; the self-pipe wakes the accept loop at once.
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
    struct sigaction action {};
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
  struct sigaction previous_term_ {};
  struct sigaction previous_int_ {};
};

// Counts the connection threads, so that shutdown can wait for all of them.
class ConnectionCount {
 public:
  bool try_add(uint32_t cap) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (count_ >= cap) return false;
    ++count_;
    return true;
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

// One connection, from HELLO to close. Never throws.
void serve_connection(Socket socket, ShardService& service) {
  service.connection_opened();
  std::shared_ptr<Session> session;
  try {
    Frame frame;
    Clock::time_point stopping_since{};
    // The first frame: HELLO within the deadline.
    const Clock::time_point hello_deadline = Clock::now() + kHelloTimeout;
    bool open = read_frame(socket, frame, hello_deadline, kPayloadTimeout);
    if (open) open = send_response(socket, service.handshake(frame, session)) && session != nullptr;
    while (open) {
      if (stop_requested.load()) {
        // Requests that had already arrived when the stop came are still answered, for a while.
        if (stopping_since == Clock::time_point{}) stopping_since = Clock::now();
        if (Clock::now() - stopping_since > kStopGrace || !socket.wait_readable(std::chrono::milliseconds(0))) break;
      } else if (!socket.wait_readable(kStopPoll)) {
        continue;
      }
      try {
        if (!read_frame(socket, frame, Clock::now() + kPayloadTimeout, kPayloadTimeout)) break;
      } catch (const BadFrame& error) {
        send_response(socket, service.refuse_frame(error));
        break;
      }
      Response response = service.handle(*session, frame);
      open = send_response(socket, response);
      service.recycle(std::move(response.frame));
    }
  } catch (const BadFrame& error) {
    send_response(socket, service.refuse_frame(error));
  } catch (const std::exception&) {
    // A broken or timed-out connection, or memory exhausted while reading a frame: end this one only.
  }
  if (session) service.end_connection(*session);
  service.connection_closed();
}

void refuse_connection(Socket socket, const std::string& reason) {
  try {
    const auto frame = encode_frame(Opcode::Hello, 0, ErrorResponse{ErrorCode::Unavailable, reason}, kFlagError);
    write_frame(socket, frame, Clock::now() + std::chrono::seconds(1));
  } catch (const std::exception&) {
  }
}

// Returns false (having logged why) if the checkpoint could not be written.
bool write_checkpoint(const ServerOptions& options, ShardService& service) {
  // Numbered, so that the log tells which checkpoint was the last one completed before a crash.
  static std::atomic<uint64_t> written{0};
  const std::string path =
      checkpoint_path(options.checkpoint_dir, options.service.shard, options.service.num_shards);
  try {
    const store::CheckpointSummary summary = store::save_store(path, service.store());
    log("checkpoint " + std::to_string(++written) + " written: " + path + " (" + store::describe(summary) + ")");
    return true;
  } catch (const std::exception& error) {
    log(std::string("checkpoint failed: ") + error.what());
    return false;
  }
}

// Frees lapsed sessions and writes periodic checkpoints until stop_requested.
void housekeeping(const ServerOptions& options, ShardService& service) {
  const auto tick = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(std::clamp(options.service.lease_seconds / 4, 0.05, 1.0)));
  const auto checkpoint_every = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options.checkpoint_every));
  Clock::time_point next_checkpoint = Clock::now() + checkpoint_every;
  while (!stop_requested.load()) {
    pollfd entry{stop_pipe[0], POLLIN, 0};
    ::poll(&entry, 1, int(std::chrono::duration_cast<std::chrono::milliseconds>(tick).count()));
    if (stop_requested.load()) break;
    service.reap_lapsed_sessions();
    if (!options.checkpoint_dir.empty() && options.checkpoint_every > 0 && Clock::now() >= next_checkpoint) {
      write_checkpoint(options, service);
      next_checkpoint = Clock::now() + checkpoint_every;
    }
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
  if (options.checkpoint_every > 0 && options.checkpoint_dir.empty()) invalid("--checkpoint-every needs --checkpoint-dir");
  if (options.max_connections < 1) invalid("--max-connections must be at least 1");
  if (service.token.size() > kMaxTokenBytes) invalid("the token is longer than " + std::to_string(kMaxTokenBytes) + " bytes");
}

}  // namespace

std::string checkpoint_path(const std::string& dir, uint32_t shard, uint32_t num_shards) {
  return dir + "/shard-" + std::to_string(shard) + "-of-" + std::to_string(num_shards) + ".recdev";
}

std::string load_shard_checkpoint(const std::string& dir, ShardService& service) {
  const uint32_t shard = service.options().shard;
  const uint32_t num_shards = service.options().num_shards;
  const std::string path = checkpoint_path(dir, shard, num_shards);
  if (::access(path.c_str(), F_OK) != 0) {
    // No file of ours: refuse a directory holding another layout's checkpoints rather than starting
    // empty beside them.
    std::vector<std::string> others;
    if (DIR* listing = ::opendir(dir.c_str())) {
      while (const dirent* entry = ::readdir(listing)) {
        unsigned other_shard = 0, other_count = 0;
        char tail[16] = {0};
        if (std::sscanf(entry->d_name, "shard-%u-of-%u.%15s", &other_shard, &other_count, tail) == 3 &&
            std::string(tail) == "recdev" && other_count != num_shards) {
          others.push_back(entry->d_name);
        }
      }
      ::closedir(listing);
    }
    if (!others.empty()) {
      std::sort(others.begin(), others.end());
      throw StoreError(ErrorCode::Corrupt, "checkpoint directory " + dir + " holds " + others.front() +
                                               ", written for another number of shards, and no checkpoint of shard " +
                                               std::to_string(shard) + " of " + std::to_string(num_shards) +
                                               "; start the servers with the layout they were written with");
    }
    return {};
  }
  store::load_store(path, service.store());
  for (const auto& [name, table] : service.store().named_tables()) {
    const uint64_t route_key = route_key_of_name(name);
    table->scan([](const store::TableScanHeader&) {},
                [&](uint64_t row_id, const float*) {
                  const uint32_t owner = owner_shard(route_key, row_id, num_shards);
                  if (owner != shard) {
                    throw StoreError(ErrorCode::Corrupt,
                                     "checkpoint " + path + " holds row " + std::to_string(row_id) + " of table '" +
                                         name + "', which belongs to shard " + std::to_string(owner) + ", not to shard " +
                                         std::to_string(shard) + " of " + std::to_string(num_shards) +
                                         ": it was written by another shard");
                  }
                });
  }
  service.adopt_named_tables();
  return path;
}

void run_server(const ServerOptions& options) {
  validate(options);
  ShardService service(options.service);
  if (!options.checkpoint_dir.empty()) {
    if (::mkdir(options.checkpoint_dir.c_str(), 0755) != 0 && errno != EEXIST) {
      throw StoreError(ErrorCode::Io, "cannot create checkpoint directory " + options.checkpoint_dir + ": " +
                                          std::strerror(errno));
    }
    const std::string own = checkpoint_path(options.checkpoint_dir, options.service.shard, options.service.num_shards);
    if (const std::string removed = store::remove_interrupted_saves(own); !removed.empty()) log(removed);
    if (const std::string loaded = load_shard_checkpoint(options.checkpoint_dir, service); !loaded.empty()) {
      log("loaded checkpoint " + loaded);
    }
  }
  HostPort bound;
  Socket listener = listen_on(parse_host_port(options.listen), bound);
  StopSignals signals;
  std::printf("listening on %s\n", format_host_port(bound).c_str());
  std::fflush(stdout);

  ConnectionCount connections;
  std::thread housekeeper(housekeeping, std::cref(options), std::ref(service));
  while (!stop_requested.load()) {
    pollfd entries[2] = {{listener.fd(), POLLIN, 0}, {stop_pipe[0], POLLIN, 0}};
    if (::poll(entries, 2, int(kStopPoll.count())) <= 0 || stop_requested.load()) continue;
    if ((entries[0].revents & POLLIN) == 0) continue;
    Socket socket = accept_connection(listener, std::chrono::milliseconds(0));
    if (!socket.valid()) continue;
    tune_connection(socket);
    if (!connections.try_add(options.max_connections)) {
      refuse_connection(std::move(socket), "too many connections (--max-connections " +
                                               std::to_string(options.max_connections) + "); try again later");
      continue;
    }
    try {
      std::thread([&connections, &service, socket = std::move(socket)]() mutable {
        serve_connection(std::move(socket), service);
        connections.remove();
      }).detach();
    } catch (const std::system_error&) {
      connections.remove();  // no thread for it: the socket closed with the lambda
      log("cannot start a thread for a new connection");
    }
  }
  listener.close();
  connections.wait_for_none();
  housekeeper.join();
  if (!options.checkpoint_dir.empty() && !write_checkpoint(options, service)) {
    throw StoreError(ErrorCode::Io, "stopped without writing the final checkpoint to " + options.checkpoint_dir);
  }
  log("stopped");
}

}  // namespace recdev::net
