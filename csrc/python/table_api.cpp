#include "python/table_api.h"

#include "device/current_store.h"
#include "device/generator.h"
#include "device/store_ranges.h"
#include "device/table_storage.h"

#include "net/client/remote_store.h"
#include "python/table_policy_binding.h"
#include "store/checkpoint_versions.h"
#include "store/deferred_table.h"
#include "store/sync_steps.h"
#include "store/table_handle.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>

#include <cmath>

namespace recdev::python {

using namespace recdev::device;  // the device entry points these bindings expose

namespace {

store::TableHandle& table_of(const at::Tensor& t, const char* what) {
  if (!is_table(t)) {
    throw py::value_error(std::string(what) + ": the tensor is not on recdev table storage (torch_recdev.is_table)");
  }
  return table_block(t.storage())->table();
}

// Keys as the store's row ids: a 1-D int64 or uint64 CPU or recdev tensor,
// every key in [0, rows).
std::vector<uint64_t> keys_of(const at::Tensor& keys, const store::TableHandle& table, const char* what) {
  if (keys.dim() != 1 || (keys.scalar_type() != at::kLong && keys.scalar_type() != at::kUInt64)) {
    throw py::type_error(std::string(what) + ": keys must be a 1-D int64 or uint64 tensor of row ids; got " +
                         keys.toString() + " of shape " + c10::str(keys.sizes()));
  }
  const at::Tensor cpu = keys.to(at::kCPU).contiguous();
  const uint64_t* data = static_cast<const uint64_t*>(cpu.const_data_ptr());
  std::vector<uint64_t> ids(data, data + cpu.numel());
  const uint64_t rows = table.num_rows();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= rows) {
      throw py::index_error(
          std::string(what) + ": key " +
          (keys.scalar_type() == at::kLong ? std::to_string(static_cast<int64_t>(ids[i])) : std::to_string(ids[i])) +
          " at position " + std::to_string(i) + " is out of range for a table of " + std::to_string(rows) + " rows");
    }
  }
  return ids;
}

// The torch dtype of a table's rows, and their width in elements of it.
c10::ScalarType dtype_of(const store::TableHandle& table, const char* what) {
  if (table.dtype() == store::ElementType::Bytes) {
    throw py::type_error(std::string(what) + ": the table holds a non-floating dtype; read it as a tensor instead");
  }
  return scalar_type_of(table.dtype());
}

int64_t row_width(const store::TableHandle& table) {
  return static_cast<int64_t>(uint64_t{table.row_words()} * 4 / store::element_bytes(table.dtype()));
}

// Rows given for `n` keys: a [n, dim] tensor of the table's dtype, as contiguous CPU. Never
// converted: a value of another dtype is refused, so that no bytes are read as another type.
at::Tensor rows_of(const at::Tensor& values, size_t n, const store::TableHandle& table, const char* what) {
  const int64_t dim = row_width(table);
  const c10::ScalarType dtype = dtype_of(table, what);
  if (values.scalar_type() != dtype || values.dim() != 2 || values.size(0) != static_cast<int64_t>(n) ||
      values.size(1) != dim) {
    throw py::value_error(std::string(what) + ": expected " + store::element_type_name(table.dtype()) +
                          " rows of shape [" + std::to_string(n) + ", " + std::to_string(dim) +
                          "] (one per key, the table's dtype); got " + values.toString() + " of shape " +
                          c10::str(values.sizes()));
  }
  return values.to(at::kCPU).contiguous();
}

store::InitRule rule_of(const std::string& kind, double a, double b) {
  store::InitRule rule;
  if (kind == "zero") rule.kind = store::InitKind::Zero;
  else if (kind == "constant") rule.kind = store::InitKind::Constant;
  else if (kind == "normal") rule.kind = store::InitKind::Normal;
  else if (kind == "uniform") rule.kind = store::InitKind::Uniform;
  else if (kind == "xavier") rule.kind = store::InitKind::Xavier;
  else throw py::value_error("unknown init strategy '" + kind + "'; use Normal, Uniform, Xavier, Zero or Constant");
  rule.a = a;
  rule.b = b;
  rule.seed = draw_op_seed(std::nullopt);
  store::validate_init_rule(rule);
  return rule;
}

// A named table as declared (store::TableDeclaration): `init` is (kind, a, b) or None, `optimizer`
// an OptimizerConfig or None; declares_rounding: whether the declaration names stochastic_rounding.
at::Tensor declare_table(const std::string& name, int64_t num_embeddings, int64_t embedding_dim,
                         const std::optional<std::tuple<std::string, double, double>>& init,
                         const std::optional<store::OptimizerConfig>& optimizer, bool declares_rounding, bool reset,
                         c10::ScalarType dtype) {
  if (num_embeddings <= 0 || embedding_dim <= 0) {
    throw py::value_error("init_embedding_table: num_embeddings and embedding_dim must be positive");
  }
  const store::ElementType type = element_type_of(dtype);
  if (type == store::ElementType::Bytes) {
    throw py::type_error(std::string("init_embedding_table: dtype must be torch.float32, float16, bfloat16 or "
                                     "float64; got ") +
                         c10::toString(dtype));
  }
  const int64_t element = static_cast<int64_t>(store::element_bytes(type));
  if (embedding_dim * element % 4 != 0) {
    throw py::value_error("init_embedding_table: a row of " + std::string(c10::toString(dtype)) +
                          " must be whole 4-byte words: embedding_dim " + std::to_string(embedding_dim) +
                          " is odd; use an even embedding_dim");
  }
  // Checked by division: the byte size itself may not fit in 64 bits, and the message must be right.
  if (embedding_dim > UINT32_MAX / 8 || num_embeddings > INT64_MAX / (embedding_dim * element)) {
    throw py::value_error("init_embedding_table: a table of " + std::to_string(num_embeddings) + " rows of dim " +
                          std::to_string(embedding_dim) + " (" + std::to_string(embedding_dim * element) +
                          " bytes a row) spans more than the 2^63 - 1 bytes a tensor can; use fewer rows");
  }
  store::TableDeclaration declaration;
  declaration.config.num_rows = static_cast<uint64_t>(num_embeddings);
  declaration.config.row_words = static_cast<uint32_t>(embedding_dim * element / 4);
  declaration.config.dtype = type;
  if (init) {
    declaration.config.init = rule_of(std::get<0>(*init), std::get<1>(*init), std::get<2>(*init));
    declaration.declares_init = true;
  }
  if (optimizer) {
    declaration.optimizer = *optimizer;
    declaration.declares_rounding = declares_rounding;
  }
  declaration.reset = reset;
  std::shared_ptr<store::StoreClient> client = current_store();
  std::shared_ptr<store::TableHandle> table;
  {
    py::gil_scoped_release no_gil;
    table = client->declare(name, declaration);
  }
  const store::TableConfig config = declaration.config;
  c10::Storage storage = wrap_table(std::move(table), std::move(client), config.num_rows * config.row_words * 4,
                                    config.row_words * 4, false);
  auto tensor = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), c10::scalarTypeToTypeMeta(dtype));
  tensor.unsafeGetTensorImpl()->set_sizes_contiguous({num_embeddings, embedding_dim});
  return tensor;
}

// emb_init(keys, strategy): the rows' values under the rule, written.
void init_rows(const at::Tensor& t, const at::Tensor& keys, const std::string& kind, double a, double b) {
  store::TableHandle& table = table_of(t, "emb_init");
  const std::vector<uint64_t> ids = keys_of(keys, table, "emb_init");
  const store::InitRule rule = rule_of(kind, a, b);
  const store::TableConfig config = table.config();
  dtype_of(table, "emb_init");
  // A row's float32 init values converted to the table's type, as the store makes them.
  const uint32_t elements = store::row_elements(config);
  std::vector<float> values(elements);
  std::vector<float> rows(ids.size() * config.row_words);
  for (size_t i = 0; i < ids.size(); ++i) {
    store::fill_row(rule, table.init_stream(), ids[i], elements, config.num_rows, values.data());
    store::store_init_values(config.dtype, values.data(), rows.data() + i * config.row_words, elements);
  }
  py::gil_scoped_release no_gil;
  const trace::Range range = device::write_range(table, ids.size());
  table.write(ids.data(), ids.size(), rows.data());
}

at::Tensor read_rows(const at::Tensor& t, const at::Tensor& keys) {
  store::TableHandle& table = table_of(t, "emb_read");
  const std::vector<uint64_t> ids = keys_of(keys, table, "emb_read");
  at::Tensor out = at::empty({static_cast<int64_t>(ids.size()), row_width(table)}, dtype_of(table, "emb_read"));
  py::gil_scoped_release no_gil;
  const trace::Range range = device::gather_range(table, ids.size());
  table.gather(ids.data(), ids.size(), static_cast<float*>(out.data_ptr()));
  return out;
}

void write_rows(const at::Tensor& t, const at::Tensor& keys, const at::Tensor& values) {
  store::TableHandle& table = table_of(t, "emb_write");
  const std::vector<uint64_t> ids = keys_of(keys, table, "emb_write");
  const at::Tensor rows = rows_of(values, ids.size(), table, "emb_write");
  py::gil_scoped_release no_gil;
  const trace::Range range = device::write_range(table, ids.size());
  table.write(ids.data(), ids.size(), static_cast<const float*>(rows.const_data_ptr()));
}

void update_rows(const at::Tensor& t, const at::Tensor& keys, const at::Tensor& grads) {
  store::TableHandle& table = table_of(t, "emb_update");
  const std::vector<uint64_t> ids = keys_of(keys, table, "emb_update");
  const at::Tensor rows = rows_of(grads, ids.size(), table, "emb_update");
  py::gil_scoped_release no_gil;
  const trace::Range range = device::update_range(table, ids.size(), 0);
  table.update(ids.data(), ids.size(), rows.const_data_ptr());
}

at::Tensor exists(const at::Tensor& t, const at::Tensor& keys) {
  store::TableHandle& table = table_of(t, "emb_exists");
  const std::vector<uint64_t> ids = keys_of(keys, table, "emb_exists");
  at::Tensor out = at::empty({static_cast<int64_t>(ids.size())}, at::kBool);
  table.exists(ids.data(), ids.size(), reinterpret_cast<uint8_t*>(out.data_ptr<bool>()));
  return out;
}

void erase(const at::Tensor& t, const at::Tensor& keys) {
  store::TableHandle& table = table_of(t, "emb_delete");
  const std::vector<uint64_t> ids = keys_of(keys, table, "emb_delete");
  table.erase(ids.data(), ids.size());
}

void set_optimizer(const at::Tensor& t, const store::OptimizerConfig& config) {
  table_of(t, "set_optimizer").set_optimizer(config);
}

const char* init_kind_name(store::InitKind kind) {
  switch (kind) {
    case store::InitKind::Zero: return "zero";
    case store::InitKind::Constant: return "constant";
    case store::InitKind::Normal: return "normal";
    case store::InitKind::Uniform: return "uniform";
    case store::InitKind::Xavier: return "xavier";
  }
  return "unknown";
}

// What a table would be declared as (share_tables): its init rule as (kind, a, b) and its optimizer (an
// OptimizerConfig), or None without one; the inverse of declare_table's arguments.
py::tuple table_declaration(const at::Tensor& t) {
  store::TableHandle& table = table_of(t, "table_declaration");
  const store::InitRule init = table.config().init;
  const store::OptimizerConfig optimizer = table.optimizer();
  const py::object fused = optimizer.kind == store::OptimizerKind::None ? py::none() : py::cast(optimizer);
  return py::make_tuple(py::make_tuple(init_kind_name(init.kind), init.a, init.b), fused);
}

store::DeferredTable& deferred_of(const at::Tensor& t, const char* what) {
  store::DeferredTable* deferred = table_of(t, what).sync_staging();
  if (deferred == nullptr) {
    throw py::value_error(std::string(what) + ": the table is not in synchronous mode (sync=True)");
  }
  return *deferred;
}

// The same table, seen through a DeferredTable: its lookups as before, its updates recorded for the
// synchronous exchange (torch_recdev.optim's sync=True).
at::Tensor sync_table(const at::Tensor& t) {
  store::TableHandle& table = table_of(t, "sync");
  if (t.dim() != 2 || !t.is_contiguous() || t.storage_offset() != 0 ||
      static_cast<uint64_t>(t.size(0)) != table.num_rows() || static_cast<uint64_t>(t.size(1)) != table.row_words()) {
    throw py::value_error("sync=True takes whole 2-D tables (rows x dim), not views of one");
  }
  if (table.dtype() != store::ElementType::Float32) {
    throw py::type_error(std::string("sync=True trains float32 tables; this table is ") +
                         store::element_type_name(table.dtype()) +
                         ": train it asynchronously (sync=False) or declare it in float32");
  }
  TableBlock* block = table_block(t.storage());
  auto deferred = std::make_shared<store::DeferredTable>(block->table_shared());
  c10::Storage storage =
      wrap_table(std::move(deferred), block->client, t.storage().nbytes(), table.row_words() * 4, false);
  auto tensor = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), caffe2::TypeMeta::Make<float>());
  tensor.unsafeGetTensorImpl()->set_sizes_contiguous(t.sizes());
  return tensor;
}

// The recorded rows, handed over without a copy: the tensors own them.
std::pair<at::Tensor, at::Tensor> take_pending_updates(const at::Tensor& t) {
  store::DeferredTable& table = deferred_of(t, "sync");
  auto pending = std::make_shared<store::DeferredTable::Pending>(table.take());
  const int64_t n = static_cast<int64_t>(pending->ids.size());
  static_assert(sizeof(uint64_t) == sizeof(int64_t));
  // Row ids are below the table's row count, which fits int64 (tables are sized by int64 tensors).
  at::Tensor ids = at::from_blob(pending->ids.data(), {n}, [pending](void*) {}, at::kLong);
  at::Tensor grads = at::from_blob(
      pending->grads.data(), {n, static_cast<int64_t>(table.row_words())}, [pending](void*) {}, at::kFloat);
  return {ids, grads};
}

// One optimizer step of the rows on a table in this process (a replica of a synchronous fleet on
// the embedded store).
void apply_updates(const at::Tensor& t, const at::Tensor& keys, const at::Tensor& grads) {
  store::DeferredTable& table = deferred_of(t, "sync");
  const std::vector<uint64_t> ids = keys_of(keys, table, "sync");
  const at::Tensor rows = rows_of(grads, ids.size(), table, "sync");
  py::gil_scoped_release no_gil;
  table.apply(ids.data(), ids.size(), rows.const_data_ptr<float>());
}

// The store that runs the synchronous steps of a table's fleet: its shards'.
store::SyncSteps& sync_steps_of(const at::Tensor& t) {
  store::SyncSteps* steps = table_block(t.storage())->client->sync_steps();
  if (steps == nullptr) throw py::value_error("sync: the table lives in this process, not on shards");
  return *steps;
}

store::TableHandle* staged_table(const at::Tensor& t) { return deferred_of(t, "sync").wrapped().get(); }

// A synchronous step on shards (net/client/sync_step.h), in two calls so that a profile tells them apart:
// stage_step returns once every rank's rows of every table are staged on every shard...
void stage_step(const std::vector<at::Tensor>& tables, const std::vector<at::Tensor>& keys,
                const std::vector<at::Tensor>& grads, const store::StepTag& tag, double timeout_seconds) {
  if (keys.size() != tables.size() || grads.size() != tables.size()) {
    throw py::value_error("sync: one ids and one grads tensor per table");
  }
  // The ids and rows are kept here, and the step points into them.
  std::vector<std::vector<uint64_t>> ids(tables.size());
  std::vector<at::Tensor> rows(tables.size());
  std::vector<store::StepRows> step;
  for (size_t t = 0; t < tables.size(); ++t) {
    store::TableHandle* table = staged_table(tables[t]);
    ids[t] = keys_of(keys[t], *table, "sync");
    rows[t] = rows_of(grads[t], ids[t].size(), *table, "sync");
    step.push_back(store::StepRows{table, ids[t].data(), ids[t].size(), rows[t].const_data_ptr<float>()});
  }
  if (tables.empty()) return;
  store::SyncSteps& steps = sync_steps_of(tables.front());
  py::gil_scoped_release no_gil;
  steps.stage_step(step, tag, timeout_seconds);
}

// ... then, once staged, committed: applied on every shard before this returns.
void commit_step(const std::vector<at::Tensor>& tables, const store::StepTag& tag, double timeout_seconds) {
  std::vector<store::TableHandle*> handles;
  for (const at::Tensor& t : tables) handles.push_back(staged_table(t));
  if (tables.empty()) return;
  store::SyncSteps& steps = sync_steps_of(tables.front());
  py::gil_scoped_release no_gil;
  steps.commit_step(handles, tag, timeout_seconds);
}

// Python's callable, run after each recording (DeferredTable::set_on_record). The hook holds it
// through a pointer whose deleter takes the GIL, since the table may be freed on any thread; after
// the interpreter is gone it is left alone.
void set_record_hook(const at::Tensor& t, py::function hook) {
  store::DeferredTable& table = deferred_of(t, "sync");
  std::shared_ptr<py::function> held(new py::function(std::move(hook)), [](py::function* f) {
    if (!Py_IsInitialized()) return;
    py::gil_scoped_acquire gil;
    delete f;
  });
  table.set_on_record([held] {
    py::gil_scoped_acquire gil;
    (*held)();
  });
}

// torch_recdev.connect(): servers make the current store remote; None makes it embedded again.
py::dict store_info() {
  const std::shared_ptr<store::StoreClient> client = current_store();
  py::dict info;
  info["kind"] = client->kind();
  info["servers"] = client->servers();
  info["shards"] = client->servers().size();
  if (const std::optional<double> timeout = client->timeout_seconds()) {
    info["timeout"] = *timeout;
    info["overlap_updates"] = client->overlaps_updates();
  }
  return info;
}

void connect(const std::optional<std::string>& servers, const std::string& token, double timeout_seconds,
             bool read_only, bool overlap_updates) {
  if (!servers) {
    set_current_store(embedded_store());
    return;
  }
  std::shared_ptr<store::StoreClient> client;
  {
    py::gil_scoped_release no_gil;
    client = std::make_shared<net::RemoteStoreClient>(*servers, token, timeout_seconds, read_only, overlap_updates);
  }
  set_current_store(std::move(client));
}

// RECDEV_SERVERS at import: connected on the store's first use, so that `import torch` opens no socket.
void connect_from_environment(const std::string& servers, const std::string& token, double timeout_seconds,
                              bool overlap_updates) {
  connect_on_first_use(
      [=] {
        return std::make_shared<net::RemoteStoreClient>(servers, token, timeout_seconds, /*read_only=*/false,
                                                        overlap_updates);
      },
      "RECDEV_SERVERS='" + servers + "'");
}

}  // namespace

void bind_table_api(py::module_& m) {
  m.def("_connect", &connect);
  m.def("_connect_from_environment", &connect_from_environment);
  m.def("_store_info", &store_info);
  m.def("_wait_for_store_answers", &device::wait_for_store_answers, py::call_guard<py::gil_scoped_release>());
  m.def("_declare_table", &declare_table);
  m.def("_table_declaration", &table_declaration);
  m.def("_sync_table", &sync_table);
  m.def("_take_pending_updates", &take_pending_updates);
  m.def("_apply_updates", &apply_updates);
  m.def("_stage_step",
        [](const std::vector<at::Tensor>& tables, const std::vector<at::Tensor>& ids,
           const std::vector<at::Tensor>& grads, uint64_t fleet, uint64_t step, uint32_t rank, uint32_t world,
           double timeout) { stage_step(tables, ids, grads, store::StepTag{fleet, step, rank, world}, timeout); });
  m.def("_commit_step",
        [](const std::vector<at::Tensor>& tables, uint64_t fleet, uint64_t step, uint32_t rank, uint32_t world,
           double timeout) { commit_step(tables, store::StepTag{fleet, step, rank, world}, timeout); });
  m.def("_set_record_hook", &set_record_hook);
  m.def("_table_in_process", [](const at::Tensor& t) { return table_of(t, "in_process").in_process(); });
  m.def("_set_table_init", [](const at::Tensor& t, const std::string& kind, double a, double b) {
    store::TableHandle& table = table_of(t, "emb_init");
    table.set_init(rule_of(kind, a, b));
  });
  m.def("_init_rows", &init_rows);
  m.def("_read_rows", &read_rows);
  m.def("_write_rows", &write_rows);
  m.def("_update_rows", &update_rows);
  m.def("_exists", &exists);
  m.def("_erase", &erase);
  m.def("_set_table_optimizer", &set_optimizer);
  // One random op's seed from the recdev generator, below 2**53 (exact in a double):
  // torch_recdev.optim's stochastic-rounding seed.
  m.def("_draw_seed", [] { return draw_op_seed(std::nullopt) & ((uint64_t{1} << 53) - 1); });
  m.def("_set_table_policy", [](const at::Tensor& t, const py::dict& keywords) {
    store::TableHandle& table = table_of(t, "set_table_policy");
    const store::TablePolicyConfig config = policy_from_dict(keywords);
    py::gil_scoped_release no_gil;
    table.set_policy(config);
  });
  m.def("_table_policy", [](const at::Tensor& t) { return policy_to_dict(table_of(t, "table_policy").policy()); });
  m.def("_table_has_policy", [](const at::Tensor& t) { return table_of(t, "table_policy").policy().active(); });
  m.def("_table_is_sync", [](const at::Tensor& t) { return table_of(t, "sync").sync_staging() != nullptr; });
  m.def("_set_table_lr", [](const at::Tensor& t, double lr) { table_of(t, "set_lr").set_learning_rate(lr); });
  m.def("_table_optimizer_step", [](const at::Tensor& t) { return table_of(t, "optimizer_step").optimizer_step(); });
  m.def("_set_table_optimizer_step",
        [](const at::Tensor& t, uint64_t step) { table_of(t, "set_optimizer_step").set_optimizer_step(step); });
  m.def("_save_store", [](const std::string& path) {
    py::gil_scoped_release no_gil;
    current_store()->save(path);
  });
  m.def("_load_store", [](const std::string& path) {
    py::gil_scoped_release no_gil;
    return current_store()->load(path);
  });
  m.def("_checkpoint_version", [](const std::string& directory) {
    py::gil_scoped_release no_gil;
    return current_store()->checkpoint(directory);
  });
  m.def("_restore_version", [](const std::string& directory, std::optional<uint64_t> version) {
    py::gil_scoped_release no_gil;
    return current_store()->restore(directory, version);
  });
  m.def("_export_tables", [](const std::string& directory, std::optional<at::ScalarType> dtype) {
    std::optional<store::ElementType> type;
    if (dtype) type = device::element_type_of(*dtype);
    py::gil_scoped_release no_gil;
    return current_store()->export_tables(directory, type);
  });
  m.def("_list_versions", [](const std::string& directory) {
    py::gil_scoped_release no_gil;
    return store::restorable_versions(directory);
  });
  m.def("_version_files", [](const std::string& directory) {
    std::vector<py::dict> files;
    for (const store::VersionFile& file : store::list_version_files(directory)) {
      py::dict entry;
      entry["path"] = file.path;
      entry["version"] = file.version;
      entry["kind"] = file.base ? "base" : "delta";
      entry["bytes"] = file.bytes;
      entry["written_unix_ms"] = file.written_unix_ms;
      files.push_back(entry);
    }
    return files;
  });
  m.def("_wait_version_compaction", [](const std::string& directory) {
    py::gil_scoped_release no_gil;
    store::version_writer_for(directory).wait_compaction();
  });
}

}  // namespace recdev::python
