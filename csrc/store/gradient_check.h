// check_update_gradients: the validation Table::update applies before anything changes, for clients
// that must refuse a batch before sending it to several shards (net/remote_store.cpp), so that no
// shard applies a batch another would refuse.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "element_type.h"

namespace recdev::store {

// grads: n rows of `elements` elements of `dtype` (a numeric type). Throws StoreError(InvalidArgument)
// naming the first non-finite gradient in batch order, else the first row whose summed duplicates
// overflow, in the words Table::update uses; `label` names the table.
void check_update_gradients(ElementType dtype, uint32_t elements, const uint64_t* ids, size_t n, const void* grads,
                            const std::string& label);

}  // namespace recdev::store
