// TablePolicyConfig: what a user asks of a table's budget, eviction and admission (table_policy.h runs
// it), with its validation; what the bindings, the wire and checkpoints carry.
#pragma once

#include <cstdint>
#include <string>

namespace recdev::store {

enum class EvictKind : uint8_t { None = 0, Lru = 1, Lfu = 2, Ttl = 3 };

struct TablePolicyConfig {
  uint64_t max_rows = 0;   // 0: no row budget
  uint64_t max_bytes = 0;  // 0: no byte budget
  EvictKind evict = EvictKind::None;
  double half_life = 1000;   // lfu: steps for a touch count to halve
  uint64_t ttl_steps = 0;    // ttl: evict rows not touched for this many steps, or
  double ttl_seconds = 0;    // this many seconds (exactly one of the two with evict = ttl)
  uint32_t admit_after = 1;  // a row is materialized at its admit_after-th lookup
  // Columns of the admission sketch; 0: sized from the budget (auto_sketch_width). The policy in
  // force always holds the width it uses.
  uint32_t sketch_width = 0;
  // Evicted rows go to the disk tier (disk_tier.h) with their optimizer state, and come back on their
  // next touch, instead of returning to the init rule. Needs evict.
  bool spill = false;
  uint64_t max_disk_bytes = 0;  // with spill: a bound on the disk tier's files; 0: none

  // Whether the table needs a policy at all.
  bool active() const { return max_rows != 0 || max_bytes != 0 || evict != EvictKind::None || admit_after > 1; }
};

bool operator==(const TablePolicyConfig& lhs, const TablePolicyConfig& rhs);
std::string evict_name(EvictKind kind);
std::string describe(const TablePolicyConfig& config);
// Throws StoreError(InvalidArgument) naming what is wrong and what to do.
void validate_policy(const TablePolicyConfig& config);

// What a request does to its rows, as a policy counts it.
enum class Touch { Lookup, Update, Write };

}  // namespace recdev::store
