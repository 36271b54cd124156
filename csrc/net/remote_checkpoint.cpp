#include "remote_checkpoint.h"

#include <algorithm>
#include <map>
#include <optional>

#include "store/checkpoint.h"
#include "store/errors.h"
#include "store/store.h"

namespace recdev::net {

using store::ErrorCode;
using store::StoreError;

namespace {

// Rows per DUMP or LOAD_ROWS frame, for records of `record_floats` floats.
uint32_t rows_per_frame(uint32_t record_floats) {
  const size_t row_bytes = sizeof(uint64_t) + size_t{record_floats} * sizeof(float);
  return uint32_t(std::clamp<size_t>((kMaxPayloadBytes / 2) / row_bytes, 1, UINT32_MAX));
}

// The named tables of every shard: name -> table id on each shard.
std::map<std::string, std::vector<uint64_t>> named_tables(RemoteSession& session, RemoteSession::Lease& lease) {
  const size_t shards = session.num_shards();
  std::vector<Call> calls;
  for (size_t shard = 0; shard < shards; ++shard) calls.push_back(make_call(shard, Opcode::List, Empty{}));
  session.exchange(lease, calls);
  std::map<std::string, std::vector<uint64_t>> tables;
  for (size_t shard = 0; shard < shards; ++shard) {
    for (const ListEntry& entry : answer_of<ListResponse>(calls[shard]).tables) {
      if (entry.name.empty()) continue;
      auto& ids = tables.try_emplace(entry.name, shards, 0).first->second;
      ids[shard] = entry.table_id;
    }
  }
  for (const auto& [name, ids] : tables) {
    for (size_t shard = 0; shard < shards; ++shard) {
      if (ids[shard] == 0) {
        throw StoreError(ErrorCode::NotFound, "cannot save table '" + name + "': " + session.describe(shard) +
                                                  " does not have it (was it restarted without its --checkpoint-dir?)");
      }
    }
  }
  return tables;
}

// Reads one table from every shard into `local`, a named table of the same name.
void dump_table(RemoteSession& session, RemoteSession::Lease& lease, const std::string& name,
                const std::vector<uint64_t>& ids, store::Store& local) {
  std::optional<store::RowSet> rows;
  TableDescription description;
  uint64_t step = 0;
  for (size_t shard = 0; shard < ids.size(); ++shard) {
    DumpRequest request{ids[shard], 0, 1024};
    while (true) {
      const DumpResponse part = session.call<DumpResponse>(lease, shard, Opcode::Dump, request);
      if (!rows) {
        rows.emplace(part.record_floats);
        description = part.table;
      }
      if (part.record_floats != rows->record_floats() || part.records.size() != part.ids.size() * part.record_floats) {
        throw StoreError(ErrorCode::Protocol, session.describe(shard) + " sent table '" + name +
                                                  "' with records of another width than the other shards");
      }
      step = std::max(step, part.table.optimizer_step);
      for (size_t k = 0; k < part.ids.size(); ++k) {
        if (!rows->insert(part.ids[k], part.records.data() + k * part.record_floats)) {
          throw StoreError(ErrorCode::Protocol, "row " + std::to_string(part.ids[k]) + " of table '" + name +
                                                    "' came from two shards");
        }
      }
      if (part.done) break;
      request.snapshot_id = part.snapshot_id;
      request.max_rows = rows_per_frame(part.record_floats);
    }
  }
  store::TableConfig config = description.config;
  config.state_floats = 0;
  const auto table = local.table(local.create_named_table(name, config));
  table->install(*rows, description.config.init, description.init_stream, description.optimizer, step);
}

}  // namespace

void save_checkpoint(RemoteSession& session, const std::string& path) {
  RemoteSession::Lease lease(session);
  store::Store local;
  for (const auto& [name, ids] : named_tables(session, lease)) dump_table(session, lease, name, ids, local);
  store::save_store(path, local);
}

std::vector<std::string> load_checkpoint(RemoteSession& session, const std::string& path) {
  store::Store local;
  const std::vector<std::string> names = store::load_store(path, local);
  const size_t shards = session.num_shards();
  RemoteSession::Lease lease(session);
  std::vector<std::vector<uint64_t>> load_ids(shards);  // per shard, in table order
  auto abort_all = [&] {
    std::vector<Call> aborts;
    for (size_t shard = 0; shard < shards; ++shard) {
      for (const uint64_t id : load_ids[shard]) aborts.push_back(make_call(shard, Opcode::AbortLoad, LoadRequest{id}));
    }
    try {
      session.exchange(lease, aborts);
    } catch (const StoreError&) {
      // The staging belongs to this session: the server frees it when the session lapses.
    }
  };
  try {
    for (const std::string& name : names) {
      const auto table = local.table(*local.find(name));
      const uint64_t route_key = route_key_of_name(name);
      std::vector<LoadRowsRequest> batches(shards);
      uint32_t record_floats = 0;
      uint32_t batch_rows = 1;
      auto flush = [&](size_t shard) {
        if (batches[shard].ids.empty()) return;
        session.call<Empty>(lease, shard, Opcode::LoadRows, batches[shard]);
        batches[shard].ids.clear();
        batches[shard].records.clear();
      };
      table->scan(
          [&](const store::TableScanHeader& header) {
            BeginLoadRequest request{name, header.config, header.init_stream, header.optimizer, header.optimizer_step};
            std::vector<Call> calls;
            for (size_t shard = 0; shard < shards; ++shard) calls.push_back(make_call(shard, Opcode::BeginLoad, request));
            session.exchange(lease, calls);
            for (size_t shard = 0; shard < shards; ++shard) {
              load_ids[shard].push_back(answer_of<LoadIdResponse>(calls[shard]).load_id);
              batches[shard].load_id = load_ids[shard].back();
            }
            record_floats = header.config.dim + header.config.state_floats;
            batch_rows = rows_per_frame(record_floats);
          },
          [&](uint64_t row_id, const float* record) {
            const size_t shard = owner_shard(route_key, row_id, uint32_t(shards));
            LoadRowsRequest& batch = batches[shard];
            batch.ids.push_back(row_id);
            batch.records.insert(batch.records.end(), record, record + record_floats);
            if (batch.ids.size() >= batch_rows) flush(shard);
          });
      for (size_t shard = 0; shard < shards; ++shard) flush(shard);
    }
  } catch (...) {
    abort_all();
    throw;
  }
  std::vector<Call> commits;
  for (size_t shard = 0; shard < shards; ++shard) {
    commits.push_back(make_call(shard, Opcode::CommitLoad, CommitLoadRequest{load_ids[shard]}));
  }
  session.exchange(lease, commits);
  return names;
}

}  // namespace recdev::net
