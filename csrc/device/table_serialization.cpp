#include "table_serialization.h"

#include "table_storage.h"

#include "store/chunk_pool.h"
#include "store/table_handle.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

namespace recdev::device {

namespace {

// The version of the snapshot dict below; a file with another is refused.
constexpr int64_t kSnapshotFormat = 1;

// Whole, and its bytes are its values: no lazy conjugate or negative bit to resolve while copying.
bool is_whole_table(const at::Tensor& t) {
  return is_table(t) && !t.is_conj() && !t.is_neg() && t.storage_offset() == 0 && t.is_contiguous() &&
      static_cast<uint64_t>(t.numel()) * t.itemsize() == table_block(t.storage())->nbytes;
}

// An uninitialized CPU tensor for a snapshot's rows. From a few MiB on, its memory is a huge-page
// mapping from the store's chunk pool, so that copying the rows in faults 2 MiB at a time rather
// than 4 KiB (snapshot of 10^6 rows of dim 64: 71 ms on the CPU allocator's pages, 36 ms on these).
at::Tensor empty_snapshot_array(at::IntArrayRef sizes, at::ScalarType dtype) {
  const size_t nbytes = static_cast<size_t>(c10::multiply_integers(sizes)) * c10::elementSize(dtype);
  if (nbytes < store::kChunkRegionBytes) {
    return at::empty(sizes, dtype);
  }
  const size_t mapped = (nbytes + store::kChunkRegionBytes - 1) / store::kChunkRegionBytes * store::kChunkRegionBytes;
  std::byte* memory = store::allocate_chunk(mapped).release();
  return at::from_blob(
      memory, sizes, [](void* data) { store::ChunkDeleter()(static_cast<std::byte*>(data)); }, at::TensorOptions(dtype));
}

void install(store::TableHandle& table, store::TableSnapshot& snapshot) {
  const store::TableScanHeader& h = snapshot.header;
  table.install(snapshot.rows, h.config.init, h.init_stream, h.optimizer, h.optimizer_step);
}

// torch.save: (header, row ids [k] int64, records [k, dim + state_floats] float32), both on the CPU.
py::tuple table_snapshot(const at::Tensor& t) {
  if (!is_table(t)) {
    throw py::value_error("_table_snapshot: the tensor is not on recdev table storage");
  }
  const TableBlock& block = *table_block(t.storage());
  store::TableScanHeader header;
  at::Tensor ids, records;
  {
    py::gil_scoped_release no_gil;
    block.table().scan_into([&](const store::TableScanHeader& h) {
      header = h;
      const auto count = static_cast<int64_t>(h.row_count);
      ids = empty_snapshot_array({count}, at::kLong);
      records = empty_snapshot_array({count, static_cast<int64_t>(h.config.dim + h.config.state_floats)}, at::kFloat);
      // Row ids are below 2^63: the same bits as int64.
      return store::RowArrays{reinterpret_cast<uint64_t*>(ids.data_ptr<int64_t>()), records.data_ptr<float>()};
    });
  }
  const store::TableConfig& config = header.config;
  const store::OptimizerConfig& optimizer = header.optimizer;
  py::dict d;
  d["format"] = kSnapshotFormat;
  d["nbytes"] = block.nbytes;
  d["row_bytes"] = block.row_bytes;
  d["num_rows"] = config.num_rows;
  d["dim"] = config.dim;
  d["state_floats"] = config.state_floats;
  d["init"] = py::make_tuple(static_cast<uint32_t>(config.init.kind), config.init.a, config.init.b);
  d["init_seed"] = config.init.seed;
  d["init_stream"] = header.init_stream;
  d["optimizer"] = py::make_tuple(
      static_cast<uint32_t>(optimizer.kind), optimizer.lr, optimizer.weight_decay, optimizer.eps, optimizer.lr_decay,
      optimizer.initial_accumulator_value, optimizer.beta1, optimizer.beta2);
  d["optimizer_step"] = header.optimizer_step;
  return py::make_tuple(d, ids, records);
}

constexpr const char* kDamaged = "torch.load: the saved recdev table is damaged or was not written by torch_recdev: ";

[[noreturn]] void refuse(const std::string& problem) {
  throw py::value_error(kDamaged + problem);
}

template <class T>
T field(const py::dict& header, const char* name) {
  if (!header.contains(name)) {
    refuse(std::string("its header has no '") + name + "'");
  }
  try {
    return header[name].cast<T>();
  } catch (const py::cast_error&) {
    refuse(std::string("its header's '") + name + "' has the wrong type");
  }
}

// The header's (kind, numbers...) tuple; `count` numbers after the kind.
std::pair<uint32_t, std::vector<double>> kind_and_numbers(const py::dict& header, const char* name, size_t count) {
  const auto values = field<py::tuple>(header, name);
  if (values.size() != count + 1) {
    refuse(std::string("its header's '") + name + "' has " + std::to_string(values.size()) + " fields, not " +
           std::to_string(count + 1));
  }
  try {
    std::vector<double> numbers;
    for (size_t i = 1; i <= count; ++i) numbers.push_back(values[i].cast<double>());
    return {values[0].cast<uint32_t>(), numbers};
  } catch (const py::cast_error&) {
    refuse(std::string("its header's '") + name + "' has a field of the wrong type");
  }
}

// Rebuilds a table from its snapshot, verified before anything is created: a uint8 recdev tensor
// over the new table storage (the caller views it with the saved dtype, offset, size and stride).
at::Tensor restore_table(const py::dict& header, const at::Tensor& ids, const at::Tensor& records) {
  const auto format = field<int64_t>(header, "format");
  if (format != kSnapshotFormat) {
    throw py::value_error(
        "torch.load: the saved recdev table has snapshot format " + std::to_string(format) + "; this torch_recdev reads format " +
        std::to_string(kSnapshotFormat) + ". Load it with the torch_recdev version that saved it.");
  }
  const auto nbytes = field<uint64_t>(header, "nbytes");
  const auto row_bytes = field<uint32_t>(header, "row_bytes");
  store::TableConfig config;
  config.num_rows = field<uint64_t>(header, "num_rows");
  config.dim = field<uint32_t>(header, "dim");
  config.state_floats = field<uint32_t>(header, "state_floats");
  if (row_bytes == 0 || row_bytes != config.dim * 4 || config.num_rows != (nbytes + row_bytes - 1) / row_bytes) {
    refuse("its storage (" + std::to_string(nbytes) + " bytes in rows of " + std::to_string(row_bytes) +
           ") does not match its table of " + std::to_string(config.num_rows) + " x " + std::to_string(config.dim));
  }
  const auto [init_kind, init] = kind_and_numbers(header, "init", 2);
  if (init_kind > static_cast<uint32_t>(store::InitKind::Xavier)) {
    refuse("unknown init rule kind " + std::to_string(init_kind));
  }
  config.init.kind = static_cast<store::InitKind>(init_kind);
  config.init.a = init[0];
  config.init.b = init[1];
  config.init.seed = field<uint64_t>(header, "init_seed");
  store::validate_table_config(config);
  const auto [optimizer_kind, hp] = kind_and_numbers(header, "optimizer", 7);
  if (optimizer_kind > static_cast<uint32_t>(store::OptimizerKind::Adam)) {
    refuse("unknown optimizer kind " + std::to_string(optimizer_kind));
  }
  store::OptimizerConfig optimizer{
      static_cast<store::OptimizerKind>(optimizer_kind), hp[0], hp[1], hp[2], hp[3], hp[4], hp[5], hp[6]};
  store::validate_optimizer(optimizer);
  if (optimizer.kind != store::OptimizerKind::None &&
      config.state_floats != store::optimizer_state_floats(optimizer.kind, config.dim)) {
    refuse("its rows carry " + std::to_string(config.state_floats) + " optimizer-state floats, but its optimizer " +
           store::describe(optimizer) + " needs " +
           std::to_string(store::optimizer_state_floats(optimizer.kind, config.dim)));
  }
  const int64_t record_floats = config.dim + config.state_floats;
  if (ids.device().type() != at::kCPU || ids.scalar_type() != at::kLong || ids.dim() != 1 ||
      records.device().type() != at::kCPU || records.scalar_type() != at::kFloat || records.dim() != 2 ||
      records.size(0) != ids.size(0) || records.size(1) != record_floats) {
    refuse("its rows are not int64 ids [k] with float32 records [k, " + std::to_string(record_floats) + "]; got " +
           ids.toString() + " " + c10::str(ids.sizes()) + " and " + records.toString() + " " +
           c10::str(records.sizes()));
  }
  const at::Tensor id_values = ids.contiguous();
  const int64_t* id = id_values.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < ids.size(0); ++i) {
    if (id[i] < 0 || static_cast<uint64_t>(id[i]) >= config.num_rows) {
      refuse("row id " + std::to_string(id[i]) + " is out of range for " + std::to_string(config.num_rows) + " rows");
    }
  }
  const store::TableScanHeader saved{config, field<uint64_t>(header, "init_stream"), optimizer,
                                     field<uint64_t>(header, "optimizer_step"), static_cast<uint64_t>(ids.size(0))};
  c10::Storage storage = make_table_storage(nbytes, row_bytes);
  table_block(storage)->defer_rows([saved, id_values, record_values = records.contiguous()](store::TableHandle& into) {
    store::RowSet rows(saved.config.dim + saved.config.state_floats);
    // In range, so non-negative: the same values as uint64.
    const int64_t* id = id_values.const_data_ptr<int64_t>();
    const auto repeat = rows.insert_all(
        reinterpret_cast<const uint64_t*>(id), record_values.const_data_ptr<float>(), saved.row_count);
    TORCH_CHECK_VALUE(!repeat, kDamaged, "row ", repeat ? id[*repeat] : 0, " appears twice");
    into.install(rows, saved.config.init, saved.init_stream, saved.optimizer, saved.optimizer_step);
  });
  auto raw = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), caffe2::TypeMeta::Make<uint8_t>());
  raw.unsafeGetTensorImpl()->set_sizes_contiguous({static_cast<int64_t>(nbytes)});
  return raw;
}

} // namespace

bool copy_whole_table(const at::Tensor& src, const at::Tensor& dst) {
  if (!is_whole_table(src) || !is_whole_table(dst) || src.dtype() != dst.dtype() || src.sizes() != dst.sizes()) {
    return false;
  }
  const TableBlock& from = *table_block(src.storage());
  const TableBlock& to = *table_block(dst.storage());
  if (from.row_bytes != to.row_bytes || from.nbytes != to.nbytes) {
    return false;
  }
  if (from.same_table(to)) {
    return true;
  }
  store::TableHandle& destination = to.table();
  if (from.install_pending_into(destination)) {
    return true;  // a table torch.load just rebuilt: its rows went from the file straight to dst
  }
  store::TableSnapshot snapshot = from.table().snapshot();
  install(destination, snapshot);
  return true;  // the snapshot now holds dst's old rows, freed here outside the table's locks
}

void bind_table_serialization(py::module_& m) {
  m.def("_table_snapshot", &table_snapshot);
  m.def("_restore_table", &restore_table);
}

} // namespace recdev::device
