// What this process holds for recdev, counted when it is allocated and freed, so that current and
// peak figures are exact rather than sampled: table memory (the store's chunks of row records and
// row indexes, counted by chunk_pool.cpp) and host storage (the blocks of recdev tensors, counted by
// the device layer). torch.accelerator's memory stats and torch.recdev's read it
// (csrc/device/allocator.cpp); docs/device.md ("Memory") maps it to PyTorch's stat names.
//
// "Allocated" bytes are in use; "reserved" bytes are those plus what is kept for reuse (the host
// block cache, the chunk pool's unused and cached regions): what the process got from the system.
// Thread-safe; one lock, taken per block or chunk (a chunk holds many rows).
#pragma once

#include <cstdint>

namespace recdev::store {

// Which pool bytes are counted in. PyTorch splits its stats into blocks under 1 MiB and the rest;
// tables are counted with the large blocks.
enum class MemoryKind : uint8_t { SmallHostBlock, LargeHostBlock, Table };

// The scopes of a reading: PyTorch's StatType order (all, small pool, large pool), then recdev's split.
enum MemoryScope : int { kAllMemory, kSmallPool, kLargePool, kHostMemory, kTableMemory, kMemoryScopes };

// As c10's Stat: `allocated` and `freed` accumulate until reset_memory_accumulated().
struct MemoryGauge {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;
  int64_t freed = 0;
};

struct MemoryReading {
  MemoryGauge allocated_bytes[kMemoryScopes];
  MemoryGauge reserved_bytes[kMemoryScopes];
  MemoryGauge allocations[kMemoryScopes];  // blocks and chunks in use
  MemoryGauge segments[kMemoryScopes];     // blocks, chunks and regions reserved
};

// `bytes` > 0 counts one allocation of that many bytes, < 0 frees one.
void count_allocated(MemoryKind kind, int64_t bytes);
void count_reserved(MemoryKind kind, int64_t bytes);

MemoryReading read_memory();
void reset_memory_peaks();        // every peak to its current value
void reset_memory_accumulated();  // every allocated and freed to 0

}  // namespace recdev::store
