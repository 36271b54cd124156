// FlatIdMap<Value>: row id -> Value in one open-addressing array (linear probing, backward-shift
// erase, so no tombstones): one cache line per lookup and no allocation per row, which a node-based
// map would cost on every admission, eviction and spill (a request makes tens of thousands).
// MaxLoadPercent trades memory for probe length: the policy's touch metadata keeps it at 50, the
// disk tier's index (whose slots are the memory a row on disk still costs) at 80.
//
// Row ids are below num_rows <= 2^64 - 1, so the largest value marks a free slot. Not thread-safe.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "mix64.h"

namespace recdev::store {

template <class Value, unsigned MaxLoadPercent, template <class> class Allocator = std::allocator>
class FlatIdMap {
 public:
  struct Slot {
    uint64_t id;
    Value value;
  };
  using SlotAllocator = Allocator<Slot>;

  explicit FlatIdMap(const SlotAllocator& allocator = SlotAllocator()) : slots_(allocator) {}

  size_t size() const { return size_; }
  size_t bytes() const { return slots_.capacity() * sizeof(Slot); }

  // Inline: the batch loops call these once per row.
  Value* find(uint64_t id) {
    if (size_ == 0) return nullptr;
    const size_t mask = slots_.size() - 1;
    for (size_t i = home(id);; i = (i + 1) & mask) {
      if (slots_[i].id == id) return &slots_[i].value;
      if (slots_[i].id == kFree) return nullptr;
    }
  }
  const Value* find(uint64_t id) const { return const_cast<FlatIdMap*>(this)->find(id); }
  void prefetch(uint64_t id) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[home(id)]);
  }

  // {value, created}; a new row's value is unset.
  std::pair<Value*, bool> find_or_insert(uint64_t id) {
    if (100 * (size_ + 1) > MaxLoadPercent * slots_.size()) grow();
    const size_t mask = slots_.size() - 1;
    for (size_t i = home(id);; i = (i + 1) & mask) {
      if (slots_[i].id == id) return {&slots_[i].value, false};
      if (slots_[i].id == kFree) {
        slots_[i].id = id;
        ++size_;
        return {&slots_[i].value, true};
      }
    }
  }
  Value& insert(uint64_t id, const Value& value) { return *find_or_insert(id).first = value; }

  // Whether the row was there; its value goes to *old if given.
  bool erase(uint64_t id, Value* old = nullptr) {
    if (size_ == 0) return false;
    const size_t mask = slots_.size() - 1;
    size_t hole = home(id);
    while (slots_[hole].id != id) {
      if (slots_[hole].id == kFree) return false;
      hole = (hole + 1) & mask;
    }
    if (old != nullptr) *old = slots_[hole].value;
    // Backward shift: every later entry of the probe run whose home is not within (hole, it] moves
    // into the hole, so that lookups never need tombstones.
    for (size_t i = (hole + 1) & mask; slots_[i].id != kFree; i = (i + 1) & mask) {
      if (((i - home(slots_[i].id)) & mask) >= ((i - hole) & mask)) {
        slots_[hole] = slots_[i];
        hole = i;
      }
    }
    slots_[hole].id = kFree;
    --size_;
    return true;
  }

  void clear() {  // frees the slots
    slots_ = std::vector<Slot, SlotAllocator>(slots_.get_allocator());
    size_ = 0;
  }

  template <class Fn>
  void for_each(Fn fn) {  // fn(id, value&)
    for (Slot& slot : slots_) {
      if (slot.id != kFree) fn(slot.id, slot.value);
    }
  }
  template <class Fn>
  void for_each(Fn fn) const {
    for (const Slot& slot : slots_) {
      if (slot.id != kFree) fn(slot.id, slot.value);
    }
  }

 private:
  static constexpr uint64_t kFree = ~uint64_t{0};
  static constexpr size_t kMinSlots = 16;

  size_t home(uint64_t id) const { return size_t(mix64(id)) & (slots_.size() - 1); }
  void grow() {
    std::vector<Slot, SlotAllocator> old(std::max(kMinSlots, 2 * slots_.size()), Slot{kFree, {}},
                                         slots_.get_allocator());
    old.swap(slots_);
    size_ = 0;
    for (const Slot& slot : old) {
      if (slot.id != kFree) insert(slot.id, slot.value);
    }
  }

  std::vector<Slot, SlotAllocator> slots_;
  size_t size_ = 0;
};

}  // namespace recdev::store
