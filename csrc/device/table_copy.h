#pragma once
// Whole-table copies (copy_, load_state_dict, clone of a table): the destination becomes a copy of
// the source's table in time proportional to its materialized rows, never num_rows dense rows.

#include <ATen/core/Tensor.h>

namespace recdev::device {

// dst.copy_(src) when both are whole tables (offset 0, contiguous, covering their storage, no conjugate
// or negative bit) of the same dtype, shape and row width: dst becomes a copy of src's table — init
// rule, init stream, rows with their optimizer state, optimizer and step — installed at once. Returns
// false, having done nothing, for any other pair.
bool copy_whole_table(const at::Tensor& src, const at::Tensor& dst);

}  // namespace recdev::device
