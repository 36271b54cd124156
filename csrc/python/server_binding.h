// The `_server` submodule: the wire protocol's version and payload cap, and server_stats (a server's
// STATS as a dict), for tests and tooling. The server itself is the native recdev-server (csrc/server).
#pragma once

#include <pybind11/pybind11.h>

namespace recdev::python {

void bind_server(pybind11::module_& m);

}  // namespace recdev::python
