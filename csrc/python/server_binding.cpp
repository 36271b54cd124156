// StoreErrors reach Python through _C's translator (store_errors.h).
#include "python/server_binding.h"

#include <pybind11/stl.h>

#include <chrono>

#include "net/client/connection.h"

namespace py = pybind11;

namespace recdev::python {

using namespace recdev::net;  // the client these bindings expose

void bind_server_stats(py::module_& m) {
  m.def(
      "_server_stats",
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
        py::list tables;
        for (const TableCounters& table : stats.table_counters) {
          py::dict entry;
          entry["table_id"] = table.table_id;
          entry["name"] = table.name;
          entry["rows"] = table.rows;
          entry["evicted"] = table.evicted;
          entry["admitted"] = table.admitted;
          entry["pending"] = table.pending;
          entry["max_rows"] = table.policy.max_rows;
          entry["max_bytes"] = table.policy.max_bytes;
          entry["spill"] = table.policy.spill;
          entry["rows_on_disk"] = table.rows_on_disk;
          entry["disk_bytes"] = table.disk_bytes;
          entry["disk_reads"] = table.disk_reads;
          entry["disk_writes"] = table.disk_writes;
          tables.append(entry);
        }
        d["table_counters"] = tables;
        d["staged_steps"] = stats.staged_steps;
        d["staged_bytes"] = stats.staged_bytes;
        // Per opcode answered (by name): latency_buckets[k] counts the requests that took at most
        // latency_bucket_bounds_us[k] microseconds and more than the bound before; the last, the rest.
        py::dict opcodes;
        for (const OpcodeCounters& counters : stats.opcodes) {
          py::dict entry;
          entry["requests"] = counters.requests();
          entry["errors"] = counters.errors;
          entry["bytes_received"] = counters.bytes_received;
          entry["bytes_sent"] = counters.bytes_sent;
          entry["rows"] = counters.rows;
          entry["latency_seconds"] = double(counters.latency_ns) / 1e9;
          entry["latency_buckets"] =
              std::vector<uint64_t>(counters.latency_buckets, counters.latency_buckets + kLatencyBuckets);
          opcodes[opcode_name(uint8_t(counters.opcode))] = entry;
        }
        d["opcodes"] = opcodes;
        std::vector<uint64_t> bounds;
        for (size_t bucket = 0; bucket + 1 < kLatencyBuckets; ++bucket)
          bounds.push_back(latency_bucket_bound_us(bucket));
        d["latency_bucket_bounds_us"] = bounds;
        // A serving shard's (--serve): the directory, the version served (0: none yet) and its age.
        d["serving_dir"] = stats.serving_dir;
        d["serving_version"] = stats.serving_version;
        if (stats.serving_version != 0) {
          const int64_t now_ms =
              std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
                  .count();
          d["serving_age_seconds"] = double(now_ms - stats.serving_written_unix_ms) / 1000.0;
        }
        return d;
      },
      py::arg("address"), py::arg("token") = "", py::arg("timeout") = 10.0, "The STATS of one server, as a dict.");
}

}  // namespace recdev::python
