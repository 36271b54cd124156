// The torch_recdev._C extension module: the few entry points Python needs that the dispatcher does
// not already expose, StoreFullError, and the stats client of a recdev-server. Test-only bindings live
// in torch_recdev._testing (testing/module.cpp).

#include "device/allocator.h"
#include "device/generator.h"
#include "device/host_block_cache.h"
#include "device/placement.h"
#include "device/table_storage.h"
#include "python/async_ops_binding.h"
#include "python/optimizer_binding.h"
#include "python/server_binding.h"
#include "python/store_errors.h"
#include "python/table_api.h"
#include "python/table_policy_binding.h"
#include "python/table_serialization.h"

#include "store/chunk_pool.h"
#include "store/cpu_features.h"
#include "store/disk_dir.h"
#include "store/memory_accounting.h"
#include "store/table_handle.h"

#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/pybind.h>

namespace recdev::python {

using namespace recdev::device;  // the device entry points these bindings expose

namespace {

py::object default_generator_object(c10::DeviceIndex index) {
  return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(default_generator(index)));
}

PlacementOverride parse_placement(const std::string& name) {
  if (name == "auto") {
    return PlacementOverride::None;
  }
  if (name == "host") {
    return PlacementOverride::Host;
  }
  if (name == "table") {
    return PlacementOverride::Table;
  }
  throw py::value_error("placement must be 'host', 'table' or 'auto'; got '" + name + "'");
}

std::string placement_name(PlacementOverride p) {
  switch (p) {
    case PlacementOverride::Host: return "host";
    case PlacementOverride::Table: return "table";
    case PlacementOverride::None: break;
  }
  return "auto";
}

py::dict table_stats(const at::Tensor& t) {
  TableBlock* block = is_table(t) ? table_block(t.storage()) : nullptr;
  if (block == nullptr) {
    throw py::value_error("table_stats: the tensor is not on recdev table storage (see torch_recdev.is_table)");
  }
  const store::TableStats stats = block->table().stats();
  py::dict d;
  d["num_embeddings"] = t.dim() >= 1 ? t.size(0) : int64_t{1};
  d["embedding_dim"] = t.dim() >= 2 ? t.numel() / std::max<int64_t>(t.size(0), 1) : int64_t{1};
  d["rows"] = stats.rows;
  d["bytes"] = stats.bytes;
  d["row_bytes"] = block->row_bytes;
  // The rows' type in the store: float32, float16, bfloat16, float64, or bytes (any other dtype).
  d["dtype"] = store::element_type_name(block->table().dtype());
  d["table_rows"] = stats.num_rows;
  d["reads"] = stats.reads;
  d["writes"] = stats.writes;
  d["updates"] = stats.updates;
  d["evicted"] = stats.evicted;
  d["admitted"] = stats.admitted;
  d["pending"] = stats.pending;
  d["rows_in_memory"] = stats.rows_in_memory;
  d["rows_on_disk"] = stats.rows_on_disk;
  d["disk_bytes"] = stats.disk_bytes;
  d["disk_live_bytes"] = stats.disk_live_bytes;
  d["disk_reads"] = stats.disk_reads;
  d["disk_read_ops"] = stats.disk_read_ops;
  d["disk_writes"] = stats.disk_writes;
  d["policy"] = policy_to_dict(block->table().policy());
  return d;
}

}  // namespace

}  // namespace recdev::python

PYBIND11_MODULE(_C, m) {
  namespace device = recdev::device;
  namespace python = recdev::python;
  m.doc() = "torch_recdev native extension: the recdev device (PrivateUse1).";
  m.def("_default_generator", &python::default_generator_object, py::arg("index") = 0);
  m.def("_table_min_bytes", &device::table_min_bytes);
  m.def("_set_table_min_bytes", &device::set_table_min_bytes);
  m.def("_max_fallback_bytes", &device::max_fallback_bytes);
  m.def("_set_max_fallback_bytes", &device::set_max_fallback_bytes);
  m.def("_placement", [] { return python::placement_name(device::placement_override()); });
  m.def("_set_placement",
        [](const std::string& name) { device::set_placement_override(python::parse_placement(name)); });
  m.def("_is_table", &device::is_table);
  // Freed memory kept for reuse: host blocks, and the empty regions of the store's chunk pool.
  m.def("_empty_cache", &device::empty_memory_caches);
  // torch.recdev.memory_stats' own keys: its host storage and its tables, apart.
  m.def("_memory_split", [] {
    const recdev::store::MemoryReading reading = recdev::store::read_memory();
    py::dict split;
    for (const auto& [name, scope] :
         {std::pair{"host", recdev::store::kHostMemory}, std::pair{"table", recdev::store::kTableMemory}}) {
      for (const auto& [kind, gauges] :
           {std::pair{"allocated", reading.allocated_bytes}, std::pair{"reserved", reading.reserved_bytes}}) {
        const std::string key = std::string(name) + "_" + kind + "_bytes.";
        split[py::str(key + "current")] = gauges[scope].current;
        split[py::str(key + "peak")] = gauges[scope].peak;
        split[py::str(key + "allocated")] = gauges[scope].allocated;
        split[py::str(key + "freed")] = gauges[scope].freed;
      }
    }
    return split;
  });
  m.def("_memory_cached", [] { return device::cached_host_bytes() + recdev::store::cached_chunk_region_bytes(); });
  m.def("_table_stats", &python::table_stats);
  python::bind_async_ops(m);
  m.def("_set_disk_dir", &recdev::store::set_disk_dir, py::arg("path"));
  m.def("_disk_dir", &recdev::store::disk_dir);
  m.def("_store_kernel_capability", &recdev::store::store_kernel_capability);
  python::bind_optimizer_config(m);
  python::bind_table_api(m);
  python::bind_table_serialization(m);
  python::bind_store_errors(m, python::ErrorScope::Global);
  python::bind_server_stats(m);
}
