// RemoteSession: one client session with every shard of a remote store (one recdev-server per shard).
//
// Per shard it keeps the server's session id and a pool of open connections; an operation leases one
// connection per shard it needs, and exchange() (exchange.h) sends all its requests before waiting on
// any, then waits for every answer in one poll loop over all of them — so the shards work in parallel, requests
// on one connection are pipelined, and a large request to one server never waits for another's
// answer. Nothing blocks without a deadline: a server that makes no progress for `timeout` seconds,
// refuses the connection or drops it gives StoreError(Unavailable) naming the server and the operation.
//
// Opening a connection tries again until the timeout while the server refuses it for now (too many
// connections, or dropped while waiting to say HELLO) or closes it before answering HELLO, then
// raises the server's reason. A pooled connection the server closed (its --idle-timeout) is noticed
// before reuse and replaced.
//
// Restarts: a connection opened after a server lost the session (it restarted, or the session's lease
// lapsed) starts a new session there and bumps that shard's epoch; tables check the epoch of the
// connection they are about to use and look their table ids up again (RemoteTable).
//
// A heartbeat thread pings every shard a few times per lease, so that a session with open tables
// does not lapse while the client is idle.
#pragma once

#include <unistd.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "exchange.h"
#include "net/wire/protocol.h"
#include "net/wire/socket.h"

namespace recdev::net {

// "tcp://h1:7070,tcp://h2:7071" (the tcp:// is optional; "[::1]:7070" for IPv6) -> "h1:7070",
// "h2:7071". Throws StoreError(InvalidArgument) saying what is wrong with which entry.
std::vector<std::string> parse_server_list(const std::string& list);

// getpid() without a system call per use (glibc does not cache it, and a session asks each time a
// connection is leased and given back): the pid, which changes only in a fork's child.
pid_t this_process();

class RemoteSession {
 public:
  // servers: "host:port" of shard 0, 1, ... The first connection to each is opened here, so a bad
  // address, a wrong token or a server that is not listening fails now.
  // read_only: every request that would change a table (changes_tables) is refused here, before it
  // is sent (StoreError(ReadOnly)): for inference against serving shards or training shards alike.
  // overlap_updates: a backward pass does not wait for its updates' answers (updates_owner).
  RemoteSession(std::vector<std::string> servers, std::string token, double timeout_seconds, bool read_only = false,
                bool overlap_updates = false);
  bool read_only() const { return read_only_; }
  bool overlaps_updates() const { return overlap_updates_; }
  ~RemoteSession();
  RemoteSession(const RemoteSession&) = delete;
  RemoteSession& operator=(const RemoteSession&) = delete;

  size_t num_shards() const { return links_.size(); }
  const std::vector<std::string>& servers() const { return servers_; }
  double timeout_seconds() const { return timeout_seconds_; }
  // "recdev-server 127.0.0.1:7070 (shard 0 of 2)"
  std::string describe(size_t shard) const;

  // One connection per shard, for one operation; returned to the pools when it ends.
  class Lease {
   public:
    Lease(RemoteSession& session) : session_(session), connections_(session.num_shards()) {}
    ~Lease();
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    // Opens or reuses a connection to the shard (StoreError(Unavailable) if it cannot).
    ShardConnection& connection(size_t shard);

   private:
    RemoteSession& session_;
    std::vector<std::unique_ptr<ShardConnection>> connections_;
  };

  // Sends every call on the lease's connections and waits for every answer. Then, if any failed,
  // throws the error of the first failed call (in call order): the server's StoreError with its code,
  // or StoreError(Unavailable) for a transport failure or a timeout. on_answer(k), if given, runs as
  // soon as call k's answer is in, while the other answers are still arriving (an exception it
  // throws counts as call k's error).
  void exchange(Lease& lease, std::vector<Call>& calls, const std::function<void(size_t call)>& on_answer = {});
  // exchange, with a connection allowed `timeout_seconds` without progress instead of the session's
  // timeout: for requests a server answers only once other clients have sent theirs (STAGE_UPDATE).
  void exchange_within(Lease& lease, std::vector<Call>& calls, double timeout_seconds,
                       const std::function<void(size_t call)>& on_answer = {});
  // exchange, for requests that undo or free after a failure or in a destructor, whose callers
  // swallow what it throws: a failure of an overlapped update read meanwhile stays kept for the next
  // request to raise, instead of stopping the cleanup and being lost with its error.
  void exchange_keeping_failures(Lease& lease, std::vector<Call>& calls);

  // Requests whose answers are read later, for the updates of a backward pass and lookups of several
  // tables: they then cross the network together, not a round trip each. build(lease) makes the
  // calls on the session's lease for answers owed (it may exchange on it: that reads the answers
  // owed first); they are sent now, after the ones sent before them, on one connection per shard, so
  // a shard applies them in the order sent. Every exchange of this session reads the answers owed
  // before it sends, so each request still sees the ones sent before it. A failure among them is
  // kept for `owner` (the table that sent them), whichever thread read it: read_answers_owed(owner)
  // throws it. on_answer(call, k), if given, runs as each call's answer is read (an exception it
  // throws counts as the call's error).
  void send_answer_later(const void* owner, const std::function<std::vector<Call>(Lease&)>& build,
                         std::function<void(const Call& call, size_t k)> on_answer = {});
  // The owner to send a table's updates for: the table, whose wait_for_answers (at the end of the
  // backward pass) throws their failure; or, with overlap_updates, the session itself, so that the
  // pass need not wait for them: the shards apply them while the step goes on, and the session's next
  // request (an exchange, send_answer_later or read_answers_owed, from any thread) reads their answers
  // before it sends and throws a failure among them instead of sending.
  const void* updates_owner(const void* table) const { return overlap_updates_ ? this : table; }
  // Reads every answer owed, gives the lease's connections back, and throws the first failure kept
  // for `owner` (saying how many more of its requests failed), after any of an overlapped update.
  // read_answers_owed(nullptr) throws only the latter: torch.recdev.synchronize().
  void read_answers_owed(const void* owner);
  // For an owner that goes away: its failures are dropped, and those of its requests still owed
  // will be too (no later owner at the same address gets them).
  void forget_owner(const void* owner);

  template <class Response, class Request>
  Response call(Lease& lease, size_t shard, Opcode opcode, const Request& request) {
    std::vector<Call> calls;
    calls.push_back(make_call(shard, opcode, request));
    exchange(lease, calls);
    return answer_of<Response>(calls[0]);
  }

 private:
  struct Link {
    std::string address;
    HostPort host_port;
    std::mutex mutex;  // guards the fields below
    uint64_t session_id = 0;
    uint64_t epoch = 0;
    std::vector<std::unique_ptr<ShardConnection>> idle;
    std::mutex connect_mutex;  // one HELLO at a time per shard, so a lost session is replaced once
    double lease_seconds = 0;
  };

  std::unique_ptr<ShardConnection> acquire(size_t shard);
  void release(size_t shard, std::unique_ptr<ShardConnection> connection);
  std::unique_ptr<ShardConnection> open(size_t shard, double timeout_seconds);
  // Reads the answers owed, then (raising_failures_kept: after throwing an overlapped update's
  // failure kept, if any) exchanges calls.
  void exchange_after_answers_owed(Lease& lease, std::vector<Call>& calls, double timeout_seconds,
                                   const std::function<void(size_t call)>& on_answer, bool raising_failures_kept);
  void exchange_on(const std::vector<ShardConnection*>& connections, std::vector<Call>& calls, double timeout_seconds,
                   const std::function<void(size_t call)>& on_answer = {});
  void heartbeat();
  void refuse_changes_if_read_only(const std::vector<Call>& calls) const;
  std::vector<ShardConnection*> connections_for(Lease& lease, const std::vector<Call>& calls) const;
  // Runs every batch sent with its answer owed to its end, in the order sent, keeping each failure
  // for the batch's owner; keeps the lease. Under answers_owed_mutex_.
  void finish_batches_owed();
  // A forked child (a DataLoader worker) inherits its parent's requests owed and failures kept: they
  // are the parent's to read, on the parent's sockets, and to raise, so the child forgets them. Under
  // answers_owed_mutex_.
  void forget_answers_of_parent();
  // The heartbeat's part in overlapped updates: answers owed since the beat before with no request
  // since are read, and their connections go back to the pools. Held out of them, those connections
  // would get no ping, so the server's idle timeout and the session's lease would run out on them
  // during a long pause between steps (an evaluation, a barrier). Skipped while a request holds
  // answers_owed_mutex_.
  void read_answers_left_owed();
  // Throws (and forgets) the failures kept for `owner`, if any; `context` says what they were. Under
  // answers_owed_mutex_.
  void throw_failures_kept(const void* owner, const std::string& context);

  const std::vector<std::string> servers_;
  const std::string token_;
  const double timeout_seconds_;
  const bool read_only_;
  const bool overlap_updates_;
  const pid_t pid_ = this_process();  // the process whose connections the pools hold
  std::vector<std::unique_ptr<Link>> links_;

  // The requests sent by send_answer_later whose answers are not read yet, in the order sent, with
  // the lease whose connections carry them. Recursive: building a batch may exchange on that lease,
  // and an exchange first reads the answers owed.
  struct BatchOwed {
    const void* owner;
    std::vector<Call> calls;
    std::unique_ptr<Exchange> exchange;
  };
  struct FailuresKept {
    std::exception_ptr first;
    size_t count = 0;
  };
  std::recursive_mutex answers_owed_mutex_;
  std::unique_ptr<Lease> owed_lease_;
  bool building_owed_ = false;  // send_answer_later's build is running: owed_lease_ is in use
  std::vector<std::unique_ptr<BatchOwed>> batches_owed_;
  std::unordered_map<const void*, FailuresKept> failures_kept_;  // by owner, until it reads them
  uint64_t batches_sent_ = 0;                                    // by send_answer_later
  uint64_t batches_seen_by_heartbeat_ = 0;                       // batches_sent_ at its last beat
  pid_t answers_owed_pid_ = this_process();                      // the process they belong to

  std::mutex heartbeat_mutex_;
  std::condition_variable heartbeat_wake_;
  bool stopping_ = false;
  std::thread heartbeat_thread_;
};

}  // namespace recdev::net
