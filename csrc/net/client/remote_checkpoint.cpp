#include "remote_checkpoint.h"

#include <map>
#include <memory>

#include "remote_transfer.h"
#include "store/checkpoint.h"
#include "store/checkpoint_versions.h"
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

// Verified tables onto the shards, as a staged load committed on every shard (each shard gets its
// share of a table's policy state). Returns their names.
std::vector<std::string> load_staged(RemoteSession& session, std::vector<store::StagedTable>& tables) {
  RemoteSession::Lease lease(session);
  std::vector<std::unique_ptr<TableLoad>> loads;
  std::vector<const TableLoad*> staged;
  std::vector<std::string> names;
  try {
    for (store::StagedTable& table : tables) {
      const store::CheckpointTableInfo& info = table.info;
      const BeginLoadRequest request{info.name,           0, info.config, info.init_stream, info.optimizer,
                                     info.optimizer_step, {}};
      loads.push_back(std::make_unique<TableLoad>(session, lease, request, std::vector<uint64_t>{},
                                                  route_key_of_name(info.name), info.policy ? &*info.policy : nullptr));
      staged.push_back(loads.back().get());
      table.rows.for_each([&](uint64_t row_id, const float* record) { loads.back()->add(row_id, record); });
      loads.back()->flush();
      names.push_back(info.name);
    }
    commit_loads(session, lease, staged);
  } catch (...) {
    abort_loads(session, lease, staged);
    throw;
  }
  return names;
}

std::vector<std::string> load_checkpoint(RemoteSession& session, const std::string& path) {
  std::vector<store::StagedTable> tables = store::read_store_file(path);
  return load_staged(session, tables);
}

uint64_t save_version(RemoteSession& session, const std::string& directory) {
  RemoteSession::Lease lease(session);
  const auto tables = named_tables(session, lease);
  store::VersionSource source;
  source.cut = [&](uint64_t chain) {
    std::vector<store::NamedCut> cuts;
    for (const auto& [name, ids] : tables) {
      const std::string label = "table '" + name + "'";
      std::optional<store::TableCut> cut = dump_cut(session, lease, ids, label, chain);
      if (!cut) {
        // Every row instead, as ops.save takes it (a later delta may repeat some of them).
        store::TableSnapshot snapshot = dump_snapshot(session, lease, ids, label);
        cut = store::whole_cut(snapshot);
        cut->policy = fetch_policy_state(session, lease, ids, snapshot.header.config.num_rows, label);
      }
      cuts.push_back(store::NamedCut{name, std::move(*cut)});
    }
    return cuts;
  };
  // A chain the shards are never asked for again is dropped there once kMaxChangeChains newer ones
  // exist; until then it keeps change tracking on.
  source.forget = [](uint64_t) {};
  return store::version_writer_for(directory).write(source).version;
}

uint64_t export_version(RemoteSession& session, const std::string& directory, std::optional<store::ElementType> dtype) {
  RemoteSession::Lease lease(session);
  const auto tables = named_tables(session, lease);
  return store::version_writer_for(directory)
      .write_base_alone([&] {
        std::vector<store::NamedCut> cuts;
        for (const auto& [name, ids] : tables) {
          store::TableSnapshot snapshot = dump_snapshot(session, lease, ids, "table '" + name + "'");
          cuts.push_back(store::NamedCut{name, store::exported(store::whole_cut(snapshot), dtype, name)});
        }
        return cuts;
      })
      .version;
}

std::pair<uint64_t, std::vector<std::string>> restore_version(RemoteSession& session, const std::string& directory,
                                                              std::optional<uint64_t> version) {
  if (!version) version = store::newest_version(directory);
  std::vector<store::StagedTable> tables = store::read_version(directory, *version);
  return {*version, load_staged(session, tables)};
}

}  // namespace recdev::net
