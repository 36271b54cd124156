// TablePolicy: bounded memory for unbounded ids — a table's budget (max_rows / max_bytes), which rows
// go when it is reached (evict: lru, lfu, ttl) and which rows are let in at all (admit_after).
// This file holds the bookkeeping only; Table (table.h) runs it around each request.
//
// Design
// - With evict, the policy tracks every materialized row of its table (id -> touch metadata) and decides, for one
//   request at a time, under the table's policy lock which Table holds from the request's first row
//   to its last: which rows of the request are stored (resident or admitted now), which new rows to
//   materialize, and which rows to evict first. Table then gives the admitted rows their records
//   (a victim's of the same sub-shard where there is one: Table::evict_and_admit) under their sub-shard
//   write locks, and runs the request itself; rows the request
//   does not store (pending admission) read as their init value and drop their updates. Requests on
//   a table with a policy are therefore serialized (each still uses several threads), which is what
//   makes victims deterministic and keeps the budget after every request; a row is only erased under
//   its sub-shard write lock, so no reader sees a torn row, and no request's rows are evicted while it
//   runs.
// - Without evict (admission alone, or a budget that refuses) no row is ever a victim, so no touch
//   metadata is kept at all: the policy asks the table which rows it holds (HeldRows) and how many.
//   Admission then costs the sketch and nothing per row, which is what makes it save memory.
//   Setting evict later adopts the rows held, in id order, as set_policy does for a new policy.
// - Touches: gather and gather_pooled (lookups), update and update_pooled, write and write_bytes.
//   Each distinct row counts once per request, in first-occurrence order. Under lru, an update of
//   exactly the ids the request before it looked up (and stored: training's backward after its
//   forward) touches nothing: touching the same rows again in the same order leaves the recency
//   order as it was, and lru reads nothing else of a touch. It saves a pass over the metadata per
//   step; the rows keep their lookup's step, which only a later change to ttl in steps would see. peek, read_bytes, exists and
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
// - Cost: O(distinct ids) per request, each a probe of one flat array (id -> metadata) prefetched a few
//   rows ahead, and for lru/ttl an append to the touch log (the recency order, kept lazily: see
//   Entry); a victim costs a log entry read and a probe. No allocation per row. Without evict no order
//   is kept at all.
// - Admission sketch size: sketch_width 0 (the default) sizes it from the budget when the policy is
//   set: auto_sketch_width below.
// - Accounting: the metadata containers allocate through a counting allocator, so bytes() is the
//   exact number of bytes they asked for, plus the sketch.
//
// Not thread-safe: Table calls it under its policy lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "flat_id_map.h"
#include "frequency_sketch.h"
#include "mix64.h"
#include "table_policy_config.h"

namespace recdev::store {

// The sketch width for a table of that row budget (UINT64_MAX: none): the power of two at or above
// twice the budget, within [kMinAutoSketchWidth, kMaxAutoSketchWidth]; kNoBudgetSketchWidth without a
// budget. At admit_after=2 the sketch takes 1 byte per column (FrequencySketch packs 2-bit counters):
// from 1 KiB up to 4 MiB, about 2 bytes per row of the budget.
constexpr uint32_t kMinAutoSketchWidth = 1u << 10;
constexpr uint32_t kMaxAutoSketchWidth = 1u << 22;
constexpr uint32_t kNoBudgetSketchWidth = 1u << 14;
uint32_t auto_sketch_width(uint64_t row_budget);

// The table's rows, as a policy that keeps no touch metadata sees them (evict none). Called under the
// table's policy lock, when only requests holding it add or erase rows.
struct HeldRows {
  std::function<void(const uint64_t* ids, size_t n, uint8_t* held)> contains;
  std::function<uint64_t()> count;
  // With spill: whether a row is in the disk tier, asked of every distinct row of a request that is
  // not held. Such a row was admitted before: any touch brings it back (Status::Admit) without asking
  // the sketch.
  std::function<bool(uint64_t id)> on_disk;
};

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
  // A new config, keeping the rows' metadata (and the sketch if its width stays). A sketch_width of 0
  // becomes auto_sketch_width of the new budget. A config without evict drops the metadata; one that
  // sets evict where there was none leaves the rows held to adopt(). A config without evict whose
  // budget the rows held pass is refused (StoreError(Full)) with nothing changed.
  void reconfigure(const TablePolicyConfig& config, const HeldRows& held);
  void set_record_bytes(uint64_t record_bytes) { record_bytes_ = record_bytes; }
  // The row budget in force (max_rows and max_bytes combined), or UINT64_MAX.
  uint64_t row_budget() const { return budget_of(config_, record_bytes_); }
  // Whether rows carry touch metadata: only an evict policy needs it (see the design notes).
  bool keeps_touches() const { return config_.evict != EvictKind::None; }

  // Records one request's touches and decides it (see PolicyDecision). Throws StoreError with
  // nothing changed when the request cannot be served within the budget. now: steady-clock seconds.
  // before_changes runs once the request is known to fit and before anything changes; if it throws,
  // nothing changes either (the table reads a request's rows back from disk there).
  PolicyDecision apply(const uint64_t* ids, size_t n, Touch touch, double now, const HeldRows& held,
                       const std::function<void()>& before_changes = {});
  // Throws what apply would throw for this request now, and changes nothing either way: a table split
  // over shards asks every shard before any applies its part (RemoteTable, CHECK_POLICY).
  void check(const uint64_t* ids, size_t n, Touch touch, double now, const HeldRows& held);
  // Throws what apply would throw for an update of these rows (nothing changes either way), judged
  // so that it holds whatever other requests do before that update: more distinct rows than the
  // budget; without evict, more new rows than the budget leaves beside the rows held now. A
  // synchronous step checks this when staged, so that no shard refuses it after another applied it.
  void check_update_fits(const uint64_t* ids, size_t n, const HeldRows& held) const;
  // Rows materialized outside a request (the rows a table held when the policy was set, or that a
  // checkpoint installed), touched in the given order; nothing without touch metadata.
  void adopt(const std::vector<uint64_t>& ids, double now);
  // The victims that bring the rows within the budget (and past ttl) now; StoreError(Full) without
  // evict. Removes them from the policy.
  std::vector<uint64_t> enforce(double now, const HeldRows& held);
  void forget(const uint64_t* ids, size_t n);  // rows erased by the user
  void clear();                                // every row dropped (set_init)

  PolicyStats stats() const;

  // Checkpoints: every row's touch metadata (in eviction order, time as the age at `now`), the clocks
  // and counters, the sketch.
  std::vector<RowTouch> touches(double now) const;
  // The touch metadata of those of `ids` (distinct) that have some, in eviction order, as touches()
  // lists them: an incremental checkpoint's share of it.
  std::vector<RowTouch> touches_of(const std::vector<uint64_t>& ids, double now) const;
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
    bool operator==(const Counting<U>& other) const {
      return bytes == other.bytes;
    }
    template <class U>
    bool operator!=(const Counting<U>& other) const {
      return bytes != other.bytes;
    }
  };
  // id -> Meta, at most half full (flat_id_map.h); its slots count in bytes().
  using MetaMap = FlatIdMap<Meta, 50, Counting>;
  struct Key {
    double score;
    uint64_t tick;
    uint64_t id;
    bool operator<(const Key& other) const { return score != other.score ? score < other.score : tick < other.tick; }
  };
  // lru and ttl: the recency order is a log of touches, oldest first; a touch appends its row with its
  // new tick, which makes the row's earlier entry stale (its tick is no longer the row's). Appending
  // is all a touch costs; stale entries are skipped by walks and dropped by trim_log().
  struct Entry {
    uint64_t id;
    uint64_t tick;
  };

  static uint64_t budget_of(const TablePolicyConfig& config, uint64_t record_bytes);
  void configure(const TablePolicyConfig& config);  // reconfigure, unchecked
  // StoreError(Full) if the table holds more rows than the budget of config, which has no evict.
  void check_held_within(const TablePolicyConfig& config, const HeldRows& held) const;
  Key key_of(uint64_t id, const Meta& meta) const { return Key{meta.score, meta.tick, id}; }
  // lru and ttl order rows by the log, lfu by the set of keys; without evict nothing is ever a victim,
  // so no order is kept (a checkpoint sorts the rows by tick).
  bool uses_log() const { return config_.evict == EvictKind::Lru || config_.evict == EvictKind::Ttl; }
  bool uses_keys() const { return config_.evict == EvictKind::Lfu; }
  bool live(const Entry& entry) const {
    const Meta* meta = rows_.find(entry.id);
    return meta != nullptr && meta->tick == entry.tick;
  }
  void link(uint64_t id, const Meta& meta);  // into the order
  void relink_all();                         // after the kind of order changed
  std::vector<Key> sorted_keys() const;      // every row's key, in eviction order
  // Consumes the log's stale entries at its front, and compacts it once it holds several entries per
  // live row (amortized O(1) per touch).
  void trim_log();
  // The rows in eviction order: fn(id, meta) until it returns false.
  template <class Fn>
  void walk(Fn fn) const;
  double touched_score(const Meta* old) const;
  struct Decided;
  // apply's decision, with nothing changed but the sketch's counts and an update's step (undone if it
  // throws what apply throws).
  Decided decide(const uint64_t* ids, size_t n, Touch touch, double now, const HeldRows& held);
  // Whether ids are those of the last request, a lookup under lru that stored them all (see Touches).
  bool repeats_last_lookup(const uint64_t* ids, size_t n) const;
  bool expired(const Meta& meta, double now) const;
  void touch(uint64_t id, uint64_t tick, double now);
  void remove(uint64_t id);

  TablePolicyConfig config_;
  uint64_t record_bytes_;
  // Declared before the containers, which count into it.
  std::unique_ptr<uint64_t> metadata_bytes_ = std::make_unique<uint64_t>(0);
  MetaMap rows_{MetaMap::SlotAllocator(metadata_bytes_.get())};
  std::set<Key, std::less<Key>, Counting<Key>> order_{std::less<Key>(), Counting<Key>(metadata_bytes_.get())};
  std::vector<Entry, Counting<Entry>> log_{Counting<Entry>(metadata_bytes_.get())};
  size_t log_head_ = 0;                      // entries before it were consumed
  std::unique_ptr<FrequencySketch> sketch_;  // with admit_after > 1
  // The ids of the last request if it was a lookup under lru that stored them all; cleared by every
  // other request and change.
  std::vector<uint64_t, Counting<uint64_t>> last_lookup_{Counting<uint64_t>(metadata_bytes_.get())};
  uint64_t tick_ = 0;
  uint64_t step_ = 0;
  uint64_t evicted_ = 0;
  uint64_t admitted_ = 0;
  uint64_t pending_ = 0;
};

// A table's policy with the rows' touch metadata, its clocks and sketch, as checkpoints record it
// (Table::policy_state).
struct TablePolicyState {
  TablePolicyConfig config;
  std::vector<RowTouch> touches;
  TablePolicy::Clocks clocks;
  std::vector<uint16_t> sketch;
  uint64_t sketch_since_aging;
};

}  // namespace recdev::store
