#pragma once
// The Python bindings of the store API on recdev tables (torch_recdev.ops and
// torch_recdev.optim call them): named tables, row reads and writes by key,
// init rules, updates through the fused optimizer, checkpoints.

#include <torch/csrc/utils/pybind.h>

namespace recdev::python {

void bind_table_api(py::module_& m);

}  // namespace recdev::python
