// FrequencySketch: a count-min sketch of how often row ids were touched, for admission
// (table_policy.h): a row is materialized only once the sketch says it was looked up admit_after
// times. Memory is fixed whatever the number of ids: kDepth rows of `width` 16-bit counters, 8 bytes per
// column (width a power of two, sized from the table's budget: auto_sketch_width in table_policy.h).
//
// Count-min never undercounts an id; collisions can only make it overcount, i.e. admit an id a little
// early, never starve one. Counters saturate at 65535. Aging: once `width * kAgingFactor` increments
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

  explicit FrequencySketch(size_t width);
  size_t width() const { return width_; }
  size_t bytes() const { return counters_.size() * sizeof(uint16_t); }

  // The count of `id`, counted once more; the cells incremented go to `touched` (for rollback).
  uint32_t increment(uint64_t id, std::vector<uint32_t>& touched);
  // Undoes the increments listed by increment (in any order).
  void rollback(const std::vector<uint32_t>& touched);
  uint32_t estimate(uint64_t id) const;
  // Counts `increments` increments towards aging, halving every counter when they reach the period.
  void note_increments(uint64_t increments);

  // For checkpoints: the counters and the increments since the last halving.
  const std::vector<uint16_t>& counters() const { return counters_; }
  uint64_t since_aging() const { return since_aging_; }
  void restore(std::vector<uint16_t> counters, uint64_t since_aging);

 private:
  uint32_t cell(size_t row, uint64_t id) const;

  size_t width_;
  std::vector<uint16_t> counters_;  // kDepth rows of width_
  uint64_t since_aging_ = 0;
};

}  // namespace recdev::store
