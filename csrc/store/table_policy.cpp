#include "table_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "errors.h"
#include "mix64.h"

namespace recdev::store {
namespace {

constexpr uint64_t kNoBudget = std::numeric_limits<uint64_t>::max();
// Rows ahead whose metadata slot a batch loop prefetches: enough to overlap the misses of a large map.
constexpr size_t kPrefetchAhead = 8;
// The log is compacted once it holds kLogPerRow entries per live row (and kLogSlack more): each
// compaction checks every entry, so a larger factor checks fewer per touch, at 16 bytes an entry.
constexpr size_t kLogPerRow = 4;
constexpr size_t kLogSlack = 1024;

enum class Status : uint8_t { Resident, Admit, Pending };

// A request's distinct ids: an open-addressing set from id to its first position among them, without
// an allocation per id (a batch has tens of thousands). An id and its position share a cell, so a
// probe costs one cache miss.
class DistinctIds {
 public:
  explicit DistinctIds(size_t n) {
    size_t capacity = 16;
    while (capacity < 2 * n) capacity *= 2;
    cells_.assign(capacity, Cell{kEmpty, 0});
    mask_ = capacity - 1;
  }
  // {slot of id, whether it is new}; a new id gets slot `next`.
  std::pair<uint32_t, bool> insert(uint64_t id, uint32_t next) {
    for (size_t i = mix64(id) & mask_;; i = (i + 1) & mask_) {
      Cell& cell = cells_[i];
      if (cell.id == id) return {cell.slot, false};
      if (cell.id == kEmpty) {
        cell = Cell{id, next};
        return {next, true};
      }
    }
  }
  void prefetch(uint64_t id) const { __builtin_prefetch(&cells_[mix64(id) & mask_]); }

 private:
  // No row id is UINT64_MAX: num_rows is at most UINT64_MAX, so ids are below it.
  static constexpr uint64_t kEmpty = std::numeric_limits<uint64_t>::max();
  struct Cell {
    uint64_t id;
    uint32_t slot;
  };
  std::vector<Cell> cells_;
  size_t mask_;
};

}  // namespace

TablePolicy::TablePolicy(const TablePolicyConfig& config, uint64_t record_bytes) : record_bytes_(record_bytes) {
  configure(config);
}

void TablePolicy::check_held_within(const TablePolicyConfig& config, const HeldRows& held) const {
  const uint64_t budget = budget_of(config, record_bytes_);
  if (budget == kNoBudget) return;
  const uint64_t rows_held = held.count();
  if (rows_held <= budget) return;
  throw StoreError(ErrorCode::Full, "the table holds " + std::to_string(rows_held) + " rows, more than the budget of " +
                                        std::to_string(budget) + " rows (" + describe(config) +
                                        "), and has no evict policy: set evict='lru', 'lfu' or 'ttl', or raise the "
                                        "budget");
}

void TablePolicy::reconfigure(const TablePolicyConfig& config, const HeldRows& held) {
  validate_policy(config);
  // Refused before anything changes: without evict the rows' metadata is dropped, and could not be
  // brought back if the budget then refused.
  if (config.evict == EvictKind::None) check_held_within(config, held);
  configure(config);
}

uint32_t auto_sketch_width(uint64_t row_budget) {
  if (row_budget == kNoBudget) return kNoBudgetSketchWidth;
  uint32_t width = kMinAutoSketchWidth;
  while (width < kMaxAutoSketchWidth && width / 2 < row_budget) width *= 2;
  return width;
}

void TablePolicy::configure(const TablePolicyConfig& requested) {
  last_lookup_.clear();
  validate_policy(requested);
  TablePolicyConfig config = requested;
  if (config.admit_after > 1 && config.sketch_width == 0) {
    config.sketch_width = auto_sketch_width(budget_of(config, record_bytes_));
  }
  const bool rescore = config.evict != config_.evict || config.half_life != config_.half_life;
  if (config.admit_after <= 1) {
    sketch_.reset();
  } else if (!sketch_ || sketch_->width() != config.sketch_width) {
    sketch_ = std::make_unique<FrequencySketch>(config.sketch_width, config.admit_after);
  } else if (FrequencySketch::bytes_for(config.sketch_width, config.admit_after) != sketch_->bytes()) {
    // Counters of another width for the new admit_after; the counts carry over (capped).
    auto repacked = std::make_unique<FrequencySketch>(config.sketch_width, config.admit_after);
    repacked->restore(sketch_->counters(), sketch_->since_aging());
    sketch_ = std::move(repacked);
  }
  config_ = config;
  if (!keeps_touches()) {
    clear();
    return;
  }
  if (rescore && rows_.size() != 0) {
    // The order's keys depend on the kind: one touch count per row at its last step.
    rows_.for_each([&](uint64_t, Meta& meta) {
      meta.score = config_.evict == EvictKind::Lfu ? double(meta.step) / config_.half_life : 0.0;
    });
    relink_all();
  }
}

void TablePolicy::link(uint64_t id, const Meta& meta) {
  if (uses_log()) {
    log_.push_back(Entry{id, meta.tick});
  } else if (uses_keys()) {
    order_.insert(key_of(id, meta));
  }
}

void TablePolicy::trim_log() {
  while (log_head_ < log_.size() && !live(log_[log_head_])) ++log_head_;
  if (log_.size() <= kLogPerRow * rows_.size() + kLogSlack) return;
  size_t kept = 0;
  for (size_t i = log_head_; i < log_.size(); ++i) {
    if (i + kPrefetchAhead < log_.size()) rows_.prefetch(log_[i + kPrefetchAhead].id);
    if (live(log_[i])) log_[kept++] = log_[i];
  }
  log_.resize(kept);
  log_head_ = 0;
}

std::vector<TablePolicy::Key> TablePolicy::sorted_keys() const {
  std::vector<Key> keys;
  keys.reserve(rows_.size());
  rows_.for_each([&](uint64_t id, const Meta& meta) { keys.push_back(key_of(id, meta)); });
  std::sort(keys.begin(), keys.end());
  return keys;
}

void TablePolicy::relink_all() {
  const std::vector<Key> keys = sorted_keys();
  order_.clear();
  log_.clear();
  log_head_ = 0;
  for (const Key& key : keys) link(key.id, *rows_.find(key.id));
}

template <class Fn>
void TablePolicy::walk(Fn fn) const {
  if (uses_log()) {
    for (size_t i = log_head_; i < log_.size(); ++i) {
      if (i + kPrefetchAhead < log_.size()) rows_.prefetch(log_[i + kPrefetchAhead].id);
      const Meta* meta = rows_.find(log_[i].id);
      if (meta == nullptr || meta->tick != log_[i].tick) continue;  // stale
      if (!fn(log_[i].id, *meta)) return;
    }
    return;
  }
  if (uses_keys()) {
    for (const Key& key : order_) {
      if (!fn(key.id, *rows_.find(key.id))) return;
    }
    return;
  }
  for (const Key& key : sorted_keys()) {
    if (!fn(key.id, *rows_.find(key.id))) return;
  }
}

uint64_t TablePolicy::budget_of(const TablePolicyConfig& config, uint64_t record_bytes) {
  uint64_t budget = config.max_rows != 0 ? config.max_rows : kNoBudget;
  if (config.max_bytes != 0) budget = std::min(budget, config.max_bytes / (record_bytes + kRowOverheadBytes));
  return budget;
}

double TablePolicy::touched_score(const Meta* old) const {
  if (config_.evict != EvictKind::Lfu) return 0.0;
  const double now = double(step_) / config_.half_life;
  if (old == nullptr) return now;
  return std::log2(std::pow(2.0, old->score - now) + 1.0) + now;
}

bool TablePolicy::expired(const Meta& meta, double now) const {
  if (config_.evict != EvictKind::Ttl) return false;
  if (config_.ttl_steps != 0) return step_ - meta.step > config_.ttl_steps;
  return now - meta.time > config_.ttl_seconds;
}

void TablePolicy::touch(uint64_t id, uint64_t tick, double now) {
  const auto [meta, created] = rows_.find_or_insert(id);
  if (!created && uses_keys()) order_.erase(key_of(id, *meta));
  *meta = Meta{tick, step_, now, touched_score(created ? nullptr : meta)};
  link(id, *meta);
}

void TablePolicy::remove(uint64_t id) {
  const Meta* meta = rows_.find(id);
  if (meta == nullptr) return;
  if (uses_keys()) order_.erase(key_of(id, *meta));
  rows_.erase(id);  // its log entry, if any, is stale from now on
}

void TablePolicy::check_update_fits(const uint64_t* ids, size_t n, const HeldRows& held) const {
  const uint64_t budget = row_budget();
  if (budget == kNoBudget) return;
  std::vector<uint64_t> distinct(ids, ids + n);
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  // Every distinct row may be stored by then (rows pending admission may have been admitted).
  if (distinct.size() > budget) {
    throw StoreError(ErrorCode::InvalidArgument,
                     "an update touching " + std::to_string(distinct.size()) +
                         " distinct rows cannot fit the budget of " + std::to_string(budget) + " rows (" +
                         describe(config_) + "): split the batch, or raise max_rows / max_bytes; nothing was applied");
  }
  if (config_.evict != EvictKind::None) return;
  std::vector<uint8_t> resident(distinct.size());
  held.contains(distinct.data(), distinct.size(), resident.data());
  const uint64_t new_rows = uint64_t(std::count(resident.begin(), resident.end(), uint8_t{0}));
  const uint64_t rows_held = held.count();
  if (rows_held + new_rows > budget) {
    throw StoreError(ErrorCode::Full, "the update would materialize up to " + std::to_string(new_rows) +
                                          " rows beyond the " + std::to_string(rows_held) +
                                          " held, past the budget of " + std::to_string(budget) + " rows (" +
                                          describe(config_) +
                                          "), and the table has no evict policy: set evict='lru', 'lfu' or 'ttl', or "
                                          "raise the budget; nothing was applied");
  }
}

// A request's decision before anything changes but the sketch (its counts are in sketch_cells) and
// the step (an update's, already counted): apply carries it out, check undoes it.
struct TablePolicy::Decided {
  std::vector<uint64_t> distinct;    // the request's distinct rows in first-occurrence order
  std::vector<Status> status;        // per distinct row: resident, admitted now, or pending
  std::vector<Meta*> resident_meta;  // valid until a row is removed
  std::vector<uint32_t> sketch_cells;
  uint64_t new_count = 0;
  uint64_t increments = 0;
  PolicyDecision decision;  // its `stored` filled in
};

TablePolicy::Decided TablePolicy::decide(const uint64_t* ids, size_t n, Touch touch_kind, double now,
                                         const HeldRows& held) {
  const uint64_t saved_step = step_;
  if (touch_kind == Touch::Update) ++step_;  // undone below if the request is refused
  Decided d;
  // The request's distinct rows in first-occurrence order, each resident, admitted now or pending.
  DistinctIds index_of(n);
  std::vector<uint32_t> slot_of(n);
  for (size_t i = 0; i < n; ++i) {
    if (i + kPrefetchAhead < n) index_of.prefetch(ids[i + kPrefetchAhead]);
    const auto [slot, created] = index_of.insert(ids[i], uint32_t(d.distinct.size()));
    if (created) d.distinct.push_back(ids[i]);
    slot_of[i] = slot;
  }
  const std::vector<uint64_t>& distinct = d.distinct;
  d.status.resize(distinct.size());
  std::vector<uint8_t> held_by_table;  // without touch metadata: which rows the table holds
  if (!keeps_touches()) {
    held_by_table.resize(distinct.size());
    held.contains(distinct.data(), distinct.size(), held_by_table.data());
  }
  uint64_t stored_count = 0;
  d.resident_meta.resize(keeps_touches() ? distinct.size() : 0);
  for (size_t k = 0; k < distinct.size(); ++k) {
    if (k + kPrefetchAhead < distinct.size()) rows_.prefetch(distinct[k + kPrefetchAhead]);
    const uint64_t id = distinct[k];
    Meta* found = keeps_touches() ? rows_.find(id) : nullptr;
    Status s;
    if (keeps_touches() ? found != nullptr && !expired(*found, now) : held_by_table[k] != 0) {
      if (keeps_touches()) d.resident_meta[k] = found;
      s = Status::Resident;
    } else if ((held.on_disk && held.on_disk(id)) || config_.admit_after <= 1 || touch_kind == Touch::Write) {
      s = Status::Admit;
    } else if (touch_kind == Touch::Lookup) {
      ++d.increments;
      s = sketch_->increment(id, d.sketch_cells) >= config_.admit_after ? Status::Admit : Status::Pending;
    } else {
      s = Status::Pending;
    }
    d.status[k] = s;
    stored_count += s != Status::Pending;
    d.new_count += s == Status::Admit;
  }
  d.decision.stored.resize(n);
  for (size_t i = 0; i < n; ++i) {
    d.decision.stored[i] = d.status[slot_of[i]] != Status::Pending;
    d.decision.all_stored = d.decision.all_stored && d.decision.stored[i];
  }
  const uint64_t budget = row_budget();
  const auto refuse = [&](ErrorCode code, const std::string& message) {
    if (sketch_) sketch_->rollback(d.sketch_cells);
    step_ = saved_step;
    throw StoreError(code, message + "; nothing was applied");
  };
  if (stored_count > budget) {
    refuse(ErrorCode::InvalidArgument, "a request touching " + std::to_string(stored_count) +
                                           " distinct rows cannot fit the budget of " + std::to_string(budget) +
                                           " rows (" + describe(config_) +
                                           "): split the batch, or raise max_rows / max_bytes");
  }
  const uint64_t rows_held = keeps_touches() ? rows_.size() : budget != kNoBudget ? held.count() : 0;
  if (config_.evict == EvictKind::None && rows_held + d.new_count > budget) {
    refuse(ErrorCode::Full, "the request would materialize " + std::to_string(d.new_count) + " rows beyond the " +
                                std::to_string(rows_held) + " held, past the budget of " + std::to_string(budget) +
                                " rows (" + describe(config_) +
                                "), and the table has no evict policy: set evict='lru', 'lfu' or 'ttl', or raise "
                                "the budget");
  }
  return d;
}

void TablePolicy::check(const uint64_t* ids, size_t n, Touch touch_kind, double now, const HeldRows& held) {
  if (touch_kind == Touch::Update && repeats_last_lookup(ids, n)) return;
  const uint64_t saved_step = step_;
  const Decided d = decide(ids, n, touch_kind, now, held);  // a refusal has undone itself
  if (sketch_) sketch_->rollback(d.sketch_cells);
  step_ = saved_step;
}

PolicyDecision TablePolicy::apply(const uint64_t* ids, size_t n, Touch touch_kind, double now, const HeldRows& held,
                                  const std::function<void()>& before_changes) {
  if (touch_kind == Touch::Update && repeats_last_lookup(ids, n)) {
    ++step_;
    last_lookup_.clear();
    return PolicyDecision{};
  }
  last_lookup_.clear();
  const uint64_t step_before = step_;
  Decided decided = decide(ids, n, touch_kind, now, held);
  if (before_changes) {
    try {
      before_changes();
    } catch (...) {  // as check() leaves it
      if (sketch_) sketch_->rollback(decided.sketch_cells);
      step_ = step_before;
      throw;
    }
  }
  const std::vector<uint64_t>& distinct = decided.distinct;
  const std::vector<Status>& status = decided.status;
  const uint64_t budget = row_budget();
  const uint64_t new_count = decided.new_count;
  PolicyDecision decision = std::move(decided.decision);

  // From here on nothing throws but bad_alloc.
  // The request's stored rows get their ticks in first-occurrence order. The resident ones are
  // touched first, through the pointers found above (before any row is removed): their log entries
  // (lru, ttl) go stale and their keys (lfu) leave the order, so the walks below never meet a row of
  // the request, and each costs one probe of the map in all. They and the admitted rows join the
  // order after the victims have left it, so that the log stays in tick order.
  std::vector<uint64_t> tick_of(keeps_touches() ? distinct.size() : 0);
  if (keeps_touches()) {
    for (size_t d = 0; d < distinct.size(); ++d) {
      if (status[d] == Status::Pending) continue;
      tick_of[d] = ++tick_;
      if (Meta* meta = decided.resident_meta[d]) {
        if (uses_keys()) order_.erase(key_of(distinct[d], *meta));
        *meta = Meta{tick_of[d], step_, now, touched_score(meta)};
      }
    }
  }
  walk([&](uint64_t id, const Meta& meta) {
    if (!expired(meta, now)) return false;
    decision.victims.push_back(id);
    return true;
  });
  for (const uint64_t id : decision.victims) remove(id);
  if (budget != kNoBudget && rows_.size() + new_count > budget) {
    uint64_t excess = rows_.size() + new_count - budget;
    const size_t first_victim = decision.victims.size();
    walk([&](uint64_t id, const Meta&) {
      decision.victims.push_back(id);
      return --excess > 0;
    });
    for (size_t v = first_victim; v < decision.victims.size(); ++v) remove(decision.victims[v]);
  }
  for (size_t d = 0; d < distinct.size(); ++d) {
    if (status[d] == Status::Pending) {
      ++pending_;
      continue;
    }
    if (status[d] == Status::Admit) decision.admitted.push_back(distinct[d]);
    if (!keeps_touches()) continue;
    if (status[d] == Status::Admit) {
      link(distinct[d], rows_.insert(distinct[d], Meta{tick_of[d], step_, now, touched_score(nullptr)}));
    } else if (uses_log()) {
      log_.push_back(Entry{distinct[d], tick_of[d]});  // the row's meta is as touched above
    } else {
      link(distinct[d], *rows_.find(distinct[d]));
    }
  }
  trim_log();
  evicted_ += decision.victims.size();
  admitted_ += decision.admitted.size();
  if (sketch_) sketch_->note_increments(decided.increments);
  if (touch_kind == Touch::Lookup && config_.evict == EvictKind::Lru && decision.all_stored) {
    last_lookup_.assign(ids, ids + n);
  }
  return decision;
}

bool TablePolicy::repeats_last_lookup(const uint64_t* ids, size_t n) const {
  return n != 0 && last_lookup_.size() == n && std::equal(ids, ids + n, last_lookup_.begin());
}

void TablePolicy::adopt(const std::vector<uint64_t>& ids, double now) {
  last_lookup_.clear();
  if (!keeps_touches()) return;
  for (const uint64_t id : ids) touch(id, ++tick_, now);
}

std::vector<uint64_t> TablePolicy::enforce(double now, const HeldRows& held) {
  last_lookup_.clear();
  const uint64_t budget = row_budget();
  if (!keeps_touches()) {
    check_held_within(config_, held);
    return {};
  }
  std::vector<uint64_t> victims;
  uint64_t excess = budget != kNoBudget && rows_.size() > budget ? rows_.size() - budget : 0;
  walk([&](uint64_t id, const Meta& meta) {
    if (excess == 0 && !expired(meta, now)) return false;
    victims.push_back(id);
    if (excess > 0) --excess;
    return true;
  });
  for (const uint64_t id : victims) remove(id);
  trim_log();
  evicted_ += victims.size();
  return victims;
}

void TablePolicy::forget(const uint64_t* ids, size_t n) {
  last_lookup_.clear();
  for (size_t i = 0; i < n; ++i) remove(ids[i]);
  trim_log();
}

void TablePolicy::clear() {
  // Fresh vectors, not clear(): their memory goes too (a policy switched to no evict keeps none).
  last_lookup_ = decltype(last_lookup_)(last_lookup_.get_allocator());
  order_.clear();
  log_ = decltype(log_)(log_.get_allocator());
  log_head_ = 0;
  rows_.clear();
}

PolicyStats TablePolicy::stats() const {
  return PolicyStats{evicted_, admitted_, pending_, *metadata_bytes_ + (sketch_ ? sketch_->bytes() : 0)};
}

std::vector<RowTouch> TablePolicy::touches(double now) const {
  std::vector<RowTouch> out;
  out.reserve(rows_.size());
  walk([&](uint64_t id, const Meta& meta) {
    out.push_back(RowTouch{id, meta.tick, meta.step, now - meta.time, meta.score});
    return true;
  });
  return out;
}

std::vector<RowTouch> TablePolicy::touches_of(const std::vector<uint64_t>& ids, double now) const {
  std::vector<RowTouch> out;
  if (!keeps_touches()) return out;
  for (const uint64_t id : ids) {
    if (const Meta* meta = rows_.find(id))
      out.push_back(RowTouch{id, meta->tick, meta->step, now - meta->time, meta->score});
  }
  // A walk's order: the log's is by tick (a touch takes the next tick, and only a row's newest entry
  // is live); the keys' is theirs.
  std::sort(out.begin(), out.end(), [&](const RowTouch& a, const RowTouch& b) {
    if (uses_keys()) return Key{a.score, a.tick, a.id} < Key{b.score, b.tick, b.id};
    return a.tick < b.tick;
  });
  return out;
}

void TablePolicy::restore(const std::vector<RowTouch>& touches, const Clocks& clocks,
                          const std::vector<uint16_t>* sketch, uint64_t sketch_since_aging, double now) {
  clear();
  // Touches saved for a policy without evict (older files kept some) have nothing to order.
  if (keeps_touches()) {
    for (const RowTouch& row : touches) {
      link(row.id, rows_.insert(row.id, Meta{row.tick, row.step, now - row.time, row.score}));
    }
  }
  tick_ = clocks.tick;
  step_ = clocks.step;
  evicted_ = clocks.evicted;
  admitted_ = clocks.admitted;
  pending_ = clocks.pending;
  if (sketch_ && sketch != nullptr) sketch_->restore(*sketch, sketch_since_aging);
}

}  // namespace recdev::store
