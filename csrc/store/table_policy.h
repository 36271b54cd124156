// TablePolicy: bounded memory for unbounded ids — a table's budget (max_rows / max_bytes), which rows
// go when it is reached (evict: lru, lfu, ttl) and which rows are let in at all (admit_after).
// This file holds the bookkeeping only; Table (table.h) runs it around each request.
//
// Design
// - The policy tracks every materialized row of its table (id -> touch metadata) and decides, for one
//   request at a time, under the table's policy lock which Table holds from the request's first row
//   to its last: which rows of the request are stored (resident or admitted now), which new rows to
//   materialize, and which rows to evict first. Table then erases the victims and materializes the
//   admitted rows under their sub-shard write locks, and runs the request itself; rows the request
//   does not store (pending admission) read as their init value and drop their updates. Requests on
//   a table with a policy are therefore serialized (each still uses several threads), which is what
//   makes victims deterministic and keeps the budget after every request; a row is only erased under
//   its sub-shard write lock, so no reader sees a torn row, and no request's rows are evicted while it
//   runs.
// - Touches: gather and gather_pooled (lookups), update and update_pooled, write and write_bytes.
//   Each distinct row counts once per request, in first-occurrence order. peek, read_bytes, exists and
//   gather_state are not touches (they do not materialize).
// - Clock: a step is one update (or update_pooled) request of the table; ttl in steps and lfu's
//   half-life count those. Every touch also gets a tick (a counter over all touches), which orders
//   rows by recency.
// - lru: victims in order of their last touch's tick, oldest first.
//   lfu: victims by lowest decayed touch count, ties by oldest tick. A count halves every half_life
//   steps; kept as key = log2(count at last touch) + step / half_life, which orders rows by their
//   current decayed count without revisiting them (decay multiplies every count by the same factor).
//   A touch at step t sets key = log2(2^(key - t/half_life) + 1) + t/half_life (a new row: t/half_life).
//   ttl: rows whose last touch is more than ttl steps (or seconds) old are evicted at the start of
//   every request, oldest first; they are the front of the recency order, so nothing is scanned.
//   Under a budget, ttl evicts in lru order.
// - Budget: with max_bytes, max_rows is max_bytes / row_cost where row_cost = the record (weight and
//   optimizer state) + kRowOverheadBytes (index and touch metadata); table_stats()["bytes"] reports
//   exactly what is held. A request whose distinct stored rows exceed the budget is refused
//   (StoreError(InvalidArgument)), nothing applied; a budget without evict refuses (StoreError(Full))
//   the request that would pass it, nothing applied. The victims are never rows of the request itself.
// - Admission (admit_after = k > 1): a lookup of a row that is not materialized counts it in a
//   count-min sketch (frequency_sketch.h); at the k-th such lookup the row is materialized. An update
//   never admits (in training, each lookup is followed by the update of the same rows: counting both
//   would admit at half the count); write and write_bytes admit at once (an explicit assignment).
// - Accounting: the metadata containers allocate through a counting allocator, so bytes() is the
//   exact number of bytes they asked for, plus the sketch.
//
// Not thread-safe: Table calls it under its policy lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "frequency_sketch.h"

namespace recdev::store {

enum class EvictKind : uint8_t { None = 0, Lru = 1, Lfu = 2, Ttl = 3 };

struct TablePolicyConfig {
  uint64_t max_rows = 0;   // 0: no row budget
  uint64_t max_bytes = 0;  // 0: no byte budget
  EvictKind evict = EvictKind::None;
  double half_life = 1000;  // lfu: steps for a touch count to halve
  uint64_t ttl_steps = 0;   // ttl: evict rows not touched for this many steps, or
  double ttl_seconds = 0;   // this many seconds (exactly one of the two with evict = ttl)
  uint32_t admit_after = 1; // a row is materialized at its admit_after-th lookup
  uint32_t sketch_width = 1u << 16;

  // Whether the table needs a policy at all.
  bool active() const { return max_rows != 0 || max_bytes != 0 || evict != EvictKind::None || admit_after > 1; }
};

bool operator==(const TablePolicyConfig& lhs, const TablePolicyConfig& rhs);
std::string evict_name(EvictKind kind);
std::string describe(const TablePolicyConfig& config);
// Throws StoreError(InvalidArgument) naming what is wrong and what to do.
void validate_policy(const TablePolicyConfig& config);

enum class Touch { Lookup, Update, Write };

// What a request does, decided by TablePolicy::apply.
struct PolicyDecision {
  std::vector<uint64_t> victims;   // rows to erase first, in eviction order
  std::vector<uint64_t> admitted;  // rows to materialize with their init value
  std::vector<uint8_t> stored;     // per position of the request: 1 if its row is materialized
  bool all_stored = true;
};

struct PolicyStats {
  uint64_t evicted = 0;   // rows evicted since the policy was set
  uint64_t admitted = 0;  // rows materialized through the policy since it was set
  uint64_t pending = 0;   // touches of rows not admitted (their reads gave the init value)
  uint64_t bytes = 0;     // touch metadata and sketch
};

// One row's touch metadata, as checkpoints record it.
struct RowTouch {
  uint64_t id;
  uint64_t tick;
  uint64_t step;
  double time;   // seconds since the last touch (ttl in seconds)
  double score;  // lfu key (see above)
};

class TablePolicy {
 public:
  // Extra bytes per row counted against max_bytes besides its record (index bucket and id, touch
  // metadata): an estimate, see the design notes.
  static constexpr uint64_t kRowOverheadBytes = 128;

  TablePolicy(const TablePolicyConfig& config, uint64_t record_bytes);
  TablePolicy(const TablePolicy&) = delete;
  TablePolicy& operator=(const TablePolicy&) = delete;

  const TablePolicyConfig& config() const { return config_; }
  // A new config, keeping the rows' metadata (and the sketch if its width stays).
  void reconfigure(const TablePolicyConfig& config);
  void set_record_bytes(uint64_t record_bytes) { record_bytes_ = record_bytes; }
  // The row budget in force (max_rows and max_bytes combined), or UINT64_MAX.
  uint64_t row_budget() const;
  uint64_t rows() const { return rows_.size(); }

  // Records one request's touches and decides it (see PolicyDecision). Throws StoreError with
  // nothing changed when the request cannot be served within the budget. now: steady-clock seconds.
  PolicyDecision apply(const uint64_t* ids, size_t n, Touch touch, double now);
  // Rows materialized outside a request (the rows a table held when the policy was set, or that a
  // checkpoint installed), touched in the given order.
  void adopt(const std::vector<uint64_t>& ids, double now);
  // The victims that bring the rows within the budget (and past ttl) now; StoreError(Full) without
  // evict. Removes them from the policy.
  std::vector<uint64_t> enforce(double now);
  void forget(const uint64_t* ids, size_t n);  // rows erased by the user
  void clear();                                // every row dropped (set_init)

  PolicyStats stats() const;

  // Checkpoints: every row's touch metadata (in eviction order, time as the age at `now`), the clocks
  // and counters, the sketch.
  std::vector<RowTouch> touches(double now) const;
  struct Clocks {
    uint64_t tick, step, evicted, admitted, pending;
  };
  Clocks clocks() const { return {tick_, step_, evicted_, admitted_, pending_}; }
  const FrequencySketch* sketch() const { return sketch_.get(); }
  // Replaces the metadata (after the table's rows were replaced by the same rows); times are ages, as
  // touches() gives them.
  void restore(const std::vector<RowTouch>& touches, const Clocks& clocks, const std::vector<uint16_t>* sketch,
               uint64_t sketch_since_aging, double now);

 private:
  struct Meta {
    uint64_t tick;
    uint64_t step;
    double time;
    double score;
    // lru and ttl: the recency list, oldest first (map nodes do not move).
    std::pair<const uint64_t, Meta>* older = nullptr;
    std::pair<const uint64_t, Meta>* newer = nullptr;
  };
  using Node = std::pair<const uint64_t, Meta>;
  struct Key {
    double score;
    uint64_t tick;
    uint64_t id;
    bool operator<(const Key& other) const {
      return score != other.score ? score < other.score : tick < other.tick;
    }
  };
  template <class T>
  struct Counting {
    using value_type = T;
    uint64_t* bytes;
    explicit Counting(uint64_t* counter) : bytes(counter) {}
    template <class U>
    Counting(const Counting<U>& other) : bytes(other.bytes) {}
    T* allocate(size_t n) {
      *bytes += n * sizeof(T);
      return std::allocator<T>().allocate(n);
    }
    void deallocate(T* p, size_t n) {
      *bytes -= n * sizeof(T);
      std::allocator<T>().deallocate(p, n);
    }
    template <class U>
    bool operator==(const Counting<U>& other) const { return bytes == other.bytes; }
    template <class U>
    bool operator!=(const Counting<U>& other) const { return bytes != other.bytes; }
  };

  Key key_of(uint64_t id, const Meta& meta) const { return Key{meta.score, meta.tick, id}; }
  // lru and ttl order rows by a list (a touch moves its row to the end in O(1)); lfu by the set of keys.
  bool uses_list() const { return config_.evict != EvictKind::Lfu; }
  void link(Node* node);    // into the order
  void unlink(Node* node);  // out of it
  void relink_all();        // after the kind of order changed
  // The rows in eviction order: fn(id, meta) until it returns false.
  template <class Fn>
  void walk(Fn fn) const;
  double touched_score(const Meta* old) const;
  bool expired(const Meta& meta, double now) const;
  void touch(uint64_t id, uint64_t tick, double now);
  void remove(uint64_t id);

  TablePolicyConfig config_;
  uint64_t record_bytes_;
  // Declared before the containers, which count into it.
  std::unique_ptr<uint64_t> metadata_bytes_ = std::make_unique<uint64_t>(0);
  std::unordered_map<uint64_t, Meta, std::hash<uint64_t>, std::equal_to<uint64_t>,
                     Counting<std::pair<const uint64_t, Meta>>>
      rows_{0, std::hash<uint64_t>(), std::equal_to<uint64_t>(),
            Counting<std::pair<const uint64_t, Meta>>(metadata_bytes_.get())};
  std::set<Key, std::less<Key>, Counting<Key>> order_{std::less<Key>(), Counting<Key>(metadata_bytes_.get())};
  Node* oldest_ = nullptr;
  Node* newest_ = nullptr;
  std::unique_ptr<FrequencySketch> sketch_;  // with admit_after > 1
  uint64_t tick_ = 0;
  uint64_t step_ = 0;
  uint64_t evicted_ = 0;
  uint64_t admitted_ = 0;
  uint64_t pending_ = 0;
};

}  // namespace recdev::store
