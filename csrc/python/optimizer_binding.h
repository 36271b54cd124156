// _C.OptimizerConfig: a fused optimizer's configuration (store::OptimizerConfig) with typed fields, as
// torch_recdev.optim attaches it, init_embedding_table declares it and share_tables reads it back.
#pragma once

#include <pybind11/pybind11.h>

namespace recdev::python {

void bind_optimizer_config(pybind11::module_& m);

}  // namespace recdev::python
