// Table's side of a budget (table_policy.h): each request's pass through the policy, evictions and admissions applied
// to the rows, and the policy's state for checkpoints.
#include "table.h"

#include <algorithm>
#include <iterator>

#include "errors.h"
#include "prefetch.h"
#include "table_internals.h"
#include "task_runner.h"

namespace recdev::store {
namespace {

// Rows a policy evicts or admits worth a thread of their own: each is a bucket miss or two, and an
// admitted row's init value, about half a microsecond.
constexpr size_t kEvictedOrAdmittedRowsPerThread = 1024;

}  // namespace

Table::PolicyPass Table::open_policy_pass() {
  if (!has_policy_.load(std::memory_order_acquire)) {
    std::shared_lock<std::shared_mutex> unpoliced(unpoliced_mutex_);
    // A policy is published under unpoliced_mutex_: seen absent here, it waits for this request.
    if (!has_policy_.load(std::memory_order_acquire)) return PolicyPass{std::move(unpoliced), {}, {}};
  }
  std::unique_lock<std::mutex> lock(policy_mutex_);
  if (!policy_) {  // removed in between
    return PolicyPass{std::shared_lock<std::shared_mutex>(unpoliced_mutex_), {}, {}};
  }
  return PolicyPass{{}, std::move(lock), {}};
}

void Table::decide(PolicyPass& pass, const uint64_t* ids, size_t n, Touch touch) {
  PolicyDecision decision = policy_->apply(ids, n, touch, steady_seconds(), held_rows());
  {
    std::shared_lock<std::shared_mutex> request(request_mutex_);
    evict_and_admit(decision.victims, decision.admitted);
  }
  pass.decision = std::move(decision);
}

Table::PolicyPass Table::enter_policy(const uint64_t* ids, size_t n, Touch touch) {
  PolicyPass pass = open_policy_pass();
  if (pass.policed()) decide(pass, ids, n, touch);
  return pass;
}

HeldRows Table::held_rows() const {
  return HeldRows{[this](const uint64_t* ids, size_t n, uint8_t* held) { exists(ids, n, held); },
                  [this] {
                    uint64_t rows = 0;
                    for (const Shard& shard : shards_) {
                      std::shared_lock<std::shared_mutex> lock(shard.mutex);
                      rows += shard.rows.size();
                    }
                    return rows;
                  }};
}

// Victim and admitted rows of a sub-shard pair up, each admitted row taking a victim's record in
// place (RowIndex::replace); the rest are erased or appended. Under a budget nearly every admission
// comes with an eviction, and a pair then costs two bucket probes and the init value, where erasing
// moved the sub-shard's last record into the hole (a third miss, and a record copy) and appending grew
// the arena. Sub-shards go to several threads, the ids and buckets ahead prefetched.
void Table::evict_and_admit(const std::vector<uint64_t>& victims, const std::vector<uint64_t>& admitted) {
  if (victims.empty() && admitted.empty()) return;
  const ShardRoute out(victims.data(), victims.size());
  const ShardRoute in(admitted.data(), admitted.size());
  run_tasks(kNumShards, threads_for(victims.size() + admitted.size(), kEvictedOrAdmittedRowsPerThread), [&](size_t s) {
    if (out.begin(s) == out.end(s) && in.begin(s) == in.end(s)) return;
    Shard& shard = shards_[s];
    std::unique_lock<std::shared_mutex> lock(shard.mutex);
    const auto prefetch_ahead = [&](const ShardRoute& route, const std::vector<uint64_t>& ids, size_t entry) {
      if (entry + 2 * kBucketAhead < route.end(s)) prefetch(&ids[route.position(entry + 2 * kBucketAhead)]);
      if (entry + kBucketAhead < route.end(s)) shard.rows.prefetch_bucket(route.hash(entry + kBucketAhead));
    };
    size_t victim = out.begin(s);
    size_t entry = in.begin(s);
    for (; victim < out.end(s) && entry < in.end(s); ++victim, ++entry) {
      prefetch_ahead(out, victims, victim);
      prefetch_ahead(in, admitted, entry);
      const uint64_t victim_id = victims[out.position(victim)];
      const uint64_t row_id = admitted[in.position(entry)];
      float* record = shard.rows.replace(out.hash(victim), row_id, in.hash(entry));
      if (record == nullptr) {  // not as the policy said: the general path
        erase_row(shard, victim_id, out.hash(victim));
        materialize(shard, row_id, in.hash(entry));
        continue;
      }
      if (direct_.built()) direct_.set(victim_id, nullptr);
      fill_weight(row_id, record);
      fill_state(record + row_words_);
      if (direct_.built()) direct_.set(row_id, record);
    }
    for (; victim < out.end(s); ++victim) {
      prefetch_ahead(out, victims, victim);
      erase_row(shard, victims[out.position(victim)], out.hash(victim));
    }
    if (entry < in.end(s)) shard.rows.reserve(shard.rows.size() + (in.end(s) - entry));
    for (; entry < in.end(s); ++entry) {
      prefetch_ahead(in, admitted, entry);
      materialize(shard, admitted[in.position(entry)], in.hash(entry));
    }
  });
  drop_direct_index_unless_worth_keeping();
}

void Table::evict_now(const std::vector<uint64_t>& victims) {
  if (victims.empty()) return;
  std::shared_lock<std::shared_mutex> request(request_mutex_);
  erase_rows(victims.data(), victims.size());
}

std::vector<uint64_t> Table::materialized_ids() const {
  std::vector<uint64_t> ids;
  for (const Shard& shard : shards_) {
    shard.rows.for_each([&](uint64_t row_id, const float*) { ids.push_back(row_id); });
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

void Table::check_update_fits(const uint64_t* ids, size_t n) const {
  std::lock_guard<std::mutex> lock(policy_mutex_);
  if (policy_) policy_->check_update_fits(ids, n, held_rows());
}

void Table::check_policy(const uint64_t* ids, size_t n, Touch touch) {
  check_ids(ids, n);
  std::lock_guard<std::mutex> lock(policy_mutex_);
  if (policy_) policy_->check(ids, n, touch, steady_seconds(), held_rows());
}

void Table::set_policy(const TablePolicyConfig& config) {
  validate_policy(config);
  std::lock_guard<std::mutex> lock(policy_mutex_);
  if (!config.active()) {
    policy_.reset();
    has_policy_.store(false, std::memory_order_release);
    return;
  }
  const uint64_t record_bytes = uint64_t{record_words_} * sizeof(float);
  if (config.max_bytes != 0 && config.max_bytes / (record_bytes + TablePolicy::kRowOverheadBytes) == 0) {
    throw StoreError(ErrorCode::InvalidArgument,
                     "invalid " + describe(config) + ": max_bytes holds no row of table " + std::to_string(id_) +
                         " (a row costs " + std::to_string(record_bytes + TablePolicy::kRowOverheadBytes) +
                         " bytes: its record and " + std::to_string(TablePolicy::kRowOverheadBytes) +
                         " of index and touch metadata)");
  }
  const double now = steady_seconds();
  if (policy_) {
    const bool adopt_rows = !policy_->keeps_touches() && config.evict != EvictKind::None;
    policy_->reconfigure(config, held_rows());
    if (adopt_rows) {
      const auto locks = lock_all_shards();
      policy_->adopt(materialized_ids(), now);
    }
    // Only a budget without evict refuses, and reconfigure checked that one.
    evict_now(policy_->enforce(now, held_rows()));
    return;
  }
  auto fresh = std::make_unique<TablePolicy>(config, record_bytes);
  // Requests without a policy finish first; later ones see it (see the header comment).
  std::unique_lock<std::shared_mutex> unpoliced(unpoliced_mutex_);
  {
    const auto locks = lock_all_shards();
    fresh->adopt(materialized_ids(), now);
  }
  const std::vector<uint64_t> victims = fresh->enforce(now, held_rows());
  policy_ = std::move(fresh);
  has_policy_.store(true, std::memory_order_release);
  unpoliced.unlock();
  evict_now(victims);
}

TablePolicyConfig Table::policy() const {
  std::lock_guard<std::mutex> lock(policy_mutex_);
  return policy_ ? policy_->config() : TablePolicyConfig{};
}

std::optional<TablePolicyState> Table::policy_state() const {
  std::lock_guard<std::mutex> lock(policy_mutex_);
  if (!policy_) return std::nullopt;
  const FrequencySketch* sketch = policy_->sketch();
  return TablePolicyState{policy_->config(), policy_->touches(steady_seconds()), policy_->clocks(),
                          sketch ? sketch->counters() : std::vector<uint16_t>{}, sketch ? sketch->since_aging() : 0};
}

void Table::restore_policy_state(const TablePolicyState& state) {
  validate_policy(state.config);
  std::lock_guard<std::mutex> lock(policy_mutex_);
  const double now = steady_seconds();
  auto fresh = std::make_unique<TablePolicy>(state.config, uint64_t{record_words_} * sizeof(float));
  std::unique_lock<std::shared_mutex> unpoliced(unpoliced_mutex_);  // as in set_policy
  std::vector<uint64_t> ids;
  {
    const auto locks = lock_all_shards();
    ids = materialized_ids();
  }
  // Metadata of rows the table no longer holds is dropped; rows without metadata are adopted.
  std::vector<RowTouch> kept;
  std::vector<uint64_t> kept_ids;
  for (const RowTouch& row : state.touches) {
    if (std::binary_search(ids.begin(), ids.end(), row.id)) {
      kept.push_back(row);
      kept_ids.push_back(row.id);
    }
  }
  std::sort(kept_ids.begin(), kept_ids.end());
  std::vector<uint64_t> unknown;
  std::set_difference(ids.begin(), ids.end(), kept_ids.begin(), kept_ids.end(), std::back_inserter(unknown));
  fresh->restore(kept, state.clocks, state.sketch.empty() ? nullptr : &state.sketch, state.sketch_since_aging, now);
  fresh->adopt(unknown, now);
  const std::vector<uint64_t> victims = fresh->enforce(now, held_rows());
  policy_ = std::move(fresh);
  has_policy_.store(true, std::memory_order_release);
  unpoliced.unlock();
  evict_now(victims);
}

}  // namespace recdev::store
