// A table policy (store/table_policy.h) over the shards of a remote table: each shard runs its own
// TablePolicy over the rows it owns and enforces its share of the budget; the client splits a
// table's policy into those shares and merges the shards' back (docs/budgets.md, "On shards").
//
// - Budget shares: max_rows, max_bytes and max_disk_bytes are split so that the shares add up to the table's budget
//   exactly: shard s of N holds budget / N, plus one for s < budget % N. A budget below N cannot be
//   split (a shard with a share of 0 would have no budget at all) and is refused. Each shard evicts
//   against its own share, so a skewed id distribution can evict on one shard before the table as a
//   whole holds its budget.
// - Everything else (evict, half_life, ttl, admit_after, sketch width) is the same on every shard.
// - Policy states (checkpoints): merging concatenates the shards' touch metadata and renumbers the
//   recency ticks into one sequence that keeps every shard's order (each shard counts its own ticks,
//   so the raw values of two shards collide), sums the counters (evicted, admitted, pending), and takes the
//   admission sketches' element-wise maximum: an id lives on one shard, whose counters bound its
//   count, so the maximum still never under-counts an id; and since splitting gives each shard the
//   whole sketch, a sum would count every id once per shard at the next save (save, load, save
//   inflated every count N-fold), where the maximum of N copies is the copy. Splitting gives each
//   shard the touches of its rows, its share of the counters and the whole sketch. Split back over as many shards as it was merged from, a state is what each
//   shard held; over another number of shards, rows of different former shards interleave in
//   recency by their renumbered ticks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "store/table.h"

namespace recdev::net {

// Shard `shard`'s part of a table's policy; `label` names the table in errors (StoreError
// InvalidArgument for a budget smaller than the number of shards).
store::TablePolicyConfig shard_policy(const store::TablePolicyConfig& table, uint32_t shard, uint32_t num_shards,
                                      const std::string& label);
// The table's policy from every shard's: budgets summed. Shards that disagree on anything else
// (a policy set on some shards only) are StoreError(InvalidArgument) naming both.
store::TablePolicyConfig merge_policies(const std::vector<store::TablePolicyConfig>& shards, const std::string& label);

// The policy state of the rows of shard `shard` (owner_shard with `route_key`).
store::TablePolicyState shard_policy_state(const store::TablePolicyState& table, uint64_t route_key, uint32_t shard,
                                           uint32_t num_shards, const std::string& label);
// The table's policy state from every shard's (none of them empty).
store::TablePolicyState merge_policy_states(const std::vector<store::TablePolicyState>& shards,
                                            const std::string& label);

}  // namespace recdev::net
