#include "remote_checkpoint.h"

#include <map>
#include <memory>

#include "remote_transfer.h"
#include "store/checkpoint.h"
#include "store/errors.h"
#include "store/store.h"

namespace recdev::net {

using store::ErrorCode;
using store::StoreError;

namespace {

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
void copy_to_local(RemoteSession& session, RemoteSession::Lease& lease, const std::string& name,
                   const std::vector<uint64_t>& ids, store::Store& local) {
  store::TableSnapshot snapshot = dump_snapshot(session, lease, ids, "table '" + name + "'");
  const store::TableScanHeader& header = snapshot.header;
  store::TableConfig config = header.config;
  config.state_words = 0;
  const auto table = local.table(local.create_named_table(name, config));
  table->install(snapshot.rows, header.config.init, header.init_stream, header.optimizer, header.optimizer_step);
  // Taken after the rows: restoring drops the metadata of rows a request added since the snapshot
  // and adopts rows it evicted since, as torch.save of a table does.
  if (const auto policy = fetch_policy_state(session, lease, ids, header.config.num_rows, "table '" + name + "'")) {
    table->restore_policy_state(*policy);
  }
}

}  // namespace

void save_checkpoint(RemoteSession& session, const std::string& path) {
  RemoteSession::Lease lease(session);
  store::Store local;
  for (const auto& [name, ids] : named_tables(session, lease)) copy_to_local(session, lease, name, ids, local);
  store::save_store(path, local);
}

std::vector<std::string> load_checkpoint(RemoteSession& session, const std::string& path) {
  store::Store local;
  const std::vector<std::string> names = store::load_store(path, local);
  RemoteSession::Lease lease(session);
  std::vector<std::unique_ptr<TableLoad>> loads;
  std::vector<const TableLoad*> staged;
  try {
    for (const std::string& name : names) {
      const auto policy = local.table(*local.find(name))->policy_state();
      local.table(*local.find(name))
          ->scan(
              [&](const store::TableScanHeader& header) {
                const BeginLoadRequest request{
                    name, 0, header.config, header.init_stream, header.optimizer, header.optimizer_step, {}};
                loads.push_back(std::make_unique<TableLoad>(session, lease, request, std::vector<uint64_t>{},
                                                            route_key_of_name(name), policy ? &*policy : nullptr));
                staged.push_back(loads.back().get());
              },
              [&](uint64_t row_id, const float* record) { loads.back()->add(row_id, record); });
      loads.back()->flush();
    }
    commit_loads(session, lease, staged);
  } catch (...) {
    abort_loads(session, lease, staged);
    throw;
  }
  return names;
}

}  // namespace recdev::net
