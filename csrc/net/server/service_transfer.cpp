// ShardService's handlers that move whole tables for client-side checkpoints: DUMP (a snapshot read
// out in batches) and the staged load BEGIN_LOAD / LOAD_ROWS / COMMIT_LOAD (docs/protocol.md).
#include <algorithm>

#include "service.h"
#include "service_helpers.h"
#include "store/checkpoint.h"

namespace recdev::net {

using namespace service_detail;

std::vector<uint8_t> ShardService::dump(Session& session, const Frame& frame) {
  const auto request = decode<DumpRequest>(frame);
  if (request.max_rows == 0) invalid("DUMP needs max_rows >= 1");
  const Target target = resolve(session, request.table_id);
  std::lock_guard<std::mutex> lock(session.mutex);
  uint64_t snapshot_id = request.snapshot_id;
  if (snapshot_id == 0) {
    // Not checked against --max-memory, so that a shard filled up to its cap can still be saved (the
    // headroom it needs is in docs/remote.md). Its bytes count while it lives: other requests that
    // would grow the shard see the memory it holds.
    DumpSnapshot snapshot;
    snapshot.table_id = request.table_id;
    if (request.chain != 0) {
      store::TableCut cut = target.table->cut_changes(request.chain);
      snapshot.table = TableDescription{request.table_id, cut.header.config, cut.header.init_stream,
                                        cut.header.optimizer, cut.header.optimizer_step};
      snapshot.record_words = cut.header.config.row_words + cut.header.config.state_words;
      snapshot.ids = std::move(cut.ids);
      snapshot.records = std::move(cut.records);
      snapshot.whole = cut.whole;
      snapshot.erased = std::move(cut.erased);
      if (cut.policy) {
        const std::string state = store::encode_policy_state(*cut.policy);
        snapshot.policy_state.assign(state.begin(), state.end());
      }
    } else {
      target.table->scan(
          [&](const store::TableScanHeader& header) {
            snapshot.table = TableDescription{request.table_id, header.config, header.init_stream, header.optimizer,
                                              header.optimizer_step};
            snapshot.record_words = header.config.row_words + header.config.state_words;
            snapshot.ids.reserve(header.row_count);
            snapshot.records.reserve(header.row_count * snapshot.record_words);
          },
          [&](uint64_t row_id, const float* record) {
            snapshot.ids.push_back(row_id);
            snapshot.records.insert(snapshot.records.end(), record, record + snapshot.record_words);
          });
    }
    snapshot_id = sessions_.next_object_id();
    staged_bytes_.fetch_add(snapshot.bytes());
    session.snapshots.emplace(snapshot_id, std::move(snapshot));
  }
  const auto found = session.snapshots.find(snapshot_id);
  if (found == session.snapshots.end() || found->second.table_id != request.table_id) {
    throw StoreError(ErrorCode::NotFound, "no dump snapshot " + std::to_string(snapshot_id) + " of table " +
                                              std::to_string(request.table_id) + " in this session");
  }
  DumpSnapshot& snapshot = found->second;
  const uint64_t record_bytes = uint64_t{snapshot.record_words} * sizeof(float) + sizeof(uint64_t);
  const uint64_t fit = (kMaxPayloadBytes - kResponseSlackBytes) / record_bytes;
  const size_t count = size_t(std::min<uint64_t>({request.max_rows, fit, snapshot.ids.size() - snapshot.next}));
  DumpResponse response;
  response.whole = snapshot.whole;
  if (snapshot.next == 0 && snapshot.next_erased == 0) response.policy_state = std::move(snapshot.policy_state);
  response.snapshot_id = snapshot_id;
  response.table = snapshot.table;
  response.total_rows = snapshot.ids.size();
  response.record_words = snapshot.record_words;
  response.ids.assign(snapshot.ids.begin() + snapshot.next, snapshot.ids.begin() + snapshot.next + count);
  const auto records = snapshot.records.begin() + snapshot.next * snapshot.record_words;
  response.records.assign(records, records + count * snapshot.record_words);
  snapshot.next += count;
  if (snapshot.next == snapshot.ids.size()) {
    // The dropped rows after the rows, in the room the rows left.
    const uint64_t room = (kMaxPayloadBytes - kResponseSlackBytes - count * record_bytes) / sizeof(uint64_t);
    const size_t erased = size_t(std::min<uint64_t>(room, snapshot.erased.size() - snapshot.next_erased));
    response.erased.assign(snapshot.erased.begin() + snapshot.next_erased,
                           snapshot.erased.begin() + snapshot.next_erased + erased);
    snapshot.next_erased += erased;
  }
  response.done = snapshot.next == snapshot.ids.size() && snapshot.next_erased == snapshot.erased.size();
  if (response.done) {
    staged_bytes_.fetch_sub(snapshot.bytes());
    session.snapshots.erase(found);
  }
  return reply(frame, response);
}

namespace {

std::string label_of(const BeginLoadRequest& header) {
  return header.name.empty() ? "table " + std::to_string(header.table_id) : "table '" + header.name + "'";
}

// A load into an existing table must keep its shape: rows already handed out stay valid.
void check_same_shape(const store::TableConfig& existing, const BeginLoadRequest& header, const char* since) {
  if (existing.num_rows != header.config.num_rows || existing.row_words != header.config.row_words ||
      existing.dtype != header.config.dtype) {
    invalid(label_of(header) + " " + since + " " + store::describe(existing) + "; the load has num_rows " +
            std::to_string(header.config.num_rows) + ", dim " + std::to_string(header.config.row_words) +
            " and dtype " + store::describe(header.config.dtype) + " (rows are never loaded as another dtype)");
  }
}

}  // namespace

std::vector<uint8_t> ShardService::begin_load(Session& session, const Frame& frame) {
  auto request = decode<BeginLoadRequest>(frame);
  if (request.name.empty() == (request.table_id == 0)) {
    invalid("BEGIN_LOAD needs exactly one target: the name of a named table, or the id of an existing table");
  }
  store::validate_table_config(request.config);
  check_table_shape(request.config);
  store::validate_optimizer(request.optimizer);
  const uint32_t dim = request.config.row_words;
  if (request.optimizer.kind != store::OptimizerKind::None &&
      request.config.state_words != store::optimizer_state_words(request.optimizer.kind, request.config.dtype, dim)) {
    invalid("state_words " + std::to_string(request.config.state_words) + " does not match optimizer " +
            store::describe(request.optimizer) + ", which keeps " +
            std::to_string(store::optimizer_state_words(request.optimizer.kind, request.config.dtype, dim)) +
            " words per row");
  }
  StagedLoad load;
  if (request.table_id != 0) {
    const Target target = resolve(session, request.table_id);
    check_same_shape(target.table->config(), request, "exists with");
    load.route_key = target.entry.route_key;
  } else {
    if (const auto existing = store_.find(request.name)) {
      check_same_shape(store_.table(*existing)->config(), request, "exists with");
    }
    load.route_key = route_key_of_name(request.name);
  }
  if (!request.policy_state.empty()) {
    load.policy = store::decode_policy_state(request.policy_state.data(), request.policy_state.size(),
                                             request.config.num_rows, request.config.num_rows);
    request.policy_state.clear();
  }
  load.label = label_of(request);
  load.rows = std::make_unique<store::RowSet>(dim + request.config.state_words);
  load.header = std::move(request);
  load.bytes = kNewTableBytes;
  const Reservation reserved = reserve(load.bytes);
  const uint64_t load_id = sessions_.next_object_id();
  std::lock_guard<std::mutex> lock(session.mutex);
  staged_bytes_.fetch_add(load.bytes);
  session.loads.emplace(load_id, std::move(load));
  return reply(frame, LoadIdResponse{load_id});
}

std::vector<uint8_t> ShardService::load_rows(Session& session, const Frame& frame) {
  const auto request = decode<LoadRowsRequest>(frame);
  std::lock_guard<std::mutex> lock(session.mutex);
  const auto found = session.loads.find(request.load_id);
  if (found == session.loads.end()) {
    throw StoreError(ErrorCode::NotFound, "no load " + std::to_string(request.load_id) + " in this session");
  }
  StagedLoad& load = found->second;
  const store::TableConfig& config = load.header.config;
  const uint64_t record_words = uint64_t{config.row_words} + config.state_words;
  const size_t n = request.ids.size();
  if (request.records.size() != n * record_words) {
    invalid("records hold " + std::to_string(request.records.size()) + " floats; " + std::to_string(n) + " rows of " +
            std::to_string(record_words) + " floats need " + std::to_string(n * record_words));
  }
  for (size_t i = 0; i < n; ++i) {
    if (request.ids[i] >= config.num_rows) {
      throw StoreError(ErrorCode::OutOfRange, "row id " + std::to_string(request.ids[i]) + " is out of range [0, " +
                                                  std::to_string(config.num_rows) + ") of " + load.label);
    }
    const uint32_t owner = owner_shard(load.route_key, request.ids[i], options_.num_shards);
    if (owner != options_.shard) {
      invalid("row id " + std::to_string(request.ids[i]) + " of " + load.label + " belongs to shard " +
              std::to_string(owner) + ", not to shard " + std::to_string(options_.shard));
    }
  }
  const uint64_t growth = n * row_cost(record_words);
  const Reservation reserved = reserve(growth);
  for (size_t i = 0; i < n; ++i) {
    if (!load.rows->insert(request.ids[i], request.records.data() + i * record_words)) {
      staged_bytes_.fetch_sub(load.bytes);
      session.loads.erase(found);
      invalid("row id " + std::to_string(request.ids[i]) + " appears twice in load " + std::to_string(request.load_id) +
              ", which was dropped; start again with BEGIN_LOAD");
    }
    load.bytes += row_cost(record_words);
    staged_bytes_.fetch_add(row_cost(record_words));
    ++load.row_count;
  }
  return reply_empty(frame);
}

std::vector<uint8_t> ShardService::commit_load(Session& session, const Frame& frame) {
  const auto request = decode<CommitLoadRequest>(frame);
  std::lock_guard<std::mutex> lock(session.mutex);
  // Everything that can be checked is checked for every load before any table changes.
  std::vector<std::map<uint64_t, StagedLoad>::iterator> loads;
  std::vector<std::shared_ptr<store::Table>> targets;  // null: a named table to create
  for (const uint64_t load_id : request.load_ids) {
    const auto found = session.loads.find(load_id);
    if (found == session.loads.end()) {
      throw StoreError(ErrorCode::NotFound, "no load " + std::to_string(load_id) + " in this session");
    }
    if (std::find(loads.begin(), loads.end(), found) != loads.end()) {
      invalid("load " + std::to_string(load_id) + " is listed twice");
    }
    const BeginLoadRequest& header = found->second.header;
    std::shared_ptr<store::Table> target;
    if (header.table_id != 0) {
      target = resolve(session, header.table_id).table;  // NotFound if it was freed since BEGIN_LOAD
    } else if (const auto existing = store_.find(header.name)) {
      target = store_.table(*existing);
    }
    if (target) check_same_shape(target->config(), header, "changed to");
    loads.push_back(found);
    targets.push_back(std::move(target));
  }
  CommitLoadResponse response;
  for (size_t k = 0; k < loads.size(); ++k) {
    StagedLoad& load = loads[k]->second;
    const BeginLoadRequest& header = load.header;
    std::shared_ptr<store::Table> target = targets[k];
    if (!target) {
      const uint64_t table_id = store_.create_named_table(header.name, header.config);
      register_table(table_id, TableEntry{load.route_key, 0, header.name});
      target = store_.table(table_id);
    }
    // As a checkpoint load into a local store does: the saved policy replaces the table's own before
    // the rows are installed, so that the old one evicts none of them.
    if (load.policy) target->set_policy(store::TablePolicyConfig{});
    target->install(*load.rows, header.config.init, header.init_stream, header.optimizer, header.optimizer_step);
    if (load.policy) target->restore_policy_state(*load.policy);
    response.table_ids.push_back(target->id());
  }
  for (const auto& found : loads) {
    staged_bytes_.fetch_sub(found->second.bytes);
    session.loads.erase(found);  // frees the tables' previous rows, which install left in the row set
  }
  return reply(frame, response);
}

}  // namespace recdev::net
