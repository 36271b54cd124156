// FrequencySketch: a count-min sketch of how often row ids were touched, for admission
// (table_policy.h): a row is materialized only once the sketch says it was looked up admit_after
// times. Memory is fixed whatever the number of ids: kDepth rows of `width` counters (width a power of
// two, sized from the table's budget: auto_sketch_width in table_policy.h).
//
// Counters take the fewest bits that still count to admit_after: 2, 4, 8 or 16, saturating at 3, 15,
// 255 or 65535 (count_limit). Admission only asks whether a count reached admit_after, so a larger
// count carries nothing, and at admit_after=2 a column is 1 byte instead of 8: the sketch must cost
// less than the rows it keeps out, or admission saves no memory.
//
// Count-min never undercounts an id; collisions can only make it overcount, i.e. admit an id a little
// early, never starve one. Counters saturate at count_limit(). Aging: once `width * kAgingFactor` increments
// were counted, every counter is halved (TinyLFU's reset), so that an id seen long ago has to be seen
// again before it is admitted and the sketch does not fill up under an unbounded stream. The period is
// one increment per column: a one-off id is then admitted at admit_after=2 only if all kDepth of its
// counters were hit by others, about (1 - e^-1.5)^4 ~ 37% at the end of a period and far less before;
// at 10 per column (TinyLFU's sample size) nearly every counter is 2 or more and admission at 2
// admits almost everything.
//
// Deterministic, so that a Python reference model (test/store/policy_model.py) predicts it exactly:
// the counter of id in row r is column mix64(id ^ kSeeds[r]) & (width - 1).
// Not thread-safe: the owning TablePolicy runs under its table's policy lock.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace recdev::store {

class FrequencySketch {
 public:
  static constexpr size_t kDepth = 4;
  static constexpr uint64_t kAgingFactor = 1;
  static constexpr std::array<uint64_t, kDepth> kSeeds = {0x243F6A8885A308D3ull, 0x13198A2E03707344ull,
                                                          0xA4093822299F31D0ull, 0x082EFA98EC4E6C89ull};

  // Counters count up to at least max_count (admit_after).
  FrequencySketch(size_t width, uint32_t max_count);
  size_t width() const { return width_; }
  uint32_t count_limit() const { return limit_; }
  size_t bytes() const { return bytes_for(width_, limit_); }
  static size_t bytes_for(size_t width, uint32_t max_count);

  // The count of `id`, counted once more; the cells incremented go to `touched` (for rollback).
  uint32_t increment(uint64_t id, std::vector<uint32_t>& touched);
  // Undoes the increments listed by increment (in any order).
  void rollback(const std::vector<uint32_t>& touched);
  uint32_t estimate(uint64_t id) const;
  // Counts `increments` increments towards aging, halving every counter when they reach the period.
  void note_increments(uint64_t increments);

  // For checkpoints: the counters (kDepth rows of width, whatever their packing) and the increments
  // since the last halving. restore caps counts at count_limit.
  std::vector<uint16_t> counters() const;
  uint64_t since_aging() const { return since_aging_; }
  void restore(const std::vector<uint16_t>& counters, uint64_t since_aging);

 private:
  uint32_t cell(size_t row, uint64_t id) const;
  uint32_t get(uint32_t cell) const {
    return uint32_t(words_[cell >> cells_per_word_log2_] >> shift_of(cell)) & limit_;
  }
  void set(uint32_t cell, uint32_t count) {
    uint64_t& word = words_[cell >> cells_per_word_log2_];
    word = (word & ~(uint64_t{limit_} << shift_of(cell))) | (uint64_t{count} << shift_of(cell));
  }
  unsigned shift_of(uint32_t cell) const { return (cell & ((1u << cells_per_word_log2_) - 1)) * bits_; }

  size_t width_;
  unsigned bits_;                 // per counter: 2, 4, 8 or 16
  unsigned cells_per_word_log2_;  // log2(64 / bits_)
  uint32_t limit_;                // 2^bits_ - 1
  uint64_t halving_mask_;         // each counter's bits but its top one, as a halved word keeps them
  std::vector<uint64_t> words_;   // kDepth rows of width_ counters, packed
  uint64_t since_aging_ = 0;
};

}  // namespace recdev::store
