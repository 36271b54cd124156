// Checkpoints of a remote store: every named table, with its optimizer state, in one file on the
// client machine, in checkpoint.h's format — the same file ops.save writes for the embedded store,
// so either kind of store loads what the other saved.
//
// save reads each table from every shard with DUMP (a point-in-time snapshot per shard), assembles
// it in a private in-process store and writes that with store::save_store. load verifies the whole
// file with store::load_store into a private store first (nothing is sent for a damaged file), then
// stages every table on every shard (BEGIN_LOAD, LOAD_ROWS) and installs them with one COMMIT_LOAD
// per shard; a failure before the commit aborts every staged load, leaving the servers as they were.
// Both hold the named tables' materialized rows in client memory while they run.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "remote_session.h"

namespace recdev::net {

void save_checkpoint(RemoteSession& session, const std::string& path);
// The names of the tables loaded.
std::vector<std::string> load_checkpoint(RemoteSession& session, const std::string& path);

// Incremental versions (store/checkpoint_versions.h) in a directory on the client machine, the same
// files the embedded store writes: each shard cuts its changes (DUMP with a chain), the client merges
// them and writes the version. Restore replays the version in a private store and loads it as
// load_checkpoint does.
uint64_t save_version(RemoteSession& session, const std::string& directory);
std::pair<uint64_t, std::vector<std::string>> restore_version(RemoteSession& session, const std::string& directory,
                                                              std::optional<uint64_t> version);
// export_tables (store::StoreClient) of every named table, read from every shard with DUMP.
uint64_t export_version(RemoteSession& session, const std::string& directory, std::optional<store::ElementType> dtype);

}  // namespace recdev::net
