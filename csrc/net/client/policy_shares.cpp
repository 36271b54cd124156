#include "policy_shares.h"

#include <algorithm>

#include "net/wire/protocol.h"
#include "store/errors.h"

namespace recdev::net {

using store::ErrorCode;
using store::StoreError;

namespace {

uint64_t share_of(uint64_t total, uint32_t shard, uint32_t num_shards) {
  return total / num_shards + (shard < total % num_shards ? 1 : 0);
}

uint64_t split_budget(uint64_t budget, const char* what, uint32_t shard, uint32_t num_shards,
                      const std::string& label) {
  if (budget == 0) return 0;
  if (budget < num_shards) {
    throw StoreError(ErrorCode::InvalidArgument, std::string(what) + "=" + std::to_string(budget) + " of " + label +
                                                     " cannot be split over its " + std::to_string(num_shards) +
                                                     " shards: each shard enforces its own share of the budget, and a "
                                                     "share of 0 would be no budget; give at least " +
                                                     std::to_string(num_shards));
  }
  return share_of(budget, shard, num_shards);
}

// Two shards' policies with their budgets set aside.
bool same_but_budget(store::TablePolicyConfig lhs, store::TablePolicyConfig rhs) {
  lhs.max_rows = rhs.max_rows = 0;
  lhs.max_bytes = rhs.max_bytes = 0;
  lhs.max_disk_bytes = rhs.max_disk_bytes = 0;
  return lhs == rhs;
}

}  // namespace

store::TablePolicyConfig shard_policy(const store::TablePolicyConfig& table, uint32_t shard, uint32_t num_shards,
                                      const std::string& label) {
  store::TablePolicyConfig share = table;
  share.max_rows = split_budget(table.max_rows, "max_rows", shard, num_shards, label);
  share.max_bytes = split_budget(table.max_bytes, "max_bytes", shard, num_shards, label);
  share.max_disk_bytes = split_budget(table.max_disk_bytes, "max_disk_bytes", shard, num_shards, label);
  return share;
}

store::TablePolicyConfig merge_policies(const std::vector<store::TablePolicyConfig>& shards, const std::string& label) {
  store::TablePolicyConfig table = shards.at(0);
  for (size_t shard = 1; shard < shards.size(); ++shard) {
    if (!same_but_budget(shards[0], shards[shard]) || (shards[0].max_rows == 0) != (shards[shard].max_rows == 0) ||
        (shards[0].max_bytes == 0) != (shards[shard].max_bytes == 0) ||
        (shards[0].max_disk_bytes == 0) != (shards[shard].max_disk_bytes == 0)) {
      throw StoreError(ErrorCode::InvalidArgument,
                       "the shards of " + label + " disagree on its policy: shard 0 has " + store::describe(shards[0]) +
                           " and shard " + std::to_string(shard) + " has " + store::describe(shards[shard]) +
                           "; set it again with set_table_policy");
    }
    table.max_rows += shards[shard].max_rows;
    table.max_bytes += shards[shard].max_bytes;
    table.max_disk_bytes += shards[shard].max_disk_bytes;
  }
  return table;
}

store::TablePolicyState shard_policy_state(const store::TablePolicyState& table, uint64_t route_key, uint32_t shard,
                                           uint32_t num_shards, const std::string& label) {
  store::TablePolicyState state;
  state.config = shard_policy(table.config, shard, num_shards, label);
  for (const store::RowTouch& row : table.touches) {
    if (owner_shard(route_key, row.id, num_shards) == shard) state.touches.push_back(row);
  }
  state.clocks = table.clocks;
  state.clocks.evicted = share_of(table.clocks.evicted, shard, num_shards);
  state.clocks.admitted = share_of(table.clocks.admitted, shard, num_shards);
  state.clocks.pending = share_of(table.clocks.pending, shard, num_shards);
  state.sketch = table.sketch;
  state.sketch_since_aging = share_of(table.sketch_since_aging, shard, num_shards);
  return state;
}

store::TablePolicyState merge_policy_states(const std::vector<store::TablePolicyState>& shards,
                                            const std::string& label) {
  std::vector<store::TablePolicyConfig> configs;
  for (const store::TablePolicyState& state : shards) configs.push_back(state.config);
  store::TablePolicyState table;
  table.config = merge_policies(configs, label);
  // Every touch as (its shard's tick, shard, index), in one order that keeps each shard's.
  struct Ref {
    uint64_t tick;
    size_t shard, index;
  };
  std::vector<Ref> refs;
  for (size_t shard = 0; shard < shards.size(); ++shard) {
    for (size_t k = 0; k < shards[shard].touches.size(); ++k) refs.push_back({shards[shard].touches[k].tick, shard, k});
  }
  std::stable_sort(refs.begin(), refs.end(), [](const Ref& a, const Ref& b) { return a.tick < b.tick; });
  // A shard's recency list (lru, ttl) is in tick order, so this order keeps each shard's list.
  table.touches.reserve(refs.size());
  for (size_t rank = 0; rank < refs.size(); ++rank) {
    table.touches.push_back(shards[refs[rank].shard].touches[refs[rank].index]);
    table.touches.back().tick = rank + 1;
  }
  table.clocks = shards[0].clocks;
  table.clocks.tick = refs.size();
  table.clocks.evicted = table.clocks.admitted = table.clocks.pending = 0;
  table.sketch_since_aging = 0;
  for (const store::TablePolicyState& state : shards) {
    table.clocks.step = std::max(table.clocks.step, state.clocks.step);
    table.clocks.evicted += state.clocks.evicted;
    table.clocks.admitted += state.clocks.admitted;
    table.clocks.pending += state.clocks.pending;
    table.sketch_since_aging += state.sketch_since_aging;
    if (state.sketch.empty()) continue;
    if (table.sketch.empty()) table.sketch.assign(state.sketch.size(), 0);
    if (state.sketch.size() != table.sketch.size()) {
      throw StoreError(ErrorCode::Protocol, "the shards of " + label + " sent admission sketches of different sizes");
    }
    for (size_t i = 0; i < state.sketch.size(); ++i) table.sketch[i] = std::max(table.sketch[i], state.sketch[i]);
  }
  return table;
}

}  // namespace recdev::net
