// RowIndex: the materialized rows of one sub-shard — an open-addressing hash index from row id to a
// record in a SlabArena.
//
// A bucket holds a row's full 64-bit hash and its arena slot (16 bytes, four to a cache line).
// hash_row_id is a bijection, so equal hashes mean equal ids: a lookup reads bucket lines only, never
// a record, and a record is nothing but its floats (weight, then optimizer state). A row of dim 128
// is then 512 bytes in whole cache lines, which a batch loop fetches after one bucket miss, with no
// second, dependent miss on the record to compare ids. Each slot's row id is also kept in a second
// arena (8-byte records, in slot order) for for_each and for deletion, which moves the last record
// into the freed slot and must find that record's bucket.
//
// Linear probing at a load factor of at most 0.8 keeps probes within one or two cache lines; deletion
// shifts later entries back (no tombstones), and the last record moves into the freed slot, so the
// arenas stay dense and memory follows the row count down as well as up.
//
// Memory: 16 bytes of bucket per row / load factor (20-40 bytes) plus 8 bytes of id.
// Not thread-safe: the owning Table guards each RowIndex with its sub-shard lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "chunk_pool.h"
#include "mix64.h"
#include "prefetch.h"
#include "slab_arena.h"

namespace recdev::store {

inline uint64_t hash_row_id(uint64_t row_id) { return mix64(row_id); }

class RowIndex {
 public:
  explicit RowIndex(uint32_t record_words = 0);
  // Moving leaves the source empty (and usable); copying a whole sub-shard is never intended.
  RowIndex(RowIndex&& other) noexcept;
  RowIndex& operator=(RowIndex&& other) noexcept;

  size_t size() const { return arena_.size(); }

  // A copy of every row, bucket array and arenas copied whole: a memory copy, no row re-inserted.
  // Throws std::bad_alloc.
  RowIndex copy() const;
  // Every row's id and record, in slot order, to size() ids and size() records of record_words floats.
  void copy_out(uint64_t* ids, float* records) const {
    ids_.copy_out(reinterpret_cast<std::byte*>(ids));
    arena_.copy_out(reinterpret_cast<std::byte*>(records));
  }

  // The record of the row whose hash_row_id is `hash` (a bijection: the hash alone names the row),
  // or null. Callers compute the hash once and also route by it.
  float* find(uint64_t hash) const {
    const Location found = locate(hash);
    return found.slot != kNoSlot ? floats_at(found.slot) : nullptr;
  }

  // A prefetch hint for batch lookups, which overlap the cache misses of many rows instead of paying
  // them one after another: prefetch_bucket(hash) a few rows before find(hash). Never faults.
  void prefetch_bucket(uint64_t hash) const {
    if (capacity_ != 0) prefetch(&buckets_[hash & mask_]);
  }

  // Returns the row's record and whether this call created it; a created record's floats are
  // uninitialized. Throws StoreError(Full) when memory or the sub-shard's capacity runs out, leaving
  // the index unchanged.
  std::pair<float*, bool> find_or_insert(uint64_t row_id, uint64_t hash);

  // Sizes the bucket array for `rows` rows, so that inserting up to that many rehashes nothing (a
  // bulk load knows its count). Throws StoreError(Full) like find_or_insert, leaving the index unchanged.
  void reserve(size_t rows);

  // What erase did: whether the row was present, and where the sub-shard's last record went if it
  // moved into the freed slot (moved_record null if none did). Pointers to it elsewhere are stale.
  struct Erased {
    bool found = false;
    uint64_t moved_id = 0;
    const float* moved_record = nullptr;
  };
  Erased erase(uint64_t row_id, uint64_t hash);

  // Hands the record of the row whose hash is old_hash over to row new_id, in place: the old row is
  // gone as after erase, the new one holds its slot, and no other record moves (erase then
  // find_or_insert would move the sub-shard's last record into the hole and append the new row).
  // For a budget that evicts one row to admit another. Returns the record, its floats as the old row
  // left them, for the caller to overwrite; or null, with nothing changed, if the old row is absent or
  // the new one present.
  float* replace(uint64_t old_hash, uint64_t new_id, uint64_t new_hash);

  void clear();

  // Every byte held: the bucket array and the arenas.
  size_t bytes() const { return capacity_ * sizeof(Bucket) + arena_.bytes() + ids_.bytes(); }

  // Calls fn(row_id, const float* record_words) for every row, in slot order.
  template <class Fn>
  void for_each(Fn&& fn) const {
    for (size_t slot = 0; slot < arena_.size(); ++slot) fn(id_at(slot), static_cast<const float*>(floats_at(slot)));
  }

 private:
  static constexpr size_t kNoSlot = ~size_t{0};

  struct Bucket {
    uint64_t hash;
    size_t slot;  // kNoSlot: empty
  };

  float* floats_at(size_t slot) const { return reinterpret_cast<float*>(arena_.record(slot)); }
  uint64_t id_at(size_t slot) const {
    uint64_t id;
    std::memcpy(&id, ids_.record(slot), sizeof(id));
    return id;
  }

  struct Location {
    size_t bucket;
    size_t slot;  // kNoSlot if the row is absent
  };
  Location locate(uint64_t hash) const {
    if (capacity_ == 0) return {0, kNoSlot};
    for (size_t bucket = hash & mask_;; bucket = (bucket + 1) & mask_) {
      const Bucket& entry = buckets_[bucket];
      if (entry.slot == kNoSlot || entry.hash == hash) return {bucket, entry.slot};
    }
  }
  void insert_bucket(const Bucket& entry);  // into a bucket array with room
  void free_bucket(size_t bucket);          // empties it, shifting its cluster back
  void rehash(size_t new_capacity);
  void grow_to(size_t new_capacity);  // rehash, or StoreError(Full)

  // capacity buckets from the chunk pool (on huge pages once large: every lookup reads a random one).
  static ChunkPtr allocate_buckets(size_t capacity);

  SlabArena arena_;  // the records: record_words floats each
  SlabArena ids_;    // the row id of each slot
  ChunkPtr bucket_memory_;
  Bucket* buckets_ = nullptr;  // in bucket_memory_
  size_t capacity_ = 0;        // a power of two, or 0 before the first insert
  size_t mask_ = 0;
};

}  // namespace recdev::store
