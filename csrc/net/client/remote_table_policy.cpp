// RemoteTable's policy facet: each shard holds its share of the budget (policy_shares.h); a batch a
// share would refuse is refused before any shard changes (check_every_shard).
#include "remote_store.h"

#include <string>
#include <vector>

#include "policy_shares.h"
#include "remote_transfer.h"
#include "store/checkpoint.h"
#include "store/errors.h"

namespace recdev::net {

using store::ErrorCode;
using store::StoreError;

void RemoteTable::set_policy(const store::TablePolicyConfig& config) {
  store::validate_policy(config);
  const uint32_t shards = uint32_t(session_->num_shards());
  std::vector<store::TablePolicyConfig> shares;
  for (uint32_t shard = 0; shard < shards; ++shard) shares.push_back(shard_policy(config, shard, shards, label()));
  const std::vector<store::TablePolicyConfig> before = shard_policies();
  RemoteSession::Lease lease(*session_);
  std::vector<Call> calls;
  for (uint32_t shard = 0; shard < shards; ++shard) {
    calls.push_back(make_call(shard, Opcode::SetPolicy, SetPolicyRequest{table_id(lease, shard), shares[shard]}));
  }
  std::vector<uint8_t> applied(shards, 0);
  try {
    session_->exchange(lease, calls, [&](size_t shard) { applied[shard] = 1; });
  } catch (...) {
    // A shard refused (a budget without evict that its rows already pass, or its --max-memory): the
    // others go back to the policy they had, so that the table keeps one policy. Going back keeps the
    // rows' touch metadata; rows a new budget with evict already evicted on a shard stay evicted.
    std::vector<Call> undo;
    for (uint32_t shard = 0; shard < shards; ++shard) {
      if (applied[shard]) {
        undo.push_back(make_call(shard, Opcode::SetPolicy, SetPolicyRequest{table_id(lease, shard), before[shard]}));
      }
    }
    try {
      session_->exchange_keeping_failures(lease, undo);
    } catch (const StoreError&) {}
    throw;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  known_policy_ = config;
}

void RemoteTable::check_every_shard(const uint64_t* ids, size_t n, store::Touch touch) const {
  const uint32_t shards = uint32_t(session_->num_shards());
  if (shards < 2 || n == 0) return;
  const auto has_budget = [](const store::TablePolicyConfig& policy) {
    return policy.max_rows != 0 || policy.max_bytes != 0;  // only a budget refuses
  };
  std::optional<store::TablePolicyConfig> policy;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    policy = known_policy_;
  }
  if (policy && !has_budget(*policy)) return;
  const uint32_t first = owner_shard(route_key_, ids[0], shards);
  size_t i = 1;
  while (i < n && owner_shard(route_key_, ids[i], shards) == first) ++i;
  if (i == n) return;                    // one shard decides the whole batch alone
  if (!policy) policy = this->policy();  // once per handle that neither set nor read it yet
  if (!has_budget(*policy)) return;
  const Routed routed = route(ids, n);
  if (policy->evict != store::EvictKind::None && policy->admit_after <= 1 && policy->max_bytes == 0) {
    // Every distinct row of a batch is then stored, so a share refuses exactly a part with more
    // distinct rows than its max_rows: judged here, without a request.
    for (uint32_t shard = 0; shard < shards; ++shard) {
      std::vector<uint64_t> part = routed.ids[shard];
      std::sort(part.begin(), part.end());
      const size_t distinct = size_t(std::unique(part.begin(), part.end()) - part.begin());
      const store::TablePolicyConfig share = shard_policy(*policy, shard, shards, label());
      if (distinct > share.max_rows) {
        throw StoreError(ErrorCode::InvalidArgument,
                         session_->describe(shard) + ": a request touching " + std::to_string(distinct) +
                             " distinct rows of " + label() + " cannot fit the budget of " +
                             std::to_string(share.max_rows) + " rows (" + store::describe(share) +
                             ", its share of the table's): split the batch, or raise max_rows / max_bytes; "
                             "nothing was applied");
      }
    }
    return;
  }
  // Otherwise what a share refuses depends on what it holds (a budget without evict, admission) or
  // on its row size (max_bytes): each shard judges its part.
  const size_t per_request = ids_per_request(sizeof(uint64_t));
  RemoteSession::Lease lease(*session_);
  std::vector<Call> calls;
  routed.for_each_piece(per_request, [&](size_t shard, size_t begin, size_t end) {
    calls.push_back(make_call(shard, Opcode::CheckPolicy,
                              CheckPolicyRequest{table_id(lease, shard), touch, routed.piece(shard, begin, end)}));
  });
  session_->exchange(lease, calls);
}

std::vector<store::TablePolicyConfig> RemoteTable::shard_policies() const {
  std::vector<store::TablePolicyConfig> policies;
  for (const TableInfoResponse& info : infos()) policies.push_back(info.policy);
  return policies;
}

store::TablePolicyConfig RemoteTable::policy() const {
  const store::TablePolicyConfig merged = merge_policies(shard_policies(), label());
  std::lock_guard<std::mutex> lock(mutex_);
  known_policy_ = merged;
  return merged;
}

std::optional<store::TablePolicyState> RemoteTable::policy_state() const {
  RemoteSession::Lease lease(*session_);
  return fetch_policy_state(*session_, lease, shard_table_ids(lease), num_rows_, label());
}

void RemoteTable::restore_policy_state(const store::TablePolicyState& state) {
  store::validate_policy(state.config);
  const uint32_t shards = uint32_t(session_->num_shards());
  std::vector<std::vector<uint8_t>> encoded;
  for (uint32_t shard = 0; shard < shards; ++shard) {
    const std::string bytes = store::encode_policy_state(shard_policy_state(state, route_key_, shard, shards, label()));
    encoded.emplace_back(bytes.begin(), bytes.end());
  }
  RemoteSession::Lease lease(*session_);
  std::vector<Call> calls;
  for (uint32_t shard = 0; shard < shards; ++shard) {
    calls.push_back(
        make_call(shard, Opcode::RestorePolicy, RestorePolicyRequest{table_id(lease, shard), encoded[shard]}));
  }
  session_->exchange(lease, calls);
}

}  // namespace recdev::net
