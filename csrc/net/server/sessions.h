// Client sessions of a server: what each owns (anonymous tables, staged checkpoint loads, dump
// snapshots) and its lease. A session lapses when it has had no open connection and no request for
// the lease; the server then frees what it owned (docs/protocol.md, "Sessions and leases").
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "net/wire/protocol.h"
#include "net/wire/socket.h"
#include "store/table.h"

namespace recdev::net {

// Rows of a checkpoint being loaded (BEGIN_LOAD ... COMMIT_LOAD), off to the side of the store.
struct StagedLoad {
  BeginLoadRequest header;
  uint64_t route_key = 0;  // of the target table: which rows this shard may take
  std::string label;       // the target, for errors
  std::unique_ptr<store::RowSet> rows;
  uint64_t row_count = 0;
  uint64_t bytes = 0;                             // estimated memory held, counted against --max-memory
  std::optional<store::TablePolicyState> policy;  // header.policy_state, decoded
};

// A point-in-time copy of a table's materialized rows, read out by DUMP a batch at a time.
struct DumpSnapshot {
  uint64_t table_id = 0;
  TableDescription table;
  uint32_t record_words = 0;
  std::vector<uint64_t> ids;
  std::vector<float> records;
  size_t next = 0;  // the first row not yet sent
  // A cut of a change chain (DUMP with a chain): whether it is whole, the rows dropped since and
  // the first of them not yet sent, and the policy state the first response carries.
  bool whole = true;
  std::vector<uint64_t> erased;
  size_t next_erased = 0;
  std::vector<uint8_t> policy_state;
  uint64_t bytes() const {
    return (ids.size() + erased.size()) * sizeof(uint64_t) + records.size() * sizeof(float) + policy_state.size();
  }
};

// Shared by its connections and Sessions; weakly by the synchronous steps it staged parts of
// (StagedSteps: a step waits for a rank's commit while that rank's session lives).
struct Session : std::enable_shared_from_this<Session> {
  explicit Session(uint64_t id) : id(id) {}
  const uint64_t id;

  // Guards everything below; held by one request of the session at a time (never with a store lock).
  std::mutex mutex;
  std::set<uint64_t> tables;  // anonymous tables created in this session
  std::map<uint64_t, StagedLoad> loads;
  std::map<uint64_t, DumpSnapshot> snapshots;

  // Held by Sessions' mutex.
  int connections = 0;
  Clock::time_point last_active;
};

class Sessions {
 public:
  explicit Sessions(double lease_seconds);

  double lease_seconds() const { return lease_seconds_; }
  // session_id 0 starts a new session; another joins that live session (StoreError(NotFound) if it
  // lapsed or never existed). The caller calls detach() when its connection closes.
  std::shared_ptr<Session> attach(uint64_t session_id);
  void detach(Session& session);
  void touch(Session& session);
  // Removes and returns the sessions whose lease lapsed.
  std::vector<std::shared_ptr<Session>> take_lapsed();
  size_t size() const;
  // A fresh id for a load or a snapshot (never 0).
  uint64_t next_object_id() { return next_object_id_.fetch_add(1); }

 private:
  const double lease_seconds_;
  mutable std::mutex mutex_;
  std::map<uint64_t, std::shared_ptr<Session>> sessions_;
  std::mt19937_64 random_;
  std::atomic<uint64_t> next_object_id_{1};
};

}  // namespace recdev::net
