#include "protocol.h"

#include <algorithm>

#include "store/mix64.h"

namespace recdev::net {

using store::ErrorCode;
using store::StoreError;

namespace {

struct OpcodeName {
  Opcode opcode;
  const char* name;
};

constexpr OpcodeName kOpcodeNames[] = {
    {Opcode::Hello, "HELLO"},
    {Opcode::Ping, "PING"},
    {Opcode::Stats, "STATS"},
    {Opcode::CreateTable, "CREATE_TABLE"},
    {Opcode::OpenNamed, "OPEN_NAMED"},
    {Opcode::Find, "FIND"},
    {Opcode::FreeTable, "FREE_TABLE"},
    {Opcode::List, "LIST"},
    {Opcode::GetTableInfo, "GET_TABLE_INFO"},
    {Opcode::SetInit, "SET_INIT"},
    {Opcode::Gather, "GATHER"},
    {Opcode::Peek, "PEEK"},
    {Opcode::GatherPooledPartial, "GATHER_POOLED_PARTIAL"},
    {Opcode::Write, "WRITE"},
    {Opcode::WriteBytes, "WRITE_BYTES"},
    {Opcode::Exists, "EXISTS"},
    {Opcode::Erase, "ERASE"},
    {Opcode::Update, "UPDATE"},
    {Opcode::GatherState, "GATHER_STATE"},
    {Opcode::SetOptimizer, "SET_OPTIMIZER"},
    {Opcode::SetLearningRate, "SET_LR"},
    {Opcode::SetStep, "SET_STEP"},
    {Opcode::SetPolicy, "SET_POLICY"},
    {Opcode::GetPolicyState, "GET_POLICY_STATE"},
    {Opcode::RestorePolicy, "RESTORE_POLICY"},
    {Opcode::CheckPolicy, "CHECK_POLICY"},
    {Opcode::Dump, "DUMP"},
    {Opcode::BeginLoad, "BEGIN_LOAD"},
    {Opcode::LoadRows, "LOAD_ROWS"},
    {Opcode::CommitLoad, "COMMIT_LOAD"},
    {Opcode::AbortLoad, "ABORT_LOAD"},
    {Opcode::StageUpdate, "STAGE_UPDATE"},
    {Opcode::CommitUpdate, "COMMIT_UPDATE"},
};

// An enum received as an integer: anything past `last` is not a value the peer could have meant.
template <class Enum, class Int>
Enum get_enum(Reader& in, const char* what, Enum last) {
  const Int value = in.get<Int>(what);
  if (value > Int(last)) Reader::fail(std::string(what) + " " + std::to_string(value) + " is not a known value");
  return Enum(value);
}

void encode(Writer& out, const store::InitRule& rule) {
  out.put<uint32_t>(uint32_t(rule.kind));
  out.put<double>(rule.a);
  out.put<double>(rule.b);
  out.put<uint64_t>(rule.seed);
}

void decode(Reader& in, store::InitRule& rule) {
  rule.kind = get_enum<store::InitKind, uint32_t>(in, "init kind", store::InitKind::Xavier);
  rule.a = in.get<double>("init a");
  rule.b = in.get<double>("init b");
  rule.seed = in.get<uint64_t>("init seed");
}

void encode(Writer& out, const store::TableConfig& config) {
  out.put<uint64_t>(config.num_rows);
  out.put<uint32_t>(config.row_words);
  out.put<uint32_t>(config.state_words);
  encode(out, config.init);
  out.put<uint8_t>(uint8_t(config.dtype));
}

void decode(Reader& in, store::TableConfig& config) {
  config.num_rows = in.get<uint64_t>("num_rows");
  config.row_words = in.get<uint32_t>("dim");
  config.state_words = in.get<uint32_t>("state_words");
  decode(in, config.init);
  config.dtype = get_enum<store::ElementType, uint8_t>(in, "element type", store::ElementType::Bytes);
}

void encode(Writer& out, const store::OptimizerConfig& optimizer) {
  out.put<uint32_t>(uint32_t(optimizer.kind));
  out.put<double>(optimizer.lr);
  out.put<double>(optimizer.weight_decay);
  out.put<double>(optimizer.eps);
  out.put<double>(optimizer.lr_decay);
  out.put<double>(optimizer.initial_accumulator_value);
  out.put<double>(optimizer.beta1);
  out.put<double>(optimizer.beta2);
  out.put<uint8_t>(optimizer.stochastic_rounding ? 1 : 0);
  out.put<uint64_t>(optimizer.rounding_seed);
}

void decode(Reader& in, store::OptimizerConfig& optimizer) {
  optimizer.kind = get_enum<store::OptimizerKind, uint32_t>(in, "optimizer kind", store::OptimizerKind::Adam);
  optimizer.lr = in.get<double>("lr");
  optimizer.weight_decay = in.get<double>("weight_decay");
  optimizer.eps = in.get<double>("eps");
  optimizer.lr_decay = in.get<double>("lr_decay");
  optimizer.initial_accumulator_value = in.get<double>("initial_accumulator_value");
  optimizer.beta1 = in.get<double>("beta1");
  optimizer.beta2 = in.get<double>("beta2");
  const uint8_t stochastic_rounding = in.get<uint8_t>("stochastic_rounding");
  if (stochastic_rounding > 1) {
    Reader::fail("stochastic_rounding " + std::to_string(stochastic_rounding) + " is not 0 or 1");
  }
  optimizer.stochastic_rounding = stochastic_rounding == 1;
  optimizer.rounding_seed = in.get<uint64_t>("rounding_seed");
}

void encode(Writer& out, const store::TableStats& stats) {
  out.put<uint64_t>(stats.num_rows);
  out.put<uint32_t>(stats.row_words);
  out.put<uint64_t>(stats.rows);
  out.put<uint64_t>(stats.bytes);
  out.put<uint64_t>(stats.reads);
  out.put<uint64_t>(stats.writes);
  out.put<uint64_t>(stats.updates);
  out.put<uint64_t>(stats.evicted);
  out.put<uint64_t>(stats.admitted);
  out.put<uint64_t>(stats.pending);
  for (const uint64_t value : {stats.rows_in_memory, stats.rows_on_disk, stats.disk_bytes, stats.disk_live_bytes,
                               stats.disk_reads, stats.disk_read_ops, stats.disk_writes}) {
    out.put<uint64_t>(value);
  }
}

void decode(Reader& in, store::TableStats& stats) {
  stats.num_rows = in.get<uint64_t>("num_rows");
  stats.row_words = in.get<uint32_t>("dim");
  stats.rows = in.get<uint64_t>("rows");
  stats.bytes = in.get<uint64_t>("bytes");
  stats.reads = in.get<uint64_t>("reads");
  stats.writes = in.get<uint64_t>("writes");
  stats.updates = in.get<uint64_t>("updates");
  stats.evicted = in.get<uint64_t>("evicted");
  stats.admitted = in.get<uint64_t>("admitted");
  stats.pending = in.get<uint64_t>("pending");
  stats.rows_in_memory = in.get<uint64_t>("rows_in_memory");
  stats.rows_on_disk = in.get<uint64_t>("rows_on_disk");
  stats.disk_bytes = in.get<uint64_t>("disk_bytes");
  stats.disk_live_bytes = in.get<uint64_t>("disk_live_bytes");
  stats.disk_reads = in.get<uint64_t>("disk_reads");
  stats.disk_read_ops = in.get<uint64_t>("disk_read_ops");
  stats.disk_writes = in.get<uint64_t>("disk_writes");
}

constexpr uint8_t kHasMaxRows = 1;
constexpr uint8_t kHasMaxBytes = 2;
constexpr uint8_t kSpills = 4;
constexpr uint8_t kHasMaxDiskBytes = 8;

void encode(Writer& out, const store::TablePolicyConfig& policy) {
  out.put<uint8_t>(uint8_t((policy.max_rows != 0 ? kHasMaxRows : 0) | (policy.max_bytes != 0 ? kHasMaxBytes : 0) |
                           (policy.spill ? kSpills : 0) | (policy.max_disk_bytes != 0 ? kHasMaxDiskBytes : 0)));
  out.put<int64_t>(int64_t(policy.max_rows));
  out.put<int64_t>(int64_t(policy.max_bytes));
  out.put<int64_t>(int64_t(policy.max_disk_bytes));
  out.put<uint8_t>(uint8_t(policy.evict));
  out.put<double>(policy.half_life);
  out.put<uint64_t>(policy.ttl_steps);
  out.put<double>(policy.ttl_seconds);
  out.put<uint32_t>(policy.admit_after);
  out.put<uint32_t>(policy.sketch_width);
}

// A budget flagged present must be a positive count: zero and negative budgets are the sender's
// mistake (InvalidArgument, answered), not a malformed frame.
uint64_t get_budget(Reader& in, bool present, const char* what) {
  const int64_t value = in.get<int64_t>(what);
  if (!present) {
    if (value != 0) Reader::fail(std::string(what) + " is " + std::to_string(value) + " but flagged absent");
    return 0;
  }
  if (value <= 0) {
    throw StoreError(ErrorCode::InvalidArgument, std::string(what) +
                                                     " must be a positive number (or absent for no "
                                                     "budget); got " +
                                                     std::to_string(value));
  }
  return uint64_t(value);
}

// The evict code is kept as sent: store::validate_policy refuses an unknown one with InvalidArgument.
void decode(Reader& in, store::TablePolicyConfig& policy) {
  const uint8_t flags = in.get<uint8_t>("budget flags");
  if ((flags & ~(kHasMaxRows | kHasMaxBytes | kSpills | kHasMaxDiskBytes)) != 0) {
    Reader::fail("unknown budget flags " + std::to_string(flags));
  }
  policy.max_rows = get_budget(in, (flags & kHasMaxRows) != 0, "max_rows");
  policy.max_bytes = get_budget(in, (flags & kHasMaxBytes) != 0, "max_bytes");
  policy.max_disk_bytes = get_budget(in, (flags & kHasMaxDiskBytes) != 0, "max_disk_bytes");
  policy.spill = (flags & kSpills) != 0;
  policy.evict = store::EvictKind(in.get<uint8_t>("evict"));
  policy.half_life = in.get<double>("half_life");
  policy.ttl_steps = in.get<uint64_t>("ttl_steps");
  policy.ttl_seconds = in.get<double>("ttl_seconds");
  policy.admit_after = in.get<uint32_t>("admit_after");
  policy.sketch_width = in.get<uint32_t>("sketch_width");
}

}  // namespace

bool changes_tables(Opcode opcode) {
  switch (opcode) {
    case Opcode::CreateTable:
    case Opcode::FreeTable:
    case Opcode::SetInit:
    case Opcode::Write:
    case Opcode::WriteBytes:
    case Opcode::Erase:
    case Opcode::Update:
    case Opcode::SetOptimizer:
    case Opcode::SetLearningRate:
    case Opcode::SetStep:
    case Opcode::SetPolicy:
    case Opcode::RestorePolicy:
    case Opcode::BeginLoad:
    case Opcode::LoadRows:
    case Opcode::CommitLoad:
    case Opcode::StageUpdate:
    case Opcode::CommitUpdate: return true;
    default: return false;
  }
}

const char* opcode_name(uint8_t opcode) {
  for (const OpcodeName& entry : kOpcodeNames) {
    if (uint8_t(entry.opcode) == opcode) return entry.name;
  }
  return nullptr;
}

void encode_header(const FrameHeader& header, uint8_t out[kHeaderBytes]) {
  std::memcpy(out, &header.payload_bytes, 4);
  out[4] = uint8_t(header.opcode);
  out[5] = header.flags;
  out[6] = 0;
  out[7] = 0;
  std::memcpy(out + 8, &header.request_id, 8);
}

FrameHeader decode_header(const uint8_t in[kHeaderBytes]) {
  FrameHeader header;
  std::memcpy(&header.payload_bytes, in, 4);
  std::memcpy(&header.request_id, in + 8, 8);
  const auto bad_frame = [](const std::string& problem) {
    throw StoreError(ErrorCode::Protocol, "bad frame: " + problem);
  };
  if (header.payload_bytes > kMaxPayloadBytes) {
    bad_frame("a payload of " + std::to_string(header.payload_bytes) + " bytes is past the limit of " +
              std::to_string(kMaxPayloadBytes) + " bytes; split the request");
  }
  if (opcode_name(in[4]) == nullptr) bad_frame("unknown opcode " + std::to_string(in[4]));
  header.opcode = Opcode(in[4]);
  header.flags = in[5];
  if ((header.flags & ~kFlagError) != 0) bad_frame("unknown flags " + std::to_string(header.flags));
  if (in[6] != 0 || in[7] != 0) bad_frame("the reserved field is not 0");
  return header;
}

void finish_frame(std::vector<uint8_t>& frame, Opcode opcode, uint64_t request_id, uint8_t flags) {
  const size_t payload = frame.size() - kHeaderBytes;
  if (payload > kMaxPayloadBytes) {
    throw StoreError(ErrorCode::InvalidArgument, std::string(opcode_name(uint8_t(opcode))) + " of " +
                                                     std::to_string(payload) + " bytes is past the frame limit of " +
                                                     std::to_string(kMaxPayloadBytes) +
                                                     " bytes; split it into smaller batches");
  }
  encode_header(FrameHeader{uint32_t(payload), opcode, flags, request_id}, frame.data());
}

uint32_t owner_shard(uint64_t route_key, uint64_t row_id, uint32_t num_shards) {
  // mix64(row_id) is the hash whose top bits pick a store sub-shard; mixing it again with the key
  // gives bits independent of those.
  const uint64_t hash = store::mix64(store::mix64(row_id) ^ route_key);
  return uint32_t((static_cast<unsigned __int128>(hash) * num_shards) >> 64);
}

uint64_t route_key_of_name(const std::string& name) {
  // FNV-1a from its standard offset basis, then mixed twice so that it shares no structure with the
  // init stream of a named table (store.cpp, mixed once).
  uint64_t hash = 0xCBF29CE484222325ull;
  for (const char c : name) hash = (hash ^ uint8_t(c)) * 0x100000001B3ull;
  return store::mix64(store::mix64(hash));
}

// ---- Messages ----

void encode(Writer&, const Empty&) {}
void decode(Reader&, Empty&) {}

void encode(Writer& out, const ErrorResponse& m) {
  out.put<uint8_t>(uint8_t(m.code));
  out.put_string(m.message.size() > kMaxMessageBytes ? m.message.substr(0, kMaxMessageBytes) : m.message);
}
void decode(Reader& in, ErrorResponse& m) {
  // Any non-zero code is accepted: a newer server may send codes this build does not name.
  const uint8_t code = in.get<uint8_t>("error code");
  if (code == 0) Reader::fail("error code 0");
  m.code = ErrorCode(code);
  m.message = in.get_string("error message", kMaxMessageBytes);
}

void encode(Writer& out, const Hello& m) {
  for (const char c : kMagic) out.put<uint8_t>(uint8_t(c));
  out.put<uint16_t>(m.version);
  out.put_string(m.token);
  out.put<uint64_t>(m.session_id);
}
void decode(Reader& in, Hello& m) {
  for (const char c : kMagic) {
    if (in.get<uint8_t>("magic") != uint8_t(c)) Reader::fail("HELLO does not start with the magic RECDEVNP");
  }
  m.version = in.get<uint16_t>("version");
  if (m.version != kProtocolVersion) {
    // The rest is laid out as that version says; the server only needs the number to refuse it.
    in.skip_rest();
    return;
  }
  m.token = in.get_string("token", kMaxTokenBytes);
  m.session_id = in.get<uint64_t>("session_id");
}

void encode(Writer& out, const Welcome& m) {
  out.put<uint16_t>(m.version);
  out.put<uint32_t>(m.shard);
  out.put<uint32_t>(m.num_shards);
  out.put<uint64_t>(m.session_id);
  out.put<double>(m.lease_seconds);
  out.put<uint32_t>(m.max_payload_bytes);
}
void decode(Reader& in, Welcome& m) {
  m.version = in.get<uint16_t>("version");
  m.shard = in.get<uint32_t>("shard");
  m.num_shards = in.get<uint32_t>("num_shards");
  m.session_id = in.get<uint64_t>("session_id");
  m.lease_seconds = in.get<double>("lease_seconds");
  m.max_payload_bytes = in.get<uint32_t>("max_payload_bytes");
}

void encode(Writer& out, const ServerStats& m) {
  out.put<uint32_t>(m.shard);
  out.put<uint32_t>(m.num_shards);
  out.put<uint64_t>(m.tables);
  out.put<uint64_t>(m.named_tables);
  out.put<uint64_t>(m.rows);
  out.put<uint64_t>(m.bytes);
  out.put<uint64_t>(m.max_memory);
  out.put<uint64_t>(m.requests);
  out.put<uint64_t>(m.errors);
  out.put<uint64_t>(m.connections);
  out.put<uint64_t>(m.sessions);
  out.put<double>(m.uptime_seconds);
  out.put<uint32_t>(wire_count(m.table_counters.size()));
  for (const TableCounters& table : m.table_counters) {
    out.put<uint64_t>(table.table_id);
    out.put_string(table.name);
    out.put<uint64_t>(table.rows);
    out.put<uint64_t>(table.evicted);
    out.put<uint64_t>(table.admitted);
    out.put<uint64_t>(table.pending);
    for (const uint64_t value : {table.rows_on_disk, table.disk_bytes, table.disk_reads, table.disk_writes}) {
      out.put<uint64_t>(value);
    }
    encode(out, table.policy);
  }
  out.put_string(m.serving_dir);
  out.put<uint64_t>(m.serving_version);
  out.put<int64_t>(m.serving_written_unix_ms);
  out.put<uint64_t>(m.staged_steps);
  out.put<uint64_t>(m.staged_bytes);
  out.put<uint32_t>(wire_count(m.opcodes.size()));
  for (const OpcodeCounters& counters : m.opcodes) {
    out.put<uint8_t>(uint8_t(counters.opcode));
    for (const uint64_t value :
         {counters.errors, counters.bytes_received, counters.bytes_sent, counters.rows, counters.latency_ns}) {
      out.put<uint64_t>(value);
    }
    out.put_array(counters.latency_buckets, kLatencyBuckets);
  }
}
void decode(Reader& in, ServerStats& m) {
  m.shard = in.get<uint32_t>("shard");
  m.num_shards = in.get<uint32_t>("num_shards");
  m.tables = in.get<uint64_t>("tables");
  m.named_tables = in.get<uint64_t>("named_tables");
  m.rows = in.get<uint64_t>("rows");
  m.bytes = in.get<uint64_t>("bytes");
  m.max_memory = in.get<uint64_t>("max_memory");
  m.requests = in.get<uint64_t>("requests");
  m.errors = in.get<uint64_t>("errors");
  m.connections = in.get<uint64_t>("connections");
  m.sessions = in.get<uint64_t>("sessions");
  m.uptime_seconds = in.get<double>("uptime_seconds");
  const uint32_t count = in.get<uint32_t>("table count");
  // Each entry is at least 90 bytes: bound the count by the bytes present before reserving.
  if (uint64_t{count} * 90 > in.remaining()) Reader::fail("table count " + std::to_string(count) + " past the payload");
  m.table_counters.resize(count);
  for (TableCounters& table : m.table_counters) {
    table.table_id = in.get<uint64_t>("table_id");
    table.name = in.get_string("name", kMaxNameBytes);
    table.rows = in.get<uint64_t>("rows");
    table.evicted = in.get<uint64_t>("evicted");
    table.admitted = in.get<uint64_t>("admitted");
    table.pending = in.get<uint64_t>("pending");
    table.rows_on_disk = in.get<uint64_t>("rows_on_disk");
    table.disk_bytes = in.get<uint64_t>("disk_bytes");
    table.disk_reads = in.get<uint64_t>("disk_reads");
    table.disk_writes = in.get<uint64_t>("disk_writes");
    decode(in, table.policy);
  }
  m.serving_dir = in.get_string("serving_dir", kMaxNameBytes);
  m.serving_version = in.get<uint64_t>("serving_version");
  m.serving_written_unix_ms = in.get<int64_t>("serving_written_unix_ms");
  m.staged_steps = in.get<uint64_t>("staged_steps");
  m.staged_bytes = in.get<uint64_t>("staged_bytes");
  const uint32_t opcodes = in.get<uint32_t>("opcode count");
  // One entry per opcode at most: bounded before anything is allocated.
  if (opcodes > 256) Reader::fail("opcode count " + std::to_string(opcodes) + " past the 256 opcodes a byte names");
  m.opcodes.resize(opcodes);
  for (OpcodeCounters& counters : m.opcodes) {
    const uint8_t opcode = in.get<uint8_t>("opcode");
    if (opcode_name(opcode) == nullptr) Reader::fail("unknown opcode " + std::to_string(opcode) + " in STATS");
    counters.opcode = Opcode(opcode);
    counters.errors = in.get<uint64_t>("errors");
    counters.bytes_received = in.get<uint64_t>("bytes_received");
    counters.bytes_sent = in.get<uint64_t>("bytes_sent");
    counters.rows = in.get<uint64_t>("rows");
    counters.latency_ns = in.get<uint64_t>("latency_ns");
    const std::vector<uint64_t> buckets = in.get_array<uint64_t>("latency_buckets");
    if (buckets.size() != kLatencyBuckets) {
      Reader::fail(std::to_string(buckets.size()) + " latency buckets; this version has " +
                   std::to_string(kLatencyBuckets));
    }
    std::copy(buckets.begin(), buckets.end(), counters.latency_buckets);
  }
}

uint64_t OpcodeCounters::requests() const {
  uint64_t total = 0;
  for (const uint64_t count : latency_buckets) total += count;
  return total;
}

void encode(Writer& out, const TableRequest& m) { out.put<uint64_t>(m.table_id); }
void decode(Reader& in, TableRequest& m) { m.table_id = in.get<uint64_t>("table_id"); }

void encode(Writer& out, const CreateTableRequest& m) {
  encode(out, m.config);
  out.put_bool(m.init_stream.has_value());
  out.put<uint64_t>(m.init_stream.value_or(0));
  out.put<uint64_t>(m.route_key);
}
void decode(Reader& in, CreateTableRequest& m) {
  decode(in, m.config);
  const bool has_init_stream = in.get_bool("has_init_stream");
  const uint64_t init_stream = in.get<uint64_t>("init_stream");
  if (has_init_stream) m.init_stream = init_stream;
  m.route_key = in.get<uint64_t>("route_key");
}

void encode(Writer& out, const TableIdResponse& m) { out.put<uint64_t>(m.table_id); }
void decode(Reader& in, TableIdResponse& m) { m.table_id = in.get<uint64_t>("table_id"); }

void encode(Writer& out, const OpenNamedRequest& m) {
  out.put_string(m.name);
  encode(out, m.declaration.config);
  out.put_bool(m.declaration.declares_init);
  out.put_bool(m.declaration.optimizer.has_value());
  encode(out, m.declaration.optimizer.value_or(store::OptimizerConfig{}));
  out.put_bool(m.declaration.reset);
  out.put_bool(m.declaration.declares_rounding);
}
void decode(Reader& in, OpenNamedRequest& m) {
  m.name = in.get_string("name", kMaxNameBytes);
  decode(in, m.declaration.config);
  m.declaration.declares_init = in.get_bool("declares_init");
  const bool has_optimizer = in.get_bool("has_optimizer");
  store::OptimizerConfig optimizer;
  decode(in, optimizer);
  if (has_optimizer) m.declaration.optimizer = optimizer;
  m.declaration.reset = in.get_bool("reset");
  m.declaration.declares_rounding = in.get_bool("declares_rounding");
}

void encode(Writer& out, const NameRequest& m) { out.put_string(m.name); }
void decode(Reader& in, NameRequest& m) { m.name = in.get_string("name", kMaxNameBytes); }

void encode(Writer& out, const TableDescription& m) {
  out.put<uint64_t>(m.table_id);
  encode(out, m.config);
  out.put<uint64_t>(m.init_stream);
  encode(out, m.optimizer);
  out.put<uint64_t>(m.optimizer_step);
}
void decode(Reader& in, TableDescription& m) {
  m.table_id = in.get<uint64_t>("table_id");
  decode(in, m.config);
  m.init_stream = in.get<uint64_t>("init_stream");
  decode(in, m.optimizer);
  m.optimizer_step = in.get<uint64_t>("optimizer_step");
}

void encode(Writer& out, const FindResponse& m) {
  out.put_bool(m.table.has_value());
  if (m.table) encode(out, *m.table);
}
void decode(Reader& in, FindResponse& m) {
  if (in.get_bool("found")) decode(in, m.table.emplace());
}

void encode(Writer& out, const ListResponse& m) {
  out.put<uint32_t>(uint32_t(m.tables.size()));
  for (const ListEntry& entry : m.tables) {
    out.put<uint64_t>(entry.table_id);
    out.put_string(entry.name);
    out.put<uint64_t>(entry.route_key);
  }
}
void decode(Reader& in, ListResponse& m) {
  const uint32_t count = in.get<uint32_t>("table count");
  // Each entry is at least 20 bytes: bound the count by the bytes present before reserving.
  if (uint64_t{count} * 20 > in.remaining()) Reader::fail("table count " + std::to_string(count) + " past the payload");
  m.tables.resize(count);
  for (ListEntry& entry : m.tables) {
    entry.table_id = in.get<uint64_t>("table_id");
    entry.name = in.get_string("name", kMaxNameBytes);
    entry.route_key = in.get<uint64_t>("route_key");
  }
}

void encode(Writer& out, const TableInfoResponse& m) {
  encode(out, m.table);
  out.put_string(m.name);
  out.put<uint64_t>(m.route_key);
  encode(out, m.stats);
  encode(out, m.policy);
}
void decode(Reader& in, TableInfoResponse& m) {
  decode(in, m.table);
  m.name = in.get_string("name", kMaxNameBytes);
  m.route_key = in.get<uint64_t>("route_key");
  decode(in, m.stats);
  decode(in, m.policy);
}

void encode(Writer& out, const SetInitRequest& m) {
  out.put<uint64_t>(m.table_id);
  encode(out, m.rule);
}
void decode(Reader& in, SetInitRequest& m) {
  m.table_id = in.get<uint64_t>("table_id");
  decode(in, m.rule);
}

void encode(Writer& out, const IdsRequest& m) {
  out.put<uint64_t>(m.table_id);
  out.put<uint8_t>(uint8_t(m.dtype));
  out.put_array(m.ids);
}
void decode(Reader& in, IdsRequest& m) {
  m.table_id = in.get<uint64_t>("table_id");
  m.dtype = get_enum<store::ElementType, uint8_t>(in, "element type", store::ElementType::Bytes);
  m.ids = in.get_array<uint64_t>("ids");
}

void encode(Writer& out, const RowsRequest& m) {
  out.put<uint64_t>(m.table_id);
  out.put<uint8_t>(uint8_t(m.dtype));
  out.put_array(m.ids);
  out.put_array(m.rows);
}
void decode(Reader& in, RowsRequest& m) {
  m.table_id = in.get<uint64_t>("table_id");
  m.dtype = get_enum<store::ElementType, uint8_t>(in, "element type", store::ElementType::Bytes);
  m.ids = in.get_array<uint64_t>("ids");
  m.rows = in.get_array<float>("rows");
}

void encode(Writer& out, const FloatsResponse& m) { out.put_array(m.values); }
void decode(Reader& in, FloatsResponse& m) { m.values = in.get_array<float>("values"); }

void encode(Writer& out, const ExistsResponse& m) { out.put_array(m.exists); }
void decode(Reader& in, ExistsResponse& m) { m.exists = in.get_array<uint8_t>("exists"); }

void encode(Writer& out, const StateResponse& m) {
  out.put<uint32_t>(m.width);
  out.put_array(m.state);
}
void decode(Reader& in, StateResponse& m) {
  m.width = in.get<uint32_t>("width");
  m.state = in.get_array<float>("state");
}

void encode(Writer& out, const PooledPartialRequest& m) {
  out.put<uint64_t>(m.table_id);
  out.put<uint8_t>(uint8_t(m.dtype));
  out.put_array(m.ids);
  out.put_array(m.offsets);
  out.put<uint8_t>(uint8_t(m.mode));
  out.put_bool(m.per_sample_weights.has_value());
  if (m.per_sample_weights) out.put_array(*m.per_sample_weights);
  out.put<int64_t>(m.padding_idx);
  out.put_array(m.ignore_nan);
}
void decode(Reader& in, PooledPartialRequest& m) {
  m.table_id = in.get<uint64_t>("table_id");
  m.dtype = get_enum<store::ElementType, uint8_t>(in, "element type", store::ElementType::Bytes);
  m.ids = in.get_array<uint64_t>("ids");
  m.offsets = in.get_array<uint64_t>("offsets");
  m.mode = get_enum<store::PoolingMode, uint8_t>(in, "pooling mode", store::PoolingMode::Max);
  if (in.get_bool("has_per_sample_weights")) m.per_sample_weights = in.get_array<float>("per_sample_weights");
  m.padding_idx = in.get<int64_t>("padding_idx");
  m.ignore_nan = in.get_array<uint8_t>("ignore_nan");
}

void encode(Writer& out, const PooledPartialResponse& m) {
  out.put_array(m.values);
  out.put_array(m.counts);
  out.put_array(m.positions);
}
void decode(Reader& in, PooledPartialResponse& m) {
  m.values = in.get_array<float>("values");
  m.counts = in.get_array<uint32_t>("counts");
  m.positions = in.get_array<int32_t>("positions");
}

void encode(Writer& out, const WriteBytesRequest& m) {
  out.put<uint64_t>(m.table_id);
  out.put<uint8_t>(uint8_t(m.dtype));
  out.put<uint64_t>(m.byte_offset);
  out.put_array(m.data);
}
void decode(Reader& in, WriteBytesRequest& m) {
  m.table_id = in.get<uint64_t>("table_id");
  m.dtype = get_enum<store::ElementType, uint8_t>(in, "element type", store::ElementType::Bytes);
  m.byte_offset = in.get<uint64_t>("byte_offset");
  m.data = in.get_array<uint8_t>("data");
}

void encode(Writer& out, const SetOptimizerRequest& m) {
  out.put<uint64_t>(m.table_id);
  encode(out, m.optimizer);
}
void decode(Reader& in, SetOptimizerRequest& m) {
  m.table_id = in.get<uint64_t>("table_id");
  decode(in, m.optimizer);
}

void encode(Writer& out, const SetPolicyRequest& m) {
  out.put<uint64_t>(m.table_id);
  encode(out, m.policy);
}
void decode(Reader& in, SetPolicyRequest& m) {
  m.table_id = in.get<uint64_t>("table_id");
  decode(in, m.policy);
}

void encode(Writer& out, const PolicyStateResponse& m) { out.put_array(m.state); }
void decode(Reader& in, PolicyStateResponse& m) { m.state = in.get_array<uint8_t>("policy state"); }

void encode(Writer& out, const CheckPolicyRequest& m) {
  out.put<uint64_t>(m.table_id);
  out.put<uint8_t>(uint8_t(m.touch));
  out.put_array(m.ids);
}
void decode(Reader& in, CheckPolicyRequest& m) {
  m.table_id = in.get<uint64_t>("table_id");
  m.touch = get_enum<store::Touch, uint8_t>(in, "touch", store::Touch::Write);
  m.ids = in.get_array<uint64_t>("ids");
}

void encode(Writer& out, const RestorePolicyRequest& m) {
  out.put<uint64_t>(m.table_id);
  out.put_array(m.state);
}
void decode(Reader& in, RestorePolicyRequest& m) {
  m.table_id = in.get<uint64_t>("table_id");
  m.state = in.get_array<uint8_t>("policy state");
}

void encode(Writer& out, const SetLearningRateRequest& m) {
  out.put<uint64_t>(m.table_id);
  out.put<double>(m.lr);
}
void decode(Reader& in, SetLearningRateRequest& m) {
  m.table_id = in.get<uint64_t>("table_id");
  m.lr = in.get<double>("lr");
}

void encode(Writer& out, const SetStepRequest& m) {
  out.put<uint64_t>(m.table_id);
  out.put<uint64_t>(m.step);
}
void decode(Reader& in, SetStepRequest& m) {
  m.table_id = in.get<uint64_t>("table_id");
  m.step = in.get<uint64_t>("step");
}

namespace {

void encode_tag(Writer& out, const StepTag& m) {
  out.put<uint64_t>(m.fleet);
  out.put<uint64_t>(m.step);
  out.put<uint32_t>(m.rank);
  out.put<uint32_t>(m.world);
}
StepTag decode_tag(Reader& in) {
  StepTag m;
  m.fleet = in.get<uint64_t>("fleet");
  m.step = in.get<uint64_t>("step");
  m.rank = in.get<uint32_t>("rank");
  m.world = in.get<uint32_t>("world");
  return m;
}

}  // namespace

void encode(Writer& out, const StageUpdateRequest& m) {
  encode_tag(out, m.tag);
  out.put<uint64_t>(m.rank_rows);
  out.put<uint32_t>(m.timeout_ms);
  encode(out, m.rows);
}
void decode(Reader& in, StageUpdateRequest& m) {
  m.tag = decode_tag(in);
  m.rank_rows = in.get<uint64_t>("rank_rows");
  m.timeout_ms = in.get<uint32_t>("timeout_ms");
  decode(in, m.rows);
}

void encode(Writer& out, const CommitUpdateRequest& m) {
  out.put<uint64_t>(m.table_id);
  encode_tag(out, m.tag);
}
void decode(Reader& in, CommitUpdateRequest& m) {
  m.table_id = in.get<uint64_t>("table_id");
  m.tag = decode_tag(in);
}

void encode(Writer& out, const DumpRequest& m) {
  out.put<uint64_t>(m.table_id);
  out.put<uint64_t>(m.snapshot_id);
  out.put<uint32_t>(m.max_rows);
  out.put<uint64_t>(m.chain);
}
void decode(Reader& in, DumpRequest& m) {
  m.table_id = in.get<uint64_t>("table_id");
  m.snapshot_id = in.get<uint64_t>("snapshot_id");
  m.max_rows = in.get<uint32_t>("max_rows");
  m.chain = in.get<uint64_t>("chain");
}

void encode(Writer& out, const DumpResponse& m) {
  out.put<uint64_t>(m.snapshot_id);
  encode(out, m.table);
  out.put<uint64_t>(m.total_rows);
  out.put<uint32_t>(m.record_words);
  out.put_array(m.ids);
  out.put_array(m.records);
  out.put_bool(m.done);
  out.put_bool(m.whole);
  out.put_array(m.erased);
  out.put_array(m.policy_state);
}
void decode(Reader& in, DumpResponse& m) {
  m.snapshot_id = in.get<uint64_t>("snapshot_id");
  decode(in, m.table);
  m.total_rows = in.get<uint64_t>("total_rows");
  m.record_words = in.get<uint32_t>("record_words");
  m.ids = in.get_array<uint64_t>("ids");
  m.records = in.get_array<float>("records");
  m.done = in.get_bool("done");
  m.whole = in.get_bool("whole");
  m.erased = in.get_array<uint64_t>("erased");
  m.policy_state = in.get_array<uint8_t>("policy_state");
}

void encode(Writer& out, const BeginLoadRequest& m) {
  out.put_string(m.name);
  out.put<uint64_t>(m.table_id);
  encode(out, m.config);
  out.put<uint64_t>(m.init_stream);
  encode(out, m.optimizer);
  out.put<uint64_t>(m.optimizer_step);
  out.put_array(m.policy_state);
}
void decode(Reader& in, BeginLoadRequest& m) {
  m.name = in.get_string("name", kMaxNameBytes);
  m.table_id = in.get<uint64_t>("table_id");
  decode(in, m.config);
  m.init_stream = in.get<uint64_t>("init_stream");
  decode(in, m.optimizer);
  m.optimizer_step = in.get<uint64_t>("optimizer_step");
  m.policy_state = in.get_array<uint8_t>("policy state");
}

void encode(Writer& out, const LoadIdResponse& m) { out.put<uint64_t>(m.load_id); }
void decode(Reader& in, LoadIdResponse& m) { m.load_id = in.get<uint64_t>("load_id"); }

void encode(Writer& out, const LoadRowsRequest& m) {
  out.put<uint64_t>(m.load_id);
  out.put_array(m.ids);
  out.put_array(m.records);
}
void decode(Reader& in, LoadRowsRequest& m) {
  m.load_id = in.get<uint64_t>("load_id");
  m.ids = in.get_array<uint64_t>("ids");
  m.records = in.get_array<float>("records");
}

void encode(Writer& out, const LoadRequest& m) { out.put<uint64_t>(m.load_id); }
void decode(Reader& in, LoadRequest& m) { m.load_id = in.get<uint64_t>("load_id"); }

void encode(Writer& out, const CommitLoadRequest& m) { out.put_array(m.load_ids); }
void decode(Reader& in, CommitLoadRequest& m) { m.load_ids = in.get_array<uint64_t>("load_ids"); }

void encode(Writer& out, const CommitLoadResponse& m) { out.put_array(m.table_ids); }
void decode(Reader& in, CommitLoadResponse& m) { m.table_ids = in.get_array<uint64_t>("table_ids"); }

}  // namespace recdev::net
