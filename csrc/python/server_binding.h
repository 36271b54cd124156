// _server_stats: a running recdev-server's STATS as a dict (torch_recdev.server_stats). The server
// itself is the native recdev-server (csrc/server).
#pragma once

#include <pybind11/pybind11.h>

namespace recdev::python {

void bind_server_stats(pybind11::module_& m);

}  // namespace recdev::python
