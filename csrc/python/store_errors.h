// The translation of store::StoreError into Python exceptions for one extension module, which gets
// its own StoreFullError (store_errors.cpp has the mapping).
#pragma once

#include <pybind11/pybind11.h>

namespace recdev::python {

// Global: StoreErrors reaching Python through any pybind11 function (torch's own, which call into
// recdev, included) are translated; _C's. Local: only m's functions' (the test module, which holds a
// second copy of the store whose errors must not become _C's exceptions, nor _C's its).
enum class ErrorScope { Global, Local };

// Defines m.StoreFullError and translates StoreErrors as `scope` says.
void bind_store_errors(pybind11::module_& m, ErrorScope scope);

}  // namespace recdev::python
