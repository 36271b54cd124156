#pragma once
// Tables in torch.save / torch.load and in load_state_dict (docs/tables.md, "Saving and loading"):
// a table travels as its snapshot — the store's header (shape, init rule, init stream, optimizer
// and step) and its materialized rows with their optimizer state — never as num_rows dense rows.

#include <torch/extension.h>

namespace recdev::device {

// dst.copy_(src) when both are whole tables (offset 0, contiguous, covering their storage, no conjugate
// or negative bit) of the
// same dtype, shape and row width: dst becomes a copy of src's table — init rule, init stream,
// rows with their optimizer state, optimizer and step — in time proportional to src's
// materialized rows, installed at once. Returns false, having done nothing, for any other pair.
bool copy_whole_table(const at::Tensor& src, const at::Tensor& dst);

// _table_snapshot (torch.save) and _restore_table (torch.load).
void bind_table_serialization(py::module_& m);

} // namespace recdev::device
