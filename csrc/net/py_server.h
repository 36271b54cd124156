// The Python binding of the server: a `_server` submodule of the extension module that calls bind(),
// used by the recdev-server command (torch_recdev/server.py). The only file of csrc/net that
// includes pybind11.
#pragma once

#include <pybind11/pybind11.h>

namespace recdev::net {

void bind(pybind11::module_& m);

}  // namespace recdev::net
