#include "frequency_sketch.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "errors.h"
#include "mix64.h"

namespace recdev::store {

FrequencySketch::FrequencySketch(size_t width) : width_(width), counters_(kDepth * width, 0) {
  if (width == 0 || (width & (width - 1)) != 0) {
    throw StoreError(ErrorCode::InvalidArgument,
                     "the admission sketch width must be a power of two; got " + std::to_string(width));
  }
}

uint32_t FrequencySketch::cell(size_t row, uint64_t id) const {
  return uint32_t(row * width_ + (mix64(id ^ kSeeds[row]) & (width_ - 1)));
}

uint32_t FrequencySketch::increment(uint64_t id, std::vector<uint32_t>& touched) {
  uint32_t count = std::numeric_limits<uint16_t>::max();
  for (size_t row = 0; row < kDepth; ++row) {
    const uint32_t c = cell(row, id);
    if (counters_[c] < std::numeric_limits<uint16_t>::max()) {
      ++counters_[c];
      touched.push_back(c);
    }
    count = std::min<uint32_t>(count, counters_[c]);
  }
  return count;
}

void FrequencySketch::rollback(const std::vector<uint32_t>& touched) {
  for (const uint32_t c : touched) --counters_[c];
}

uint32_t FrequencySketch::estimate(uint64_t id) const {
  uint32_t count = std::numeric_limits<uint16_t>::max();
  for (size_t row = 0; row < kDepth; ++row) count = std::min<uint32_t>(count, counters_[cell(row, id)]);
  return count;
}

void FrequencySketch::note_increments(uint64_t increments) {
  since_aging_ += increments;
  if (since_aging_ < uint64_t{width_} * kAgingFactor) return;
  for (uint16_t& counter : counters_) counter = uint16_t(counter >> 1);
  since_aging_ = 0;
}

void FrequencySketch::restore(std::vector<uint16_t> counters, uint64_t since_aging) {
  if (counters.size() != counters_.size()) {
    throw StoreError(ErrorCode::Corrupt, "admission sketch of " + std::to_string(counters.size()) +
                                             " counters does not match a sketch of width " + std::to_string(width_));
  }
  counters_ = std::move(counters);
  since_aging_ = since_aging;
}

}  // namespace recdev::store
