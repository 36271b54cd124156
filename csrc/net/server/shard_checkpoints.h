// A shard's own checkpoints (--checkpoint-dir D): numbered versions of its named tables in
// D/shard-I-of-N/ (store/checkpoint_versions.h), a base and then deltas of the rows changed since,
// written every --checkpoint-every seconds and at shutdown; a restart restores the newest complete
// version (its base and deltas replayed). A directory from before versions, with its one file
// D/shard-I-of-N.recdev, still loads; the next checkpoint is then a base in D/shard-I-of-N/.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "service.h"

namespace recdev::net {

// D/shard-I-of-N: the shard's versions.
std::string shard_versions_dir(const std::string& dir, uint32_t shard, uint32_t num_shards);
// D/shard-I-of-N.recdev: the one checkpoint file of servers before versions.
std::string shard_checkpoint_file(const std::string& dir, uint32_t shard, uint32_t num_shards);

// Creates the directory if need be, removes what interrupted checkpoints left, and loads the shard's
// newest version (or its file from before versions) into the service's store. Refuses
// (StoreError(Corrupt)) a directory whose checkpoints were written for another number of shards and
// none for this one, or one holding rows this shard does not own. `log` gets one line per thing done.
void restore_shard_checkpoints(const std::string& dir, ShardService& service,
                               const std::function<void(const std::string&)>& log);

// Writes the next version; returns false (having logged why) if it could not.
bool write_shard_checkpoint(const std::string& dir, ShardService& service,
                            const std::function<void(const std::string&)>& log);

}  // namespace recdev::net
