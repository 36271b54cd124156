// The async-op thread's bindings (torch_recdev/pending.py): issuing and running its operations in the
// caller's thread-local state, and waiting for them without holding the interpreter lock; and the
// blocking section the device guard waits in (device/async_ops.h).
#pragma once

#include <pybind11/pybind11.h>

namespace recdev::python {

void bind_async_ops(pybind11::module_& m);

}  // namespace recdev::python
