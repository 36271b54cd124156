// A serving shard (recdev-server --serve DIR): read-only, it serves the newest version of a directory
// of incremental checkpoints (store/checkpoint_versions.h) — written by ops.checkpoint on the embedded
// store or on shards, or by a shard's own --checkpoint-dir — and follows new versions as they appear.
//
// VersionFollower::check looks for a newer complete version; if there is one, it reads and verifies
// its base and deltas off to the side (this shard's rows only, with --shard I --num-shards N) and
// hands them to ShardService::serve_version, which swaps every table between two requests. A version
// that fails to load (a damaged file) is logged with the file named and skipped; the version served
// before keeps serving.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "service.h"

namespace recdev::net {

class VersionFollower {
 public:
  VersionFollower(std::string directory, ShardService& service, std::function<void(const std::string&)> log);
  // Serves the newest version if it is newer than the one served; returns whether it swapped.
  bool check();

 private:
  const std::string directory_;
  ShardService& service_;
  const std::function<void(const std::string&)> log_;
  uint64_t served_ = 0;
  uint64_t refused_ = 0;  // the newest version that failed to load, not tried again
  std::string last_listing_error_;
};

}  // namespace recdev::net
