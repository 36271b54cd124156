// Table's change tracking for incremental checkpoints: which rows changed since each change chain's
// last cut, and the cuts themselves (cut_changes).
//
// Every change to a row's record, presence or place (memory or disk) happens under its sub-shard's
// write lock, which is where note_changed records it: the row id with the current generation, in
// that sub-shard's ChangedRows. A policed lookup changes only the rows' touch metadata, under
// policy_mutex_, and is recorded in policy_changed_. A cut holds the view locks (no request is
// halfway), takes the ids whose generation is newer than the chain's last cut, copies those rows
// (sub-shards in parallel) and moves the generation on; entries every chain has seen are dropped, so the sets hold only what
// some chain has yet to cut. Wholesale changes drop every chain instead of marking every row.
#include <algorithm>
#include <array>
#include <cstring>

#include "table.h"
#include "table_internals.h"
#include "task_runner.h"

namespace recdev::store {
namespace {

// A cut holds the view locks, so no request runs while it copies: it takes every core it can.
constexpr size_t kCutRowsPerThread = 65536;

// Drops the entries of `rows` that every chain has seen; appends the others newer than `since`.
template <class ChangedRows>
void collect(ChangedRows& rows, uint64_t since, uint64_t prune_upto, std::vector<uint64_t>& ids) {
  std::vector<uint64_t> seen;
  rows.for_each([&](uint64_t id, uint64_t generation) {
    if (generation > since) ids.push_back(id);
    if (generation <= prune_upto) seen.push_back(id);
  });
  if (seen.size() == rows.size()) {
    rows.clear();
    return;
  }
  for (const uint64_t id : seen) rows.erase(id);
}

}  // namespace

void Table::forget_change_chains() const {
  change_chains_.clear();
  tracking_changes_ = false;
  for (Shard& shard : shards_) shard.changed.clear();
  policy_changed_.clear();
}

void Table::forget_change_chain(uint64_t chain) const {
  const ViewLocks locks = lock_for_view();
  std::erase_if(change_chains_, [&](const auto& entry) { return entry.first == chain; });
  tracking_changes_ = !change_chains_.empty();
  if (!tracking_changes_) forget_change_chains();
}

void Table::cut_whole(TableCut& cut) const {
  std::array<size_t, kNumShards + 1> first{};
  for (size_t s = 0; s < kNumShards; ++s) first[s + 1] = first[s] + shards_[s].rows.size();
  cut.ids.resize(cut.header.row_count);
  cut.records.resize(cut.header.row_count * size_t{record_words_});
  run_tasks(kNumShards, threads_for(first[kNumShards], kCutRowsPerThread), [&](size_t s) {
    shards_[s].rows.copy_out(cut.ids.data() + first[s], cut.records.data() + first[s] * record_words_);
  });
  if (!disk_) return;
  size_t next = first[kNumShards];
  const size_t record_bytes = size_t{record_words_} * sizeof(float);
  disk_->for_each([&](uint64_t id, const float* record) {
    cut.ids[next] = id;
    std::memcpy(cut.records.data() + next * record_words_, record, record_bytes);
    ++next;
  });
}

void Table::cut_changed(TableCut& cut, uint64_t since, uint64_t prune_upto) const {
  // Per sub-shard: the changed ids (those whose touch metadata alone changed routed in), then their
  // records where they are in memory; the rows on disk or gone are settled after, in one pass.
  std::array<std::vector<uint64_t>, kNumShards> ids;
  std::vector<uint64_t> touched;
  collect(policy_changed_, since, prune_upto, touched);
  for (const uint64_t id : touched) ids[shard_of(hash_row_id(id))].push_back(id);
  size_t tracked = touched.size();
  for (const Shard& shard : shards_) tracked += shard.changed.size();
  std::array<std::vector<const float*>, kNumShards> held;
  std::array<size_t, kNumShards + 1> first{};
  const size_t threads = threads_for(tracked, kCutRowsPerThread);
  run_tasks(kNumShards, threads, [&](size_t s) {
    collect(shards_[s].changed, since, prune_upto, ids[s]);
    std::sort(ids[s].begin(), ids[s].end());
    ids[s].erase(std::unique(ids[s].begin(), ids[s].end()), ids[s].end());
    held[s].resize(ids[s].size());
    size_t found = 0;
    for (size_t i = 0; i < ids[s].size(); ++i) {
      held[s][i] = shards_[s].rows.find(hash_row_id(ids[s][i]));
      found += held[s][i] != nullptr;
    }
    first[s + 1] = found;
  });
  for (size_t s = 0; s < kNumShards; ++s) first[s + 1] += first[s];
  const size_t record_bytes = size_t{record_words_} * sizeof(float);
  cut.ids.resize(first[kNumShards]);
  cut.records.resize(first[kNumShards] * size_t{record_words_});
  run_tasks(kNumShards, threads, [&](size_t s) {
    size_t next = first[s];
    for (size_t i = 0; i < ids[s].size(); ++i) {
      if (held[s][i] == nullptr) continue;
      cut.ids[next] = ids[s][i];
      std::memcpy(cut.records.data() + next * record_words_, held[s][i], record_bytes);
      ++next;
    }
  });
  std::vector<float> record(record_words_);
  for (size_t s = 0; s < kNumShards; ++s) {
    for (size_t i = 0; i < ids[s].size(); ++i) {
      if (held[s][i] != nullptr) continue;
      if (disk_ && disk_->read_one(ids[s][i], record.data())) {
        cut.ids.push_back(ids[s][i]);
        cut.records.insert(cut.records.end(), record.begin(), record.end());
      } else {
        cut.erased.push_back(ids[s][i]);
      }
    }
  }
}

TableCut Table::cut_changes(uint64_t chain) const {
  const ViewLocks locks = lock_for_view();
  TableCut cut;
  cut.header = scan_header();
  const auto found = std::find_if(change_chains_.begin(), change_chains_.end(),
                                  [&](const auto& entry) { return entry.first == chain; });
  cut.whole = found == change_chains_.end();
  const uint64_t generation = change_generation_;
  if (cut.whole) {
    cut_whole(cut);
    if (change_chains_.size() == kMaxChangeChains) {
      change_chains_.erase(std::min_element(change_chains_.begin(), change_chains_.end(),
                                            [](const auto& a, const auto& b) { return a.second < b.second; }));
    }
    change_chains_.emplace_back(chain, generation);
  } else {
    const uint64_t since = found->second;
    found->second = generation;
    uint64_t oldest = generation;
    for (const auto& entry : change_chains_) oldest = std::min(oldest, entry.second);
    cut_changed(cut, since, oldest);
  }
  cut.header.row_count = cut.ids.size();
  tracking_changes_ = true;
  change_generation_ = generation + 1;
  if (policy_) {
    const double now = steady_seconds();
    const FrequencySketch* sketch = policy_->sketch();
    cut.policy = TablePolicyState{
        policy_->config(), cut.whole ? policy_->touches(now) : policy_->touches_of(cut.ids, now), policy_->clocks(),
        sketch ? sketch->counters() : std::vector<uint16_t>{}, sketch ? sketch->since_aging() : 0};
  }
  return cut;
}

}  // namespace recdev::store
