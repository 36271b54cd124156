// The disk tier's directory: where tables with spill=True keep the rows their budget evicts
// (disk_tier.h). One per process — the embedded store's, set from Python (set_disk_dir or
// RECDEV_DISK_DIR), or a server shard's --disk-dir.
//
// Each table spilling in it gets a directory of its own, recdev-PID-N, removed with the table. The
// disk tier is a cache under the memory tier, not a checkpoint (checkpoints copy the rows they hold),
// so a process that died leaves nothing worth keeping: set_disk_dir removes the recdev-PID-* directories
// of processes that are gone.
#pragma once

#include <cstdint>
#include <string>

namespace recdev::store {

// Creates the directory if needed and checks that files can be made in it (StoreError(Io) naming the
// path and the reason otherwise); then removes what dead processes left there. Returns the number of
// such directories removed. An empty path unsets it.
uint64_t set_disk_dir(const std::string& path);
// The directory set, else $RECDEV_DISK_DIR, else empty.
std::string disk_dir();
// A new, empty directory for one table's files under disk_dir(); StoreError(InvalidArgument) when no
// directory is set, StoreError(Io) when it cannot be made.
std::string make_table_disk_dir();
// Removes a directory made by make_table_disk_dir and the files in it (no error if it is gone).
void remove_table_disk_dir(const std::string& path);

}  // namespace recdev::store
