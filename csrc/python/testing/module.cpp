// torch_recdev._testing: bindings for tests and benchmarks only, never part of _C. Built by
// `make test` and `make bench` (build_native.py --testing) from the store's sources without torch:
// the engine alone (`_store`) and the wire protocol's constants (`_server`).
#include <pybind11/pybind11.h>

#include "net/wire/protocol.h"
#include "python/testing/store_binding.h"

PYBIND11_MODULE(_testing, m) {
  m.doc() = "torch_recdev's test bindings: the store engine and the wire protocol's constants.";
  recdev::python::bind_store(m);
  pybind11::module_ server = m.def_submodule("_server", "recdev-server's wire protocol constants.");
  server.attr("PROTOCOL_VERSION") = recdev::net::kProtocolVersion;
  server.attr("MAX_PAYLOAD_BYTES") = recdev::net::kMaxPayloadBytes;
}
