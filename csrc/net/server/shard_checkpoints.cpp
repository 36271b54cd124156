#include "shard_checkpoints.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "net/wire/wire.h"
#include "store/checkpoint.h"
#include "store/checkpoint_versions.h"
#include "store/errors.h"
#include "store/file_io.h"

namespace recdev::net {

using store::ErrorCode;
using store::StoreError;

namespace {

// Checkpoints of this directory written for another number of shards: directories shard-I-of-M and
// files shard-I-of-M.recdev with M != num_shards.
std::vector<std::string> other_layouts(const std::string& dir, uint32_t num_shards) {
  std::vector<std::string> others;
  if (DIR* listing = ::opendir(dir.c_str())) {
    while (const dirent* entry = ::readdir(listing)) {
      unsigned shard = 0, count = 0;
      int end = 0;
      if (std::sscanf(entry->d_name, "shard-%u-of-%u%n", &shard, &count, &end) != 2) continue;
      const std::string tail = entry->d_name + end;
      if ((tail.empty() || tail == ".recdev") && count != num_shards) others.push_back(entry->d_name);
    }
    ::closedir(listing);
  }
  std::sort(others.begin(), others.end());
  return others;
}

// Every row of the store's named tables must be this shard's: a checkpoint of another shard (a
// directory renamed, or copied to the wrong host) is refused rather than served.
void check_rows_owned(const std::string& loaded, ShardService& service) {
  const uint32_t shard = service.options().shard;
  const uint32_t num_shards = service.options().num_shards;
  for (const auto& [name, table] : service.store().named_tables()) {
    const uint64_t route_key = route_key_of_name(name);
    table->scan([](const store::TableScanHeader&) {},
                [&](uint64_t row_id, const float*) {
                  const uint32_t owner = owner_shard(route_key, row_id, num_shards);
                  if (owner != shard) {
                    throw StoreError(ErrorCode::Corrupt,
                                     "checkpoint " + loaded + " holds row " + std::to_string(row_id) + " of table '" +
                                         name + "', which belongs to shard " + std::to_string(owner) +
                                         ", not to shard " + std::to_string(shard) + " of " +
                                         std::to_string(num_shards) + ": it was written by another shard");
                  }
                });
  }
}

}  // namespace

std::string shard_versions_dir(const std::string& dir, uint32_t shard, uint32_t num_shards) {
  return dir + "/shard-" + std::to_string(shard) + "-of-" + std::to_string(num_shards);
}

std::string shard_checkpoint_file(const std::string& dir, uint32_t shard, uint32_t num_shards) {
  return shard_versions_dir(dir, shard, num_shards) + ".recdev";
}

void restore_shard_checkpoints(const std::string& dir, ShardService& service,
                               const std::function<void(const std::string&)>& log) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    throw StoreError(ErrorCode::Io, "cannot create checkpoint directory " + dir + ": " + std::strerror(errno));
  }
  const uint32_t shard = service.options().shard;
  const uint32_t num_shards = service.options().num_shards;
  const std::string versions = shard_versions_dir(dir, shard, num_shards);
  const std::string file = shard_checkpoint_file(dir, shard, num_shards);
  if (const std::string removed = store::remove_interrupted_saves(file); !removed.empty()) log(removed);
  const bool has_versions = ::access(versions.c_str(), F_OK) == 0;
  if (has_versions) {
    // This shard's directory: every temporary file in it is of a server that is gone.
    const store::RemovedFiles removed = store::remove_temp_files_in(versions, store::TempFiles::All);
    if (removed.count != 0) {
      log("removed " + std::to_string(removed.count) + " temporary file" + (removed.count == 1 ? "" : "s") + " (" +
          std::to_string(removed.bytes) + " bytes) of interrupted saves of " + versions);
    }
  }
  std::string loaded;
  if (has_versions && !store::restorable_versions(versions).empty()) {
    const auto [version, names] = store::restore_version(versions, std::nullopt, service.store());
    loaded = "version " + std::to_string(version) + " of " + versions;
  } else if (::access(file.c_str(), F_OK) == 0) {
    store::load_store(file, service.store());
    loaded = file;
  } else {
    // Nothing of ours: refuse a directory holding another layout's checkpoints rather than starting
    // empty beside them.
    const std::vector<std::string> others = other_layouts(dir, num_shards);
    if (!others.empty()) {
      throw StoreError(ErrorCode::Corrupt, "checkpoint directory " + dir + " holds " + others.front() +
                                               ", written for another number of shards, and no checkpoint of shard " +
                                               std::to_string(shard) + " of " + std::to_string(num_shards) +
                                               "; start the servers with the layout they were written with");
    }
    return;
  }
  check_rows_owned(loaded, service);
  service.adopt_named_tables();
  log("loaded checkpoint " + loaded);
}

bool write_shard_checkpoint(const std::string& dir, ShardService& service,
                            const std::function<void(const std::string&)>& log) {
  // Numbered, so that the log tells which checkpoint was the last one completed before a crash.
  static std::atomic<uint64_t> written{0};
  const std::string versions = shard_versions_dir(dir, service.options().shard, service.options().num_shards);
  try {
    const store::WrittenVersion version = store::checkpoint_store_version(versions, service.store());
    log("checkpoint " + std::to_string(++written) + " written: " + version.path + " (" + store::describe(version) +
        ")");
    return true;
  } catch (const std::exception& error) {
    log(std::string("checkpoint failed: ") + error.what());
    return false;
  }
}

}  // namespace recdev::net
