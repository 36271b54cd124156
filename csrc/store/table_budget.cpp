// Table's side of a budget (table_policy.h): each request's pass through the policy, evictions and admissions applied
// to the rows, and the policy's state for checkpoints.
#include "table.h"

#include <algorithm>
#include <cstring>
#include <iterator>

#include "errors.h"
#include "prefetch.h"
#include "table_internals.h"
#include "task_runner.h"
#include "trace_range.h"

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
  RowsReadBack back;
  std::vector<uint64_t> on_disk;  // the request's rows the policy found on disk
  HeldRows held = held_rows();
  if (disk_) {
    // The previous request's victims written (or the error that stopped them, a full disk, refuses
    // this one): from here to evict_and_admit nothing changes the disk tier.
    disk_->wait_flushed();
    disk_->flush();
    held.on_disk = [&](uint64_t id) {
      const bool found = disk_->contains_while_quiet(id);
      if (found) on_disk.push_back(id);
      return found;
    };
  }
  // The rows on disk are read back once the request is known to fit, before the policy changes
  // anything: a read that fails (a corrupt block) refuses the request with nothing changed.
  PolicyDecision decision = policy_->apply(ids, n, touch, steady_seconds(), held, [&] {
    if (!on_disk.empty()) back = disk_->read_back(on_disk.data(), on_disk.size());
  });
  if (disk_ && policy_->config().evict == EvictKind::Ttl) keep_expired_rows_of_request(decision);
  if (tracking_changes_) {
    for (size_t i = 0; i < n; ++i) policy_changed_.insert(ids[i], change_generation_);
  }
  {
    std::shared_lock<std::shared_mutex> request(request_mutex_);
    evict_and_admit(decision.victims, decision.admitted, disk_ ? &back : nullptr);
  }
  // This request's victims go to their files while the request runs.
  if (disk_ && !decision.victims.empty()) disk_->flush_in_background();
  pass.decision = std::move(decision);
}

// A row of the request that ttl expired is a victim and admitted at once: with a disk tier it would
// go to disk and straight back, so it stays where it is, with its values.
void Table::keep_expired_rows_of_request(PolicyDecision& decision) {
  std::vector<uint64_t> admitted = decision.admitted;
  std::sort(admitted.begin(), admitted.end());
  std::vector<uint64_t> both;
  for (const uint64_t id : decision.victims) {
    if (std::binary_search(admitted.begin(), admitted.end(), id)) both.push_back(id);
  }
  if (both.empty()) return;
  std::sort(both.begin(), both.end());
  const auto in_both = [&](uint64_t id) { return std::binary_search(both.begin(), both.end(), id); };
  std::erase_if(decision.victims, in_both);
  std::erase_if(decision.admitted, in_both);
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
                  },
                  disk_ ? std::function<bool(uint64_t)>([this](uint64_t id) { return disk_->contains(id); })
                        : std::function<bool(uint64_t)>()};
}

// Victim and admitted rows of a sub-shard pair up, each admitted row taking a victim's record in
// place (RowIndex::replace); the rest are erased or appended. Under a budget nearly every admission
// comes with an eviction, and a pair then costs two bucket probes and the init value, where erasing
// moved the sub-shard's last record into the hole (a third miss, and a record copy) and appending grew
// the arena. Sub-shards go to several threads, the ids and buckets ahead prefetched.
void Table::evict_and_admit(const std::vector<uint64_t>& victims, const std::vector<uint64_t>& admitted,
                            const RowsReadBack* back) {
  if (victims.empty() && admitted.empty()) return;
  const trace::Range range("recdev::admit",
                           {{"table", id_}, {"admitted", admitted.size()}, {"evicted", victims.size()}});
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
      if (disk_) spill_row(shard, victim_id, out.hash(victim));
      float* record = shard.rows.replace(out.hash(victim), row_id, in.hash(entry));
      if (record == nullptr) {  // not as the policy said: the general path
        erase_row(shard, victim_id, out.hash(victim));
        materialize(shard, row_id, in.hash(entry), back);
        continue;
      }
      if (direct_.built()) direct_.set(victim_id, nullptr);
      note_changed(shard, victim_id);
      note_changed(shard, row_id);
      fill_record(row_id, record, back);
      if (direct_.built()) direct_.set(row_id, record);
    }
    for (; victim < out.end(s); ++victim) {
      prefetch_ahead(out, victims, victim);
      if (disk_) spill_row(shard, victims[out.position(victim)], out.hash(victim));
      erase_row(shard, victims[out.position(victim)], out.hash(victim));
    }
    if (entry < in.end(s)) shard.rows.reserve(shard.rows.size() + (in.end(s) - entry));
    for (; entry < in.end(s); ++entry) {
      prefetch_ahead(in, admitted, entry);
      materialize(shard, admitted[in.position(entry)], in.hash(entry), back);
    }
  });
  drop_direct_index_unless_worth_keeping();
}

void Table::evict_now(const std::vector<uint64_t>& victims) {
  if (victims.empty()) return;
  std::shared_lock<std::shared_mutex> request(request_mutex_);
  erase_rows(victims.data(), victims.size(), true);
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
  if (disk_) disk_->wait_flushed();
  if (policy_) policy_->check_update_fits(ids, n, held_rows());
}

void Table::check_policy(const uint64_t* ids, size_t n, Touch touch) {
  check_ids(ids, n);
  std::lock_guard<std::mutex> lock(policy_mutex_);
  if (disk_) disk_->wait_flushed();
  if (policy_) policy_->check(ids, n, touch, steady_seconds(), held_rows());
}

void Table::set_policy(const TablePolicyConfig& config) {
  validate_policy(config);
  std::lock_guard<std::mutex> lock(policy_mutex_);
  {
    // Every row's touch metadata may change (adopted, or gone with the policy).
    std::shared_lock<std::shared_mutex> request(request_mutex_);
    const auto locks = lock_all_shards();
    forget_change_chains();
  }
  configure_disk_tier(config);
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
  configure_disk_tier(state.config);
  const double now = steady_seconds();
  auto fresh = std::make_unique<TablePolicy>(state.config, uint64_t{record_words_} * sizeof(float));
  std::unique_lock<std::shared_mutex> unpoliced(unpoliced_mutex_);  // as in set_policy
  std::vector<uint64_t> ids;
  {
    const auto locks = lock_all_shards();
    ids = materialized_ids();
    forget_change_chains();
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
  // With spill, a row without metadata was on disk when the state was taken: it goes back there,
  // colder than every row in memory, rather than in as the newest.
  std::vector<uint64_t> back_to_disk;
  if (disk_) {
    back_to_disk = std::move(unknown);
  } else {
    fresh->adopt(unknown, now);
  }
  const std::vector<uint64_t> victims = fresh->enforce(now, held_rows());
  policy_ = std::move(fresh);
  has_policy_.store(true, std::memory_order_release);
  unpoliced.unlock();
  evict_now(back_to_disk);
  evict_now(victims);
  if (disk_) disk_->flush();
}

void Table::configure_disk_tier(const TablePolicyConfig& config) {
  if (config.spill) {
    if (disk_) {
      disk_->set_max_disk_bytes(config.max_disk_bytes);
      return;
    }
    auto made = std::make_unique<DiskTier>(id_, record_words_, config.max_disk_bytes);
    std::shared_lock<std::shared_mutex> request(request_mutex_);
    const auto locks = lock_all_shards();
    disk_ = std::move(made);
    return;
  }
  if (!disk_) return;
  // Every row on disk back into memory; the policy set next adopts them (they are the coldest: the
  // ones it evicts first), and evicts what passes its budget.
  std::vector<uint64_t> ids;
  std::vector<float> records;
  disk_->for_each([&](uint64_t id, const float* record) {
    ids.push_back(id);
    records.insert(records.end(), record, record + record_words_);
  });
  std::shared_lock<std::shared_mutex> request(request_mutex_);
  const auto locks = lock_all_shards();
  for (size_t r = 0; r < ids.size(); ++r) {
    const uint64_t hash = hash_row_id(ids[r]);
    Shard& shard = shards_[shard_of(hash)];
    const auto [record, created] = shard.rows.find_or_insert(ids[r], hash);
    if (created) std::memcpy(record, records.data() + r * record_words_, size_t{record_words_} * sizeof(float));
  }
  reindex_all_rows();  // the count, and the direct index (inserting may have moved records)
  if (policy_) policy_->adopt(ids, steady_seconds());
  disk_.reset();
}

void Table::drop_disk_rows() {
  if (disk_) disk_->clear();
}

}  // namespace recdev::store
