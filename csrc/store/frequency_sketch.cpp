#include "frequency_sketch.h"

#include <algorithm>
#include <string>

#include "errors.h"
#include "mix64.h"

namespace recdev::store {
namespace {

unsigned counter_bits(uint32_t max_count) {
  for (unsigned bits : {2u, 4u, 8u}) {
    if (max_count <= (1u << bits) - 1) return bits;
  }
  return 16;
}

}  // namespace

size_t FrequencySketch::bytes_for(size_t width, uint32_t max_count) {
  const size_t cells = kDepth * width;
  const size_t cells_per_word = 64 / counter_bits(max_count);
  return (cells + cells_per_word - 1) / cells_per_word * sizeof(uint64_t);
}

FrequencySketch::FrequencySketch(size_t width, uint32_t max_count)
    : width_(width),
      bits_(counter_bits(max_count)),
      cells_per_word_log2_(__builtin_ctz(64 / bits_)),
      limit_((1u << bits_) - 1),
      words_(bytes_for(width, max_count) / sizeof(uint64_t), 0) {
  if (width == 0 || (width & (width - 1)) != 0) {
    throw StoreError(ErrorCode::InvalidArgument,
                     "the admission sketch width must be a power of two; got " + std::to_string(width));
  }
  halving_mask_ = 0;
  for (unsigned shift = 0; shift < 64; shift += bits_) halving_mask_ |= uint64_t{limit_ >> 1} << shift;
}

uint32_t FrequencySketch::cell(size_t row, uint64_t id) const {
  return uint32_t(row * width_ + (mix64(id ^ kSeeds[row]) & (width_ - 1)));
}

uint32_t FrequencySketch::increment(uint64_t id, std::vector<uint32_t>& touched) {
  uint32_t count = limit_;
  for (size_t row = 0; row < kDepth; ++row) {
    const uint32_t c = cell(row, id);
    uint32_t counter = get(c);
    if (counter < limit_) {
      set(c, ++counter);
      touched.push_back(c);
    }
    count = std::min(count, counter);
  }
  return count;
}

void FrequencySketch::rollback(const std::vector<uint32_t>& touched) {
  for (const uint32_t c : touched) set(c, get(c) - 1);
}

uint32_t FrequencySketch::estimate(uint64_t id) const {
  uint32_t count = limit_;
  for (size_t row = 0; row < kDepth; ++row) count = std::min(count, get(cell(row, id)));
  return count;
}

void FrequencySketch::note_increments(uint64_t increments) {
  since_aging_ += increments;
  if (since_aging_ < uint64_t{width_} * kAgingFactor) return;
  // Every packed counter shifted right at once; the mask drops the bit each took from its neighbour.
  for (uint64_t& word : words_) word = (word >> 1) & halving_mask_;
  since_aging_ = 0;
}

std::vector<uint16_t> FrequencySketch::counters() const {
  std::vector<uint16_t> out(kDepth * width_);
  for (size_t c = 0; c < out.size(); ++c) out[c] = uint16_t(get(uint32_t(c)));
  return out;
}

void FrequencySketch::restore(const std::vector<uint16_t>& counters, uint64_t since_aging) {
  if (counters.size() != kDepth * width_) {
    throw StoreError(ErrorCode::Corrupt, "admission sketch of " + std::to_string(counters.size()) +
                                             " counters does not match a sketch of width " + std::to_string(width_));
  }
  for (size_t c = 0; c < counters.size(); ++c) set(uint32_t(c), std::min<uint32_t>(counters[c], limit_));
  since_aging_ = since_aging;
}

}  // namespace recdev::store
