// DiskTier: the rows a spilling table's budget evicted (table_policy_config.h: spill), with their
// optimizer state, kept on disk until their next touch brings them back (Table moves them; see
// table.h). One per table, in its own directory (disk_dir.h).
//
// Layout (docs/disk_tier.md has the measurements behind it):
// - Records go to append-only segment files of fixed-size blocks. A block is 4 KiB (or the multiple
//   of 4 KiB that holds one record, for records over 4 KiB) and holds as many records as fit:
//     block  := u32 crc32c (of the rest of the block) | u32 count | count x (u64 row_id | record)
//               | zero padding
//   so a row costs one aligned read, and rows spilled together share blocks.
// - The index (disk_index.h) maps each row on disk to (segment, slot) in memory; nothing else of a
//   row stays in memory. A row spilled again, brought back or erased leaves a dead record behind.
// - New records fill blocks in a write buffer; flush() writes the full ones, a run at a time, and
//   leaves the last, partly filled block in memory. Reads of buffered blocks are served from it.
// - Compaction (in flush): when the files hold more than twice the live records' bytes, the segment
//   with the fewest live records is rewritten into the write buffer and removed — one segment per
//   flush, so its cost is spread over the requests that made the garbage.
// - max_disk_bytes: past it, the oldest segments are dropped whole with their live rows (counted in
//   dropped): a FIFO over spill time, the rows that went cold first.
// - Every block read is checked: its CRC, and that the slot holds the row the index says. A block
//   that fails raises StoreError(Corrupt) naming the file; nothing is read from it.
//
// Thread-safe: reads share a lock; stage, forget, flush and clear take it exclusively. Callers may
// hold a table's sub-shard locks (it takes no other lock).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "disk_index.h"
#include "disk_io.h"

namespace recdev::store {

// Rows of a request read back from a disk tier before the request moves them (Table::decide): each
// found row's record, by id.
struct RowsReadBack {
  std::vector<size_t> positions;  // in the request's ids
  std::vector<float> records;
  std::unordered_map<uint64_t, const float*> by_id;
  const float* find(uint64_t id) const {
    const auto it = by_id.find(id);
    return it == by_id.end() ? nullptr : it->second;
  }
};

struct DiskTierStats {
  uint64_t rows = 0;          // rows on disk (or in the write buffer on their way)
  uint64_t live_bytes = 0;    // their records' bytes
  uint64_t file_bytes = 0;    // the segment files' bytes: live and dead records, headers, padding
  uint64_t memory_bytes = 0;  // the index and the write buffer
  uint64_t reads = 0;         // rows read back
  uint64_t read_ops = 0;      // blocks read from segment files
  uint64_t writes = 0;        // rows spilled
  uint64_t write_ops = 0;     // blocks written
  uint64_t dropped = 0;       // rows dropped past max_disk_bytes
  uint64_t compacted = 0;     // live rows rewritten by compaction
  uint64_t segments = 0;      // segment files
};

class DiskTier {
 public:
  // `table` names the owner in error messages. Creates the table's directory under disk_dir().
  DiskTier(uint64_t table, uint32_t record_words, uint64_t max_disk_bytes);
  ~DiskTier();  // removes the files
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  uint32_t record_words() const { return record_words_; }
  const std::string& directory() const { return directory_; }
  void set_max_disk_bytes(uint64_t bytes);

  bool contains(uint64_t id) const;
  // contains() without the lock, for a caller that knows nothing stages, forgets or flushes meanwhile
  // (the owning table's policy, between wait_flushed() and its next change of the tier).
  bool contains_while_quiet(uint64_t id) const { return index_.find(id) != nullptr; }
  size_t size() const;
  // Records of those of the rows that are on disk: positions gets each one's position in ids, and
  // records its record (record_words() floats each, in the same order). Distinct blocks are read once
  // each, many at a time.
  void read(const uint64_t* ids, size_t n, std::vector<size_t>& positions, std::vector<float>& records) const;
  RowsReadBack read_back(const uint64_t* ids, size_t n) const;
  // The record of one row into `record` (record_words() floats); false if the row is not on disk.
  bool read_one(uint64_t id, float* record) const;
  // Adds a row's record (weight then state), replacing any copy it has on disk. Memory only.
  void stage(uint64_t id, const float* record);
  // The row is no longer on disk (it was brought back or erased). Memory only.
  void forget(uint64_t id);
  // Writes the buffered full blocks, removes emptied segments, compacts, trims to max_disk_bytes.
  // On an error (a full disk) the records stay buffered, readable, for the next flush.
  void flush();
  // flush() on the tier's own thread, so that writing a request's victims overlaps the request
  // itself; wait_flushed() waits for it and rethrows what it threw.
  void flush_in_background();
  void wait_flushed();
  // fn(id, record) for every row on disk, in no particular order (reads every segment).
  void for_each(const std::function<void(uint64_t id, const float* record)>& fn) const;
  void clear();  // drops every row, and the files
  DiskTierStats stats() const;

 private:
  struct Segment {
    std::unique_ptr<SegmentFile> file;  // null until its first block is written
    uint32_t blocks_written = 0;
    uint64_t live = 0;
  };
  struct BufferedBlock {
    uint32_t segment;
    uint32_t block;
    AlignedBuffer bytes;
  };

  uint64_t location(uint32_t segment, uint64_t slot) const { return (uint64_t{segment} << 32) | slot; }
  uint32_t block_count(const std::byte* block) const;
  void seal(std::byte* block) const;  // writes the CRC
  // Throws StoreError(Corrupt) unless the block's CRC holds.
  void check_block(const std::byte* block, uint32_t segment, uint32_t block_index) const;
  std::string segment_path(uint32_t segment) const;
  void stage_locked(uint64_t id, const float* record);
  void note_dead(uint64_t old_location);
  void write_buffered_blocks(bool including_partial);
  void remove_segment(uint32_t segment);
  void compact_one();
  void trim_to_budget();
  // fn(id, record, location) for every record of a written segment that the index still points to.
  void for_each_live_in(uint32_t segment, const std::function<void(uint64_t, const float*, uint64_t)>& fn) const;
  uint64_t file_bytes_locked() const;

  const uint64_t table_;
  const uint32_t record_words_;
  const size_t record_bytes_;
  const size_t slot_bytes_;
  const size_t block_bytes_;
  const uint32_t per_block_;
  const size_t segment_bytes_;
  const uint32_t segment_blocks_;
  const std::string directory_;
  uint64_t max_disk_bytes_;

  mutable std::shared_mutex mutex_;
  DiskIndex index_;
  std::map<uint32_t, Segment> segments_;
  uint32_t active_ = 0;                // the segment new blocks go to
  uint32_t active_blocks_ = 0;         // blocks of it assigned (written or buffered)
  std::vector<BufferedBlock> buffer_;  // in (segment, block) order; the last one may be partly filled
  // The background flush (flush_in_background): started at its first use, stopped by the destructor.
  void run_flusher();
  std::mutex flusher_mutex_;
  std::condition_variable flusher_wake_;
  std::condition_variable flusher_done_;
  bool flush_wanted_ = false;
  bool flushing_ = false;
  bool stopping_ = false;
  std::exception_ptr flush_error_;
  std::thread flusher_;
  mutable DiskTierStats counters_;
  mutable std::mutex counters_mutex_;  // reads count under the shared lock
};

}  // namespace recdev::store
