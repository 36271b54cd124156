// The validation of an update's gradients, before anything changes: every value finite, and no row's
// summed duplicates overflowing. Table::update checks a batch this way, and so do clients that must
// refuse a batch before sending it to several shards (net/client/remote_store.cpp, net/server/service_steps.cpp), so
// that no shard applies a batch another would refuse; both refuse in the same words.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "element_type.h"

namespace recdev::store {

// Whether all `count` values are finite: G is float (Float32), uint16_t (the bits of a Float16 or
// BFloat16, as `type` says) or double (Float64). Vectorized: it reads the exponent bits.
template <class G>
bool all_finite_values(ElementType type, const G* values, size_t count);

// Throws StoreError(InvalidArgument) naming the first non-finite value of rows[0 .. n) (each
// `elements` values of G, as above) in batch order; returns if there is none. label: "table 3".
template <class G>
void refuse_first_non_finite(ElementType type, const uint64_t* ids, size_t n, const G* const* rows, uint32_t elements,
                             const std::string& label);

// Throws the StoreError(InvalidArgument) of a row whose summed duplicates overflow to inf.
[[noreturn]] void refuse_overflowing_sum(uint64_t row_id, uint32_t column, const std::string& label);

// grads: n rows of `elements` elements of `dtype` (a numeric type), packed. Throws as the functions
// above, or for a dtype the store cannot train.
void check_update_gradients(ElementType dtype, uint32_t elements, const uint64_t* ids, size_t n, const void* grads,
                            const std::string& label);

}  // namespace recdev::store
