// RemoteTable: a table on recdev-server shards seen as a TableHandle: its rows routed to the shards,
// one request per shard a batch reaches; administration broadcast; whole-table transfers.

#include "remote_store.h"

#include <algorithm>
#include <cstring>

#include "pooled_partial.h"
#include "remote_transfer.h"
#include "store/errors.h"
#include "store/gradient_check.h"
#include "store/id_check.h"
#include "store/pooled_gradients.h"
#include "store/row_copier.h"

namespace recdev::net {

using store::ErrorCode;
using store::StoreError;

namespace {

// Room for a request's fixed fields (table id, counts, flags) besides its per-id bytes.
constexpr size_t kFrameOverhead = 256;

[[noreturn]] void bad_answer(const std::string& what) {
  throw StoreError(ErrorCode::Protocol, "a server answered " + what + " with a result of the wrong size");
}

// The rows of a GATHER or PEEK answer for `count` ids, read where they are: decoding a FloatsResponse
// would copy every row once more.
const float* rows_in(const Call& call, size_t count, uint32_t dim) {
  Reader in(call.response.data(), call.response.size());
  const uint32_t floats = in.get<uint32_t>("rows");
  if (floats != count * dim || in.remaining() != size_t{floats} * sizeof(float)) {
    bad_answer(opcode_name(uint8_t(call.opcode)));
  }
  return reinterpret_cast<const float*>(call.response.data() + sizeof(uint32_t));
}

}  // namespace

RemoteTable::RemoteTable(std::shared_ptr<RemoteSession> session, uint64_t client_id, std::string name,
                         uint64_t route_key, uint64_t num_rows, uint32_t dim, store::ElementType dtype,
                         std::vector<uint64_t> table_ids, std::vector<uint64_t> epochs)
    : session_(std::move(session)),
      client_id_(client_id),
      name_(std::move(name)),
      route_key_(route_key),
      num_rows_(num_rows),
      row_words_(dim),
      dtype_(dtype),
      table_ids_(std::move(table_ids)),
      epochs_(std::move(epochs)) {}

std::string RemoteTable::label() const {
  return name_.empty() ? "anonymous table " + std::to_string(client_id_) : "table '" + name_ + "'";
}

void RemoteTable::check_ids(const uint64_t* ids, size_t n) const {
  if (store::all_ids_below(ids, n, num_rows_)) return;
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] >= num_rows_) {
      throw StoreError(ErrorCode::OutOfRange, "row id " + std::to_string(ids[i]) + " (ids[" + std::to_string(i) +
                                                  "]) is out of range [0, " + std::to_string(num_rows_) + ") of " +
                                                  label());
    }
  }
}

RemoteTable::Routed RemoteTable::route(const uint64_t* ids, size_t n) const {
  const size_t shards = session_->num_shards();
  Routed routed{std::vector<std::vector<uint64_t>>(shards), std::vector<std::vector<size_t>>(shards)};
  // Room for a fair share and a little more: no reallocations while the shares fill, in the common case.
  const size_t share = n / shards + n / (4 * shards) + 16;
  for (size_t shard = 0; shard < shards; ++shard) {
    routed.ids[shard].reserve(share);
    routed.positions[shard].reserve(share);
  }
  for (size_t i = 0; i < n; ++i) {
    const uint32_t shard = owner_shard(route_key_, ids[i], uint32_t(shards));
    routed.ids[shard].push_back(ids[i]);
    routed.positions[shard].push_back(i);
  }
  return routed;
}

uint64_t RemoteTable::table_id(RemoteSession::Lease& lease, size_t shard) const {
  const uint64_t epoch = lease.connection(shard).epoch;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (epochs_[shard] == epoch) return table_ids_[shard];
  }
  if (name_.empty()) {
    throw StoreError(ErrorCode::NotFound, session_->describe(shard) + " no longer has " + label() +
                                              ": the server restarted or this session's lease lapsed, and anonymous "
                                              "tables do not survive that");
  }
  const FindResponse found = session_->call<FindResponse>(lease, shard, Opcode::Find, NameRequest{name_});
  if (!found.table || found.table->config.num_rows != num_rows_ || found.table->config.row_words != row_words_) {
    throw StoreError(ErrorCode::NotFound, session_->describe(shard) + " restarted without " + label() +
                                              " (was it started with the --checkpoint-dir it had?)");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  table_ids_[shard] = found.table->table_id;
  epochs_[shard] = epoch;
  return found.table->table_id;
}

size_t RemoteTable::ids_per_request(size_t bytes_per_id) {
  return std::max<size_t>(1, (kMaxPayloadBytes - kFrameOverhead) / bytes_per_id);
}

namespace {

// A batch's requests to one shard carry at most this many bytes of answer each: the shard gathers
// the next piece while the previous one crosses the network, and this client copies each answer
// into place as it arrives instead of after the last one.
constexpr size_t kPipelinedAnswerBytes = size_t{1} << 20;

}  // namespace

RemoteTable::FannedIds RemoteTable::fan_out(const uint64_t* ids, size_t n, size_t answer_bytes_per_id) const {
  FannedIds fanned{route(ids, n), {}};
  const size_t bytes_per_id = std::max<size_t>(sizeof(uint64_t), answer_bytes_per_id);
  const size_t per_request =
      std::min(ids_per_request(bytes_per_id), std::max<size_t>(1, kPipelinedAnswerBytes / bytes_per_id));
  fanned.routed.for_each_piece(
      per_request, [&](size_t shard, size_t begin, size_t end) { fanned.pieces.push_back({shard, begin, end}); });
  return fanned;
}

std::vector<Call> RemoteTable::fanned_calls(RemoteSession::Lease& lease, const FannedIds& fanned, Opcode opcode) const {
  std::vector<Call> calls;
  for (const FannedIds::Piece& piece : fanned.pieces) {
    calls.push_back(make_call(
        piece.shard, opcode,
        IdsRequest{table_id(lease, piece.shard), dtype_, fanned.routed.piece(piece.shard, piece.begin, piece.end)}));
  }
  return calls;
}

template <class Take>
void RemoteTable::fan_out_ids(const uint64_t* ids, size_t n, Opcode opcode, size_t answer_bytes_per_id,
                              Take take) const {
  const FannedIds fanned = fan_out(ids, n, answer_bytes_per_id);
  RemoteSession::Lease lease(*session_);
  std::vector<Call> calls = fanned_calls(lease, fanned, opcode);
  session_->exchange(lease, calls, [&](size_t k) {
    take(calls[k], fanned.positions(k), fanned.count(k));
    lease.connection(calls[k].shard).recycle(std::move(calls[k].response));
  });
}

template <class MakeMessage>
void RemoteTable::broadcast(Opcode opcode, MakeMessage message) {
  RemoteSession::Lease lease(*session_);
  std::vector<Call> calls;
  for (size_t shard = 0; shard < session_->num_shards(); ++shard) {
    calls.push_back(make_call(shard, opcode, message(table_id(lease, shard))));
  }
  session_->exchange(lease, calls);
}

TableInfoResponse RemoteTable::info(size_t shard) const {
  RemoteSession::Lease lease(*session_);
  return session_->call<TableInfoResponse>(lease, shard, Opcode::GetTableInfo, TableRequest{table_id(lease, shard)});
}

store::TableConfig RemoteTable::config() const { return info(0).table.config; }
uint64_t RemoteTable::init_stream() const { return info(0).table.init_stream; }
store::OptimizerConfig RemoteTable::optimizer() const {
  store::OptimizerConfig config = info(0).table.optimizer;
  if (config.kind != store::OptimizerKind::None) seen_optimizer_ = true;
  return config;
}

bool RemoteTable::has_optimizer() const { return seen_optimizer_ || optimizer().kind != store::OptimizerKind::None; }
uint64_t RemoteTable::optimizer_step() const { return info(0).table.optimizer_step; }

std::vector<TableInfoResponse> RemoteTable::infos() const {
  RemoteSession::Lease lease(*session_);
  std::vector<Call> calls;
  for (size_t shard = 0; shard < session_->num_shards(); ++shard) {
    calls.push_back(make_call(shard, Opcode::GetTableInfo, TableRequest{table_id(lease, shard)}));
  }
  session_->exchange(lease, calls);
  std::vector<TableInfoResponse> answers;
  for (const Call& call : calls) answers.push_back(answer_of<TableInfoResponse>(call));
  return answers;
}

store::TableStats RemoteTable::stats() const {
  store::TableStats total{num_rows_, row_words_, 0, 0, 0, 0, 0};
  for (const TableInfoResponse& info : infos()) {
    const store::TableStats& stats = info.stats;
    total.rows += stats.rows;
    total.bytes += stats.bytes;
    total.reads += stats.reads;
    total.writes += stats.writes;
    total.updates += stats.updates;
    total.evicted += stats.evicted;
    total.admitted += stats.admitted;
    total.pending += stats.pending;
    total.rows_in_memory += stats.rows_in_memory;
    total.rows_on_disk += stats.rows_on_disk;
    total.disk_bytes += stats.disk_bytes;
    total.disk_live_bytes += stats.disk_live_bytes;
    total.disk_reads += stats.disk_reads;
    total.disk_read_ops += stats.disk_read_ops;
    total.disk_writes += stats.disk_writes;
  }
  return total;
}

void RemoteTable::set_init(const store::InitRule& rule) {
  store::validate_init_rule(rule);
  broadcast(Opcode::SetInit, [&](uint64_t id) { return SetInitRequest{id, rule}; });
}

void RemoteTable::set_optimizer(const store::OptimizerConfig& config) {
  store::validate_optimizer(config);
  broadcast(Opcode::SetOptimizer, [&](uint64_t id) { return SetOptimizerRequest{id, config}; });
  seen_optimizer_ = config.kind != store::OptimizerKind::None;
}

void RemoteTable::set_learning_rate(double lr) {
  broadcast(Opcode::SetLearningRate, [&](uint64_t id) { return SetLearningRateRequest{id, lr}; });
}

void RemoteTable::set_optimizer_step(uint64_t step) {
  broadcast(Opcode::SetStep, [&](uint64_t id) { return SetStepRequest{id, step}; });
}

void RemoteTable::copy_rows(const Call& call, const size_t* positions, size_t count, size_t n, float* out) const {
  const size_t row_bytes = size_t{row_words_} * sizeof(float);
  const store::RowCopier copier(out, n * row_bytes, row_bytes);
  const float* rows = rows_in(call, count, row_words_);
  for (size_t k = 0; k < count; ++k) copier.copy(out + positions[k] * row_words_, rows + k * row_words_);
}

void RemoteTable::fetch_rows(const uint64_t* ids, size_t n, float* out, Opcode opcode) const {
  check_ids(ids, n);
  fan_out_ids(
      ids, n, opcode, size_t{row_words_} * sizeof(float),
      [&](const Call& call, const size_t* positions, size_t count) { copy_rows(call, positions, count, n, out); });
}

void RemoteTable::gather(const uint64_t* ids, size_t n, float* out) {
  check_ids(ids, n);
  check_every_shard(ids, n, store::Touch::Lookup);
  fetch_rows(ids, n, out, Opcode::Gather);
}

void RemoteTable::send_gather(const uint64_t* ids, size_t n, float* out) {
  check_ids(ids, n);
  check_every_shard(ids, n, store::Touch::Lookup);
  // Owned by the answers' handler, which runs once the caller has returned.
  auto fanned = std::make_shared<const FannedIds>(fan_out(ids, n, size_t{row_words_} * sizeof(float)));
  session_->send_answer_later(
      this, [&](RemoteSession::Lease& lease) { return fanned_calls(lease, *fanned, Opcode::Gather); },
      [this, fanned, n, out](const Call& call, size_t k) {
        copy_rows(call, fanned->positions(k), fanned->count(k), n, out);
      });
}

void RemoteTable::peek(const uint64_t* ids, size_t n, float* out) const { fetch_rows(ids, n, out, Opcode::Peek); }

void RemoteTable::exists(const uint64_t* ids, size_t n, uint8_t* out) const {
  check_ids(ids, n);
  fan_out_ids(ids, n, Opcode::Exists, 1, [&](const Call& call, const size_t* positions, size_t count) {
    const ExistsResponse answer = answer_of<ExistsResponse>(call);
    if (answer.exists.size() != count) bad_answer("EXISTS");
    for (size_t k = 0; k < count; ++k) out[positions[k]] = answer.exists[k];
  });
}

void RemoteTable::erase(const uint64_t* ids, size_t n) {
  check_ids(ids, n);
  fan_out_ids(ids, n, Opcode::Erase, 0, [](const Call&, const size_t*, size_t) {});
}

uint32_t RemoteTable::gather_state(const uint64_t* ids, size_t n, std::vector<float>& out) const {
  check_ids(ids, n);
  std::optional<uint32_t> width;  // every shard's answer has the table's one state width
  // The widest state is Adam's, 2 * dim floats.
  fan_out_ids(ids, n, Opcode::GatherState, size_t{2} * row_words_ * sizeof(float),
              [&](const Call& call, const size_t* positions, size_t count) {
                const StateResponse answer = answer_of<StateResponse>(call);
                if (answer.state.size() != count * answer.width || (width && answer.width != *width)) {
                  bad_answer("GATHER_STATE");
                }
                if (!width) {
                  width = answer.width;
                  out.assign(n * answer.width, 0.0f);
                }
                for (size_t k = 0; k < count; ++k) {
                  std::copy_n(answer.state.data() + k * answer.width, answer.width,
                              out.data() + positions[k] * answer.width);
                }
              });
  if (!width) {
    width = store::optimizer_state_words(optimizer().kind, dtype_, row_words_);
    out.assign(0, 0.0f);
  }
  return *width;
}

void RemoteTable::write(const uint64_t* ids, size_t n, const float* rows) {
  check_ids(ids, n);
  check_every_shard(ids, n, store::Touch::Write);
  const Routed routed = route(ids, n);
  const size_t per_request = ids_per_request(sizeof(uint64_t) + size_t{row_words_} * sizeof(float));
  RemoteSession::Lease lease(*session_);
  std::vector<Call> calls;
  routed.for_each_piece(per_request, [&](size_t shard, size_t begin, size_t end) {
    RowsRequest request;
    request.table_id = table_id(lease, shard);
    request.dtype = dtype_;
    request.ids = routed.piece(shard, begin, end);
    request.rows.resize((end - begin) * row_words_);
    for (size_t k = begin; k < end; ++k) {
      std::memcpy(request.rows.data() + (k - begin) * row_words_, rows + routed.positions[shard][k] * row_words_,
                  size_t{row_words_} * sizeof(float));
    }
    calls.push_back(make_call(shard, Opcode::Write, request));
  });
  session_->exchange(lease, calls);
}

void RemoteTable::expand_bag_gradients(const store::EmbeddingBag& bag, const void* bag_grads,
                                       void (RemoteTable::*send)(const uint64_t*, size_t, const void*)) {
  store::validate_embedding_bag(bag, num_rows_);
  if (bag.mode == store::PoolingMode::Max) {
    throw StoreError(ErrorCode::InvalidArgument, "update_pooled of " + label() + ": max bags need per-id gradients");
  }
  if (dtype() != store::ElementType::Float32) {
    throw StoreError(ErrorCode::InvalidArgument, "update_pooled of " + label() + ": a " + store::describe(dtype()) +
                                                     " table on shards takes per-id gradients (update)");
  }
  const store::PooledGradients<float> pooled(bag, static_cast<const float*>(bag_grads), row_words_,
                                             store::ElementType::Float32);
  std::vector<float> grads(pooled.size() * row_words_);
  for (size_t i = 0; i < pooled.size(); ++i) {
    std::copy_n(pooled.rows()[i], row_words_, grads.data() + i * row_words_);
  }
  (this->*send)(pooled.ids(), pooled.size(), grads.data());
}

void RemoteTable::update_pooled(const uint64_t* ids, size_t num_ids, const int64_t* offsets, size_t num_bags,
                                store::PoolingMode mode, const float* per_sample_weights, bool include_last_offset,
                                int64_t padding_idx, const void* bag_grads) {
  expand_bag_gradients({ids, num_ids, offsets, num_bags, include_last_offset, mode, per_sample_weights, padding_idx},
                       bag_grads, &RemoteTable::update);
}

void RemoteTable::send_update_pooled(const uint64_t* ids, size_t num_ids, const int64_t* offsets, size_t num_bags,
                                     store::PoolingMode mode, const float* per_sample_weights, bool include_last_offset,
                                     int64_t padding_idx, const void* bag_grads) {
  expand_bag_gradients({ids, num_ids, offsets, num_bags, include_last_offset, mode, per_sample_weights, padding_idx},
                       bag_grads, &RemoteTable::send_update);
}

std::vector<uint64_t> RemoteTable::shard_table_ids(RemoteSession::Lease& lease) const {
  std::vector<uint64_t> ids;
  for (size_t shard = 0; shard < session_->num_shards(); ++shard) ids.push_back(table_id(lease, shard));
  return ids;
}

void RemoteTable::scan_into(const std::function<store::RowArrays(const store::TableScanHeader&)>& allocate) const {
  store::RowArrays out{};
  uint32_t record_words = 0;
  uint64_t rows = 0;
  RemoteSession::Lease lease(*session_);
  dump_table(
      *session_, lease, shard_table_ids(lease), label(),
      [&](const store::TableScanHeader& header) {
        out = allocate(header);
        record_words = header.config.row_words + header.config.state_words;
        rows = header.row_count;
      },
      [&](uint64_t row_id, const float* record) {
        // dump_table checks a shard's row count after its last row: stop before writing past the arrays.
        if (rows-- == 0) bad_answer("DUMP");
        *out.ids++ = row_id;
        out.records = std::copy_n(record, record_words, out.records);
      });
}

store::TableSnapshot RemoteTable::snapshot() const {
  RemoteSession::Lease lease(*session_);
  return dump_snapshot(*session_, lease, shard_table_ids(lease), label());
}

void RemoteTable::install(store::RowSet& rows, const store::InitRule& init, uint64_t init_stream,
                          const store::OptimizerConfig& optimizer, uint64_t optimizer_step) {
  if (rows.record_words() < row_words_) {
    throw StoreError(ErrorCode::InvalidArgument, "cannot install rows of " + std::to_string(rows.record_words()) +
                                                     " floats into " + label() + " of dim " +
                                                     std::to_string(row_words_));
  }
  RemoteSession::Lease lease(*session_);
  const std::vector<uint64_t> ids = shard_table_ids(lease);
  const BeginLoadRequest header{
      "",          0,         store::TableConfig{num_rows_, row_words_, rows.record_words() - row_words_, init, dtype_},
      init_stream, optimizer, optimizer_step};
  TableLoad load(*session_, lease, header, ids, route_key_, nullptr);
  try {
    rows.for_each([&](uint64_t row_id, const float* record) { load.add(row_id, record); });
    load.flush();
    commit_loads(*session_, lease, {&load});
  } catch (...) {
    abort_loads(*session_, lease, {&load});
    throw;
  }
}

RowsRequest RemoteTable::gradients_for(RemoteSession::Lease& lease, const Routed& routed, size_t shard,
                                       const float* grads) const {
  const size_t bytes_per_id = sizeof(uint64_t) + size_t{row_words_} * sizeof(float);
  if (routed.ids[shard].size() * bytes_per_id > kMaxPayloadBytes - kFrameOverhead) {
    throw StoreError(ErrorCode::InvalidArgument,
                     "update of " + label() + " refused: " + std::to_string(routed.ids[shard].size()) + " rows for " +
                         session_->describe(shard) + " do not fit in one request of " +
                         std::to_string(kMaxPayloadBytes >> 20) +
                         " MiB, and one optimizer step must be one request; use smaller batches");
  }
  RowsRequest request;
  request.table_id = table_id(lease, shard);
  request.dtype = dtype_;
  request.ids = routed.ids[shard];
  request.rows.resize(request.ids.size() * row_words_);
  for (size_t k = 0; k < request.ids.size(); ++k) {
    std::memcpy(request.rows.data() + k * row_words_, grads + routed.positions[shard][k] * row_words_,
                size_t{row_words_} * sizeof(float));
  }
  return request;
}

void RemoteTable::check_update(const uint64_t* ids, size_t n, const void* grads) const {
  check_ids(ids, n);
  // The store's checks, here, so that no shard applies a batch another would refuse.
  store::check_update_gradients(dtype_, uint32_t(uint64_t{row_words_} * 4 / store::element_bytes(dtype_)), ids, n,
                                grads, label());
  check_every_shard(ids, n, store::Touch::Update);
}

std::vector<Call> RemoteTable::update_calls(RemoteSession::Lease& lease, const Routed& routed,
                                            const void* grads) const {
  // Gradients travel as the table's words (its element type), as rows do.
  std::vector<Call> calls;
  for (size_t shard = 0; shard < routed.ids.size(); ++shard) {
    calls.push_back(
        make_call(shard, Opcode::Update, gradients_for(lease, routed, shard, static_cast<const float*>(grads))));
  }
  return calls;
}

void RemoteTable::update(const uint64_t* ids, size_t n, const void* grads) {
  check_update(ids, n, grads);
  const Routed routed = route(ids, n);
  RemoteSession::Lease lease(*session_);
  std::vector<Call> calls = update_calls(lease, routed, grads);
  session_->exchange(lease, calls);
}

void RemoteTable::send_update(const uint64_t* ids, size_t n, const void* grads) {
  check_update(ids, n, grads);
  const Routed routed = route(ids, n);
  session_->send_answer_later(session_->updates_owner(this),
                              [&](RemoteSession::Lease& lease) { return update_calls(lease, routed, grads); });
}

void RemoteTable::stage_calls(RemoteSession::Lease& lease, const uint64_t* ids, size_t n, const float* grads,
                              const StepTag& tag, uint32_t timeout_ms, std::vector<Call>& calls) {
  if (dtype_ != store::ElementType::Float32) {
    throw StoreError(ErrorCode::InvalidArgument, "synchronous step of " + label() + ": float32 tables only");
  }
  check_ids(ids, n);
  store::check_update_gradients(dtype_, row_words_, ids, n, grads, label());
  const Routed routed = route(ids, n);
  for (size_t shard = 0; shard < routed.ids.size(); ++shard) {
    calls.push_back(make_call(shard, Opcode::StageUpdate,
                              StageUpdateRequest{tag, n, timeout_ms, gradients_for(lease, routed, shard, grads)}));
  }
}

void RemoteTable::commit_calls(RemoteSession::Lease& lease, const StepTag& tag, std::vector<Call>& calls,
                               std::vector<std::pair<size_t, std::exception_ptr>>& unaddressed) {
  for (size_t shard = 0; shard < session_->num_shards(); ++shard) {
    try {
      calls.push_back(make_call(shard, Opcode::CommitUpdate, CommitUpdateRequest{table_id(lease, shard), tag}));
    } catch (const StoreError&) {
      unaddressed.emplace_back(shard, std::current_exception());
    }
  }
}

std::string RemoteTable::describe_shard(size_t shard) const { return label() + " on " + session_->describe(shard); }

void RemoteTable::gather_pooled(const uint64_t* ids, size_t num_ids, const int64_t* offsets, size_t num_bags,
                                store::PoolingMode mode, const float* per_sample_weights, bool include_last_offset,
                                int64_t padding_idx, const store::PooledOutput& out, int64_t* max_positions) {
  if (out.type != store::ElementType::Float32) {
    // Shards add partial sums in another order than CPU's, so a half table's rows are pooled by the
    // caller (RowPathTraits::pools_rows is false for it).
    throw StoreError(ErrorCode::InvalidArgument,
                     "gather_pooled of " + label() +
                         " refused: a remote table pools into float32 only; gather a half table's rows and pool "
                         "them on the CPU");
  }
  const store::EmbeddingBag bag{ids,        num_ids, offsets, num_bags, include_last_offset, mode, per_sample_weights,
                                padding_idx};
  store::validate_embedding_bag(bag, num_rows_);
  check_ids(ids, num_ids);
  check_every_shard(ids, num_ids, store::Touch::Lookup);
  const size_t shards = session_->num_shards();
  std::vector<uint32_t> owner(num_ids);
  for (size_t i = 0; i < num_ids; ++i) owner[i] = owner_shard(route_key_, ids[i], uint32_t(shards));
  // Chunks of whole bags whose ids, bag starts and answers fit in a frame.
  const size_t answer_bytes_per_bag = size_t{row_words_} * (sizeof(float) + sizeof(int32_t)) + sizeof(uint32_t);
  const size_t max_ids = ids_per_request(sizeof(uint64_t) + sizeof(float));
  const size_t max_bags = ids_per_request(answer_bytes_per_bag + sizeof(uint64_t));
  struct Chunk {
    size_t first_bag, end_bag;
    std::vector<ShardBags> shares;
    std::vector<size_t> shards;  // the shards with ids in this chunk
    size_t first_call;
  };
  std::vector<Chunk> chunks;
  std::vector<Call> calls;
  RemoteSession::Lease lease(*session_);
  for (size_t first_bag = 0; first_bag < num_bags;) {
    size_t end_bag = first_bag + 1;
    while (end_bag < num_bags && end_bag - first_bag < max_bags &&
           bag.bag_end(end_bag) - bag.bag_begin(first_bag) <= max_ids) {
      ++end_bag;
    }
    Chunk chunk{first_bag, end_bag, split_bags(bag, first_bag, end_bag, owner, shards), {}, calls.size()};
    for (size_t shard = 0; shard < shards; ++shard) {
      const ShardBags& share = chunk.shares[shard];
      if (share.ids.empty()) continue;
      PooledPartialRequest request;
      request.table_id = table_id(lease, shard);
      request.dtype = dtype_;
      request.ids = share.ids;
      request.offsets = share.offsets;
      request.mode = mode;
      if (per_sample_weights != nullptr) request.per_sample_weights = share.weights;
      request.padding_idx = padding_idx;
      request.ignore_nan = share.ignore_nan;
      calls.push_back(make_call(shard, Opcode::GatherPooledPartial, request));
      chunk.shards.push_back(shard);
    }
    chunks.push_back(std::move(chunk));
    first_bag = end_bag;
  }
  session_->exchange(lease, calls);
  for (Chunk& chunk : chunks) {
    std::vector<ShardBags> shares;
    std::vector<PooledPartialResponse> partials;
    for (size_t k = 0; k < chunk.shards.size(); ++k) {
      shares.push_back(std::move(chunk.shares[chunk.shards[k]]));
      partials.push_back(answer_of<PooledPartialResponse>(calls[chunk.first_call + k]));
    }
    combine_partials(bag, chunk.first_bag, chunk.end_bag, shares, partials, row_words_, static_cast<float*>(out.data),
                     max_positions);
  }
}

void RemoteTable::check_byte_range(uint64_t byte_offset, uint64_t nbytes) const {
  store::check_dense_byte_range(num_rows_, row_words_, byte_offset, nbytes, label());
}

void RemoteTable::read_bytes(uint64_t byte_offset, uint64_t nbytes, void* out) const {
  check_byte_range(byte_offset, nbytes);
  if (nbytes == 0) return;
  const uint64_t row_bytes = uint64_t{row_words_} * sizeof(float);
  const uint64_t first_row = byte_offset / row_bytes;
  const uint64_t end_row = (byte_offset + nbytes + row_bytes - 1) / row_bytes;
  std::vector<uint64_t> ids(end_row - first_row);
  for (size_t k = 0; k < ids.size(); ++k) ids[k] = first_row + k;
  std::vector<float> rows(ids.size() * row_words_);
  peek(ids.data(), ids.size(), rows.data());
  std::memcpy(out, reinterpret_cast<const uint8_t*>(rows.data()) + (byte_offset - first_row * row_bytes), nbytes);
}

void RemoteTable::write_bytes(uint64_t byte_offset, uint64_t nbytes, const void* data) {
  check_byte_range(byte_offset, nbytes);
  const auto* bytes = static_cast<const uint8_t*>(data);
  const uint64_t row_bytes = uint64_t{row_words_} * sizeof(float);
  const uint64_t end = byte_offset + nbytes;
  std::vector<uint64_t> whole_ids;
  std::vector<float> whole_rows;
  RemoteSession::Lease lease(*session_);
  std::vector<Call> calls;
  // A part of a row goes as WRITE_BYTES to the row's owner; whole rows as one WRITE.
  auto write_part = [&](uint64_t from, uint64_t to) {
    const uint64_t row = from / row_bytes;
    const size_t shard = owner_shard(route_key_, row, uint32_t(session_->num_shards()));
    WriteBytesRequest request;
    request.table_id = table_id(lease, shard);
    request.dtype = dtype_;
    request.byte_offset = from;
    request.data.assign(bytes + (from - byte_offset), bytes + (to - byte_offset));
    calls.push_back(make_call(shard, Opcode::WriteBytes, request));
  };
  for (uint64_t at = byte_offset; at < end;) {
    const uint64_t row_end = (at / row_bytes + 1) * row_bytes;
    const uint64_t piece_end = std::min(end, row_end);
    if (at % row_bytes == 0 && piece_end == row_end) {
      whole_ids.push_back(at / row_bytes);
      const size_t k = whole_rows.size();
      whole_rows.resize(k + row_words_);
      std::memcpy(whole_rows.data() + k, bytes + (at - byte_offset), row_bytes);
    } else {
      write_part(at, piece_end);
    }
    at = piece_end;
  }
  session_->exchange(lease, calls);
  if (!whole_ids.empty()) write(whole_ids.data(), whole_ids.size(), whole_rows.data());
}

void RemoteTable::free() noexcept {
  try {
    RemoteSession::Lease lease(*session_);
    std::vector<Call> calls;
    for (size_t shard = 0; shard < session_->num_shards(); ++shard) {
      uint64_t id;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (epochs_[shard] != lease.connection(shard).epoch) continue;  // that server no longer has it
        id = table_ids_[shard];
      }
      calls.push_back(make_call(shard, Opcode::FreeTable, TableRequest{id}));
    }
    session_->exchange_keeping_failures(lease, calls);
  } catch (...) {
    // Unreachable or already gone: the session's lease frees what a server still holds.
  }
}

}  // namespace recdev::net
