#include "python/table_policy_binding.h"

#include <string>

namespace py = pybind11;

namespace recdev::python {

using namespace recdev::store;  // the store types these bindings expose
namespace {

EvictKind parse_evict(const py::handle& value) {
  if (value.is_none()) return EvictKind::None;
  const std::string name = py::str(value);
  if (name == "lru") return EvictKind::Lru;
  if (name == "lfu") return EvictKind::Lfu;
  if (name == "ttl") return EvictKind::Ttl;
  throw py::value_error("unknown evict policy '" + name + "'; choose 'lru', 'lfu', 'ttl' or None");
}

template <class T>
T non_negative(const py::handle& value, const std::string& key) {
  if (value.is_none()) return T{0};
  const auto number = value.cast<long long>();
  if (number < 0) throw py::value_error(key + " must be >= 0; got " + std::to_string(number));
  return T(number);
}

}  // namespace

TablePolicyConfig policy_from_dict(const py::dict& keywords) {
  TablePolicyConfig config;
  for (const auto& [key_object, value] : keywords) {
    const std::string key = py::str(key_object);
    if (key == "max_rows") config.max_rows = non_negative<uint64_t>(value, key);
    else if (key == "max_bytes") config.max_bytes = non_negative<uint64_t>(value, key);
    else if (key == "evict") config.evict = parse_evict(value);
    else if (key == "half_life") config.half_life = value.cast<double>();
    else if (key == "ttl_steps") config.ttl_steps = non_negative<uint64_t>(value, key);
    else if (key == "ttl_seconds") config.ttl_seconds = value.is_none() ? 0.0 : value.cast<double>();
    else if (key == "admit_after") config.admit_after = non_negative<uint32_t>(value, key);
    else if (key == "sketch_width") config.sketch_width = non_negative<uint32_t>(value, key);
    else if (key == "spill") config.spill = value.cast<bool>();
    else if (key == "max_disk_bytes") config.max_disk_bytes = non_negative<uint64_t>(value, key);
    else throw py::value_error("unknown table policy key '" + key + "'");
  }
  return config;
}

py::dict policy_to_dict(const TablePolicyConfig& config) {
  py::dict out;
  out["max_rows"] = config.max_rows != 0 ? py::object(py::int_(config.max_rows)) : py::none();
  out["max_bytes"] = config.max_bytes != 0 ? py::object(py::int_(config.max_bytes)) : py::none();
  out["evict"] = config.evict != EvictKind::None ? py::object(py::str(evict_name(config.evict))) : py::none();
  out["half_life"] = config.half_life;
  out["ttl_steps"] = config.ttl_steps != 0 ? py::object(py::int_(config.ttl_steps)) : py::none();
  out["ttl_seconds"] = config.ttl_seconds != 0 ? py::object(py::float_(config.ttl_seconds)) : py::none();
  out["admit_after"] = config.admit_after;
  out["sketch_width"] = config.sketch_width;
  out["spill"] = config.spill;
  out["max_disk_bytes"] = config.max_disk_bytes != 0 ? py::object(py::int_(config.max_disk_bytes)) : py::none();
  return out;
}

}  // namespace recdev::python
