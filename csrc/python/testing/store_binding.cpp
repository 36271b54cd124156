// The `_store` binding of the store engine (csrc/store knows nothing of Python), for tests and
// benchmarks only: the test module torch_recdev._testing holds it, never _C. Table operations release
// the GIL, so Python threads can drive the store concurrently. StoreErrors become Python exceptions as
// store_errors.h maps them.
#include "python/testing/store_binding.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <string>
#include <vector>

#include "python/store_errors.h"
#include "python/table_policy_binding.h"
#include "store/checkpoint.h"
#include "store/checkpoint_versions.h"
#include "store/chunk_pool.h"
#include "store/crc32c.h"
#include "store/disk_dir.h"
#include "store/errors.h"
#include "store/init_rule.h"
#include "store/optimizer.h"
#include "store/philox.h"
#include "store/store.h"
#include "store/table.h"

namespace py = pybind11;

namespace recdev::python {

using namespace recdev::store;  // the store types these bindings expose
namespace {

constexpr auto kArrayFlags = py::array::c_style | py::array::forcecast;
using IdArray = py::array_t<uint64_t, kArrayFlags>;
using OffsetArray = py::array_t<int64_t, kArrayFlags>;
using FloatArray = py::array_t<float, kArrayFlags>;

std::string fspath(const py::object& path) { return py::str(py::module_::import("os").attr("fspath")(path)); }

const uint64_t* id_data(const IdArray& ids) {
  if (ids.ndim() != 1) throw py::value_error("ids must be a 1-D array");
  return ids.data();
}

// A C-contiguous view of any object with the buffer protocol (bytes, bytearray, numpy arrays, ...).
class ContiguousBytes {
 public:
  explicit ContiguousBytes(const py::handle& object) {
    if (PyObject_GetBuffer(object.ptr(), &view_, PyBUF_C_CONTIGUOUS) != 0) throw py::error_already_set();
  }
  ~ContiguousBytes() { PyBuffer_Release(&view_); }
  ContiguousBytes(const ContiguousBytes&) = delete;
  ContiguousBytes& operator=(const ContiguousBytes&) = delete;
  const void* data() const { return view_.buf; }
  uint64_t size() const { return uint64_t(view_.len); }

 private:
  Py_buffer view_;
};

// The rows of ids read by `read` (Table::gather or Table::peek), as an [n, dim] array.
template <typename Read>
py::array_t<float> read_rows(const Table& table, const IdArray& ids, Read read) {
  const uint64_t* id_ptr = id_data(ids);
  const size_t n = size_t(ids.size());
  const uint32_t dim = table.config().row_words;
  py::array_t<float> out({py::ssize_t(n), py::ssize_t(dim)});
  float* out_ptr = out.mutable_data();
  py::gil_scoped_release release;
  read(id_ptr, n, out_ptr);
  return out;
}

// The shapes of gather_pooled's and update_pooled's bag arguments.
struct BagArrays {
  size_t num_bags;
  const float* weights;  // or null
};

BagArrays bag_arrays(const IdArray& ids, const OffsetArray& offsets,
                     const std::optional<FloatArray>& per_sample_weights, bool include_last_offset) {
  if (offsets.ndim() != 1) throw py::value_error("offsets must be a 1-D array");
  if (include_last_offset && offsets.size() == 0) {
    throw py::value_error("include_last_offset needs at least one offset");
  }
  const float* weights = nullptr;
  if (per_sample_weights) {
    if (per_sample_weights->ndim() != 1 || per_sample_weights->size() != ids.size()) {
      throw py::value_error("per_sample_weights must be a 1-D array with one weight per id");
    }
    weights = per_sample_weights->data();
  }
  return {size_t(offsets.size()) - (include_last_offset ? 1 : 0), weights};
}

py::array_t<float> gather(Table& table, const IdArray& ids) {
  return read_rows(table, ids, [&](const uint64_t* id_ptr, size_t n, float* out) { table.gather(id_ptr, n, out); });
}

py::array_t<float> peek(const Table& table, const IdArray& ids) {
  return read_rows(table, ids, [&](const uint64_t* id_ptr, size_t n, float* out) { table.peek(id_ptr, n, out); });
}

py::tuple gather_pooled(Table& table, const IdArray& ids, const OffsetArray& offsets, PoolingMode mode,
                        const std::optional<FloatArray>& per_sample_weights, bool include_last_offset,
                        int64_t padding_idx) {
  const uint64_t* id_ptr = id_data(ids);
  const size_t n = size_t(ids.size());
  const auto [num_bags, weights] = bag_arrays(ids, offsets, per_sample_weights, include_last_offset);
  const uint32_t dim = table.config().row_words;
  py::array_t<float> out({py::ssize_t(num_bags), py::ssize_t(dim)});
  py::object max_positions = py::none();
  int64_t* positions_ptr = nullptr;
  if (mode == PoolingMode::Max) {
    py::array_t<int64_t> positions({py::ssize_t(num_bags), py::ssize_t(dim)});
    positions_ptr = positions.mutable_data();
    max_positions = positions;
  }
  float* out_ptr = out.mutable_data();
  const int64_t* offset_ptr = offsets.data();
  {
    py::gil_scoped_release release;
    table.gather_pooled(id_ptr, n, offset_ptr, num_bags, mode, weights, include_last_offset, padding_idx, out_ptr,
                        positions_ptr);
  }
  return py::make_tuple(out, max_positions);
}

void write(Table& table, const IdArray& ids, const FloatArray& rows) {
  const uint64_t* id_ptr = id_data(ids);
  const size_t n = size_t(ids.size());
  const uint32_t dim = table.config().row_words;
  if (rows.ndim() != 2 || size_t(rows.shape(0)) != n || size_t(rows.shape(1)) != dim) {
    throw py::value_error("rows must have shape (" + std::to_string(n) + ", " + std::to_string(dim) + ")");
  }
  const float* rows_ptr = rows.data();
  py::gil_scoped_release release;
  table.write(id_ptr, n, rows_ptr);
}

py::array_t<uint8_t> read_bytes(const Table& table, uint64_t byte_offset, uint64_t nbytes) {
  table.check_byte_range(byte_offset, nbytes);  // before allocating the output
  py::array_t<uint8_t> out{py::ssize_t(nbytes)};
  void* out_ptr = out.mutable_data();
  py::gil_scoped_release release;
  table.read_bytes(byte_offset, nbytes, out_ptr);
  return out;
}

void write_bytes(Table& table, uint64_t byte_offset, const py::object& data) {
  const ContiguousBytes bytes(data);
  py::gil_scoped_release release;
  table.write_bytes(byte_offset, bytes.size(), bytes.data());
}

py::array_t<bool> exists(const Table& table, const IdArray& ids) {
  const uint64_t* id_ptr = id_data(ids);
  const size_t n = size_t(ids.size());
  py::array_t<bool> out{py::ssize_t(n)};
  auto* out_ptr = reinterpret_cast<uint8_t*>(out.mutable_data());
  py::gil_scoped_release release;
  table.exists(id_ptr, n, out_ptr);
  return out;
}

void erase(Table& table, const IdArray& ids) {
  const uint64_t* id_ptr = id_data(ids);
  const size_t n = size_t(ids.size());
  py::gil_scoped_release release;
  table.erase(id_ptr, n);
}

void update(Table& table, const IdArray& ids, const FloatArray& grads) {
  const uint64_t* id_ptr = id_data(ids);
  const size_t n = size_t(ids.size());
  const uint32_t dim = table.config().row_words;
  if (grads.ndim() != 2 || size_t(grads.shape(0)) != n || size_t(grads.shape(1)) != dim) {
    std::string shape = "(";
    for (py::ssize_t axis = 0; axis < grads.ndim(); ++axis) {
      shape += (axis ? ", " : "") + std::to_string(grads.shape(axis));
    }
    shape += grads.ndim() == 1 ? ",)" : ")";
    throw py::value_error("grads must have shape (" + std::to_string(n) + ", " + std::to_string(dim) +
                          ") — one row of dim floats per id — but has shape " + shape);
  }
  const float* grads_ptr = grads.data();
  py::gil_scoped_release release;
  table.update(id_ptr, n, grads_ptr);
}

void update_pooled(Table& table, const IdArray& ids, const OffsetArray& offsets, const FloatArray& bag_grads,
                   PoolingMode mode, const std::optional<FloatArray>& per_sample_weights, bool include_last_offset,
                   int64_t padding_idx) {
  const uint64_t* id_ptr = id_data(ids);
  const size_t n = size_t(ids.size());
  const auto [num_bags, weights] = bag_arrays(ids, offsets, per_sample_weights, include_last_offset);
  const uint32_t dim = table.config().row_words;
  if (bag_grads.ndim() != 2 || size_t(bag_grads.shape(0)) != num_bags || size_t(bag_grads.shape(1)) != dim) {
    throw py::value_error("bag_grads must have shape (" + std::to_string(num_bags) + ", " + std::to_string(dim) +
                          ") — one row of dim floats per bag");
  }
  const int64_t* offset_ptr = offsets.data();
  const float* grads_ptr = bag_grads.data();
  py::gil_scoped_release release;
  table.update_pooled(id_ptr, n, offset_ptr, num_bags, mode, weights, include_last_offset, padding_idx, grads_ptr);
}

py::array_t<float> gather_state(const Table& table, const IdArray& ids) {
  const uint64_t* id_ptr = id_data(ids);
  const size_t n = size_t(ids.size());
  std::vector<float> state;
  uint32_t width;
  {
    py::gil_scoped_release release;
    width = table.gather_state(id_ptr, n, state);
  }
  py::array_t<float> out({py::ssize_t(n), py::ssize_t(width)});
  if (!state.empty()) std::memcpy(out.mutable_data(), state.data(), state.size() * sizeof(float));
  return out;
}

py::array_t<float> init_row(const InitRule& rule, uint64_t table_id, uint64_t row_id, uint32_t dim, uint64_t num_rows) {
  validate_init_rule(rule);
  py::array_t<float> out{py::ssize_t{dim}};
  fill_row(rule, table_id, row_id, dim, num_rows, out.mutable_data());
  return out;
}

void bind_init_rules(py::module_& s) {
  py::enum_<InitKind>(s, "InitKind")
      .value("Zero", InitKind::Zero)
      .value("Constant", InitKind::Constant)
      .value("Normal", InitKind::Normal)
      .value("Uniform", InitKind::Uniform)
      .value("Xavier", InitKind::Xavier);

  py::class_<InitRule>(s, "InitRule")
      .def(py::init([](InitKind kind, double a, double b, uint64_t seed) { return InitRule{kind, a, b, seed}; }),
           py::arg("kind") = InitKind::Zero, py::arg("a") = 0.0, py::arg("b") = 0.0, py::arg("seed") = 0)
      .def_static("zero", [] { return InitRule{InitKind::Zero, 0, 0, 0}; })
      .def_static(
          "constant", [](double value) { return InitRule{InitKind::Constant, value, 0, 0}; }, py::arg("value"))
      .def_static(
          "normal", [](double mean, double std, uint64_t seed) { return InitRule{InitKind::Normal, mean, std, seed}; },
          py::arg("mean"), py::arg("std"), py::arg("seed") = 0)
      .def_static(
          "uniform",
          [](double lower, double upper, uint64_t seed) { return InitRule{InitKind::Uniform, lower, upper, seed}; },
          py::arg("lower"), py::arg("upper"), py::arg("seed") = 0)
      .def_static(
          "xavier", [](uint64_t seed) { return InitRule{InitKind::Xavier, 0, 0, seed}; }, py::arg("seed") = 0)
      .def_readwrite("kind", &InitRule::kind)
      .def_readwrite("a", &InitRule::a)
      .def_readwrite("b", &InitRule::b)
      .def_readwrite("seed", &InitRule::seed)
      .def("__eq__", [](const InitRule& lhs, const InitRule& rhs) { return lhs == rhs; })
      .def("__repr__", [](const InitRule& rule) { return describe(rule); });

  s.def("init_row", &init_row, py::arg("rule"), py::arg("table_id"), py::arg("row_id"), py::arg("dim"),
        py::arg("num_rows"), "The init value of one row, as the table computes it.");
  s.def(
      "philox4x32_10", [](const PhiloxCounter& counter, const PhiloxKey& key) { return philox4x32_10(counter, key); },
      py::arg("counter"), py::arg("key"));
}

void bind_optimizers(py::module_& s) {
  py::enum_<OptimizerKind>(s, "OptimizerKind")
      .value("None_", OptimizerKind::None)
      .value("SGD", OptimizerKind::SGD)
      .value("Adagrad", OptimizerKind::Adagrad)
      .value("RowWiseAdagrad", OptimizerKind::RowWiseAdagrad)
      .value("Adam", OptimizerKind::Adam);
  // OptimizerKind::None is None_ in Python, where None is a keyword.

  const OptimizerConfig defaults;
  py::class_<OptimizerConfig>(s, "OptimizerConfig",
                              "A table's fused optimizer (see csrc/store/optimizer.h for the exact rules).")
      .def(py::init([](OptimizerKind kind, double lr, double weight_decay, double eps, double lr_decay,
                       double initial_accumulator_value, double beta1, double beta2) {
             return OptimizerConfig{kind, lr, weight_decay, eps, lr_decay, initial_accumulator_value, beta1, beta2};
           }),
           py::arg("kind") = OptimizerKind::None, py::arg("lr") = defaults.lr,
           py::arg("weight_decay") = defaults.weight_decay, py::arg("eps") = defaults.eps,
           py::arg("lr_decay") = defaults.lr_decay,
           py::arg("initial_accumulator_value") = defaults.initial_accumulator_value, py::arg("beta1") = defaults.beta1,
           py::arg("beta2") = defaults.beta2)
      .def_static(
          "sgd",
          [](double lr, double weight_decay) {
            OptimizerConfig c;
            c.kind = OptimizerKind::SGD;
            c.lr = lr;
            c.weight_decay = weight_decay;
            return c;
          },
          py::arg("lr"), py::arg("weight_decay") = 0.0, "torch.optim.SGD without momentum.")
      .def_static(
          "adagrad",
          [](double lr, double lr_decay, double weight_decay, double initial_accumulator_value, double eps) {
            OptimizerConfig c;
            c.kind = OptimizerKind::Adagrad;
            c.lr = lr;
            c.lr_decay = lr_decay;
            c.weight_decay = weight_decay;
            c.initial_accumulator_value = initial_accumulator_value;
            c.eps = eps;
            return c;
          },
          py::arg("lr") = 0.01, py::arg("lr_decay") = 0.0, py::arg("weight_decay") = 0.0,
          py::arg("initial_accumulator_value") = 0.0, py::arg("eps") = 1e-10,
          "torch.optim.Adagrad with sparse gradients (torch's defaults).")
      .def_static(
          "rowwise_adagrad",
          [](double lr, double eps, double weight_decay) {
            OptimizerConfig c;
            c.kind = OptimizerKind::RowWiseAdagrad;
            c.lr = lr;
            c.eps = eps;
            c.weight_decay = weight_decay;
            return c;
          },
          py::arg("lr") = 0.01, py::arg("eps") = 1e-10, py::arg("weight_decay") = 0.0,
          "fbgemm's EXACT_ROWWISE_ADAGRAD (weight_decay_mode L2).")
      .def_static(
          "adam",
          [](double lr, double beta1, double beta2, double eps) {
            OptimizerConfig c;
            c.kind = OptimizerKind::Adam;
            c.lr = lr;
            c.beta1 = beta1;
            c.beta2 = beta2;
            c.eps = eps;
            return c;
          },
          py::arg("lr") = 1e-3, py::arg("beta1") = 0.9, py::arg("beta2") = 0.999, py::arg("eps") = 1e-8,
          "torch.optim.SparseAdam (torch's defaults).")
      .def_readwrite("kind", &OptimizerConfig::kind)
      .def_readwrite("lr", &OptimizerConfig::lr)
      .def_readwrite("weight_decay", &OptimizerConfig::weight_decay)
      .def_readwrite("eps", &OptimizerConfig::eps)
      .def_readwrite("lr_decay", &OptimizerConfig::lr_decay)
      .def_readwrite("initial_accumulator_value", &OptimizerConfig::initial_accumulator_value)
      .def_readwrite("beta1", &OptimizerConfig::beta1)
      .def_readwrite("beta2", &OptimizerConfig::beta2)
      .def_readwrite("stochastic_rounding", &OptimizerConfig::stochastic_rounding)
      .def_readwrite("rounding_seed", &OptimizerConfig::rounding_seed)
      .def("__eq__", [](const OptimizerConfig& lhs, const OptimizerConfig& rhs) { return lhs == rhs; })
      .def("__repr__", [](const OptimizerConfig& config) { return describe(config); });

  s.def("optimizer_state_elements", &optimizer_state_elements, py::arg("kind"), py::arg("elements"));
  s.def("pooled_chunk_slack_bytes", &pooled_chunk_slack_bytes,
        "Bytes the process-wide chunk pool holds beyond the chunks tables use (chunk_pool.h).");
  s.def("cached_chunk_region_bytes", &cached_chunk_region_bytes,
        "Bytes of empty 2 MiB regions the chunk pool keeps for reuse (RECDEV_STORE_CACHE_BYTES caps it).");
  s.def("release_cached_chunk_regions", &release_cached_chunk_regions,
        "Gives the chunk pool's empty regions back to the system.");
  s.def("validate_optimizer", &validate_optimizer, py::arg("config"));
  s.def("set_disk_dir", &set_disk_dir, py::arg("path"),
        "The disk tier's directory (store/disk_dir.h); returns how many dead processes' directories it removed.");
  // crc32c(data, crc=0) continues the running checksum crc over data; likewise the portable version.
  for (const auto& [name, update] :
       {std::pair{"crc32c", &crc32c_update}, {"crc32c_portable", &crc32c_update_portable}}) {
    s.def(
        name,
        [update = update](py::bytes data, uint32_t crc) {
          const std::string bytes = data;
          return update(crc, bytes.data(), bytes.size());
        },
        py::arg("data"), py::arg("crc") = 0);
  }
  s.def("crc32c_kernel", &crc32c_kernel, "Which CRC-32C version runs on this CPU (store/crc32c.h).");
}

void bind_tables(py::module_& s) {
  py::class_<TableConfig>(s, "TableConfig")
      .def(py::init([](uint64_t num_rows, uint32_t dim, uint32_t state_words, const InitRule& init) {
             return TableConfig{num_rows, dim, state_words, init};
           }),
           py::arg("num_rows"), py::arg("row_words"), py::arg("state_words") = 0, py::arg("init") = InitRule{})
      .def_readwrite("num_rows", &TableConfig::num_rows)
      .def_readwrite("row_words", &TableConfig::row_words)
      .def_readwrite("state_words", &TableConfig::state_words)
      .def_readwrite("init", &TableConfig::init)
      .def("__eq__", [](const TableConfig& lhs, const TableConfig& rhs) { return lhs == rhs; })
      .def("__repr__", [](const TableConfig& config) { return describe(config); });

  py::enum_<PoolingMode>(s, "PoolingMode")
      .value("Sum", PoolingMode::Sum)
      .value("Mean", PoolingMode::Mean)
      .value("Max", PoolingMode::Max);

  py::class_<TableStats>(s, "TableStats")
      .def_readonly("num_rows", &TableStats::num_rows)
      .def_readonly("row_words", &TableStats::row_words)
      .def_readonly("rows", &TableStats::rows)
      .def_readonly("bytes", &TableStats::bytes)
      .def_readonly("reads", &TableStats::reads)
      .def_readonly("writes", &TableStats::writes)
      .def_readonly("updates", &TableStats::updates)
      .def_readonly("evicted", &TableStats::evicted)
      .def_readonly("admitted", &TableStats::admitted)
      .def_readonly("pending", &TableStats::pending)
      .def_readonly("rows_in_memory", &TableStats::rows_in_memory)
      .def_readonly("rows_on_disk", &TableStats::rows_on_disk)
      .def_readonly("disk_bytes", &TableStats::disk_bytes)
      .def_readonly("disk_live_bytes", &TableStats::disk_live_bytes)
      .def_readonly("disk_reads", &TableStats::disk_reads)
      .def_readonly("disk_read_ops", &TableStats::disk_read_ops)
      .def_readonly("disk_writes", &TableStats::disk_writes)
      .def("__repr__", [](const TableStats& stats) {
        return "TableStats(num_rows=" + std::to_string(stats.num_rows) +
               ", row_words=" + std::to_string(stats.row_words) + ", rows=" + std::to_string(stats.rows) +
               ", bytes=" + std::to_string(stats.bytes) + ", reads=" + std::to_string(stats.reads) +
               ", writes=" + std::to_string(stats.writes) + ", updates=" + std::to_string(stats.updates) + ")";
      });

  py::class_<TablePolicyState>(s, "TablePolicyState",
                               "A table's policy with its rows' touch metadata, clocks and sketch (opaque).")
      .def_property_readonly("rows", [](const TablePolicyState& state) { return state.touches.size(); });

  py::class_<Table, std::shared_ptr<Table>>(s, "Table")
      .def_property_readonly("id", &Table::id)
      .def_property_readonly("config", &Table::config)
      .def_property_readonly("init_stream", &Table::init_stream)
      .def("set_init", &Table::set_init, py::arg("rule"), py::call_guard<py::gil_scoped_release>())
      .def("gather", &gather, py::arg("ids"))
      .def("peek", &peek, py::arg("ids"))
      .def("gather_pooled", &gather_pooled, py::arg("ids"), py::arg("offsets"), py::arg("mode") = PoolingMode::Sum,
           py::arg("per_sample_weights") = py::none(), py::arg("include_last_offset") = false,
           py::arg("padding_idx") = -1,
           "Returns (pooled [num_bags, dim], max_positions [num_bags, dim] for Max else None).")
      .def("write", &write, py::arg("ids"), py::arg("rows"))
      .def("read_bytes", &read_bytes, py::arg("byte_offset"), py::arg("nbytes"))
      .def("write_bytes", &write_bytes, py::arg("byte_offset"), py::arg("data"))
      .def("exists", &exists, py::arg("ids"))
      .def("erase", &erase, py::arg("ids"))
      .def("stats", &Table::stats)
      .def("direct_index_bytes", &Table::direct_index_bytes)
      .def("set_optimizer", &Table::set_optimizer, py::arg("config"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("optimizer", &Table::optimizer)
      .def("set_learning_rate", &Table::set_learning_rate, py::arg("lr"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("optimizer_step", &Table::optimizer_step)
      .def("set_optimizer_step", &Table::set_optimizer_step, py::arg("step"), py::call_guard<py::gil_scoped_release>())
      .def("update", &update, py::arg("ids"), py::arg("grads"),
           "One optimizer step: grads is (len(ids), dim); duplicate ids are summed first.")
      .def("update_pooled", &update_pooled, py::arg("ids"), py::arg("offsets"), py::arg("bag_grads"),
           py::arg("mode") = PoolingMode::Sum, py::arg("per_sample_weights") = py::none(),
           py::arg("include_last_offset") = false, py::arg("padding_idx") = -1,
           "One optimizer step from the gradient of gather_pooled's output: bag_grads is (num_bags, dim); "
           "each id gets its bag's gradient as the mode scaled it (Sum, Mean).")
      .def(
          "set_policy",
          [](Table& table, const py::kwargs& keywords) {
            const TablePolicyConfig config = policy_from_dict(keywords);
            py::gil_scoped_release release;
            table.set_policy(config);
          },
          "Budget, eviction and admission (keywords of python/table_policy_binding.h); none removes it.")
      .def_property_readonly("policy", [](const Table& table) { return policy_to_dict(table.policy()); })
      .def("policy_state", &Table::policy_state, py::call_guard<py::gil_scoped_release>(),
           "The policy and the touch metadata of the rows held, or None without a policy.")
      .def("restore_policy_state", &Table::restore_policy_state, py::arg("state"),
           py::call_guard<py::gil_scoped_release>(),
           "Sets the policy with the metadata of policy_state() for the rows the table holds now.")
      .def("gather_state", &gather_state, py::arg("ids"),
           "The optimizer state of the rows, (len(ids), state_words); does not materialize.");

  py::class_<Store, std::shared_ptr<Store>>(s, "Store")
      .def(py::init<>())
      .def("create_table", &Store::create_table, py::arg("config"), py::arg("init_stream") = py::none())
      .def("create_named_table", &Store::create_named_table, py::arg("name"), py::arg("config"))
      .def("table", &Store::table, py::arg("id"))
      .def("free_table", &Store::free_table, py::arg("id"))
      .def("find", &Store::find, py::arg("name"))
      .def("list", [](const Store& store) {
        std::vector<std::pair<uint64_t, std::string>> listed;
        for (const TableInfo& info : store.list()) listed.emplace_back(info.id, info.name);
        return listed;
      });
}

void bind_checkpoints(py::module_& s) {
  py::class_<CheckpointTableInfo>(s, "CheckpointTableInfo")
      .def_readonly("name", &CheckpointTableInfo::name)
      .def_readonly("config", &CheckpointTableInfo::config)
      .def_readonly("init_stream", &CheckpointTableInfo::init_stream)
      .def_readonly("optimizer", &CheckpointTableInfo::optimizer)
      .def_readonly("optimizer_step", &CheckpointTableInfo::optimizer_step)
      .def_readonly("row_count", &CheckpointTableInfo::row_count)
      .def_property_readonly(
          "policy",
          [](const CheckpointTableInfo& info) -> py::object {
            if (!info.policy) return py::none();
            return policy_to_dict(info.policy->config);
          },
          "The saved budget policy (as Table.policy), or None (no policy, or a file older than format 4).")
      .def_property_readonly(
          "policy_rows",
          [](const CheckpointTableInfo& info) -> uint64_t { return info.policy ? info.policy->touches.size() : 0; },
          "The rows whose touch metadata the file holds.");

  s.def(
      "save_table",
      [](const py::object& path, const Table& table, const std::string& name) {
        const std::string file = fspath(path);
        py::gil_scoped_release release;
        save_table(file, table, name);
      },
      py::arg("path"), py::arg("table"), py::arg("name") = std::string());
  s.def(
      "load_table",
      [](const py::object& path, Table& table) {
        const std::string file = fspath(path);
        py::gil_scoped_release release;
        load_table(file, table);
      },
      py::arg("path"), py::arg("table"));
  s.def(
      "save_store",
      [](const py::object& path, const Store& store) {
        const std::string file = fspath(path);
        py::gil_scoped_release release;
        save_store(file, store);
      },
      py::arg("path"), py::arg("store"));
  s.def(
      "load_store",
      [](const py::object& path, Store& store) {
        const std::string file = fspath(path);
        py::gil_scoped_release release;
        return load_store(file, store);
      },
      py::arg("path"), py::arg("store"));
  s.def(
      "read_checkpoint_info",
      [](const py::object& path) {
        const std::string file = fspath(path);
        py::gil_scoped_release release;
        return read_checkpoint_info(file);
      },
      py::arg("path"));
  s.def(
      "restorable_versions",
      [](const py::object& directory) {
        const std::string path = fspath(directory);
        py::gil_scoped_release release;
        return restorable_versions(path);
      },
      py::arg("directory"), "The versions of a directory of incremental checkpoints that a restore reaches.");
  s.def(
      "read_version_info",
      [](const py::object& directory, uint64_t version) {
        const std::string path = fspath(directory);
        py::gil_scoped_release release;
        std::vector<CheckpointTableInfo> infos;
        for (StagedTable& table : read_version(path, version)) infos.push_back(std::move(table.info));
        return infos;
      },
      py::arg("directory"), py::arg("version"),
      "A version's tables (its base and deltas replayed and verified), as read_checkpoint_info reports a file's.");
}

}  // namespace

void bind_store(py::module_& m) {
  py::module_ s = m.def_submodule("_store", "The recdev parameter-server store engine (test binding).");
  bind_store_errors(s, ErrorScope::Local);
  bind_init_rules(s);
  bind_optimizers(s);
  bind_tables(s);
  bind_checkpoints(s);
}

}  // namespace recdev::python
