#include "remote_transfer.h"

#include <optional>

#include <algorithm>

#include "policy_shares.h"
#include "store/checkpoint.h"
#include "store/errors.h"

namespace recdev::net {

using store::ErrorCode;
using store::StoreError;

namespace {

// Rows per DUMP or LOAD_ROWS frame, for records of `record_words` floats: half a frame, so that a
// frame's encoding stays well within kMaxPayloadBytes.
uint32_t rows_per_frame(uint32_t record_words) {
  const size_t row_bytes = sizeof(uint64_t) + size_t{record_words} * sizeof(float);
  return uint32_t(std::clamp<size_t>((kMaxPayloadBytes / 2) / row_bytes, 1, UINT32_MAX));
}

// dump_table of a cut (chain != 0) or of every row (0); on_part sees each response, for what a cut
// adds to the rows.
void dump_parts(RemoteSession& session, RemoteSession::Lease& lease, const std::vector<uint64_t>& shard_table_ids,
                const std::string& label, uint64_t chain,
                const std::function<void(const store::TableScanHeader&)>& on_header,
                const std::function<void(uint64_t, const float*)>& on_row,
                const std::function<void(size_t shard, const DumpResponse&)>& on_part) {
  const size_t shards = shard_table_ids.size();
  // The first batch from every shard at once: it takes each shard's snapshot and tells its row count,
  // which the header needs before any row.
  std::vector<Call> calls;
  for (size_t shard = 0; shard < shards; ++shard) {
    calls.push_back(make_call(shard, Opcode::Dump, DumpRequest{shard_table_ids[shard], 0, 1024, chain}));
  }
  session.exchange(lease, calls);
  std::vector<DumpResponse> parts;
  for (const Call& call : calls) parts.push_back(answer_of<DumpResponse>(call));
  store::TableScanHeader header{parts[0].table.config, parts[0].table.init_stream, parts[0].table.optimizer, 0, 0};
  for (size_t shard = 0; shard < shards; ++shard) {
    const DumpResponse& part = parts[shard];
    if (part.record_words != parts[0].record_words ||
        part.table.config.state_words != parts[0].table.config.state_words) {
      throw StoreError(ErrorCode::Protocol,
                       session.describe(shard) + " sent " + label + " with records of another width than shard 0's");
    }
    // Every update reaches every shard, so their steps agree but for an update in flight.
    header.optimizer_step = std::max(header.optimizer_step, part.table.optimizer_step);
    header.row_count += part.total_rows;
  }
  on_header(header);
  for (size_t shard = 0; shard < shards; ++shard) {
    DumpResponse& part = parts[shard];
    uint64_t received = 0;
    while (true) {
      if (part.records.size() != part.ids.size() * size_t{part.record_words} ||
          part.record_words != parts[0].record_words) {
        throw StoreError(ErrorCode::Protocol,
                         session.describe(shard) + " sent a DUMP of " + label + " whose records do not match its ids");
      }
      for (size_t k = 0; k < part.ids.size(); ++k) on_row(part.ids[k], part.records.data() + k * part.record_words);
      on_part(shard, part);
      received += part.ids.size();
      if (part.done) break;
      part = session.call<DumpResponse>(
          lease, shard, Opcode::Dump,
          DumpRequest{shard_table_ids[shard], part.snapshot_id, rows_per_frame(part.record_words), chain});
    }
    if (received != parts[shard].total_rows) {
      throw StoreError(ErrorCode::Protocol, session.describe(shard) + " sent " + std::to_string(received) +
                                                " rows of " + label + " after announcing " +
                                                std::to_string(parts[shard].total_rows));
    }
  }
}

}  // namespace

void dump_table(RemoteSession& session, RemoteSession::Lease& lease, const std::vector<uint64_t>& shard_table_ids,
                const std::string& label, const std::function<void(const store::TableScanHeader&)>& on_header,
                const std::function<void(uint64_t, const float*)>& on_row) {
  dump_parts(session, lease, shard_table_ids, label, 0, on_header, on_row, [](size_t, const DumpResponse&) {});
}

std::optional<store::TableCut> dump_cut(RemoteSession& session, RemoteSession::Lease& lease,
                                        const std::vector<uint64_t>& shard_table_ids, const std::string& label,
                                        uint64_t chain) {
  store::TableCut cut;
  std::vector<bool> whole(shard_table_ids.size(), true);
  std::vector<store::TablePolicyState> states;
  size_t record_words = 0;
  dump_parts(
      session, lease, shard_table_ids, label, chain,
      [&](const store::TableScanHeader& header) {
        cut.header = header;
        record_words = size_t{header.config.row_words} + header.config.state_words;
      },
      [&](uint64_t row_id, const float* record) {
        cut.ids.push_back(row_id);
        cut.records.insert(cut.records.end(), record, record + record_words);
      },
      [&](size_t shard, const DumpResponse& part) {
        whole[shard] = part.whole;
        cut.erased.insert(cut.erased.end(), part.erased.begin(), part.erased.end());
        if (!part.policy_state.empty()) {
          states.push_back(store::decode_policy_state(part.policy_state.data(), part.policy_state.size(),
                                                      cut.header.config.num_rows, cut.header.config.num_rows));
        }
      });
  // A shard that lost the chain (restarted) cut everything and the others only their changes: the
  // caller takes the whole table instead.
  if (std::find(whole.begin(), whole.end(), !whole[0]) != whole.end()) return std::nullopt;
  cut.whole = whole[0];
  if (!states.empty()) cut.policy = merge_policy_states(states, label);
  return cut;
}

store::TableSnapshot dump_snapshot(RemoteSession& session, RemoteSession::Lease& lease,
                                   const std::vector<uint64_t>& shard_table_ids, const std::string& label) {
  std::optional<store::TableSnapshot> snapshot;
  dump_table(
      session, lease, shard_table_ids, label,
      [&](const store::TableScanHeader& header) {
        snapshot.emplace(
            store::TableSnapshot{header, store::RowSet(header.config.row_words + header.config.state_words)});
      },
      [&](uint64_t row_id, const float* record) {
        if (!snapshot->rows.insert(row_id, record)) {
          throw StoreError(ErrorCode::Protocol,
                           "row " + std::to_string(row_id) + " of " + label + " came from two shards");
        }
      });
  return std::move(*snapshot);
}

std::optional<store::TablePolicyState> fetch_policy_state(RemoteSession& session, RemoteSession::Lease& lease,
                                                          const std::vector<uint64_t>& shard_table_ids,
                                                          uint64_t num_rows, const std::string& label) {
  std::vector<Call> calls;
  for (size_t shard = 0; shard < shard_table_ids.size(); ++shard) {
    calls.push_back(make_call(shard, Opcode::GetPolicyState, TableRequest{shard_table_ids[shard]}));
  }
  session.exchange(lease, calls);
  std::vector<store::TablePolicyState> states;
  std::optional<size_t> without;
  for (size_t shard = 0; shard < calls.size(); ++shard) {
    const PolicyStateResponse answer = answer_of<PolicyStateResponse>(calls[shard]);
    if (answer.state.empty()) {
      if (!without) without = shard;
      continue;
    }
    states.push_back(store::decode_policy_state(answer.state.data(), answer.state.size(), num_rows, num_rows));
  }
  if (states.empty()) return std::nullopt;
  if (without) {
    throw StoreError(ErrorCode::InvalidArgument, "the shards of " + label +
                                                     " disagree on its policy: " + session.describe(*without) +
                                                     " has none and others have " + store::describe(states[0].config) +
                                                     "; set it again with set_table_policy");
  }
  return merge_policy_states(states, label);
}

TableLoad::TableLoad(RemoteSession& session, RemoteSession::Lease& lease, const BeginLoadRequest& header,
                     const std::vector<uint64_t>& shard_table_ids, uint64_t route_key,
                     const store::TablePolicyState* policy)
    : session_(session),
      lease_(lease),
      route_key_(route_key),
      record_words_(header.config.row_words + header.config.state_words),
      batch_rows_(rows_per_frame(record_words_)),
      batches_(session.num_shards()) {
  // One shard at a time, so that a failure knows exactly which loads to drop.
  try {
    for (size_t shard = 0; shard < session.num_shards(); ++shard) {
      BeginLoadRequest request = header;
      if (!shard_table_ids.empty()) request.table_id = shard_table_ids[shard];
      if (policy != nullptr) {
        const std::string label = header.name.empty() ? "the table" : "table '" + header.name + "'";
        const std::string state = store::encode_policy_state(
            shard_policy_state(*policy, route_key, uint32_t(shard), uint32_t(session.num_shards()), label));
        request.policy_state.assign(state.begin(), state.end());
      }
      load_ids_.push_back(session.call<LoadIdResponse>(lease, shard, Opcode::BeginLoad, request).load_id);
      batches_[shard].load_id = load_ids_.back();
    }
  } catch (...) {
    abort_loads(session, lease, {this});
    throw;
  }
}

void TableLoad::add(uint64_t row_id, const float* record) {
  const size_t shard = owner_shard(route_key_, row_id, uint32_t(batches_.size()));
  LoadRowsRequest& batch = batches_[shard];
  batch.ids.push_back(row_id);
  batch.records.insert(batch.records.end(), record, record + record_words_);
  if (batch.ids.size() < batch_rows_) return;
  session_.call<Empty>(lease_, shard, Opcode::LoadRows, batch);
  batch.ids.clear();
  batch.records.clear();
}

void TableLoad::flush() {
  std::vector<Call> calls;
  for (size_t shard = 0; shard < batches_.size(); ++shard) {
    if (!batches_[shard].ids.empty()) calls.push_back(make_call(shard, Opcode::LoadRows, batches_[shard]));
  }
  session_.exchange(lease_, calls);
  for (LoadRowsRequest& batch : batches_) {
    batch.ids.clear();
    batch.records.clear();
  }
}

void commit_loads(RemoteSession& session, RemoteSession::Lease& lease, const std::vector<const TableLoad*>& loads) {
  std::vector<Call> commits;
  for (size_t shard = 0; shard < session.num_shards(); ++shard) {
    CommitLoadRequest request;
    for (const TableLoad* load : loads) request.load_ids.push_back(load->load_ids()[shard]);
    commits.push_back(make_call(shard, Opcode::CommitLoad, request));
  }
  session.exchange(lease, commits);
}

void abort_loads(RemoteSession& session, RemoteSession::Lease& lease,
                 const std::vector<const TableLoad*>& loads) noexcept {
  try {
    std::vector<Call> aborts;
    for (const TableLoad* load : loads) {
      for (size_t shard = 0; shard < load->load_ids().size(); ++shard) {
        aborts.push_back(make_call(shard, Opcode::AbortLoad, LoadRequest{load->load_ids()[shard]}));
      }
    }
    session.exchange_keeping_failures(lease, aborts);
  } catch (...) {
    // The staging belongs to this session: the server frees it when the session lapses.
  }
}

}  // namespace recdev::net
