#pragma once
// Tables in torch.save / torch.load and in load_state_dict (docs/tables.md, "Saving and loading"):
// a table travels as its snapshot — the store's header (shape, init rule, init stream, optimizer
// and step) and its materialized rows with their optimizer state — never as num_rows dense rows.

#include <torch/csrc/utils/pybind.h>

namespace recdev::python {

// _table_snapshot (torch.save) and _restore_table (torch.load).
void bind_table_serialization(py::module_& m);

}  // namespace recdev::python
