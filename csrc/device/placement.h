#pragma once
// The one place that decides whether a new recdev allocation becomes host
// storage or a store table (DESIGN.md, "Memory model": Placement).

#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <optional>

namespace recdev::device {

enum class PlacementOverride : uint8_t { None, Host, Table };

// Process-wide threshold (default 64 MiB, or RECDEV_TABLE_MIN_BYTES).
uint64_t table_min_bytes();
void set_table_min_bytes(uint64_t bytes);

// Per-thread override set by torch_recdev.placement(...).
PlacementOverride placement_override();
void set_placement_override(PlacementOverride p);

// The largest number of bytes a fallback or a copy may move out of a table
// (default 1 GiB, or RECDEV_MAX_FALLBACK_BYTES).
uint64_t max_fallback_bytes();
void set_max_fallback_bytes(uint64_t bytes);

bool place_in_table(uint64_t nbytes);

// Row width in bytes of a table holding a tensor of this shape: a size[0]
// slice when that is a whole number of 4-byte words (what embedding lookups
// gather), otherwise fixed-size chunks of the flat bytes.
uint32_t table_row_bytes(c10::IntArrayRef sizes, c10::ScalarType dtype);

}  // namespace recdev::device
