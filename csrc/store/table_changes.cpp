// Table's change tracking for incremental checkpoints: which rows changed since each change chain's
// last cut, and the cuts themselves (cut_changes).
//
// Every change to a row's record, presence or place (memory or disk) happens under its sub-shard's
// write lock, which is where note_changed records it: the row id with the current generation, in
// that sub-shard's ChangedRows. A policed lookup changes only the rows' touch metadata, under
// policy_mutex_, and is recorded in policy_changed_. A cut holds the view locks (no request is
// halfway), takes the ids whose generation is newer than the chain's last cut, copies those rows and
// moves the generation on; entries every chain has seen are dropped, so the sets hold only what
// some chain has yet to cut. Wholesale changes drop every chain instead of marking every row.
#include <algorithm>
#include <cstring>

#include "table.h"
#include "table_internals.h"

namespace recdev::store {
namespace {

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

std::vector<uint64_t> Table::take_changed_ids(uint64_t since, uint64_t prune_upto) const {
  std::vector<uint64_t> ids;
  for (Shard& shard : shards_) collect(shard.changed, since, prune_upto, ids);
  collect(policy_changed_, since, prune_upto, ids);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

TableCut Table::cut_changes(uint64_t chain) const {
  const ViewLocks locks = lock_for_view();
  TableCut cut;
  cut.header = scan_header();
  const auto found = std::find_if(change_chains_.begin(), change_chains_.end(),
                                  [&](const auto& entry) { return entry.first == chain; });
  cut.whole = found == change_chains_.end();
  const uint64_t generation = change_generation_;
  const size_t record_bytes = size_t{record_words_} * sizeof(float);
  if (cut.whole) {
    cut.ids.resize(cut.header.row_count);
    cut.records.resize(cut.header.row_count * size_t{record_words_});
    size_t next = 0;
    for (const Shard& shard : shards_) {
      shard.rows.copy_out(cut.ids.data() + next, cut.records.data() + next * record_words_);
      next += shard.rows.size();
    }
    if (disk_) {
      disk_->for_each([&](uint64_t id, const float* record) {
        cut.ids[next] = id;
        std::memcpy(cut.records.data() + next * record_words_, record, record_bytes);
        ++next;
      });
    }
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
    const std::vector<uint64_t> changed = take_changed_ids(since, oldest);
    cut.ids.reserve(changed.size());
    cut.records.reserve(changed.size() * record_words_);
    std::vector<float> record(record_words_);
    for (const uint64_t id : changed) {
      const uint64_t hash = hash_row_id(id);
      const float* held = shards_[shard_of(hash)].rows.find(hash);
      if (held == nullptr && disk_ && disk_->read_one(id, record.data())) held = record.data();
      if (held == nullptr) {
        cut.erased.push_back(id);
        continue;
      }
      cut.ids.push_back(id);
      cut.records.insert(cut.records.end(), held, held + record_words_);
    }
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
