#include "row_index.h"

#include <algorithm>
#include <new>
#include <string>
#include <type_traits>
#include <utility>

#include "errors.h"

namespace recdev::store {
namespace {

constexpr size_t kMinCapacity = 16;
// About 3.4e9 rows per sub-shard at the maximum load factor.
constexpr size_t kMaxCapacity = size_t{1} << 32;
// Bucket arrays from this size on come from the chunk pool (chunk_pool.h), on huge pages.
constexpr size_t kMinPooledBucketBytes = size_t{128} << 10;

size_t record_bytes_for(uint32_t record_words) { return std::max<size_t>(1, record_words) * sizeof(float); }

// Load factor <= 0.8.
bool over_max_load(size_t rows, size_t capacity) { return rows * 5 > capacity * 4; }

size_t next_power_of_two(size_t value) { return value <= 1 ? 1 : size_t{1} << (64 - __builtin_clzll(value - 1)); }

}  // namespace

RowIndex::RowIndex(uint32_t record_words) : arena_(record_bytes_for(record_words)), ids_(sizeof(uint64_t)) {}

void RowIndex::insert_bucket(const Bucket& entry) {
  size_t bucket = entry.hash & mask_;
  while (buckets_[bucket].slot != kNoSlot) bucket = (bucket + 1) & mask_;
  buckets_[bucket] = entry;
}

ChunkPtr RowIndex::allocate_buckets(size_t capacity) {
  static_assert(std::is_trivially_copyable_v<Bucket> && alignof(Bucket) <= alignof(std::max_align_t));
  const size_t bytes = capacity * sizeof(Bucket);
  // Small arrays stay off the pool: a few pages need no huge one, and as a table's sub-shards outgrow
  // theirs together, the freed arrays would leave holes in the regions the records' chunks share.
  if (bytes < kMinPooledBucketBytes) return allocate_heap_chunk(bytes);
  return allocate_chunk(bytes);
}

void RowIndex::rehash(size_t new_capacity) {
  ChunkPtr new_memory = allocate_buckets(new_capacity);  // throws with the index unchanged
  const ChunkPtr old_memory = std::exchange(bucket_memory_, std::move(new_memory));
  const Bucket* const old_buckets = std::exchange(buckets_, reinterpret_cast<Bucket*>(bucket_memory_.get()));
  std::fill(buckets_, buckets_ + new_capacity, Bucket{0, kNoSlot});
  const size_t old_capacity = std::exchange(capacity_, new_capacity);
  mask_ = new_capacity - 1;
  for (size_t bucket = 0; bucket < old_capacity; ++bucket) {
    if (old_buckets[bucket].slot != kNoSlot) insert_bucket(old_buckets[bucket]);
  }
}

RowIndex RowIndex::copy() const {
  RowIndex out;
  out.arena_ = arena_.copy();
  out.ids_ = ids_.copy();
  if (capacity_ != 0) {
    out.bucket_memory_ = allocate_buckets(capacity_);
    out.buckets_ = reinterpret_cast<Bucket*>(out.bucket_memory_.get());
    std::copy(buckets_, buckets_ + capacity_, out.buckets_);
  }
  out.capacity_ = capacity_;
  out.mask_ = mask_;
  return out;
}

RowIndex::RowIndex(RowIndex&& other) noexcept
    : arena_(std::move(other.arena_)),
      ids_(std::move(other.ids_)),
      bucket_memory_(std::move(other.bucket_memory_)),
      buckets_(std::exchange(other.buckets_, nullptr)),
      capacity_(std::exchange(other.capacity_, 0)),
      mask_(std::exchange(other.mask_, 0)) {}

RowIndex& RowIndex::operator=(RowIndex&& other) noexcept {
  arena_ = std::move(other.arena_);
  ids_ = std::move(other.ids_);
  bucket_memory_ = std::move(other.bucket_memory_);
  buckets_ = std::exchange(other.buckets_, nullptr);
  capacity_ = std::exchange(other.capacity_, 0);
  mask_ = std::exchange(other.mask_, 0);
  return *this;
}

void RowIndex::grow_to(size_t new_capacity) {
  if (new_capacity > kMaxCapacity) {
    throw StoreError(ErrorCode::Full, "a table sub-shard is full: it holds " + std::to_string(arena_.size()) +
                                          " rows, the most one sub-shard can index");
  }
  try {
    rehash(new_capacity);
  } catch (const std::bad_alloc&) {
    throw StoreError(ErrorCode::Full,
                     "out of memory growing the row index to " + std::to_string(new_capacity) + " buckets");
  }
}

void RowIndex::reserve(size_t rows) {
  size_t new_capacity = std::max(capacity_, kMinCapacity);
  while (over_max_load(rows, new_capacity) && new_capacity <= kMaxCapacity) new_capacity *= 2;
  if (new_capacity > capacity_) grow_to(new_capacity);
}

std::pair<float*, bool> RowIndex::find_or_insert(uint64_t row_id, uint64_t hash) {
  if (float* existing = find(hash)) return {existing, false};
  if (over_max_load(arena_.size() + 1, capacity_)) grow_to(capacity_ == 0 ? kMinCapacity : capacity_ * 2);
  size_t slot;
  try {
    slot = arena_.push_back();
    try {
      ids_.push_back();
    } catch (...) {
      arena_.pop_back();
      throw;
    }
  } catch (const std::bad_alloc&) {
    throw StoreError(ErrorCode::Full, "out of memory allocating rows (" + std::to_string(arena_.size()) +
                                          " rows held in this sub-shard)");
  }
  std::memcpy(ids_.record(slot), &row_id, sizeof(row_id));
  insert_bucket(Bucket{hash, slot});
  return {floats_at(slot), true};
}

void RowIndex::free_bucket(size_t hole) {
  // Backward-shift deletion: walk the cluster after the hole and move back every entry whose home
  // bucket is not cyclically within (hole, bucket], so no lookup ever meets a gap before its entry.
  for (size_t bucket = (hole + 1) & mask_;; bucket = (bucket + 1) & mask_) {
    const Bucket entry = buckets_[bucket];
    if (entry.slot == kNoSlot) break;
    const size_t home = entry.hash & mask_;
    const bool home_in_range = hole <= bucket ? (hole < home && home <= bucket) : (hole < home || home <= bucket);
    if (!home_in_range) {
      buckets_[hole] = entry;
      hole = bucket;
    }
  }
  buckets_[hole].slot = kNoSlot;
}

float* RowIndex::replace(uint64_t old_hash, uint64_t new_id, uint64_t new_hash) {
  const Location old_row = locate(old_hash);
  if (old_row.slot == kNoSlot || locate(new_hash).slot != kNoSlot) return nullptr;
  free_bucket(old_row.bucket);
  insert_bucket(Bucket{new_hash, old_row.slot});  // the freed bucket leaves room
  std::memcpy(ids_.record(old_row.slot), &new_id, sizeof(new_id));
  return floats_at(old_row.slot);
}

RowIndex::Erased RowIndex::erase(uint64_t row_id, uint64_t hash) {
  const Location found = locate(hash);
  if (found.slot == kNoSlot) return {};
  Erased erased{true};
  const size_t slot = found.slot;
  free_bucket(found.bucket);
  // Keep the arenas dense: the last record moves into the freed slot and its bucket is repointed.
  const size_t last = arena_.size() - 1;
  if (slot != last) {
    std::memcpy(arena_.record(slot), arena_.record(last), arena_.record_bytes());
    const uint64_t moved_id = id_at(last);
    std::memcpy(ids_.record(slot), &moved_id, sizeof(moved_id));
    for (size_t bucket = hash_row_id(moved_id) & mask_;; bucket = (bucket + 1) & mask_) {
      if (buckets_[bucket].slot == last) {
        buckets_[bucket].slot = slot;
        break;
      }
    }
    erased.moved_id = moved_id;
    erased.moved_record = floats_at(slot);
  }
  arena_.pop_back();
  ids_.pop_back();

  if (arena_.size() == 0) {
    clear();
  } else if (capacity_ > kMinCapacity && arena_.size() * 10 < capacity_) {
    try {
      rehash(std::max(kMinCapacity, next_power_of_two(arena_.size() * 2)));
    } catch (const std::bad_alloc&) {
      // Shrinking only saves memory; keeping the larger bucket array is correct too.
    }
  }
  return erased;
}

void RowIndex::clear() {
  arena_.clear();
  ids_.clear();
  bucket_memory_.reset();
  buckets_ = nullptr;
  capacity_ = 0;
  mask_ = 0;
}

}  // namespace recdev::store
