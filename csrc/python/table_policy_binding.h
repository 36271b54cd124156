// A table's budget, eviction and admission policy (store/table_policy.h) to and from a Python dict,
// shared by the store's test binding (Table.set_policy) and the device's (torch_recdev.set_table_policy):
// keys max_rows, max_bytes (0 or None: no budget), evict ("lru", "lfu", "ttl" or None), half_life,
// ttl_steps, ttl_seconds, admit_after, sketch_width. Missing keys keep their defaults; unknown keys
// and bad values raise ValueError.
#pragma once

#include <pybind11/pybind11.h>

#include "store/table_policy.h"

namespace recdev::python {

store::TablePolicyConfig policy_from_dict(const pybind11::dict& keywords);
pybind11::dict policy_to_dict(const store::TablePolicyConfig& config);

}  // namespace recdev::python
