// Incremental checkpoints: a directory of numbered versions of a store's named tables — a base with
// every row, then deltas with only what changed since the version before — for online learning,
// where a model is checkpointed (and pushed to serving) many times an hour and rewriting every row
// each time costs as much as the table.
//
// Files, one per version, each written atomically (file_io.h) and checked by a CRC-32C:
//
//   DIR/v00000001-base.recdev, DIR/v00000002-delta.recdev, ...   (at least 8 digits)
//
//   file    := magic "RECDEVVR" | u32 format = 1 | u64 version | u64 chain | u32 kind (0 base, 1 delta)
//              | i64 written (unix milliseconds) | u32 table_count | table_count x section | u32 crc32c
//   section := the section header of checkpoint.h (format 5 fields; row_count = the rows in this
//              section) | u32 flags (bit 0: whole) | u64 erased_count | erased_count x u64 row id
//              | row_count x row (checkpoint.h) | policy block (checkpoint.h; touch metadata of this
//              section's rows only)
//
// A base's sections are all whole: the table's every row. A delta lists every named table of the
// store at its cut: a whole section for a table new since the version before (or reset, reloaded,
// re-laid by a new optimizer, given a new policy), otherwise the rows changed since then with their
// records and touch metadata, and the rows dropped since (erased or evicted); a table the delta does
// not list was deleted. Each section is one point-in-time cut of its table (Table::cut_changes), so
// each request is in it wholly or not at all; tables are cut one after another.
//
// The chain is a random id the writer draws with its base: a delta belongs to the base of its chain
// and follows the version before it. A writer (one per directory per process) writes a delta when
// the directory's newest version is the one it wrote last, and a new base otherwise (the first
// checkpoint of a process, or after another writer).
//
// Files are written, and compacted, at background priority (background_priority.h).
//
// Compaction: once the deltas since the newest base add up to more than kCompactRatio times the
// base's bytes, a background thread folds them into a new base of the newest version (written
// atomically, like every file) and then removes the older files. A crash at any point leaves a
// directory that restores every version whose files are complete; temporary files of dead writers
// are removed by the next checkpoint of the directory.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint_format.h"
#include "store.h"
#include "table.h"

namespace recdev::store {

constexpr double kCompactRatio = 1.0;

struct VersionFile {
  std::string path;
  uint64_t version = 0;
  bool base = false;
  uint64_t chain = 0;
  int64_t written_unix_ms = 0;
  uint64_t bytes = 0;
};

// The version files of a directory with a readable header, ordered by version (a base before a
// delta of the same version). Temporary files and other names are ignored.
std::vector<VersionFile> list_version_files(const std::string& directory);
// The versions a restore reaches: v, such that a base b <= v and the deltas b+1 .. v of its chain exist.
std::vector<uint64_t> restorable_versions(const std::string& directory);
// The newest of them; StoreError(NotFound) when there is none.
uint64_t newest_version(const std::string& directory);
// The newest of them; StoreError(NotFound) when there is none.
uint64_t newest_version(const std::string& directory);

// A version's tables, assembled from its base and deltas with every file verified; StoreError(NotFound)
// names the versions there are when it is not restorable, StoreError(Corrupt) names a bad file.
std::vector<StagedTable> read_version(const std::string& directory, uint64_t version);
// The newest restorable version (or the one given) into the store's named tables, as load_store
// loads a checkpoint file. Returns the version restored and the tables' names.
std::pair<uint64_t, std::vector<std::string>> restore_version(const std::string& directory,
                                                              std::optional<uint64_t> version, Store& store);

struct NamedCut {
  std::string name;
  TableCut cut;
};

// What a version's cut callback does: cuts every table for `chain` (Table::cut_changes, or the
// shards' cuts of a remote store); and what undoes it when the file could not be written.
struct VersionSource {
  std::function<std::vector<NamedCut>(uint64_t chain)> cut;
  std::function<void(uint64_t chain)> forget;
};

// What a version's write did, for whoever reports it (recdev-server logs it).
struct WrittenVersion {
  uint64_t version = 0;
  bool base = false;
  std::string path;
  CheckpointSummary summary;  // tables, rows in the file, bytes, CRC-32C
};

// "version 3, delta, 2 tables, 1000 rows, 81960 bytes, crc 1a2b3c4d"
std::string describe(const WrittenVersion& written);

// Writes the versions of one directory from one process.
class VersionWriter {
 public:
  explicit VersionWriter(std::string directory);
  ~VersionWriter();  // waits for a compaction in progress
  VersionWriter(const VersionWriter&) = delete;
  VersionWriter& operator=(const VersionWriter&) = delete;

  // Writes the next version (a delta, or a base: see above) and returns its number. On failure (a
  // full disk) nothing is left in the directory and the next version is a base.
  WrittenVersion write(const VersionSource& source);
  // Writes the next version as a base of its own that no delta follows (an export): `cut` gets a
  // chain no table follows and must cut every table whole.
  WrittenVersion write_base_alone(const std::function<std::vector<NamedCut>()>& cut);
  // Waits for a compaction in progress; throws what it failed with, if it did.
  void wait_compaction();

 private:
  void compact_if_due(uint64_t version);

  const std::string directory_;
  std::mutex mutex_;
  uint64_t chain_ = 0;         // of the last version written, 0 before the first
  uint64_t last_version_ = 0;  // the last version written
  std::thread compaction_;
  std::atomic<bool> compacting_{false};  // compaction_ has not finished
  std::exception_ptr compaction_error_;
};

// The process's writer for a directory (one per directory, so two callers never race on it).
VersionWriter& version_writer_for(const std::string& directory);

// A version of every named table of an in-process store.
WrittenVersion checkpoint_store_version(const std::string& directory, const Store& store);

// An export for inference: a whole cut's rows without optimizer state (state_words 0, no optimizer,
// step 0, no policy), and narrowed to `dtype` if given (float32 rows to float16 or bfloat16, rounded
// to nearest even; a table already of that type as it is). StoreError(InvalidArgument) for another
// narrowing.
TableCut exported(TableCut whole, std::optional<ElementType> dtype, const std::string& name);
// export_tables of an in-process store: every named table, exported, as a base version of its own.
WrittenVersion export_store_version(const std::string& directory, const Store& store, std::optional<ElementType> dtype);
// A whole cut of a snapshot (ids and records copied out).
TableCut whole_cut(TableSnapshot& snapshot);

}  // namespace recdev::store
