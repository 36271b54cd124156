// Philox4x32-10, the counter-based random number generator of Salmon et al., "Parallel Random
// Numbers: As Easy as 1, 2, 3" (SC'11) — the generator behind curand's and PyTorch's CUDA RNG.
//
// A counter-based generator is a pure function (counter, key) -> 4 random words: there is no state
// to advance, so any element of any row can be generated directly, in any order, on any thread or
// shard, and always comes out the same. That is what lets a row's initial value be computed lazily.
// Verified against the Random123 known-answer vectors (test/store/test_init_rules.py).
#pragma once

#include <array>
#include <cstdint>

namespace recdev::store {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

constexpr int kPhiloxRounds = 10;
constexpr uint32_t kPhiloxMultiplier0 = 0xD2511F53u;
constexpr uint32_t kPhiloxMultiplier1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxWeyl0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kPhiloxWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1

inline PhiloxCounter philox4x32_10(PhiloxCounter ctr, PhiloxKey key) {
  for (int round = 0; round < kPhiloxRounds; ++round) {
    const uint64_t product0 = uint64_t{kPhiloxMultiplier0} * ctr[0];
    const uint64_t product1 = uint64_t{kPhiloxMultiplier1} * ctr[2];
    ctr = {uint32_t(product1 >> 32) ^ ctr[1] ^ key[0], uint32_t(product1), uint32_t(product0 >> 32) ^ ctr[3] ^ key[1],
           uint32_t(product0)};
    key[0] += kPhiloxWeyl0;
    key[1] += kPhiloxWeyl1;
  }
  return ctr;
}

}  // namespace recdev::store
