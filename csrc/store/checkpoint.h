// Checkpoint files: tables as their init rule plus their materialized rows only, so a file's size
// follows the rows touched, not num_rows.
//
// Byte layout, format version 6. Integers are unsigned little-endian, f64/f32 are IEEE-754
// little-endian; row floats are stored bit-exactly (nan payloads included).
//
//   file     := magic "RECDEVTB" (8 bytes) | u32 version = 6 | u32 table_count
//               | table_count x section | u32 crc
//   section  := u32 name_length (<= 4096) | name (UTF-8, name_length bytes; empty = anonymous)
//               | u64 num_rows | u32 row_words | u32 state_words
//               | u32 init_kind (InitKind) | u32 element_type | f64 init_a | f64 init_b | u64 init_seed
//               | u64 init_stream          (the table id that fill_row draws init values with)
//               | u32 optimizer_kind (OptimizerKind) | u32 optimizer_flags (bit 0: stochastic rounding)
//               | f64 lr | f64 weight_decay | f64 eps | f64 lr_decay | f64 initial_accumulator_value
//               | f64 beta1 | f64 beta2 | u64 rounding_seed | u64 optimizer_step
//               | u64 row_count | row_count x row
//               | u64 policy_bytes | policy (policy_bytes bytes; 0: the table has no policy)
//   row      := u64 row_id | (row_words + state_words) x f32   (weight, then optimizer state)
//   crc      := CRC-32C (crc32c.h) of every byte before it; in versions 2 to 5, which are otherwise
//               version 5's layout or older, CRC-32 (zlib.crc32)
//
// Writing is atomic (file_io.h): a temporary file in the same directory, fsync, rename, fsync of the
// directory. A table is written as a point-in-time snapshot (Table::scan).
//
//   policy   := u64 max_rows | u64 max_bytes | u32 evict (EvictKind) | u32 admit_after | f64 half_life
//               | u64 ttl_steps | f64 ttl_seconds | u32 sketch_width | u32 policy_flags
//               | (u64 max_disk_bytes, if policy_flags bit 1)   (bit 0: spill; the rest 0)
//               | u64 tick | u64 step | u64 evicted | u64 admitted | u64 pending (TablePolicy::Clocks)
//               | u64 sketch_since_aging | u64 sketch_count | sketch_count x u16 (0 or 4 x sketch_width)
//               | u64 touch_count | touch_count x (u64 id | u64 tick | u64 step | f64 age_seconds
//               | f64 lfu_score)   (the rows' touch metadata, in eviction order; only rows in the file)
// Version 4 is version 5 with optimizer_flags reserved (0) and no rounding_seed (tables without
// stochastic rounding); version 3 is version 4 without the policy blocks; version 2 has a reserved 0 for the element
// type (float32). All three still load (their tables have no policy). Version 1 (no optimizer) files are
// refused as an unsupported version.
//
// Loading a table with a policy removes the destination's policy, installs the rows, then restores
// the saved policy and metadata (Table::restore_policy_state); without one, the destination's
// policy stays and adopts the rows.
//
// Loading verifies everything before it changes anything: magic, version, that every count fits in
// the file's size (so a corrupt count cannot cause a huge allocation), each section's config,
// optimizer (valid, and state_words = its state width unless it is None) and
// rows (ids in range, no duplicates), that nothing trails the last section, the checksum, and that
// the file matches its destination. The rows are staged off to the side and installed in one step.
// A damaged, truncated or mismatched file raises StoreError(Corrupt) and leaves the destination as
// it was; an unreadable one raises StoreError(Io).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "optimizer.h"
#include "store.h"
#include "table.h"

namespace recdev::store {

struct CheckpointTableInfo {
  std::string name;
  TableConfig config;
  uint64_t init_stream;
  OptimizerConfig optimizer;
  uint64_t optimizer_step;
  uint64_t row_count;
  // The table's budget policy with its touch metadata, clocks and sketch (format 4; none in older
  // files and for tables without a policy).
  std::optional<TablePolicyState> policy;
};

// A policy state as bytes (the policy block of format 4, also what torch.save of a module table
// carries), and back. decode verifies everything restore_policy_state relies on (a valid config, a
// sketch of the config's size, distinct row ids below num_rows, at most max_touches rows) and throws
// StoreError(Corrupt) naming the problem otherwise.
std::string encode_policy_state(const TablePolicyState& state);
TablePolicyState decode_policy_state(const void* data, size_t size, uint64_t num_rows, uint64_t max_touches);

// One table per file. `name` is recorded for information (load_table ignores it).
void save_table(const std::string& path, const Table& table, const std::string& name = {});
// Replaces the table's rows (weights and optimizer state), init rule, init stream, optimizer and
// optimizer step with the file's, bit for bit. The file must hold exactly one table with the
// destination's num_rows and row_words (state_words follows the file's optimizer).
void load_table(const std::string& path, Table& table);

// What a save wrote, for whoever reports it (recdev-server logs one line per checkpoint).
struct CheckpointSummary {
  uint64_t tables = 0;
  uint64_t rows = 0;
  uint64_t bytes = 0;  // the file's size
  uint32_t crc = 0;    // the file's checksum, its last 4 bytes
};

// "2 tables, 1000 rows, 81960 bytes, crc 1a2b3c4d"
std::string describe(const CheckpointSummary& summary);

// Every named table of the store in one file. Anonymous tables are left out: they belong to the
// client session that created them and cannot be found again after a restart.
CheckpointSummary save_store(const std::string& path, const Store& store);
// Loads every table of the file into the named table of the same name, creating those that do not
// exist with the file's config. Every existing one must have the file's num_rows and row_words; that is
// checked for all of them before any table changes. Returns the names loaded.
std::vector<std::string> load_store(const std::string& path, Store& store);

// The sections' headers, after verifying the whole file (rows and checksum included).
std::vector<CheckpointTableInfo> read_checkpoint_info(const std::string& path);

// Removes the temporary files of saves to `path` that a crash interrupted (file_io.h), and returns
// a line saying how many files and bytes were removed, or "" if there were none. Only for a path
// that no live process is saving to, such as a server's own checkpoint at its start.
std::string remove_interrupted_saves(const std::string& path);

}  // namespace recdev::store
