// RowIndex: the materialized rows of one sub-shard — an open-addressing hash index from row id to a
// record in a SlabArena.
//
// Record layout in the arena: [uint64 row id | record_floats floats (weight, then optimizer state) |
// padding to 8 bytes]. Keeping the id in the record lets the index store only 8 bytes per entry:
//
//   entry = (tag << 32) | slot,   tag = the low 32 bits of the row id's hash, slot = arena slot
//
// A lookup compares tags first and reads the record's id only on a tag match — the record is about
// to be read anyway. The home bucket is (hash & mask), which the tag also holds as long as the table
// has at most 2^32 buckets; that lets deletion and rehashing run on entries alone, without touching
// records. Linear probing at a load factor of at most 0.8 keeps probes within one or two cache lines;
// deletion shifts later entries back (no tombstones), and the last record moves into the freed slot,
// so the arena stays dense and memory follows the row count down as well as up.
//
// Memory: 8 bytes of id per record plus 10-20 bytes of index per row (8 bytes / load factor).
// Not thread-safe: the owning Table guards each RowIndex with its sub-shard lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

#include "mix64.h"
#include "prefetch.h"
#include "slab_arena.h"

namespace recdev::store {

inline uint64_t hash_row_id(uint64_t row_id) { return mix64(row_id); }

class RowIndex {
 public:
  explicit RowIndex(uint32_t record_floats = 0);
  // Moving leaves the source empty (and usable); copying a whole sub-shard is never intended.
  RowIndex(RowIndex&& other) noexcept;
  RowIndex& operator=(RowIndex&& other) noexcept;

  size_t size() const { return arena_.size(); }

  // `hash` must be hash_row_id(row_id): callers compute it once and also route by it.
  float* find(uint64_t row_id, uint64_t hash) const {
    std::byte* record = locate(row_id, hash).record;
    return record != nullptr ? floats_of(record) : nullptr;
  }

  // Prefetch hints for batch lookups, which overlap the cache misses of many rows instead of paying
  // them one after another: prefetch_bucket(hash) a few rows ahead; prefetch_record(hash, bytes),
  // for the id and the first `bytes` bytes of floats of the record the bucket points to, once the
  // bucket has arrived; then find() when the row is due. Hints never fault and change nothing.
  void prefetch_bucket(uint64_t hash) const {
    if (capacity_ != 0) prefetch(&entries_[hash & mask_]);
  }
  void prefetch_record(uint64_t hash, size_t bytes) const {
    if (capacity_ == 0) return;
    // The first tag match is the row's record unless two ids share a tag, which is rare enough to
    // leave to find().
    const uint32_t tag = uint32_t(hash);
    for (size_t bucket = hash & mask_;; bucket = (bucket + 1) & mask_) {
      const uint64_t entry = entries_[bucket];
      if (entry == kEmpty) return;
      if (uint32_t(entry >> 32) == tag) {
        prefetch_range(arena_.record(uint32_t(entry)), sizeof(uint64_t) + bytes);
        return;
      }
    }
  }

  // Returns the row's record and whether this call created it; a created record's floats are
  // uninitialized. Throws StoreError(Full) when memory or the sub-shard's capacity runs out, leaving
  // the index unchanged.
  std::pair<float*, bool> find_or_insert(uint64_t row_id, uint64_t hash);

  // Returns whether the row was present. Invalidates pointers to the record that was last.
  bool erase(uint64_t row_id, uint64_t hash);

  void clear();

  // Every byte held: the bucket array and the arena.
  size_t bytes() const { return capacity_ * sizeof(uint64_t) + arena_.bytes(); }

  // Calls fn(row_id, const float* record_floats) for every row, in slot order.
  template <class Fn>
  void for_each(Fn&& fn) const {
    for (size_t slot = 0; slot < arena_.size(); ++slot) {
      const std::byte* record = arena_.record(slot);
      fn(id_of(record), floats_of(record));
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  static uint64_t id_of(const std::byte* record) {
    uint64_t id;
    std::memcpy(&id, record, sizeof(id));
    return id;
  }
  static float* floats_of(std::byte* record) { return reinterpret_cast<float*>(record + sizeof(uint64_t)); }
  static const float* floats_of(const std::byte* record) {
    return reinterpret_cast<const float*>(record + sizeof(uint64_t));
  }

  struct Location {
    size_t bucket;
    std::byte* record;  // null if the row is absent
  };
  Location locate(uint64_t row_id, uint64_t hash) const {
    if (capacity_ == 0) return {0, nullptr};
    const uint32_t tag = uint32_t(hash);
    for (size_t bucket = hash & mask_;; bucket = (bucket + 1) & mask_) {
      const uint64_t entry = entries_[bucket];
      if (entry == kEmpty) return {bucket, nullptr};
      if (uint32_t(entry >> 32) == tag) {
        std::byte* record = arena_.record(uint32_t(entry));
        if (id_of(record) == row_id) return {bucket, record};
      }
    }
  }
  void insert_entry(uint64_t entry);                           // into a bucket array with room
  void rehash(size_t new_capacity);

  SlabArena arena_;
  std::unique_ptr<uint64_t[]> entries_;
  size_t capacity_ = 0;  // a power of two, or 0 before the first insert
  size_t mask_ = 0;
};

}  // namespace recdev::store
