#include "disk_tier.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

#include "crc32c.h"
#include "disk_dir.h"
#include "errors.h"

namespace recdev::store {
namespace {

constexpr size_t kBlockHeaderBytes = 8;
// A segment file's size: large enough that a compaction pass is a few long reads, small enough that
// rewriting one is a short pause. RECDEV_DISK_SEGMENT_BYTES overrides it (at least one block).
constexpr size_t kSegmentBytes = size_t{16} << 20;

size_t segment_bytes() {
  const char* value = std::getenv("RECDEV_DISK_SEGMENT_BYTES");
  if (value == nullptr || *value == '\0') return kSegmentBytes;
  char* end = nullptr;
  const unsigned long long bytes = std::strtoull(value, &end, 10);
  if (*end != '\0' || bytes == 0) {
    throw StoreError(ErrorCode::InvalidArgument,
                     std::string("RECDEV_DISK_SEGMENT_BYTES must be a number of bytes; got '") + value + "'");
  }
  return size_t(bytes);
}
// Compaction starts when the files hold more than this many times the live records' bytes.
constexpr uint64_t kMaxSpaceAmplification = 2;
// Blocks read per round of run_reads: a bounded buffer (4 MiB of 4 KiB blocks) however large the batch.
constexpr size_t kBlocksPerRound = 1024;

size_t block_bytes_for(size_t slot_bytes) {
  const size_t needed = kBlockHeaderBytes + slot_bytes;
  return (needed + kDiskAlignment - 1) / kDiskAlignment * kDiskAlignment;
}

}  // namespace

DiskTier::DiskTier(uint64_t table, uint32_t record_words, uint64_t max_disk_bytes)
    : table_(table),
      record_words_(record_words),
      record_bytes_(size_t{record_words} * sizeof(float)),
      slot_bytes_(sizeof(uint64_t) + record_bytes_),
      block_bytes_(block_bytes_for(slot_bytes_)),
      per_block_(uint32_t((block_bytes_ - kBlockHeaderBytes) / slot_bytes_)),
      segment_bytes_(std::max(segment_bytes(), block_bytes_)),
      segment_blocks_(uint32_t(std::min<size_t>(segment_bytes_ / block_bytes_, size_t{1} << 31))),
      directory_(make_table_disk_dir()),
      max_disk_bytes_(max_disk_bytes) {}

DiskTier::~DiskTier() {
  {
    std::lock_guard<std::mutex> lock(flusher_mutex_);
    stopping_ = true;
  }
  flusher_wake_.notify_all();
  if (flusher_.joinable()) flusher_.join();
  segments_.clear();
  remove_table_disk_dir(directory_);
}

void DiskTier::set_max_disk_bytes(uint64_t bytes) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  max_disk_bytes_ = bytes;
}

std::string DiskTier::segment_path(uint32_t segment) const {
  return directory_ + "/segment-" + std::to_string(segment) + ".blocks";
}

uint32_t DiskTier::block_count(const std::byte* block) const {
  uint32_t count;
  std::memcpy(&count, block + 4, 4);
  return count;
}

void DiskTier::seal(std::byte* block) const {
  const uint32_t crc = crc32c_update(0, block + 4, block_bytes_ - 4);
  std::memcpy(block, &crc, 4);
}

void DiskTier::check_block(const std::byte* block, uint32_t segment, uint32_t block_index) const {
  uint32_t stored;
  std::memcpy(&stored, block, 4);
  const bool counted = block_count(block) <= per_block_;
  if (!counted || crc32c_update(0, block + 4, block_bytes_ - 4) != stored) {
    throw StoreError(ErrorCode::Corrupt, "table " + std::to_string(table_) + ": block " + std::to_string(block_index) +
                                             " of the disk tier's file " + segment_path(segment) +
                                             " fails its checksum; the rows spilled to it cannot be read back "
                                             "(erase them, or load the table from a checkpoint)");
  }
}

bool DiskTier::contains(uint64_t id) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return index_.find(id) != nullptr;
}

size_t DiskTier::size() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return index_.size();
}

void DiskTier::read(const uint64_t* ids, size_t n, std::vector<size_t>& positions, std::vector<float>& records) const {
  positions.clear();
  records.clear();
  std::shared_lock<std::shared_mutex> lock(mutex_);
  // (segment, block) of each row found, then the distinct blocks.
  struct Wanted {
    uint64_t block_key;  // segment << 32 | block
    uint32_t slot;
    size_t position;
    size_t output;  // its record's place in records
  };
  std::vector<Wanted> wanted;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t* where = index_.find(ids[i]);
    if (where == nullptr) continue;
    const uint32_t segment = uint32_t(*where >> 32);
    const uint32_t slot = uint32_t(*where);
    wanted.push_back(Wanted{(uint64_t{segment} << 32) | (slot / per_block_), slot % per_block_, i, positions.size()});
    positions.push_back(i);
  }
  if (wanted.empty()) return;
  records.resize(wanted.size() * record_words_);
  std::sort(wanted.begin(), wanted.end(), [](const Wanted& a, const Wanted& b) { return a.block_key < b.block_key; });
  const auto copy_out = [&](const std::byte* block, const Wanted& row) {
    const std::byte* slot = block + kBlockHeaderBytes + size_t{row.slot} * slot_bytes_;
    uint64_t stored_id;
    std::memcpy(&stored_id, slot, sizeof stored_id);
    if (row.slot >= block_count(block) || stored_id != ids[row.position]) {
      throw StoreError(ErrorCode::Corrupt, "table " + std::to_string(table_) + ": the disk tier's file " +
                                               segment_path(uint32_t(row.block_key >> 32)) + " does not hold row " +
                                               std::to_string(ids[row.position]) + " where its index says");
    }
    std::memcpy(records.data() + row.output * record_words_, slot + sizeof stored_id, record_bytes_);
  };
  // Buffered blocks are copied from memory; the others are read, kBlocksPerRound at a time.
  std::vector<uint64_t> to_read;
  for (size_t w = 0; w < wanted.size(); ++w) {
    if (w > 0 && wanted[w].block_key == wanted[w - 1].block_key) continue;
    const uint32_t segment = uint32_t(wanted[w].block_key >> 32);
    const uint32_t block = uint32_t(wanted[w].block_key);
    const auto it = segments_.find(segment);
    if (it == segments_.end() || block >= it->second.blocks_written) continue;
    to_read.push_back(wanted[w].block_key);
  }
  for (const BufferedBlock& buffered : buffer_) {
    const uint64_t key = (uint64_t{buffered.segment} << 32) | buffered.block;
    auto range = std::equal_range(wanted.begin(), wanted.end(), Wanted{key, 0, 0, 0},
                                  [](const Wanted& a, const Wanted& b) { return a.block_key < b.block_key; });
    for (auto it = range.first; it != range.second; ++it) copy_out(buffered.bytes.data(), *it);
  }
  size_t first_wanted = 0;
  for (size_t round = 0; round < to_read.size(); round += kBlocksPerRound) {
    const size_t count = std::min(kBlocksPerRound, to_read.size() - round);
    AlignedBuffer blocks(count * block_bytes_);
    run_reads(count, [&](size_t k) {
      const uint64_t key = to_read[round + k];
      const uint32_t segment = uint32_t(key >> 32);
      const uint32_t block = uint32_t(key);
      std::byte* destination = blocks.data() + k * block_bytes_;
      segments_.at(segment).file->read_at(uint64_t{block} * block_bytes_, destination, block_bytes_);
      check_block(destination, segment, block);
    });
    for (size_t k = 0; k < count; ++k) {
      while (wanted[first_wanted].block_key < to_read[round + k]) ++first_wanted;
      for (; first_wanted < wanted.size() && wanted[first_wanted].block_key == to_read[round + k]; ++first_wanted) {
        copy_out(blocks.data() + k * block_bytes_, wanted[first_wanted]);
      }
    }
  }
  std::lock_guard<std::mutex> counting(counters_mutex_);
  counters_.reads += wanted.size();
  counters_.read_ops += to_read.size();
}

RowsReadBack DiskTier::read_back(const uint64_t* ids, size_t n) const {
  RowsReadBack back;
  read(ids, n, back.positions, back.records);
  back.by_id.reserve(back.positions.size());
  for (size_t k = 0; k < back.positions.size(); ++k) {
    back.by_id.emplace(ids[back.positions[k]], back.records.data() + k * record_words_);
  }
  return back;
}

bool DiskTier::read_one(uint64_t id, float* record) const {
  std::vector<size_t> positions;
  std::vector<float> records;
  read(&id, 1, positions, records);
  if (positions.empty()) return false;
  std::memcpy(record, records.data(), record_bytes_);
  return true;
}

void DiskTier::stage(uint64_t id, const float* record) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  stage_locked(id, record);
  std::lock_guard<std::mutex> counting(counters_mutex_);
  ++counters_.writes;
}

void DiskTier::stage_locked(uint64_t id, const float* record) {
  if (buffer_.empty() || buffer_.back().segment != active_ || block_count(buffer_.back().bytes.data()) == per_block_) {
    if (active_blocks_ == segment_blocks_) {
      ++active_;
      active_blocks_ = 0;
    }
    buffer_.push_back(BufferedBlock{active_, active_blocks_++, AlignedBuffer(block_bytes_)});
    segments_[active_];  // exists from its first buffered block on
  }
  BufferedBlock& open = buffer_.back();
  const uint32_t count = block_count(open.bytes.data());
  std::byte* slot = open.bytes.data() + kBlockHeaderBytes + size_t{count} * slot_bytes_;
  std::memcpy(slot, &id, sizeof id);
  std::memcpy(slot + sizeof id, record, record_bytes_);
  const uint32_t new_count = count + 1;
  std::memcpy(open.bytes.data() + 4, &new_count, 4);
  const auto [where, created] = index_.find_or_insert(id);
  if (!created) note_dead(*where);
  *where = location(open.segment, uint64_t{open.block} * per_block_ + count);
  ++segments_[open.segment].live;
}

void DiskTier::forget(uint64_t id) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  uint64_t old;
  if (index_.erase(id, &old)) note_dead(old);
}

void DiskTier::note_dead(uint64_t old_location) { --segments_.at(uint32_t(old_location >> 32)).live; }

void DiskTier::write_buffered_blocks(bool including_partial) {
  // Runs of consecutive blocks of one segment go out in one write.
  size_t begin = 0;
  while (begin < buffer_.size()) {
    const BufferedBlock& first = buffer_[begin];
    const bool partial = block_count(first.bytes.data()) < per_block_ && first.segment == active_;
    if (partial && !including_partial) break;
    size_t end = begin + 1;
    while (end < buffer_.size() && buffer_[end].segment == first.segment &&
           (including_partial || block_count(buffer_[end].bytes.data()) == per_block_ ||
            buffer_[end].segment != active_)) {
      ++end;
    }
    Segment& segment = segments_.at(first.segment);
    if (!segment.file) segment.file = std::make_unique<SegmentFile>(segment_path(first.segment));
    AlignedBuffer run((end - begin) * block_bytes_);
    for (size_t b = begin; b < end; ++b) {
      std::byte* destination = run.data() + (b - begin) * block_bytes_;
      std::memcpy(destination, buffer_[b].bytes.data(), block_bytes_);
      seal(destination);
    }
    segment.file->write_at(uint64_t{first.block} * block_bytes_, run.data(), run.size());
    segment.blocks_written = buffer_[end - 1].block + 1;
    {
      std::lock_guard<std::mutex> counting(counters_mutex_);
      counters_.write_ops += end - begin;
    }
    begin = end;
  }
  buffer_.erase(buffer_.begin(), buffer_.begin() + std::ptrdiff_t(begin));
}

void DiskTier::remove_segment(uint32_t segment) {
  auto it = segments_.find(segment);
  if (it == segments_.end()) return;
  if (it->second.file) it->second.file->remove();
  segments_.erase(it);
}

void DiskTier::for_each_live_in(uint32_t segment,
                                const std::function<void(uint64_t, const float*, uint64_t)>& fn) const {
  const Segment& held = segments_.at(segment);
  const uint32_t blocks = held.blocks_written;
  std::vector<float> record(record_words_);
  for (uint32_t first = 0; first < blocks; first += uint32_t(kBlocksPerRound)) {
    const uint32_t count = std::min<uint32_t>(uint32_t(kBlocksPerRound), blocks - first);
    AlignedBuffer bytes(size_t{count} * block_bytes_);
    held.file->read_at(uint64_t{first} * block_bytes_, bytes.data(), bytes.size());
    for (uint32_t b = 0; b < count; ++b) {
      const std::byte* block = bytes.data() + size_t{b} * block_bytes_;
      check_block(block, segment, first + b);
      for (uint32_t s = 0; s < block_count(block); ++s) {
        const std::byte* slot = block + kBlockHeaderBytes + size_t{s} * slot_bytes_;
        uint64_t id;
        std::memcpy(&id, slot, sizeof id);
        const uint64_t where = location(segment, uint64_t{first + b} * per_block_ + s);
        const uint64_t* current = index_.find(id);
        if (current == nullptr || *current != where) continue;
        std::memcpy(record.data(), slot + sizeof id, record_bytes_);
        fn(id, record.data(), where);
      }
    }
  }
}

uint64_t DiskTier::file_bytes_locked() const {
  uint64_t bytes = 0;
  for (const auto& [number, segment] : segments_) bytes += uint64_t{segment.blocks_written} * block_bytes_;
  return bytes;
}

void DiskTier::compact_one() {
  const uint64_t live_bytes = index_.size() * slot_bytes_;
  if (file_bytes_locked() <= kMaxSpaceAmplification * live_bytes + segment_bytes_) return;
  // The written segment (not the one filling) with the smallest share of live records.
  uint32_t victim = 0;
  double best = 2;
  for (const auto& [number, segment] : segments_) {
    if (number == active_ || !segment.file || segment.blocks_written == 0) continue;
    const double share = double(segment.live) / (double(segment.blocks_written) * per_block_);
    if (share < best) best = share, victim = number;
  }
  if (best > 1) return;
  // Read whole first: restaging moves the index off the segment being read.
  std::vector<uint64_t> ids;
  std::vector<float> records;
  for_each_live_in(victim, [&](uint64_t id, const float* record, uint64_t) {
    ids.push_back(id);
    records.insert(records.end(), record, record + record_words_);
  });
  for (size_t r = 0; r < ids.size(); ++r) stage_locked(ids[r], records.data() + r * record_words_);
  remove_segment(victim);
  std::lock_guard<std::mutex> counting(counters_mutex_);
  counters_.compacted += ids.size();
}

void DiskTier::trim_to_budget() {
  if (max_disk_bytes_ == 0) return;
  while (file_bytes_locked() > max_disk_bytes_) {
    const auto oldest = std::find_if(segments_.begin(), segments_.end(),
                                     [&](const auto& entry) { return entry.first != active_ && entry.second.file; });
    if (oldest == segments_.end()) return;
    const uint32_t segment = oldest->first;
    uint64_t dropped = 0;
    for_each_live_in(segment, [&](uint64_t id, const float*, uint64_t) {
      index_.erase(id);
      ++dropped;
    });
    remove_segment(segment);
    std::lock_guard<std::mutex> counting(counters_mutex_);
    counters_.dropped += dropped;
  }
}

void DiskTier::flush() {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  write_buffered_blocks(false);
  for (auto it = segments_.begin(); it != segments_.end();) {
    const bool buffered = std::any_of(buffer_.begin(), buffer_.end(),
                                      [&](const BufferedBlock& block) { return block.segment == it->first; });
    if (it->first != active_ && it->second.live == 0 && !buffered) {
      if (it->second.file) it->second.file->remove();
      it = segments_.erase(it);
    } else {
      ++it;
    }
  }
  compact_one();
  write_buffered_blocks(false);
  trim_to_budget();
}

void DiskTier::flush_in_background() {
  std::lock_guard<std::mutex> lock(flusher_mutex_);
  if (!flusher_.joinable()) flusher_ = std::thread([this] { run_flusher(); });
  flush_wanted_ = true;
  flusher_wake_.notify_all();
}

void DiskTier::wait_flushed() {
  std::unique_lock<std::mutex> lock(flusher_mutex_);
  flusher_done_.wait(lock, [&] { return !flush_wanted_ && !flushing_; });
  if (flush_error_) std::rethrow_exception(std::exchange(flush_error_, nullptr));
}

void DiskTier::run_flusher() {
  std::unique_lock<std::mutex> lock(flusher_mutex_);
  for (;;) {
    flusher_wake_.wait(lock, [&] { return flush_wanted_ || stopping_; });
    if (stopping_) return;
    flush_wanted_ = false;
    flushing_ = true;
    lock.unlock();
    std::exception_ptr error;
    try {
      flush();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    flushing_ = false;
    if (error) flush_error_ = error;
    flusher_done_.notify_all();
  }
}

void DiskTier::for_each(const std::function<void(uint64_t id, const float* record)>& fn) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  for (const auto& [number, segment] : segments_) {
    if (segment.file) for_each_live_in(number, [&](uint64_t id, const float* record, uint64_t) { fn(id, record); });
  }
  for (const BufferedBlock& buffered : buffer_) {
    for (uint32_t s = 0; s < block_count(buffered.bytes.data()); ++s) {
      const std::byte* slot = buffered.bytes.data() + kBlockHeaderBytes + size_t{s} * slot_bytes_;
      uint64_t id;
      std::memcpy(&id, slot, sizeof id);
      const uint64_t* current = index_.find(id);
      if (current == nullptr || *current != location(buffered.segment, uint64_t{buffered.block} * per_block_ + s))
        continue;
      std::vector<float> record(record_words_);
      std::memcpy(record.data(), slot + sizeof id, record_bytes_);
      fn(id, record.data());
    }
  }
}

void DiskTier::clear() {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  for (auto& [number, segment] : segments_) {
    if (segment.file) segment.file->remove();
  }
  segments_.clear();
  buffer_.clear();
  index_.clear();
  ++active_;
  active_blocks_ = 0;
}

DiskTierStats DiskTier::stats() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  DiskTierStats stats;
  {
    std::lock_guard<std::mutex> counting(counters_mutex_);
    stats = counters_;
  }
  stats.rows = index_.size();
  stats.live_bytes = index_.size() * record_bytes_;
  stats.file_bytes = file_bytes_locked();
  stats.memory_bytes = index_.bytes() + buffer_.size() * block_bytes_;
  stats.segments = uint64_t(std::count_if(segments_.begin(), segments_.end(),
                                          [](const auto& entry) { return entry.second.file != nullptr; }));
  return stats;
}

}  // namespace recdev::store
