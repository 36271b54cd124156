// run_server blocks with the GIL released until SIGTERM or SIGINT; StoreErrors reach Python through
// the store binding's translator (csrc/store/py_store.cpp).
#include "py_server.h"

#include <pybind11/stl.h>

#include <chrono>

#include "connection.h"
#include "server.h"
#include "store/task_runner.h"

namespace py = pybind11;

namespace recdev::net {

void bind(py::module_& m) {
  py::module_ s = m.def_submodule("_server", "recdev-server: the shard server and its stats client.");
  s.attr("PROTOCOL_VERSION") = kProtocolVersion;
  s.attr("MAX_PAYLOAD_BYTES") = kMaxPayloadBytes;
  s.def(
      "run_server",
      [](const std::string& listen, uint32_t shard, uint32_t num_shards, const std::string& token, uint64_t max_memory,
         double lease_seconds, const std::string& checkpoint_dir, double checkpoint_every, uint32_t max_connections, double idle_timeout) {
        ServerOptions options;
        options.listen = listen;
        options.service.shard = shard;
        options.service.num_shards = num_shards;
        options.service.token = token;
        options.service.max_memory = max_memory;
        options.service.lease_seconds = lease_seconds;
        options.checkpoint_dir = checkpoint_dir;
        options.checkpoint_every = checkpoint_every;
        options.max_connections = max_connections;
        options.idle_timeout = idle_timeout;
        // Requests run on their connections' threads. PyTorch's OpenMP pool, which the device installs
        // for the store's batches, would give every connection thread a team of its own, spinning
        // after each request on cores the other connections need: back to plain threads per batch.
        store::set_thread_launcher(nullptr);
        py::gil_scoped_release release;
        run_server(options);
      },
      py::arg("listen"), py::arg("shard"), py::arg("num_shards"), py::arg("token") = "", py::arg("max_memory") = 0,
      py::arg("lease_seconds") = 60.0, py::arg("checkpoint_dir") = "", py::arg("checkpoint_every") = 0.0,
      py::arg("max_connections") = 64, py::arg("idle_timeout") = 300.0,
      "Serves one shard until SIGTERM or SIGINT (see docs/server.md).");
  s.def(
      "server_stats",
      [](const std::string& address, const std::string& token, double timeout_seconds) {
        ServerStats stats;
        {
          py::gil_scoped_release release;
          const auto timeout = std::chrono::milliseconds(int64_t(timeout_seconds * 1000));
          Connection connection(address, token, timeout);
          stats = connection.call<ServerStats>(Opcode::Stats, Empty{});
        }
        py::dict d;
        d["shard"] = stats.shard;
        d["num_shards"] = stats.num_shards;
        d["tables"] = stats.tables;
        d["named_tables"] = stats.named_tables;
        d["rows"] = stats.rows;
        d["bytes"] = stats.bytes;
        d["max_memory"] = stats.max_memory;
        d["requests"] = stats.requests;
        d["errors"] = stats.errors;
        d["connections"] = stats.connections;
        d["sessions"] = stats.sessions;
        d["uptime_seconds"] = stats.uptime_seconds;
        return d;
      },
      py::arg("address"), py::arg("token") = "", py::arg("timeout") = 10.0,
      "The STATS of one server, as a dict.");
}

}  // namespace recdev::net
