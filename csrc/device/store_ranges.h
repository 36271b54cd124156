// The recdev::<name> profiler ranges of the row path (docs/device.md, "Profiling"), opened where
// kernels and the store API call a table, on the calling thread: a lookup a kernel splits over
// threads is one range, and a table's rows are counted once whatever the split. Their fields:
// table (its id), ids, bags, and bytes (rows read, written or given as gradients).
#pragma once

#include <cstddef>

#include "store/table_handle.h"
#include "store/trace_range.h"

namespace recdev::device {

inline size_t row_bytes(const store::TableHandle& table) { return size_t{table.row_words()} * 4; }

inline trace::Range gather_range(const store::TableHandle& table, size_t ids) {
  return trace::Range("recdev::gather", {{"table", table.id()}, {"ids", ids}, {"bytes", ids * row_bytes(table)}});
}

inline trace::Range pooled_gather_range(const store::TableHandle& table, size_t ids, size_t bags) {
  return trace::Range("recdev::pooled_gather",
                      {{"table", table.id()}, {"ids", ids}, {"bags", bags}, {"bytes", ids * row_bytes(table)}});
}

inline trace::Range write_range(const store::TableHandle& table, size_t ids) {
  return trace::Range("recdev::write", {{"table", table.id()}, {"ids", ids}, {"bytes", ids * row_bytes(table)}});
}

// bags: 0 for a gradient row per id; the bags' count when the store spreads bag gradients itself.
inline trace::Range update_range(const store::TableHandle& table, size_t ids, size_t bags) {
  return trace::Range("recdev::update",
                      {{"table", table.id()}, {"ids", ids}, {"bags", bags}, {"bytes", ids * row_bytes(table)}});
}

}  // namespace recdev::device
