// SyncSteps: how a store whose tables live on shards runs a synchronous fleet's step
// (net/client/sync_step.h): each rank's rows of every table staged on every shard, then committed.
// The embedded store has none: its replicas apply each step themselves (deferred_table.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace recdev::store {

// Which step of which fleet, from which rank of how many.
struct StepTag {
  uint64_t fleet = 0;
  uint64_t step = 0;
  uint32_t rank = 0;
  uint32_t world = 0;
};

class TableHandle;

// One table's part of a rank's step: its recorded rows.
struct StepRows {
  TableHandle* table = nullptr;
  const uint64_t* ids = nullptr;
  size_t n = 0;
  const float* grads = nullptr;  // n * dim, float32
};

class SyncSteps {
 public:
  virtual ~SyncSteps() = default;
  // Returns once every shard holds every rank's part of every table, or throws the first shard's
  // error (nothing of the step is applied anywhere then). timeout_seconds: how long a shard waits for
  // the other ranks' parts. Every table is one of this store's (StoreError(InvalidArgument) if not).
  virtual void stage_step(const std::vector<StepRows>& tables, const StepTag& tag, double timeout_seconds) = 0;
  // Applies the staged step: on every shard before this returns.
  virtual void commit_step(const std::vector<TableHandle*>& tables, const StepTag& tag, double timeout_seconds) = 0;
};

}  // namespace recdev::store
