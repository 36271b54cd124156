// The Python binding of the store engine: a `_store` submodule of the test module
// (torch_recdev._testing), exposing Table, Store, InitRule and the checkpoint functions on numpy
// arrays, for tests and benchmarks of the engine alone; the PyTorch layers use the C++ API directly.
#pragma once

#include <pybind11/pybind11.h>

namespace recdev::python {

void bind_store(pybind11::module_& m);

}  // namespace recdev::python
