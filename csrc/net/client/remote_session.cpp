#include "remote_session.h"

#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>

#include "store/errors.h"

namespace recdev::net {

using store::ErrorCode;
using store::seconds_text;
using store::StoreError;

namespace {

constexpr size_t kMaxIdleConnections = 8;
constexpr std::string_view kScheme = "tcp://";

std::chrono::milliseconds to_ms(double seconds) { return std::chrono::milliseconds(int64_t(seconds * 1000.0)); }

std::atomic<pid_t> process_id{0};
void note_process_id() { process_id.store(::getpid(), std::memory_order_relaxed); }

}  // namespace

pid_t this_process() {
  static const bool noted = [] {
    note_process_id();
    ::pthread_atfork(nullptr, nullptr, &note_process_id);  // a fork's child notes its own
    return true;
  }();
  (void)noted;
  return process_id.load(std::memory_order_relaxed);
}

namespace {

// What the next request raises when an update sent before it with overlap_updates failed, before
// that update's own error: an exchange's request is then not sent.
constexpr std::string_view kOverlappedFailure =
    "a table update sent by an earlier backward pass failed (connect(..., overlap_updates=True): backward does not "
    "wait for its updates; the next request raises their failure). A shard that refused it changed nothing; one "
    "that did not answer may still apply it, so check the rows before sending it again";
std::string overlapped_failure_not_sent() { return std::string(kOverlappedFailure) + "; this request was not sent: "; }
std::string overlapped_failure() { return std::string(kOverlappedFailure) + ": "; }

}  // namespace

std::vector<std::string> parse_server_list(const std::string& list) {
  std::vector<std::string> servers;
  size_t begin = 0;
  while (begin <= list.size()) {
    size_t end = list.find(',', begin);
    if (end == std::string::npos) end = list.size();
    std::string entry = list.substr(begin, end - begin);
    entry.erase(0, entry.find_first_not_of(" \t"));
    entry.erase(entry.find_last_not_of(" \t") + 1);
    if (entry.empty()) {
      throw StoreError(ErrorCode::InvalidArgument,
                       "server list '" + list + "' has an empty entry; expected tcp://HOST:PORT,tcp://HOST:PORT,...");
    }
    if (entry.compare(0, kScheme.size(), kScheme) == 0) {
      entry.erase(0, kScheme.size());
    } else if (entry.find("://") != std::string::npos) {
      throw StoreError(ErrorCode::InvalidArgument, "server '" + entry + "' in '" + list +
                                                       "': only tcp:// addresses are supported (tcp://HOST:PORT)");
    }
    servers.push_back(format_host_port(parse_host_port(entry)));
    begin = end + 1;
  }
  for (size_t i = 0; i < servers.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (servers[i] == servers[j]) {
        throw StoreError(ErrorCode::InvalidArgument,
                         "server list '" + list + "' names " + servers[i] + " twice; list each shard's server once");
      }
    }
  }
  return servers;
}

RemoteSession::RemoteSession(std::vector<std::string> servers, std::string token, double timeout_seconds,
                             bool read_only, bool overlap_updates)
    : servers_(std::move(servers)),
      token_(std::move(token)),
      timeout_seconds_(timeout_seconds),
      read_only_(read_only),
      overlap_updates_(overlap_updates) {
  if (servers_.empty()) throw StoreError(ErrorCode::InvalidArgument, "a remote store needs at least one server");
  if (!(timeout_seconds_ > 0)) {
    throw StoreError(ErrorCode::InvalidArgument, "timeout must be a positive number of seconds");
  }
  for (const std::string& address : servers_) {
    auto link = std::make_unique<Link>();
    link->address = address;
    link->host_port = parse_host_port(address);
    links_.push_back(std::move(link));
  }
  for (size_t shard = 0; shard < links_.size(); ++shard) release(shard, open(shard, timeout_seconds_));
  heartbeat_thread_ = std::thread([this] { heartbeat(); });
}

RemoteSession::~RemoteSession() {
  {
    // Overlapped updates still owed are read now, and a failure nobody was left to raise is said on
    // stderr: a destructor cannot raise it.
    std::lock_guard<std::recursive_mutex> lock(answers_owed_mutex_);
    finish_batches_owed();
    const auto kept = failures_kept_.find(this);
    if (kept != failures_kept_.end()) {
      std::string what = "unknown error";
      try {
        std::rethrow_exception(kept->second.first);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {}
      std::fprintf(stderr,
                   "recdev: %zu table update(s) sent with overlap_updates=True failed and were never reported "
                   "(the connection closed before another request or torch.recdev.synchronize() read them): %s\n",
                   kept->second.count, what.c_str());
    }
  }
  {
    std::lock_guard<std::mutex> lock(heartbeat_mutex_);
    stopping_ = true;
  }
  heartbeat_wake_.notify_all();
  heartbeat_thread_.join();
}

std::string RemoteSession::describe(size_t shard) const {
  return "recdev-server " + servers_[shard] + " (shard " + std::to_string(shard) + " of " +
         std::to_string(servers_.size()) + ")";
}

RemoteSession::Lease::~Lease() {
  for (size_t shard = 0; shard < connections_.size(); ++shard) {
    if (connections_[shard]) session_.release(shard, std::move(connections_[shard]));
  }
}

ShardConnection& RemoteSession::Lease::connection(size_t shard) {
  if (!connections_[shard]) connections_[shard] = session_.acquire(shard);
  return *connections_[shard];
}

std::unique_ptr<ShardConnection> RemoteSession::acquire(size_t shard) {
  Link& link = *links_[shard];
  while (true) {
    std::unique_ptr<ShardConnection> connection;
    {
      std::lock_guard<std::mutex> lock(link.mutex);
      // A forked child (a DataLoader worker) must not talk on its parent's sockets: their frames would
      // interleave. It opens its own (in the same session).
      if (this_process() != pid_) link.idle.clear();
      if (link.idle.empty()) break;
      connection = std::move(link.idle.back());
      link.idle.pop_back();
    }
    // An idle connection has nothing to read; if it has, the server closed it (it stopped, or
    // restarted since): use another rather than fail the operation.
    pollfd check{connection->socket.fd(), POLLIN, 0};
    if (::poll(&check, 1, 0) == 0) return connection;
  }
  return open(shard, timeout_seconds_);
}

void RemoteSession::release(size_t shard, std::unique_ptr<ShardConnection> connection) {
  if (connection->broken || this_process() != pid_) return;
  Link& link = *links_[shard];
  std::lock_guard<std::mutex> lock(link.mutex);
  // A connection of an older epoch talks to a session the server has since replaced.
  if (connection->epoch == link.epoch && link.idle.size() < kMaxIdleConnections) {
    link.idle.push_back(std::move(connection));
  }
}

std::unique_ptr<ShardConnection> RemoteSession::open(size_t shard, double timeout_seconds) {
  Link& link = *links_[shard];
  std::lock_guard<std::mutex> connecting(link.connect_mutex);
  uint64_t session_id;
  {
    std::lock_guard<std::mutex> lock(link.mutex);
    session_id = link.session_id;
  }
  const Clock::time_point deadline = Clock::now() + to_ms(timeout_seconds);
  auto backoff = std::chrono::milliseconds(10);
  while (true) {
    auto connection = std::make_unique<ShardConnection>();
    try {
      connection->socket = connect_to(link.host_port, to_ms(timeout_seconds));
    } catch (const StoreError& e) {
      throw StoreError(ErrorCode::Unavailable,
                       describe(shard) + ": " + e.what() + " (is recdev-server running there?)");
    }
    Hello hello;
    hello.token = token_;
    hello.session_id = session_id;
    std::vector<Call> calls;
    calls.push_back(make_call(shard, Opcode::Hello, hello));
    std::vector<ShardConnection*> connections(links_.size(), nullptr);
    connections[shard] = connection.get();
    try {
      exchange_on(connections, calls, timeout_seconds);
    } catch (const StoreError& e) {
      if (e.code() == ErrorCode::NotFound && session_id != 0) {
        session_id = 0;  // the server restarted, or our session lapsed there: start a new one
        continue;
      }
      // Refused for now (too many connections; dropped while waiting to say HELLO behind a flood of
      // connections that never do) or closed before answering: try again until the timeout is
      // spent, then report the server's reason.
      if (e.code() == ErrorCode::Unavailable && Clock::now() + backoff < deadline) {
        std::this_thread::sleep_for(backoff);
        backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
        continue;
      }
      throw;
    }
    const Welcome welcome = answer_of<Welcome>(calls[0]);
    if (welcome.version != kProtocolVersion) {
      throw StoreError(ErrorCode::Protocol, describe(shard) + " speaks protocol version " +
                                                std::to_string(welcome.version) + "; this client speaks " +
                                                std::to_string(kProtocolVersion));
    }
    if (welcome.shard != shard || welcome.num_shards != links_.size()) {
      throw StoreError(ErrorCode::InvalidArgument,
                       describe(shard) + " serves shard " + std::to_string(welcome.shard) + " of " +
                           std::to_string(welcome.num_shards) +
                           "; list every shard's server once, in shard order (tcp://shard0,tcp://shard1,...)");
    }
    std::lock_guard<std::mutex> lock(link.mutex);
    if (welcome.session_id != link.session_id) {
      if (link.session_id != 0) ++link.epoch;
      link.session_id = welcome.session_id;
    }
    link.lease_seconds = welcome.lease_seconds;
    connection->epoch = link.epoch;
    return connection;
  }
}

void RemoteSession::exchange(Lease& lease, std::vector<Call>& calls, const std::function<void(size_t)>& on_answer) {
  exchange_within(lease, calls, timeout_seconds_, on_answer);
}

void RemoteSession::exchange_within(Lease& lease, std::vector<Call>& calls, double timeout_seconds,
                                    const std::function<void(size_t)>& on_answer) {
  exchange_after_answers_owed(lease, calls, timeout_seconds, on_answer, /*raising_failures_kept=*/true);
}

void RemoteSession::exchange_keeping_failures(Lease& lease, std::vector<Call>& calls) {
  exchange_after_answers_owed(lease, calls, timeout_seconds_, {}, /*raising_failures_kept=*/false);
}

void RemoteSession::exchange_after_answers_owed(Lease& lease, std::vector<Call>& calls, double timeout_seconds,
                                                const std::function<void(size_t)>& on_answer,
                                                bool raising_failures_kept) {
  refuse_changes_if_read_only(calls);
  {
    // Each request sees the ones sent before it: the answers owed first (a failure among them is
    // their owner's to report, not this exchange's, unless the owner is the session: overlapped
    // updates). Their lease goes back to the pools, unless this exchange is part of building a
    // request to send on it.
    std::lock_guard<std::recursive_mutex> lock(answers_owed_mutex_);
    finish_batches_owed();
    if (!building_owed_) owed_lease_.reset();
    if (raising_failures_kept) throw_failures_kept(this, overlapped_failure_not_sent());
  }
  exchange_on(connections_for(lease, calls), calls, timeout_seconds, on_answer);
}

void RemoteSession::refuse_changes_if_read_only(const std::vector<Call>& calls) const {
  if (!read_only_) return;
  for (const Call& call : calls) {
    if (changes_tables(call.opcode)) {
      throw StoreError(ErrorCode::ReadOnly, std::string(opcode_name(uint8_t(call.opcode))) +
                                                " refused: this connection is read-only (torch_recdev.connect(..., "
                                                "read_only=True)); connect without read_only to change tables");
    }
  }
}

std::vector<ShardConnection*> RemoteSession::connections_for(Lease& lease, const std::vector<Call>& calls) const {
  std::vector<ShardConnection*> connections(links_.size(), nullptr);
  for (const Call& call : calls) {
    if (connections[call.shard] == nullptr) connections[call.shard] = &lease.connection(call.shard);
  }
  return connections;
}

void RemoteSession::exchange_on(const std::vector<ShardConnection*>& connections, std::vector<Call>& calls,
                                double timeout_seconds, const std::function<void(size_t)>& on_answer) {
  Exchange exchange(connections, calls, [this](size_t shard) { return describe(shard); }, on_answer);
  exchange.run(to_ms(timeout_seconds), seconds_text(timeout_seconds));
}

void RemoteSession::send_answer_later(const void* owner, const std::function<std::vector<Call>(Lease&)>& build,
                                      std::function<void(const Call& call, size_t k)> on_answer) {
  std::lock_guard<std::recursive_mutex> lock(answers_owed_mutex_);
  forget_answers_of_parent();
  throw_failures_kept(this, overlapped_failure_not_sent());
  if (!owed_lease_) owed_lease_ = std::make_unique<Lease>(*this);
  auto batch = std::make_unique<BatchOwed>();
  batch->owner = owner;
  try {
    building_owed_ = true;
    batch->calls = build(*owed_lease_);
    building_owed_ = false;
    refuse_changes_if_read_only(batch->calls);
  } catch (...) {
    building_owed_ = false;
    if (batches_owed_.empty()) owed_lease_.reset();  // nothing owed: not kept out of the pools
    throw;
  }
  std::function<void(size_t)> handler;
  if (on_answer) {
    handler = [calls = &batch->calls, on_answer = std::move(on_answer)](size_t k) { on_answer((*calls)[k], k); };
  }
  batch->exchange = std::make_unique<Exchange>(
      connections_for(*owed_lease_, batch->calls), batch->calls, [this](size_t shard) { return describe(shard); },
      std::move(handler));
  for (Exchange::Channel& channel : batch->exchange->channels()) batch->exchange->send(channel);
  const std::vector<Exchange::Channel>& channels = batch->exchange->channels();
  const bool left_unsent = std::any_of(channels.begin(), channels.end(), [](const auto& c) { return c.sending(); });
  batches_owed_.push_back(std::move(batch));
  ++batches_sent_;
  // A batch larger than its sockets take now is run to its end at once: the rest of it would
  // otherwise wait for the next request to be sent (its shard could not apply it meanwhile, and
  // drops a frame left half-sent past its payload timeout), and no frame may start on a stream
  // before the one ahead of it is whole.
  if (left_unsent) finish_batches_owed();
}

void RemoteSession::read_answers_left_owed() {
  std::unique_lock<std::recursive_mutex> lock(answers_owed_mutex_, std::try_to_lock);
  if (!lock.owns_lock() || building_owed_) return;  // a request is at them
  if (batches_owed_.empty() || batches_sent_ != batches_seen_by_heartbeat_) {
    batches_seen_by_heartbeat_ = batches_sent_;  // owed for less than a beat: the step may go on
    return;
  }
  finish_batches_owed();  // their failures stay kept for the next request
  owed_lease_.reset();
}

void RemoteSession::forget_answers_of_parent() {
  if (answers_owed_pid_ == this_process()) return;
  batches_owed_.clear();  // before the lease whose connections they use
  owed_lease_.reset();    // closes the child's copies of the sockets; the parent's stay open
  failures_kept_.clear();
  answers_owed_pid_ = this_process();
}

void RemoteSession::finish_batches_owed() {
  forget_answers_of_parent();
  for (const auto& batch : batches_owed_) {
    try {
      batch->exchange->run(to_ms(timeout_seconds_), seconds_text(timeout_seconds_));
    } catch (...) {
      if (batch->owner == nullptr) continue;  // its owner is gone (forget_owner)
      FailuresKept& kept = failures_kept_[batch->owner];
      if (!kept.first) kept.first = std::current_exception();
      ++kept.count;
    }
  }
  batches_owed_.clear();
}

void RemoteSession::read_answers_owed(const void* owner) {
  std::lock_guard<std::recursive_mutex> lock(answers_owed_mutex_);
  finish_batches_owed();
  // The connections go back to the pools: every answer owed has been read (or its connection failed
  // and is dropped).
  if (!building_owed_) owed_lease_.reset();
  throw_failures_kept(this, overlapped_failure());
  if (owner != nullptr) throw_failures_kept(owner, "");
}

void RemoteSession::throw_failures_kept(const void* owner, const std::string& context) {
  const auto kept = failures_kept_.find(owner);
  if (kept == failures_kept_.end()) return;
  const FailuresKept failures = kept->second;
  failures_kept_.erase(kept);
  if (failures.count == 1 && context.empty()) std::rethrow_exception(failures.first);
  try {
    std::rethrow_exception(failures.first);
  } catch (const StoreError& e) {
    const std::string more =
        failures.count == 1 ? ""
                            : " (and " + std::to_string(failures.count - 1) + " more requests sent with it failed)";
    throw StoreError(e.code(), context + e.what() + more);
  }
}

void RemoteSession::forget_owner(const void* owner) {
  std::lock_guard<std::recursive_mutex> lock(answers_owed_mutex_);
  for (const auto& batch : batches_owed_) {
    if (batch->owner == owner) batch->owner = nullptr;
  }
  failures_kept_.erase(owner);
}

void RemoteSession::heartbeat() {
  std::unique_lock<std::mutex> lock(heartbeat_mutex_);
  while (!stopping_) {
    double lease_seconds = 60;
    for (const auto& link : links_) {
      std::lock_guard<std::mutex> link_lock(link->mutex);
      if (link->lease_seconds > 0) lease_seconds = std::min(lease_seconds, link->lease_seconds);
    }
    const double interval = std::clamp(lease_seconds / 4, 0.2, 10.0);
    heartbeat_wake_.wait_for(lock, to_ms(interval));
    if (stopping_) break;
    lock.unlock();
    read_answers_left_owed();
    // Pings an idle connection of each shard; one in use renews the lease by its own requests.
    for (size_t shard = 0; shard < links_.size(); ++shard) {
      std::unique_ptr<ShardConnection> connection;
      {
        std::lock_guard<std::mutex> link_lock(links_[shard]->mutex);
        if (links_[shard]->idle.empty()) continue;
        connection = std::move(links_[shard]->idle.back());
        links_[shard]->idle.pop_back();
      }
      std::vector<Call> calls;
      calls.push_back(make_call(shard, Opcode::Ping, Empty{}));
      std::vector<ShardConnection*> connections(links_.size(), nullptr);
      connections[shard] = connection.get();
      try {
        exchange_on(connections, calls, std::min(timeout_seconds_, interval * 2));
      } catch (const StoreError&) {
        // A dead server: the connection is dropped; the next operation reports it.
      }
      release(shard, std::move(connection));
    }
    lock.lock();
  }
}

}  // namespace recdev::net
