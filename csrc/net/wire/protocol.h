// The recdev wire protocol, version 1: frames, the handshake, and every request and response as a
// plain struct with its encode/decode, shared by recdev-server and the client. docs/protocol.md is
// the byte-level reference; this file and it change together.
//
//   frame := u32 payload_length | u8 opcode | u8 flags | u16 reserved = 0 | u64 request_id | payload
//
// A response carries the opcode and request_id of its request (a connection may pipeline); flags
// bit 0 marks an error response, whose payload is ErrorResponse. Requests have flags = 0.
// Compatibility: opcodes, field order and ErrorCode values are fixed for a version; a change that an
// old peer would misread bumps kProtocolVersion.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "store/declaration.h"
#include "store/embedding_bag.h"
#include "store/errors.h"
#include "store/init_rule.h"
#include "store/optimizer.h"
#include "store/sync_steps.h"
#include "store/table.h"
#include "wire.h"

namespace recdev::net {

constexpr char kMagic[8] = {'R', 'E', 'C', 'D', 'E', 'V', 'N', 'P'};
// 4: a table's config carries its element type (u8 after the init rule), and OPEN_NAMED a
// declaration (init rule, optimizer, reset) instead of opening whatever exists.
// 5: OptimizerConfig carries stochastic_rounding (u8) and rounding_seed (u64) after beta2.
// 6: table policies (SET_POLICY, GET_POLICY_STATE, RESTORE_POLICY; the policy and its counters in
// GET_TABLE_INFO and STATS), and every row request carries the element type the client holds the
// table as, so that a shard never reads or answers rows as another dtype.
// 7: synchronous steps staged on the shards (STAGE_UPDATE, COMMIT_UPDATE).
// 8: OPEN_NAMED carries declares_rounding (bool, after reset): a declared optimizer that does not
// name stochastic rounding keeps the table's rounding mode and seed.
// 9: CHECK_POLICY.
// 10: TablePolicy carries spill (budget flag bit 2) and max_disk_bytes (bit 3, an i64 after
// max_bytes); TableStats the disk tier's rows, bytes, reads and writes.
// 11: DUMP's chain, whole, erased and policy_state (incremental checkpoints).
// 12: STATS carries the staged synchronous steps and the per-opcode request counters (OpcodeCounters).
constexpr uint16_t kProtocolVersion = 12;
constexpr size_t kHeaderBytes = 16;
// Caps, checked before anything is allocated. A client splits larger batches into several requests.
constexpr uint32_t kMaxPayloadBytes = uint32_t{256} << 20;
constexpr size_t kMaxNameBytes = 4096;
constexpr size_t kMaxTokenBytes = 4096;
constexpr size_t kMaxMessageBytes = 64 * 1024;
// The largest frame a server reads before HELLO: a HELLO with the longest token is 4118 bytes, so
// a client that has not authenticated cannot make the server buffer more.
constexpr uint32_t kMaxHelloPayloadBytes = 8 * 1024;
// A table whose record (weight plus the widest optimizer state, Adam's 2 * row_words) could not travel in
// one frame is refused at creation: row_words <= 2^24.
constexpr uint32_t kMaxDim = uint32_t{1} << 24;

enum class Opcode : uint8_t {
  Hello = 1,
  Ping = 2,
  Stats = 3,
  CreateTable = 10,
  OpenNamed = 11,
  Find = 12,
  FreeTable = 13,
  List = 14,
  GetTableInfo = 15,
  SetInit = 16,
  Gather = 20,
  Peek = 21,
  GatherPooledPartial = 22,
  Write = 23,
  WriteBytes = 24,
  Exists = 25,
  Erase = 26,
  Update = 27,
  GatherState = 28,
  SetOptimizer = 30,
  SetLearningRate = 31,
  SetStep = 32,
  SetPolicy = 33,
  GetPolicyState = 34,
  RestorePolicy = 35,
  CheckPolicy = 36,
  Dump = 40,
  BeginLoad = 41,
  LoadRows = 42,
  CommitLoad = 43,
  AbortLoad = 44,
  StageUpdate = 50,
  CommitUpdate = 51,
};

// "GATHER", ..., or nullptr for a byte that is no opcode.
const char* opcode_name(uint8_t opcode);

constexpr uint8_t kFlagError = 1;

struct FrameHeader {
  uint32_t payload_bytes = 0;
  Opcode opcode = Opcode::Ping;
  uint8_t flags = 0;
  uint64_t request_id = 0;
};

void encode_header(const FrameHeader& header, uint8_t out[kHeaderBytes]);
// Throws StoreError(Protocol) for a payload past kMaxPayloadBytes, an unknown opcode, unknown flags
// or a non-zero reserved field.
FrameHeader decode_header(const uint8_t in[kHeaderBytes]);

// A whole frame in one buffer: header then the encoded message.
template <class Message>
std::vector<uint8_t> encode_frame(Opcode opcode, uint64_t request_id, const Message& message, uint8_t flags = 0);
// The same into an existing buffer, whose capacity is reused (a server answering large gathers
// would otherwise fault in fresh pages for every response).
template <class Message>
void encode_frame_into(std::vector<uint8_t>& frame, Opcode opcode, uint64_t request_id, const Message& message,
                       uint8_t flags = 0);
// Fills in the header of a frame whose payload was appended after kHeaderBytes of room.
void finish_frame(std::vector<uint8_t>& frame, Opcode opcode, uint64_t request_id, uint8_t flags = 0);

// Decodes a payload that must hold exactly one Message.
template <class Message>
Message decode_payload(const uint8_t* payload, size_t size, const char* what);

// ---- Row ownership ----

// The shard that owns row `row_id` of a table with routing key `route_key`, among num_shards >= 1:
// a stable 64-bit mix of both (independent of the bits store::shard_of takes from the row's hash,
// so each server's rows spread evenly over its sub-shards), mapped to [0, num_shards) by its high bits.
uint32_t owner_shard(uint64_t route_key, uint64_t row_id, uint32_t num_shards);
// The routing key of a named table: a stable hash of its name (anonymous tables get theirs from the
// client at CreateTable).
uint64_t route_key_of_name(const std::string& name);

// ---- Messages ----

struct Empty {};

struct ErrorResponse {
  store::ErrorCode code = store::ErrorCode::Protocol;
  std::string message;
};

struct Hello {
  uint16_t version = kProtocolVersion;
  std::string token;
  uint64_t session_id = 0;  // 0: start a new session; else resume that one
};

struct Welcome {
  uint16_t version = kProtocolVersion;
  uint32_t shard = 0;
  uint32_t num_shards = 1;
  uint64_t session_id = 0;
  double lease_seconds = 0;
  uint32_t max_payload_bytes = kMaxPayloadBytes;
};

// One table of STATS: its rows and what its policy did on this shard.
struct TableCounters {
  uint64_t table_id = 0;
  std::string name;  // empty: an anonymous table
  uint64_t rows = 0;
  uint64_t evicted = 0;
  uint64_t admitted = 0;
  uint64_t pending = 0;
  uint64_t rows_on_disk = 0;  // the disk tier (spill): its rows, files' bytes, rows read back and written
  uint64_t disk_bytes = 0;
  uint64_t disk_reads = 0;
  uint64_t disk_writes = 0;
  store::TablePolicyConfig policy;  // this shard's share of the budget
};

// The requests of one opcode a shard answered since it started (STATS, the metrics endpoint): how
// long each took from its frame read to its answer built, in kLatencyBuckets buckets — bucket k counts
// the requests that took at most latency_bucket_bound_us(k) microseconds and more than bucket k-1's
// bound, the last one every request slower than 2^25 us (33.6 s) — and what they carried.
constexpr size_t kLatencyBuckets = 27;
constexpr uint64_t latency_bucket_bound_us(size_t bucket) { return uint64_t{1} << bucket; }  // k < kLatencyBuckets - 1

struct OpcodeCounters {
  Opcode opcode = Opcode::Ping;
  uint64_t errors = 0;          // answered with an error frame
  uint64_t bytes_received = 0;  // request frames, headers included
  uint64_t bytes_sent = 0;      // response frames, headers included
  uint64_t rows = 0;            // row ids the requests named, and rows DUMP answered
  uint64_t latency_ns = 0;      // the requests' latencies added up
  uint64_t latency_buckets[kLatencyBuckets] = {};
  uint64_t requests() const;  // the buckets added up
};

struct ServerStats {
  uint32_t shard = 0;
  uint32_t num_shards = 1;
  uint64_t tables = 0;  // named and anonymous
  uint64_t named_tables = 0;
  uint64_t rows = 0;         // materialized rows of every table
  uint64_t bytes = 0;        // memory held by every table, staged loads and dump snapshots
  uint64_t max_memory = 0;   // --max-memory, 0 = no limit
  uint64_t requests = 0;     // requests answered since start (before this STATS): the opcodes' added up
  uint64_t errors = 0;       // of them, error responses
  uint64_t connections = 0;  // open now
  uint64_t sessions = 0;     // live now
  double uptime_seconds = 0;
  std::vector<TableCounters> table_counters;  // every table, by id
  // A serving shard (--serve): the directory, the version served (0 before the first) and when it was
  // written (unix milliseconds); empty, 0 and 0 for a training shard.
  std::string serving_dir;
  uint64_t serving_version = 0;
  int64_t serving_written_unix_ms = 0;
  uint64_t staged_steps = 0;  // synchronous steps held (staged_steps.h), and the bytes of their parts
  uint64_t staged_bytes = 0;
  std::vector<OpcodeCounters> opcodes;  // every opcode answered at least once, by opcode
};

// Whether a request changes what a shard holds (a read-only serving shard refuses it).
bool changes_tables(Opcode opcode);

struct TableRequest {  // FreeTable, GetTableInfo
  uint64_t table_id = 0;
};

struct CreateTableRequest {
  store::TableConfig config;
  std::optional<uint64_t> init_stream;  // none: the server's table id
  uint64_t route_key = 0;
};

struct TableIdResponse {
  uint64_t table_id = 0;
};

struct OpenNamedRequest {  // a declaration (store::TableDeclaration) of a named table
  std::string name;
  store::TableDeclaration declaration;
};

struct NameRequest {  // Find
  std::string name;
};

struct TableDescription {
  uint64_t table_id = 0;
  store::TableConfig config;
  uint64_t init_stream = 0;
  store::OptimizerConfig optimizer;
  uint64_t optimizer_step = 0;
};

struct FindResponse {
  std::optional<TableDescription> table;
};

struct ListEntry {
  uint64_t table_id = 0;
  std::string name;  // empty: an anonymous table of this session
  uint64_t route_key = 0;
};

struct ListResponse {
  std::vector<ListEntry> tables;
};

struct TableInfoResponse {
  TableDescription table;
  std::string name;
  uint64_t route_key = 0;
  store::TableStats stats{};
  store::TablePolicyConfig policy;  // this shard's share (inactive: none)
};

struct SetInitRequest {
  uint64_t table_id = 0;
  store::InitRule rule;
};

// Every request on a table's rows names the element type the client holds the table as; the shard
// refuses a request whose type is not the table's (ShardService::resolve_rows).
struct IdsRequest {  // Gather, Peek, Exists, Erase, GatherState
  uint64_t table_id = 0;
  store::ElementType dtype = store::ElementType::Float32;
  std::vector<uint64_t> ids;
};

struct RowsRequest {  // Write (rows), Update (gradients): ids.size() * row_words words of the element type
  uint64_t table_id = 0;
  store::ElementType dtype = store::ElementType::Float32;
  std::vector<uint64_t> ids;
  std::vector<float> rows;
};

struct FloatsResponse {  // Gather, Peek: ids.size() * row_words words
  std::vector<float> values;
};

struct ExistsResponse {
  std::vector<uint8_t> exists;  // 1 materialized, 0 not
};

struct StateResponse {
  uint32_t width = 0;  // state words per row
  std::vector<float> state;
};

// Partial embedding_bag over this shard's ids: the client sends each shard the ids it owns with bag
// offsets rebased to them, and combines the partial results (docs/protocol.md).
struct PooledPartialRequest {
  uint64_t table_id = 0;
  store::ElementType dtype = store::ElementType::Float32;
  std::vector<uint64_t> ids;
  std::vector<uint64_t> offsets;  // bag starts: offsets[0] = 0, non-decreasing, <= ids.size()
  store::PoolingMode mode = store::PoolingMode::Sum;
  std::optional<std::vector<float>> per_sample_weights;  // Sum only, one per id
  int64_t padding_idx = -1;
  // Max: one flag per bag, nonzero where another shard holds the bag's first row, so that a nan here
  // never counts (store::EmbeddingBag::ignore_nan). Empty for Sum and Mean.
  std::vector<uint8_t> ignore_nan;
};

struct PooledPartialResponse {
  std::vector<float> values;       // num_bags * row_words: sums (Sum, Mean) or maxima (Max; 0 for no row)
  std::vector<uint32_t> counts;    // Sum, Mean: num_bags non-padding ids per bag; Max: empty
  std::vector<int32_t> positions;  // Max: num_bags * row_words positions in ids (-1 for no row); else empty
};

struct WriteBytesRequest {
  uint64_t table_id = 0;
  store::ElementType dtype = store::ElementType::Float32;
  uint64_t byte_offset = 0;
  std::vector<uint8_t> data;
};

struct SetOptimizerRequest {
  uint64_t table_id = 0;
  store::OptimizerConfig optimizer;
};

// A table's policy on one shard: that shard's share of the budget (docs/protocol.md, "Policies").
// On the wire the budgets are signed and flagged present, so that a zero or negative budget is
// refused (InvalidArgument) rather than read as "no budget".
struct SetPolicyRequest {
  uint64_t table_id = 0;
  store::TablePolicyConfig policy;
};

// A shard's policy with its touch metadata, clocks and sketch, in the checkpoint encoding
// (store::encode_policy_state); empty: the table has no policy.
struct PolicyStateResponse {
  std::vector<uint8_t> state;
};

// Would the shard's policy refuse this request now? Answered empty, or with the policy's error; the
// shard changes nothing either way.
struct CheckPolicyRequest {
  uint64_t table_id = 0;
  store::Touch touch = store::Touch::Lookup;
  std::vector<uint64_t> ids;
};

struct RestorePolicyRequest {
  uint64_t table_id = 0;
  std::vector<uint8_t> state;  // store::encode_policy_state, as GET_POLICY_STATE answers
};

struct SetLearningRateRequest {
  uint64_t table_id = 0;
  double lr = 0;
};

struct SetStepRequest {
  uint64_t table_id = 0;
  uint64_t step = 0;
};

// A synchronous step of a fleet (docs/protocol.md, "Synchronous steps"): rank `rank` of `world` sends
// each shard its part of step `step` of fleet `fleet`; the shard applies the parts of a table once,
// as one update, when every rank's is in and one rank commits.
using store::StepTag;

struct StageUpdateRequest {
  StepTag tag;
  uint64_t rank_rows = 0;   // the rows this rank recorded for the table on all shards
  uint32_t timeout_ms = 0;  // how long the shard waits for the other ranks' parts
  RowsRequest rows;         // this rank's rows of the table on this shard, in batch order (float32)
};

struct CommitUpdateRequest {
  uint64_t table_id = 0;
  StepTag tag;
};

struct DumpRequest {
  uint64_t table_id = 0;
  uint64_t snapshot_id = 0;  // 0: take a new snapshot of the table; else continue that one
  uint32_t max_rows = 0;     // rows in this response, at least 1
  // With snapshot_id 0: 0 for every row; else the cut of the change chain (store::Table::cut_changes).
  uint64_t chain = 0;
};

struct DumpResponse {
  uint64_t snapshot_id = 0;
  TableDescription table;   // as of the snapshot
  uint64_t total_rows = 0;  // materialized rows in the snapshot
  uint32_t record_words = 0;
  std::vector<uint64_t> ids;
  std::vector<float> records;  // ids.size() * record_words: weight then optimizer state
  bool done = false;           // the last rows; the snapshot is released
  // A cut (chain != 0): whether it holds every row; the rows dropped since the chain's last cut (paged
  // like the rows, after them); and, in the first response, the policy state with the touch metadata
  // of the cut's rows (GET_POLICY_STATE's encoding; empty without a policy).
  bool whole = true;
  std::vector<uint64_t> erased;
  std::vector<uint8_t> policy_state;
};

struct BeginLoadRequest {
  // The target, exactly one of: a named table, created at commit if it does not exist; or an existing
  // table by id (a named one, or an anonymous one of this session).
  std::string name;
  uint64_t table_id = 0;
  store::TableConfig config;
  uint64_t init_stream = 0;
  store::OptimizerConfig optimizer;
  uint64_t optimizer_step = 0;
  // This shard's policy state (store::encode_policy_state), installed with the rows at commit in
  // place of the table's own policy; empty: the table keeps its policy.
  std::vector<uint8_t> policy_state;
};

struct LoadIdResponse {
  uint64_t load_id = 0;
};

struct LoadRowsRequest {
  uint64_t load_id = 0;
  std::vector<uint64_t> ids;
  std::vector<float> records;  // ids.size() * (row_words + state_words)
};

struct LoadRequest {  // AbortLoad
  uint64_t load_id = 0;
};

struct CommitLoadRequest {
  std::vector<uint64_t> load_ids;
};

struct CommitLoadResponse {
  std::vector<uint64_t> table_ids;  // one per load id, in order
};

// Each message type has encode(Writer&, const M&) and decode(Reader&, M&) overloads.
#define RECDEV_NET_MESSAGE(M)           \
  void encode(Writer& out, const M& m); \
  void decode(Reader& in, M& m);
RECDEV_NET_MESSAGE(Empty)
RECDEV_NET_MESSAGE(ErrorResponse)
RECDEV_NET_MESSAGE(Hello)
RECDEV_NET_MESSAGE(Welcome)
RECDEV_NET_MESSAGE(ServerStats)
RECDEV_NET_MESSAGE(TableRequest)
RECDEV_NET_MESSAGE(CreateTableRequest)
RECDEV_NET_MESSAGE(TableIdResponse)
RECDEV_NET_MESSAGE(OpenNamedRequest)
RECDEV_NET_MESSAGE(NameRequest)
RECDEV_NET_MESSAGE(TableDescription)
RECDEV_NET_MESSAGE(FindResponse)
RECDEV_NET_MESSAGE(ListResponse)
RECDEV_NET_MESSAGE(TableInfoResponse)
RECDEV_NET_MESSAGE(SetInitRequest)
RECDEV_NET_MESSAGE(IdsRequest)
RECDEV_NET_MESSAGE(RowsRequest)
RECDEV_NET_MESSAGE(FloatsResponse)
RECDEV_NET_MESSAGE(ExistsResponse)
RECDEV_NET_MESSAGE(StateResponse)
RECDEV_NET_MESSAGE(PooledPartialRequest)
RECDEV_NET_MESSAGE(PooledPartialResponse)
RECDEV_NET_MESSAGE(WriteBytesRequest)
RECDEV_NET_MESSAGE(SetOptimizerRequest)
RECDEV_NET_MESSAGE(SetPolicyRequest)
RECDEV_NET_MESSAGE(PolicyStateResponse)
RECDEV_NET_MESSAGE(RestorePolicyRequest)
RECDEV_NET_MESSAGE(CheckPolicyRequest)
RECDEV_NET_MESSAGE(SetLearningRateRequest)
RECDEV_NET_MESSAGE(SetStepRequest)
RECDEV_NET_MESSAGE(StageUpdateRequest)
RECDEV_NET_MESSAGE(CommitUpdateRequest)
RECDEV_NET_MESSAGE(DumpRequest)
RECDEV_NET_MESSAGE(DumpResponse)
RECDEV_NET_MESSAGE(BeginLoadRequest)
RECDEV_NET_MESSAGE(LoadIdResponse)
RECDEV_NET_MESSAGE(LoadRowsRequest)
RECDEV_NET_MESSAGE(LoadRequest)
RECDEV_NET_MESSAGE(CommitLoadRequest)
RECDEV_NET_MESSAGE(CommitLoadResponse)
#undef RECDEV_NET_MESSAGE

template <class Message>
void encode_frame_into(std::vector<uint8_t>& frame, Opcode opcode, uint64_t request_id, const Message& message,
                       uint8_t flags) {
  frame.resize(kHeaderBytes);
  Writer out(frame);
  encode(out, message);
  finish_frame(frame, opcode, request_id, flags);
}

template <class Message>
std::vector<uint8_t> encode_frame(Opcode opcode, uint64_t request_id, const Message& message, uint8_t flags) {
  std::vector<uint8_t> frame;
  encode_frame_into(frame, opcode, request_id, message, flags);
  return frame;
}

template <class Message>
Message decode_payload(const uint8_t* payload, size_t size, const char* what) {
  Reader in(payload, size);
  Message message;
  decode(in, message);
  in.expect_end(what);
  return message;
}

}  // namespace recdev::net
