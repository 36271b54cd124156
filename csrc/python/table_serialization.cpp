#include "python/table_serialization.h"

#include "device/table_storage.h"

#include "store/checkpoint.h"
#include "store/chunk_pool.h"
#include "store/crc32.h"
#include "store/crc32c.h"
#include "store/errors.h"
#include "store/table_handle.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <optional>

namespace recdev::python {

using namespace recdev::device;  // the device entry points these bindings expose

namespace {

// The version of the snapshot dict below. Format 2 added checksums (CRC-32, zlib's); format 3 made
// them CRC-32C, which the CPU computes at memory speed (a table-driven CRC-32 ran at about 1 GB/s, as
// slow as the disk, and doubled torch.load's time). Formats 1 (no checksums) and 2 still load.
constexpr int64_t kSnapshotFormat = 3;
constexpr int64_t kCrc32Format = 2;
constexpr int64_t kUncheckedFormat = 1;

// A format's checksum: its function, its name in messages, and the header fields that hold it.
struct SnapshotChecksum {
  uint32_t (*update)(uint32_t crc, const void* data, size_t size);
  const char* name;
  const char* chunk_bytes_field;
  const char* header_field;
  const char* ids_field;
  const char* records_field;
  const char* policy_field;
};
constexpr SnapshotChecksum kCrc32Fields{&store::crc32_update, "CRC-32",        "crc32_chunk_bytes", "header_crc32",
                                        "ids_crc32",          "records_crc32", "policy_crc32"};
constexpr SnapshotChecksum kCrc32cFields{&store::crc32c_update, "CRC-32C",        "crc32c_chunk_bytes", "header_crc32c",
                                         "ids_crc32c",          "records_crc32c", "policy_crc32c"};

// The ids and the records get one checksum per chunk of this many bytes, so that torch.save and
// torch.load checksum a large table on all of PyTorch's threads, and a mismatch names the rows it is in.
constexpr uint64_t kChecksumChunkBytes = 16 << 20;

// An uninitialized CPU tensor for a snapshot's rows. From a few MiB on, its memory is a huge-page
// mapping (not the pool's table memory: a snapshot is a CPU array), so that copying the rows in faults 2 MiB at a time rather
// than 4 KiB (snapshot of 10^6 rows of dim 64: 71 ms on the CPU allocator's pages, 36 ms on these).
at::Tensor empty_snapshot_array(at::IntArrayRef sizes, at::ScalarType dtype) {
  const size_t nbytes = static_cast<size_t>(c10::multiply_integers(sizes)) * c10::elementSize(dtype);
  if (nbytes < store::kChunkRegionBytes) {
    return at::empty(sizes, dtype);
  }
  const size_t mapped = (nbytes + store::kChunkRegionBytes - 1) / store::kChunkRegionBytes * store::kChunkRegionBytes;
  std::byte* memory = store::map_huge_pages(mapped);
  return at::from_blob(
      memory, sizes, [mapped](void* data) { store::unmap_huge_pages(static_cast<std::byte*>(data), mapped); },
      at::TensorOptions(dtype));
}

// What a snapshot's header says: the storage's size and row width, and the store's header.
struct SavedHeader {
  uint64_t nbytes;
  uint32_t row_bytes;
  store::TableScanHeader table;
};

// The checksum of every field of the header, each as its bytes in a fixed order: the pickled numbers
// (shape, init rule and seed, optimizer) are checked as the rows are.
uint32_t header_checksum(const SnapshotChecksum& checksum, const SavedHeader& h) {
  std::string bytes;
  const auto put = [&bytes](const auto& value) { bytes.append(reinterpret_cast<const char*>(&value), sizeof(value)); };
  const store::TableConfig& config = h.table.config;
  const store::OptimizerConfig& optimizer = h.table.optimizer;
  put(h.nbytes);
  put(h.row_bytes);
  put(config.num_rows);
  put(config.row_words);
  put(config.state_words);
  put(static_cast<uint32_t>(config.init.kind));
  put(config.init.a);
  put(config.init.b);
  put(config.init.seed);
  put(h.table.init_stream);
  put(static_cast<uint32_t>(optimizer.kind));
  for (double hp : {optimizer.lr, optimizer.weight_decay, optimizer.eps, optimizer.lr_decay,
                    optimizer.initial_accumulator_value, optimizer.beta1, optimizer.beta2}) {
    put(hp);
  }
  put(h.table.optimizer_step);
  put(h.table.row_count);
  // Hashed only when not float32, so that the headers of float32 tables saved before tables had a
  // type still verify.
  if (config.dtype != store::ElementType::Float32) put(static_cast<uint8_t>(config.dtype));
  // Likewise only with stochastic rounding, which snapshots before it did not carry.
  if (optimizer.stochastic_rounding) put(optimizer.rounding_seed);
  return checksum.update(0, bytes.data(), bytes.size());
}

// One checksum per chunk of `chunk_bytes` of a contiguous CPU tensor's bytes.
std::vector<uint32_t> chunk_checksums(const SnapshotChecksum& checksum, const at::Tensor& t, uint64_t chunk_bytes) {
  const auto* bytes = static_cast<const std::byte*>(t.const_data_ptr());
  const uint64_t nbytes = t.nbytes();
  std::vector<uint32_t> crcs((nbytes + chunk_bytes - 1) / chunk_bytes);
  at::parallel_for(0, static_cast<int64_t>(crcs.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const uint64_t start = static_cast<uint64_t>(i) * chunk_bytes;
      crcs[i] = checksum.update(0, bytes + start, std::min(chunk_bytes, nbytes - start));
    }
  });
  return crcs;
}

// torch.save: (header, row ids [k] int64, records [k, dim + state_words] float32), both on the CPU.
py::tuple table_snapshot(const at::Tensor& t) {
  if (!is_table(t)) {
    throw py::value_error("_table_snapshot: the tensor is not on recdev table storage");
  }
  const TableBlock& block = *table_block(t.storage());
  store::TableScanHeader header;
  at::Tensor ids, records;
  const SnapshotChecksum& checksum = kCrc32cFields;
  std::vector<uint32_t> ids_checksums, records_checksums;
  std::optional<store::TablePolicyState> policy;
  std::string policy_block;
  {
    py::gil_scoped_release no_gil;
    block.table().scan_into([&](const store::TableScanHeader& h) {
      header = h;
      const auto count = static_cast<int64_t>(h.row_count);
      ids = empty_snapshot_array({count}, at::kLong);
      records =
          empty_snapshot_array({count, static_cast<int64_t>(h.config.row_words + h.config.state_words)}, at::kFloat);
      // Row ids are below 2^63: the same bits as int64.
      return store::RowArrays{reinterpret_cast<uint64_t*>(ids.data_ptr<int64_t>()), records.data_ptr<float>()};
    });
    ids_checksums = chunk_checksums(checksum, ids, kChecksumChunkBytes);
    records_checksums = chunk_checksums(checksum, records, kChecksumChunkBytes);
    policy = block.table().policy_state();
    if (policy) {
      // The metadata of the rows saved (a request between the snapshot and now may have added rows).
      const auto* saved = reinterpret_cast<const uint64_t*>(ids.const_data_ptr<int64_t>());
      std::vector<uint64_t> sorted(saved, saved + ids.numel());
      std::sort(sorted.begin(), sorted.end());
      std::erase_if(policy->touches, [&](const store::RowTouch& row) {
        return !std::binary_search(sorted.begin(), sorted.end(), row.id);
      });
      policy_block = store::encode_policy_state(*policy);
    }
  }
  const store::TableConfig& config = header.config;
  const store::OptimizerConfig& optimizer = header.optimizer;
  py::dict d;
  d["format"] = kSnapshotFormat;
  d["nbytes"] = block.nbytes;
  d["row_bytes"] = block.row_bytes;
  d["num_rows"] = config.num_rows;
  d["dim"] = config.row_words;
  d["state_floats"] = config.state_words;  // the key of the format (state words)
  d["dtype"] = static_cast<uint32_t>(config.dtype);
  d["init"] = py::make_tuple(static_cast<uint32_t>(config.init.kind), config.init.a, config.init.b);
  d["init_seed"] = config.init.seed;
  d["init_stream"] = header.init_stream;
  d["optimizer"] =
      py::make_tuple(static_cast<uint32_t>(optimizer.kind), optimizer.lr, optimizer.weight_decay, optimizer.eps,
                     optimizer.lr_decay, optimizer.initial_accumulator_value, optimizer.beta1, optimizer.beta2);
  d["optimizer_step"] = header.optimizer_step;
  // Only with stochastic rounding (a snapshot without these fields rounds to nearest).
  if (optimizer.stochastic_rounding) {
    d["stochastic_rounding"] = true;
    d["rounding_seed"] = optimizer.rounding_seed;
  }
  d[checksum.chunk_bytes_field] = kChecksumChunkBytes;
  d[checksum.header_field] = header_checksum(checksum, {block.nbytes, block.row_bytes, header});
  d[checksum.ids_field] = ids_checksums;
  d[checksum.records_field] = records_checksums;
  // Only tables with a budget policy have these (so older snapshots and their readers are unchanged):
  // the policy with its touch metadata (checkpoint.h's encode_policy_state) and its checksum.
  if (policy) {
    d["policy"] = py::bytes(policy_block);
    d[checksum.policy_field] = checksum.update(0, policy_block.data(), policy_block.size());
  }
  return py::make_tuple(d, ids, records);
}

constexpr const char* kDamaged = "torch.load: the saved recdev table is damaged or was not written by torch_recdev: ";

[[noreturn]] void refuse(const std::string& problem) { throw py::value_error(kDamaged + problem); }

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

// The header's fields, read but not yet checked against each other.
SavedHeader read_header(const py::dict& header, uint64_t row_count) {
  SavedHeader saved{};
  saved.nbytes = field<uint64_t>(header, "nbytes");
  saved.row_bytes = field<uint32_t>(header, "row_bytes");
  store::TableConfig& config = saved.table.config;
  config.num_rows = field<uint64_t>(header, "num_rows");
  config.row_words = field<uint32_t>(header, "dim");
  config.state_words = field<uint32_t>(header, "state_floats");
  // Snapshots from before tables had a type hold float32 tables.
  const uint32_t dtype = header.contains("dtype") ? field<uint32_t>(header, "dtype") : 0;
  if (dtype > store::kLastElementType) refuse("unknown element type " + std::to_string(dtype));
  config.dtype = static_cast<store::ElementType>(dtype);
  const auto [init_kind, init] = kind_and_numbers(header, "init", 2);
  config.init.kind = static_cast<store::InitKind>(init_kind);
  config.init.a = init[0];
  config.init.b = init[1];
  config.init.seed = field<uint64_t>(header, "init_seed");
  saved.table.init_stream = field<uint64_t>(header, "init_stream");
  const auto [optimizer_kind, hp] = kind_and_numbers(header, "optimizer", 7);
  saved.table.optimizer = store::OptimizerConfig{
      static_cast<store::OptimizerKind>(optimizer_kind), hp[0], hp[1], hp[2], hp[3], hp[4], hp[5], hp[6]};
  if (header.contains("stochastic_rounding")) {
    saved.table.optimizer.stochastic_rounding = field<bool>(header, "stochastic_rounding");
    saved.table.optimizer.rounding_seed = field<uint64_t>(header, "rounding_seed");
  }
  saved.table.optimizer_step = field<uint64_t>(header, "optimizer_step");
  saved.table.row_count = row_count;
  return saved;
}

[[noreturn]] void damaged(const SnapshotChecksum& checksum, const std::string& table, const std::string& part) {
  throw py::value_error("torch.load: the saved recdev table " + table + " is damaged: the checksum (" + checksum.name +
                        ") of " + part +
                        " does not match the one torch.save wrote, so the file changed after it was saved. Nothing "
                        "of this table was loaded; load an intact copy of the file.");
}

// Format 2 and later: the header, the ids and the records must be the bytes torch.save checksummed.
// `table` names the table in the error.
void verify_checksums(const SnapshotChecksum& checksum, const py::dict& header, const SavedHeader& saved,
                      const at::Tensor& ids, const at::Tensor& records, const std::string& table) {
  const auto chunk_bytes = field<uint64_t>(header, checksum.chunk_bytes_field);
  const auto header_crc = field<uint32_t>(header, checksum.header_field);
  const auto ids_crc = field<std::vector<uint32_t>>(header, checksum.ids_field);
  const auto records_crc = field<std::vector<uint32_t>>(header, checksum.records_field);
  if (chunk_bytes == 0) {
    refuse(std::string("its header's '") + checksum.chunk_bytes_field + "' is 0");
  }
  if (header_checksum(checksum, saved) != header_crc) {
    damaged(checksum, table, "its header (shape, init rule, optimizer)");
  }
  const auto check = [&](const at::Tensor& t, const std::vector<uint32_t>& expected, const char* what,
                         uint64_t row_bytes) {
    std::vector<uint32_t> actual;
    {
      py::gil_scoped_release no_gil;
      actual = chunk_checksums(checksum, t, chunk_bytes);
    }
    if (actual.size() != expected.size()) {
      refuse(std::string("its header has ") + std::to_string(expected.size()) + " checksums for the " + what +
             ", not " + std::to_string(actual.size()));
    }
    for (size_t i = 0; i < actual.size(); ++i) {
      if (actual[i] != expected[i]) {
        const uint64_t first = i * chunk_bytes / row_bytes;
        const uint64_t last = std::min<uint64_t>((i + 1) * chunk_bytes, t.nbytes()) / row_bytes;
        damaged(checksum, table,
                std::string("its ") + what + " (saved rows " + std::to_string(first) + " to " +
                    std::to_string(last - 1) + ")");
      }
    }
  };
  check(ids, ids_crc, "row ids", sizeof(int64_t));
  check(records, records_crc, "row records", std::max<uint64_t>(1, records.size(1) * sizeof(float)));
}

// Rebuilds a table from its snapshot, verified before anything is created: a uint8 recdev tensor
// over the new table storage (the caller views it with the saved dtype, offset, size and stride).
// `table` names it in errors.
// Refuses a saved table whose header is inconsistent: its storage against its shape, an unknown init
// rule or optimizer, stochastic rounding on rows it does not round, a state width its optimizer does
// not keep.
void check_saved_table(const SavedHeader& saved) {
  const store::TableConfig& config = saved.table.config;
  const store::OptimizerConfig& optimizer = saved.table.optimizer;
  if (saved.row_bytes == 0 || saved.row_bytes != config.row_words * 4 ||
      config.num_rows != (saved.nbytes + saved.row_bytes - 1) / saved.row_bytes) {
    refuse("its storage (" + std::to_string(saved.nbytes) + " bytes in rows of " + std::to_string(saved.row_bytes) +
           ") does not match its table of " + std::to_string(config.num_rows) + " x " +
           std::to_string(config.row_words));
  }
  if (static_cast<uint32_t>(config.init.kind) > static_cast<uint32_t>(store::InitKind::Xavier)) {
    refuse("unknown init rule kind " + std::to_string(static_cast<uint32_t>(config.init.kind)));
  }
  store::validate_table_config(config);
  if (static_cast<uint32_t>(optimizer.kind) > static_cast<uint32_t>(store::OptimizerKind::Adam)) {
    refuse("unknown optimizer kind " + std::to_string(static_cast<uint32_t>(optimizer.kind)));
  }
  store::validate_optimizer(optimizer);
  if (optimizer.stochastic_rounding && config.dtype != store::ElementType::Float16 &&
      config.dtype != store::ElementType::BFloat16) {
    refuse(std::string("it has stochastic rounding on ") + store::element_type_name(config.dtype) +
           " rows; only float16 and bfloat16 rows are rounded");
  }
  if (optimizer.kind != store::OptimizerKind::None &&
      config.state_words != store::optimizer_state_words(optimizer.kind, config.dtype, config.row_words)) {
    refuse("its rows carry " + std::to_string(config.state_words) + " optimizer-state words, but its optimizer " +
           store::describe(optimizer) + " needs " +
           std::to_string(store::optimizer_state_words(optimizer.kind, config.dtype, config.row_words)));
  }
}

// The saved budget policy with its touch metadata (nullopt if the table had none), checked.
std::optional<store::TablePolicyState> saved_policy(const SnapshotChecksum& checksum, const py::dict& header,
                                                    const std::string& table, const store::TableConfig& config,
                                                    uint64_t row_count) {
  if (!header.contains("policy")) return std::nullopt;
  const auto block = field<std::string>(header, "policy");
  if (field<uint32_t>(header, checksum.policy_field) != checksum.update(0, block.data(), block.size())) {
    damaged(checksum, table, "its budget policy");
  }
  try {
    return store::decode_policy_state(block.data(), block.size(), config.num_rows, row_count);
  } catch (const store::StoreError& error) {
    refuse(std::string("its budget ") + error.what());
  }
}

at::Tensor restore_table(const py::dict& header, const at::Tensor& ids, const at::Tensor& records,
                         const std::string& table) {
  const auto format = field<int64_t>(header, "format");
  if (format < kUncheckedFormat || format > kSnapshotFormat) {
    throw py::value_error("torch.load: the saved recdev table " + table + " has snapshot format " +
                          std::to_string(format) + "; this torch_recdev reads formats " +
                          std::to_string(kUncheckedFormat) + " to " + std::to_string(kSnapshotFormat) +
                          ". Load it with the torch_recdev version that saved it.");
  }
  // Format 1 has no checksums, and no field of them (a damaged format number must not skip them).
  const SnapshotChecksum& checksum = format == kCrc32Format ? kCrc32Fields : kCrc32cFields;
  if (format == kUncheckedFormat) {
    for (const SnapshotChecksum* kind : {&kCrc32Fields, &kCrc32cFields}) {
      for (const char* name : {kind->chunk_bytes_field, kind->header_field, kind->ids_field, kind->records_field}) {
        if (header.contains(name)) {
          refuse(std::string("its header says format 1, which has no checksums, but it has '") + name + "'");
        }
      }
    }
  }
  if (ids.device().type() != at::kCPU || ids.scalar_type() != at::kLong || ids.dim() != 1 ||
      records.device().type() != at::kCPU || records.scalar_type() != at::kFloat || records.dim() != 2 ||
      records.size(0) != ids.size(0)) {
    refuse("its rows are not int64 ids [k] with float32 records [k, n]; got " + ids.toString() + " " +
           c10::str(ids.sizes()) + " and " + records.toString() + " " + c10::str(records.sizes()));
  }
  const at::Tensor id_values = ids.contiguous();
  const at::Tensor record_values = records.contiguous();
  const SavedHeader saved = read_header(header, static_cast<uint64_t>(ids.size(0)));
  if (format != kUncheckedFormat) {
    verify_checksums(checksum, header, saved, id_values, record_values, table);
  }
  check_saved_table(saved);
  const store::TableConfig& config = saved.table.config;
  const int64_t record_words = config.row_words + config.state_words;
  if (records.size(1) != record_words) {
    refuse("its rows are not int64 ids [k] with float32 records [k, " + std::to_string(record_words) + "]; got " +
           ids.toString() + " " + c10::str(ids.sizes()) + " and " + records.toString() + " " +
           c10::str(records.sizes()));
  }
  const int64_t* id = id_values.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < ids.size(0); ++i) {
    if (id[i] < 0 || static_cast<uint64_t>(id[i]) >= config.num_rows) {
      refuse("row id " + std::to_string(id[i]) + " is out of range for " + std::to_string(config.num_rows) + " rows");
    }
  }
  const std::optional<store::TablePolicyState> policy =
      saved_policy(checksum, header, table, config, saved.table.row_count);
  const store::TableScanHeader table_header = saved.table;
  c10::Storage storage = make_table_storage(saved.nbytes, saved.row_bytes, config.dtype);
  table_block(storage)->defer_rows([table_header, id_values, record_values, policy](store::TableHandle& into) {
    store::RowSet rows(table_header.config.row_words + table_header.config.state_words);
    // In range, so non-negative: the same values as uint64.
    const int64_t* id = id_values.const_data_ptr<int64_t>();
    const auto repeat = rows.insert_all(reinterpret_cast<const uint64_t*>(id), record_values.const_data_ptr<float>(),
                                        table_header.row_count);
    TORCH_CHECK_VALUE(!repeat, kDamaged, "row ", repeat ? id[*repeat] : 0, " appears twice");
    // The saved policy replaces the table's own, which could otherwise evict installed rows it keeps.
    if (policy) into.set_policy(store::TablePolicyConfig{});
    into.install(rows, table_header.config.init, table_header.init_stream, table_header.optimizer,
                 table_header.optimizer_step);
    if (policy) into.restore_policy_state(*policy);
  });
  auto raw = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), caffe2::TypeMeta::Make<uint8_t>());
  raw.unsafeGetTensorImpl()->set_sizes_contiguous({static_cast<int64_t>(saved.nbytes)});
  return raw;
}

}  // namespace

void bind_table_serialization(py::module_& m) {
  m.def("_table_snapshot", &table_snapshot);
  m.def("_restore_table", &restore_table, py::arg("header"), py::arg("ids"), py::arg("records"), py::arg("table"));
}

}  // namespace recdev::python
