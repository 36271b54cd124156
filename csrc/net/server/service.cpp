#include "service.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "service_helpers.h"
#include "store/checkpoint.h"
#include "store/chunk_pool.h"
#include "store/errors.h"

namespace recdev::net {

using namespace service_detail;

namespace {

// Constant time in the contents, so the comparison does not tell an attacker how much was right.
bool same_token(const std::string& expected, const std::string& given) {
  uint8_t difference = expected.size() == given.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    difference |= uint8_t(expected[i] ^ (i < given.size() ? given[i] : 0));
  }
  return difference == 0;
}

}  // namespace

ShardService::ShardService(const ServiceOptions& options)
    : options_(options),
      sessions_(options.lease_seconds),
      staged_steps_(options.max_staged_bytes, options.max_stage_seconds) {}

// ---- Responses and errors ----

Response ShardService::error_response(Opcode opcode, uint64_t request_id, ErrorCode code, const std::string& message) {
  const std::string text = "shard " + std::to_string(options_.shard) + ": " + message;
  Response response{encode_frame(opcode, request_id, ErrorResponse{code, text}, kFlagError), false};
  response.close_after = code == ErrorCode::Protocol || code == ErrorCode::PermissionDenied;
  return response;
}

Response ShardService::counted(Opcode opcode, uint64_t bytes_received, Response response, uint64_t rows,
                               Clock::time_point started) {
  counters_.record(opcode, bytes_received, response.frame, rows, Clock::now() - started);
  return response;
}

Response ShardService::refuse_frame(const BadFrame& error) {
  const Clock::time_point started = Clock::now();
  const Opcode opcode = opcode_name(error.opcode) != nullptr ? Opcode(error.opcode) : Opcode::Ping;
  Response response = error_response(opcode, error.request_id, error.code(), error.what());
  response.close_after = true;
  // Only the header was read: the length it announced is not to be believed.
  return counted(opcode, kHeaderBytes, std::move(response), 0, started);
}

Response ShardService::refuse_request(const FrameHeader& header, const StoreError& error) {
  const Clock::time_point started = Clock::now();
  return counted(header.opcode, kHeaderBytes + header.payload_bytes,
                 error_response(header.opcode, header.request_id, error.code(), error.what()), 0, started);
}

Response ShardService::flagged_request(const Frame& frame) {
  // The error flag marks responses: a request carrying it means the peer confuses the two directions.
  return error_response(frame.header.opcode, frame.header.request_id, ErrorCode::Protocol,
                        std::string(opcode_name(uint8_t(frame.header.opcode))) +
                            " request with the error flag set; requests are sent with flags 0");
}

Response ShardService::handshake(const Frame& frame, std::shared_ptr<Session>& session) {
  const Clock::time_point started = Clock::now();
  return counted(frame.header.opcode, kHeaderBytes + frame.payload.size(), authenticate(frame, session), 0, started);
}

Response ShardService::authenticate(const Frame& frame, std::shared_ptr<Session>& session) {
  const Opcode opcode = frame.header.opcode;
  const uint64_t request_id = frame.header.request_id;
  try {
    if (frame.header.flags != 0) return flagged_request(frame);
    if (opcode != Opcode::Hello) {
      return error_response(opcode, request_id, ErrorCode::Protocol,
                            std::string("the first frame must be HELLO, not ") + opcode_name(uint8_t(opcode)));
    }
    const Hello hello = decode<Hello>(frame);
    if (hello.version != kProtocolVersion) {
      return error_response(opcode, request_id, ErrorCode::Protocol,
                            "protocol version " + std::to_string(hello.version) +
                                " is not supported; this server speaks version " + std::to_string(kProtocolVersion) +
                                " (upgrade the client or the server so that they match)");
    }
    if (!options_.token.empty() && !same_token(options_.token, hello.token)) {
      Response response = error_response(
          opcode, request_id, ErrorCode::PermissionDenied,
          hello.token.empty() ? "this server requires a token; pass the one in its --token-file" : "wrong token");
      response.close_after = true;
      return response;
    }
    session = sessions_.attach(hello.session_id);
    Welcome welcome;
    welcome.shard = options_.shard;
    welcome.num_shards = options_.num_shards;
    welcome.session_id = session->id;
    welcome.lease_seconds = sessions_.lease_seconds();
    return Response{reply(frame, welcome), false};
  } catch (const StoreError& error) {
    Response response = error_response(opcode, request_id, error.code(), error.what());
    response.close_after = true;  // no session: nothing else can follow
    return response;
  } catch (const std::exception& error) {
    Response response = error_response(opcode, request_id, ErrorCode::Protocol, error.what());
    response.close_after = true;
    return response;
  }
}

Response ShardService::handle(Session& session, const Frame& frame) {
  const Clock::time_point started = Clock::now();
  request_rows = 0;
  Response response = answer(session, frame);
  return counted(frame.header.opcode, kHeaderBytes + frame.payload.size(), std::move(response), request_rows, started);
}

Response ShardService::answer(Session& session, const Frame& frame) {
  sessions_.touch(session);
  const Opcode opcode = frame.header.opcode;
  const uint64_t request_id = frame.header.request_id;
  const std::string operation = opcode_name(uint8_t(opcode));
  if (frame.header.flags != 0) return flagged_request(frame);
  try {
    return Response{dispatch(session, frame), false};
  } catch (const StoreError& error) {
    return error_response(opcode, request_id, error.code(), operation + ": " + error.what());
  } catch (const std::bad_alloc&) {
    return error_response(opcode, request_id, ErrorCode::Full,
                          operation + ": store full: the server ran out of memory");
  } catch (const std::exception& error) {
    return error_response(opcode, request_id, ErrorCode::InvalidArgument, operation + ": " + error.what());
  }
}

std::vector<uint8_t> ShardService::dispatch(Session& session, const Frame& frame) {
  std::shared_lock<VersionLock> one_version;  // a serving shard's swap waits for this request
  if (serving()) {
    if (changes_tables(frame.header.opcode)) {
      throw StoreError(ErrorCode::ReadOnly, "refused: this is a read-only serving shard (recdev-server --serve " +
                                                options_.serve_dir +
                                                "); tables change on the training shards and reach it as versions");
    }
    one_version = std::shared_lock<VersionLock>(serving_mutex_);
  }
  switch (frame.header.opcode) {
    case Opcode::Hello: throw StoreError(ErrorCode::Protocol, "HELLO was already received on this connection");
    case Opcode::Ping: decode<Empty>(frame); return reply_empty(frame);
    case Opcode::Stats: decode<Empty>(frame); return reply(frame, stats());
    case Opcode::CreateTable: return create_table(session, frame);
    case Opcode::OpenNamed: return open_named(frame);
    case Opcode::Find: return find(frame);
    case Opcode::FreeTable: return free_table(session, frame);
    case Opcode::List: return list(session, frame);
    case Opcode::GetTableInfo: return table_info(session, frame);
    case Opcode::SetInit: {
      const auto request = decode<SetInitRequest>(frame);
      resolve(session, request.table_id).table->set_init(request.rule);
      return reply_empty(frame);
    }
    case Opcode::Gather: return read_rows(session, frame, !serving());  // served rows stay the version's
    case Opcode::Peek: return read_rows(session, frame, false);
    case Opcode::GatherPooledPartial: return gather_pooled_partial(session, frame);
    case Opcode::Write: return write_or_update(session, frame, false);
    case Opcode::WriteBytes: return write_bytes(session, frame);
    case Opcode::Exists: return exists(session, frame);
    case Opcode::Erase: return erase(session, frame);
    case Opcode::Update: return write_or_update(session, frame, true);
    case Opcode::GatherState: return gather_state(session, frame);
    case Opcode::SetOptimizer: {
      const auto request = decode<SetOptimizerRequest>(frame);
      const Target target = resolve(session, request.table_id);
      const store::TableStats stats = target.table->stats();
      const uint64_t record_words =
          stats.row_words +
          store::optimizer_state_words(request.optimizer.kind, target.table->dtype(), stats.row_words);
      const Reservation relaid = reserve(stats.rows * row_cost(record_words));  // records re-laid side by side
      target.table->set_optimizer(request.optimizer);
      return reply_empty(frame);
    }
    case Opcode::SetLearningRate: {
      const auto request = decode<SetLearningRateRequest>(frame);
      resolve(session, request.table_id).table->set_learning_rate(request.lr);
      return reply_empty(frame);
    }
    case Opcode::SetStep: {
      const auto request = decode<SetStepRequest>(frame);
      resolve(session, request.table_id).table->set_optimizer_step(request.step);
      return reply_empty(frame);
    }
    case Opcode::SetPolicy: return set_policy(session, frame);
    case Opcode::GetPolicyState: return policy_state(session, frame);
    case Opcode::RestorePolicy: return restore_policy(session, frame);
    case Opcode::CheckPolicy: {
      const auto request = decode<CheckPolicyRequest>(frame);
      const Target target = resolve(session, request.table_id);
      check_rows(target, request.ids.data(), request.ids.size());
      target.table->check_policy(request.ids.data(), request.ids.size(), request.touch);
      return reply_empty(frame);
    }
    case Opcode::StageUpdate: return stage_update(session, frame);
    case Opcode::CommitUpdate: return commit_update(session, frame);
    case Opcode::Dump: return dump(session, frame);
    case Opcode::BeginLoad: return begin_load(session, frame);
    case Opcode::LoadRows: return load_rows(session, frame);
    case Opcode::CommitLoad: return commit_load(session, frame);
    case Opcode::AbortLoad: {
      const auto request = decode<LoadRequest>(frame);
      std::lock_guard<std::mutex> lock(session.mutex);
      const auto found = session.loads.find(request.load_id);
      if (found == session.loads.end()) {
        throw StoreError(ErrorCode::NotFound, "no load " + std::to_string(request.load_id) + " in this session");
      }
      staged_bytes_.fetch_sub(found->second.bytes);
      session.loads.erase(found);
      return reply_empty(frame);
    }
  }
  throw StoreError(ErrorCode::Protocol, "unknown opcode");  // decode_header admits only known opcodes
}

void ShardService::recycle(std::vector<uint8_t>&& frame) {
  // Only the largest buffer is kept: a connection's memory stays what its largest response needed.
  if (frame.capacity() > spare_buffer.capacity()) spare_buffer = std::move(frame);
}

uint64_t ShardService::response_buffer_bytes() const { return spare_buffer.capacity(); }

void ShardService::release_response_buffer() { std::vector<uint8_t>().swap(spare_buffer); }

// ---- Tables, ownership, memory ----

ShardService::Target ShardService::resolve(const Session& session, uint64_t table_id) const {
  TableEntry entry;
  {
    std::lock_guard<std::mutex> lock(directory_mutex_);
    const auto found = directory_.find(table_id);
    // Another session's anonymous table is reported exactly like a missing one.
    if (found == directory_.end() || (found->second.owner_session != 0 && found->second.owner_session != session.id)) {
      throw StoreError(ErrorCode::NotFound,
                       "no table with id " + std::to_string(table_id) + " on this shard" +
                           " (anonymous tables are visible only to the session that created them)");
    }
    entry = found->second;
  }
  return Target{store_.table(table_id), entry};
}

ShardService::Target ShardService::resolve_rows(const Session& session, uint64_t table_id, store::ElementType dtype,
                                                Opcode opcode) const {
  Target target = resolve(session, table_id);
  const store::ElementType held = target.table->dtype();
  if (dtype != held) {
    invalid(std::string(opcode_name(uint8_t(opcode))) + " of table " + std::to_string(table_id) + " as " +
            store::describe(dtype) + " refused: this shard holds the table's rows as " + store::describe(held) +
            ", and rows are never read or written as another dtype (was the table re-created with another dtype "
            "since this client opened it? open it again to get its current dtype)");
  }
  return target;
}

void ShardService::check_rows(const Target& target, const uint64_t* ids, size_t n) const {
  const uint64_t num_rows = target.table->config().num_rows;
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] >= num_rows) {
      throw StoreError(ErrorCode::OutOfRange, "row id " + std::to_string(ids[i]) + " (ids[" + std::to_string(i) +
                                                  "]) is out of range [0, " + std::to_string(num_rows) + ") of table " +
                                                  std::to_string(target.table->id()));
    }
  }
  if (options_.num_shards == 1) return;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t owner = owner_shard(target.entry.route_key, ids[i], options_.num_shards);
    if (owner != options_.shard) {
      invalid("row id " + std::to_string(ids[i]) + " (ids[" + std::to_string(i) + "]) of table " +
              std::to_string(target.table->id()) + " belongs to shard " + std::to_string(owner) + ", not to shard " +
              std::to_string(options_.shard) + " of " + std::to_string(options_.num_shards) +
              "; route rows with owner_shard (docs/protocol.md)");
    }
  }
}

TableDescription ShardService::describe_table(uint64_t table_id, const store::Table& table) const {
  TableDescription description;
  description.table_id = table_id;
  description.config = table.config();
  description.init_stream = table.init_stream();
  description.optimizer = table.optimizer();
  description.optimizer_step = table.optimizer_step();
  return description;
}

void ShardService::register_table(uint64_t table_id, const TableEntry& entry) {
  std::lock_guard<std::mutex> lock(directory_mutex_);
  directory_[table_id] = entry;
}

void ShardService::adopt_named_tables() {
  for (const auto& [name, table] : store_.named_tables())
    register_table(table->id(), TableEntry{route_key_of_name(name), 0, name});
}

// What the shard holds outside its tables and requests: the empty regions of row memory the pool keeps
// for reuse (store/chunk_pool.h), resident all the same. (Not the unused rest of the regions in use:
// about one region per chunk size, part of the constant docs/server.md states.)
static uint64_t pooled_memory_bytes() { return store::cached_chunk_region_bytes(); }

uint64_t ShardService::memory_used() const {
  uint64_t used = staged_bytes_.load() + buffer_bytes_.load() + staged_steps_.bytes() + reserved_bytes_.load() +
                  pooled_memory_bytes();
  for (const store::TableInfo& info : store_.list()) {
    try {
      used += store_.table(info.id)->memory_bytes();
    } catch (const StoreError&) {
      // Freed since list(): it holds nothing any more.
    }
  }
  return used;
}

ShardService::Reservation ShardService::reserve(uint64_t growth, const std::function<uint64_t()>& precise,
                                                uint64_t working) const {
  if (options_.max_memory == 0) return {};
  // A small request's own memory is left out, so that a full shard still answers reads of the rows it
  // holds: at most --max-connections times this, part of the constant docs/server.md states.
  constexpr uint64_t kUncountedWorkingBytes = 64 << 10;
  if (working <= kUncountedWorkingBytes) working = 0;
  if (growth == 0 && working == 0) return {};  // adds nothing: admitted even to a full shard
  std::lock_guard<std::mutex> lock(reserve_mutex_);
  uint64_t used = memory_used();
  const auto admit = [&] {
    reserved_bytes_.fetch_add(growth + working);
    return Reservation(reserved_bytes_, growth + working);
  };
  if (used + growth + working <= options_.max_memory) return admit();
  if (precise) {
    growth = precise();
    if (growth == 0 && working == 0) return {};
    if (used + growth + working <= options_.max_memory) return admit();
  }
  if (store::cached_chunk_region_bytes() != 0) {
    // Regions kept only to be reused: a full shard gives them back before it refuses anything.
    store::release_cached_chunk_regions();
    used = memory_used();
    if (used + growth + working <= options_.max_memory) return admit();
  }
  growth += working;
  throw StoreError(ErrorCode::Full, "store full: shard " + std::to_string(options_.shard) + " holds " +
                                        std::to_string(used) + " bytes of its --max-memory " +
                                        std::to_string(options_.max_memory) + " and this request could add " +
                                        std::to_string(growth) +
                                        " more; free tables or erase rows, add shards, or raise --max-memory");
}

ShardService::Reservation ShardService::reserve_rows(const store::Table& table, const uint64_t* ids, size_t n,
                                                     uint64_t working) const {
  const store::TableConfig config = table.config();
  const uint64_t cost = row_cost(uint64_t{config.row_words} + config.state_words);
  return reserve(
      n * cost,
      [&] {
        // Only rows not materialized yet grow the table.
        std::vector<uint8_t> present(n);
        table.exists(ids, n, present.data());
        return uint64_t(std::count(present.begin(), present.end(), uint8_t{0})) * cost;
      },
      working + n * kBatchWorkingBytesPerId);
}

// ---- Sessions ----

void ShardService::free_session_objects(Session& session) {
  std::lock_guard<std::mutex> lock(session.mutex);
  for (const uint64_t table_id : session.tables) {
    {
      std::lock_guard<std::mutex> directory_lock(directory_mutex_);
      directory_.erase(table_id);
    }
    try {
      store_.free_table(table_id);
    } catch (const StoreError&) {
      // Already freed.
    }
  }
  session.tables.clear();
  for (const auto& [id, load] : session.loads) staged_bytes_.fetch_sub(load.bytes);
  session.loads.clear();
  for (const auto& [id, snapshot] : session.snapshots) staged_bytes_.fetch_sub(snapshot.bytes());
  session.snapshots.clear();
}

void ShardService::reap_lapsed_sessions() {
  for (const std::shared_ptr<Session>& session : sessions_.take_lapsed()) free_session_objects(*session);
  staged_steps_.reap();
}

ServerStats ShardService::stats() {
  ServerStats stats;
  stats.shard = options_.shard;
  stats.num_shards = options_.num_shards;
  stats.bytes = staged_bytes_.load() + buffer_bytes_.load() + staged_steps_.bytes() + pooled_memory_bytes();
  for (const store::TableInfo& info : store_.list()) {
    try {
      const std::shared_ptr<store::Table> held = store_.table(info.id);
      const store::TableStats table = held->stats();
      ++stats.tables;
      if (!info.name.empty()) ++stats.named_tables;
      stats.rows += table.rows;
      stats.bytes += table.bytes;
      stats.table_counters.push_back(TableCounters{info.id, info.name, table.rows, table.evicted, table.admitted,
                                                   table.pending, table.rows_on_disk, table.disk_bytes,
                                                   table.disk_reads, table.disk_writes, held->policy()});
    } catch (const StoreError&) {}
  }
  stats.max_memory = options_.max_memory;
  stats.opcodes = counters_.read();
  for (const OpcodeCounters& counters : stats.opcodes) {
    stats.requests += counters.requests();
    stats.errors += counters.errors;
  }
  stats.connections = connections_.load();
  stats.sessions = sessions_.size();
  stats.uptime_seconds = std::chrono::duration<double>(Clock::now() - started_).count();
  stats.serving_dir = options_.serve_dir;
  stats.serving_version = serving_version_.load();
  stats.serving_written_unix_ms = serving_written_unix_ms_.load();
  stats.staged_steps = staged_steps_.steps();
  stats.staged_bytes = staged_steps_.bytes();
  return stats;
}

// ---- Handlers ----

std::vector<uint8_t> ShardService::create_table(Session& session, const Frame& frame) {
  const auto request = decode<CreateTableRequest>(frame);
  store::validate_table_config(request.config);
  check_table_shape(request.config);
  const Reservation table_bytes = reserve(kNewTableBytes);
  std::lock_guard<std::mutex> lock(session.mutex);
  const uint64_t table_id = store_.create_table(request.config, request.init_stream);
  register_table(table_id, TableEntry{request.route_key, session.id, {}});
  session.tables.insert(table_id);
  return reply(frame, TableIdResponse{table_id});
}

std::vector<uint8_t> ShardService::open_named(const Frame& frame) {
  const auto request = decode<OpenNamedRequest>(frame);
  if (serving()) return open_served(frame, request);
  store::validate_table_config(request.declaration.config);
  check_table_shape(request.declaration.config);
  const Reservation table_bytes = store_.find(request.name) ? Reservation() : reserve(kNewTableBytes);
  const store::DeclaredTable declared = store_.declare_table(request.name, request.declaration);
  if (declared.replaced) {
    std::lock_guard<std::mutex> lock(directory_mutex_);
    directory_.erase(*declared.replaced);
  }
  register_table(declared.id, TableEntry{route_key_of_name(request.name), 0, request.name});
  return reply(frame, describe_table(declared.id, *store_.table(declared.id)));
}

// A declaration on a serving shard opens the table served under that name if its shape and dtype are
// the declaration's; the rest of it (init rule, optimizer, policy) belongs to training.
std::vector<uint8_t> ShardService::open_served(const Frame& frame, const OpenNamedRequest& request) {
  if (request.declaration.reset) {
    throw StoreError(ErrorCode::ReadOnly, "cannot reset table '" + request.name +
                                              "' on a read-only serving shard (--serve " + options_.serve_dir + ")");
  }
  const auto id = store_.find(request.name);
  if (!id) {
    throw StoreError(ErrorCode::NotFound, "table '" + request.name + "' is not in version " +
                                              std::to_string(serving_version_.load()) + " served from " +
                                              options_.serve_dir);
  }
  const std::shared_ptr<store::Table> table = store_.table(*id);
  const store::TableConfig held = table->config();
  const store::TableConfig& wanted = request.declaration.config;
  if (held.num_rows != wanted.num_rows || held.row_words != wanted.row_words || held.dtype != wanted.dtype) {
    invalid("table '" + request.name + "' is served as " + store::describe(held) + "; the declaration has num_rows " +
            std::to_string(wanted.num_rows) + ", dim " + std::to_string(wanted.row_words) + " and dtype " +
            store::describe(wanted.dtype));
  }
  return reply(frame, describe_table(*id, *table));
}

void ShardService::serve_version(std::vector<store::StagedTable>& tables, uint64_t version, int64_t written_unix_ms) {
  // This shard's rows only, staged before the swap.
  if (options_.num_shards > 1) {
    for (store::StagedTable& table : tables) {
      const uint64_t route_key = route_key_of_name(table.info.name);
      store::RowSet owned(table.rows.record_words());
      table.rows.for_each([&](uint64_t id, const float* record) {
        if (owner_shard(route_key, id, options_.num_shards) == options_.shard) owned.insert(id, record);
      });
      table.rows = std::move(owned);
    }
  }
  std::unique_lock<VersionLock> swap(serving_mutex_);
  for (store::StagedTable& staged : tables) {
    const store::CheckpointTableInfo& info = staged.info;
    std::optional<uint64_t> id = store_.find(info.name);
    if (!id) {
      store::TableConfig config = info.config;
      config.state_words = 0;  // install sets the records' width
      id = store_.create_named_table(info.name, config);
    }
    const std::shared_ptr<store::Table> table = store_.table(*id);
    // A served table holds exactly the version's rows: no budget evicts or admits behind it.
    table->set_policy(store::TablePolicyConfig{});
    table->install(staged.rows, info.config.init, info.init_stream, info.optimizer, info.optimizer_step);
    register_table(*id, TableEntry{route_key_of_name(info.name), 0, info.name});
  }
  serving_version_.store(version);
  serving_written_unix_ms_.store(written_unix_ms);
}

std::vector<uint8_t> ShardService::find(const Frame& frame) {
  const auto request = decode<NameRequest>(frame);
  FindResponse response;
  if (const auto table_id = store_.find(request.name)) {
    try {
      response.table = describe_table(*table_id, *store_.table(*table_id));
    } catch (const StoreError&) {
      // Freed in between: not found.
    }
  }
  return reply(frame, response);
}

std::vector<uint8_t> ShardService::free_table(Session& session, const Frame& frame) {
  const auto request = decode<TableRequest>(frame);
  const Target target = resolve(session, request.table_id);
  {
    std::lock_guard<std::mutex> lock(directory_mutex_);
    directory_.erase(request.table_id);
  }
  store_.free_table(request.table_id);
  if (target.entry.owner_session != 0) {
    std::lock_guard<std::mutex> lock(session.mutex);
    session.tables.erase(request.table_id);
  }
  return reply_empty(frame);
}

std::vector<uint8_t> ShardService::list(const Session& session, const Frame& frame) {
  decode<Empty>(frame);
  ListResponse response;
  std::lock_guard<std::mutex> lock(directory_mutex_);
  for (const auto& [table_id, entry] : directory_) {
    if (entry.owner_session == 0 || entry.owner_session == session.id) {
      response.tables.push_back(ListEntry{table_id, entry.name, entry.route_key});
    }
  }
  return reply(frame, response);
}

std::vector<uint8_t> ShardService::table_info(const Session& session, const Frame& frame) {
  const auto request = decode<TableRequest>(frame);
  const Target target = resolve(session, request.table_id);
  TableInfoResponse response;
  response.table = describe_table(request.table_id, *target.table);
  response.name = target.entry.name;
  response.route_key = target.entry.route_key;
  response.stats = target.table->stats();
  response.policy = target.table->policy();
  return reply(frame, response);
}

std::vector<uint8_t> ShardService::read_rows(const Session& session, const Frame& frame, bool materialize) {
  const auto request = decode<IdsRequest>(frame);
  const Target target = resolve_rows(session, request.table_id, request.dtype, frame.header.opcode);
  const size_t n = request.ids.size();
  check_rows(target, request.ids.data(), n);
  const uint64_t dim = target.table->config().row_words;
  check_response_size(n * dim * sizeof(float), opcode_name(uint8_t(frame.header.opcode)));
  // The rows go straight into the response frame: its payload is one array of n * dim floats.
  const uint64_t response_bytes = kHeaderBytes + sizeof(uint32_t) + n * dim * sizeof(float);
  const Reservation reserved =
      materialize ? reserve_rows(*target.table, request.ids.data(), n, response_bytes) : reserve(0, {}, response_bytes);
  std::vector<uint8_t> response = take_buffer_of_size(response_bytes);
  auto* rows = reinterpret_cast<float*>(place_array<float>(response, kHeaderBytes, n * dim));
  if (materialize) {
    target.table->gather(request.ids.data(), n, rows);
  } else {
    target.table->peek(request.ids.data(), n, rows);
  }
  finish_frame(response, frame.header.opcode, frame.header.request_id);
  return response;
}

std::vector<uint8_t> ShardService::gather_pooled_partial(const Session& session, const Frame& frame) {
  const auto request = decode<PooledPartialRequest>(frame);
  const Target target = resolve_rows(session, request.table_id, request.dtype, frame.header.opcode);
  const size_t n = request.ids.size();
  const size_t num_bags = request.offsets.size();
  check_rows(target, request.ids.data(), n);
  if (request.per_sample_weights) {
    if (request.per_sample_weights->size() != n) {
      invalid("per_sample_weights holds " + std::to_string(request.per_sample_weights->size()) + " weights for " +
              std::to_string(n) + " ids");
    }
    if (request.mode != store::PoolingMode::Sum) invalid("per_sample_weights are only supported with mode Sum");
  }
  if (num_bags == 0 && n != 0) {
    invalid(std::to_string(n) + " ids but no bag offsets; offsets lists every bag's start, beginning with 0");
  }
  std::vector<int64_t> offsets(num_bags);
  for (size_t b = 0; b < num_bags; ++b) {
    if (request.offsets[b] > n) {
      invalid("offsets[" + std::to_string(b) + "] = " + std::to_string(request.offsets[b]) + " is past the " +
              std::to_string(n) + " ids");
    }
    offsets[b] = int64_t(request.offsets[b]);
  }
  const uint64_t dim = target.table->config().row_words;
  const bool max = request.mode == store::PoolingMode::Max;
  if (request.ignore_nan.size() != (max ? num_bags : 0)) {
    invalid("ignore_nan holds " + std::to_string(request.ignore_nan.size()) + " flags; mode " +
            (max ? "Max needs one per bag (" + std::to_string(num_bags) + ")" : std::string("Sum and Mean take none")));
  }
  const uint64_t response_bytes = num_bags * dim * sizeof(float) * (max ? 2 : 1) + num_bags * sizeof(uint32_t);
  check_response_size(response_bytes, "GATHER_POOLED_PARTIAL");
  // The response, and the positions of Max as int64 before they are narrowed into it.
  const Reservation reserved =
      reserve_rows(*target.table, request.ids.data(), n, response_bytes + (max ? num_bags * dim * sizeof(int64_t) : 0));

  PooledPartialResponse response;
  response.values.resize(num_bags * dim);
  std::vector<int64_t> positions(max ? num_bags * dim : 0);
  // Mean is pooled as Sum: the client divides the shards' summed rows by their summed counts.
  const store::PoolingMode mode = max ? store::PoolingMode::Max : store::PoolingMode::Sum;
  target.table->gather_pooled(request.ids.data(), n, offsets.data(), num_bags, mode,
                              request.per_sample_weights ? request.per_sample_weights->data() : nullptr, false,
                              request.padding_idx, response.values.data(), max ? positions.data() : nullptr,
                              max ? request.ignore_nan.data() : nullptr);
  if (max) {
    response.positions.assign(positions.begin(), positions.end());  // < n <= 2^32 / 8: fits in i32
  } else {
    response.counts.resize(num_bags);
    for (size_t b = 0; b < num_bags; ++b) {
      const size_t end = b + 1 < num_bags ? size_t(offsets[b + 1]) : n;
      uint32_t count = 0;
      for (size_t i = size_t(offsets[b]); i < end; ++i) {
        count += request.padding_idx < 0 || request.ids[i] != uint64_t(request.padding_idx) ? 1 : 0;
      }
      response.counts[b] = count;
    }
  }
  return reply(frame, response);
}

std::vector<uint8_t> ShardService::write_or_update(const Session& session, const Frame& frame, bool update) {
  const auto request = decode<RowsRequest>(frame);
  const Target target = resolve_rows(session, request.table_id, request.dtype, frame.header.opcode);
  const size_t n = request.ids.size();
  const uint64_t dim = target.table->config().row_words;
  if (request.rows.size() != n * dim) {
    invalid(std::string(update ? "grads" : "rows") + " hold " + std::to_string(request.rows.size()) + " floats; " +
            std::to_string(n) + " ids of dim " + std::to_string(dim) + " need " + std::to_string(n * dim));
  }
  check_rows(target, request.ids.data(), n);
  const Reservation reserved = reserve_rows(*target.table, request.ids.data(), n);
  if (update) {
    target.table->update(request.ids.data(), n, request.rows.data());
  } else {
    target.table->write(request.ids.data(), n, request.rows.data());
  }
  return reply_empty(frame);
}

std::vector<uint8_t> ShardService::write_bytes(const Session& session, const Frame& frame) {
  const auto request = decode<WriteBytesRequest>(frame);
  const Target target = resolve_rows(session, request.table_id, request.dtype, frame.header.opcode);
  const uint64_t nbytes = request.data.size();
  target.table->check_byte_range(request.byte_offset, nbytes);
  if (nbytes == 0) return reply_empty(frame);
  const uint64_t row_bytes = uint64_t{target.table->config().row_words} * sizeof(float);
  const uint64_t first_row = request.byte_offset / row_bytes;
  const uint64_t last_row = (request.byte_offset + nbytes - 1) / row_bytes;
  std::vector<uint64_t> rows(last_row - first_row + 1);  // at most nbytes / 4 + 2: bounded by the frame
  for (uint64_t row = first_row; row <= last_row; ++row) rows[row - first_row] = row;
  check_rows(target, rows.data(), rows.size());
  const Reservation reserved = reserve_rows(*target.table, rows.data(), rows.size());
  target.table->write_bytes(request.byte_offset, nbytes, request.data.data());
  return reply_empty(frame);
}

std::vector<uint8_t> ShardService::exists(const Session& session, const Frame& frame) {
  const auto request = decode<IdsRequest>(frame);
  const Target target = resolve_rows(session, request.table_id, request.dtype, frame.header.opcode);
  check_rows(target, request.ids.data(), request.ids.size());
  ExistsResponse response;
  response.exists.resize(request.ids.size());
  target.table->exists(request.ids.data(), request.ids.size(), response.exists.data());
  return reply(frame, response);
}

std::vector<uint8_t> ShardService::erase(const Session& session, const Frame& frame) {
  const auto request = decode<IdsRequest>(frame);
  const Target target = resolve_rows(session, request.table_id, request.dtype, frame.header.opcode);
  check_rows(target, request.ids.data(), request.ids.size());
  target.table->erase(request.ids.data(), request.ids.size());
  return reply_empty(frame);
}

std::vector<uint8_t> ShardService::gather_state(const Session& session, const Frame& frame) {
  const auto request = decode<IdsRequest>(frame);
  const Target target = resolve_rows(session, request.table_id, request.dtype, frame.header.opcode);
  check_rows(target, request.ids.data(), request.ids.size());
  check_response_size(request.ids.size() * uint64_t{target.table->config().state_words} * sizeof(float),
                      "GATHER_STATE");
  StateResponse response;
  response.width = target.table->gather_state(request.ids.data(), request.ids.size(), response.state);
  return reply(frame, response);
}

std::vector<uint8_t> ShardService::set_policy(const Session& session, const Frame& frame) {
  const auto request = decode<SetPolicyRequest>(frame);
  store::validate_policy(request.policy);
  const Target target = resolve(session, request.table_id);
  const Reservation sketch = reserve(sketch_bytes(request.policy));
  target.table->set_policy(request.policy);
  return reply_empty(frame);
}

std::vector<uint8_t> ShardService::policy_state(const Session& session, const Frame& frame) {
  const auto request = decode<TableRequest>(frame);
  const Target target = resolve(session, request.table_id);
  PolicyStateResponse response;
  if (const std::optional<store::TablePolicyState> state = target.table->policy_state()) {
    const std::string encoded = store::encode_policy_state(*state);
    check_response_size(encoded.size(), "GET_POLICY_STATE");
    response.state.assign(encoded.begin(), encoded.end());
  }
  return reply(frame, response);
}

std::vector<uint8_t> ShardService::restore_policy(const Session& session, const Frame& frame) {
  const auto request = decode<RestorePolicyRequest>(frame);
  const Target target = resolve(session, request.table_id);
  const uint64_t num_rows = target.table->config().num_rows;
  // decode_policy_state checks every count against the bytes present before it allocates.
  const store::TablePolicyState state =
      store::decode_policy_state(request.state.data(), request.state.size(), num_rows, num_rows);
  const Reservation sketch = reserve(sketch_bytes(state.config));
  target.table->restore_policy_state(state);
  return reply_empty(frame);
}

}  // namespace recdev::net
