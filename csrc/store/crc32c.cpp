#include "crc32c.h"

#include <array>
#include <cstring>

#include "cpu_features.h"

namespace recdev::store {
namespace {

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t byte = 0; byte < 256; ++byte) {
    uint32_t crc = byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    table[byte] = crc;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kTable = make_table();

// The register of the CRC (no inversion at either end) after `size` more bytes: the unit every
// version below works in, and in which the CRC is linear.
uint32_t crc32c_register_portable(uint32_t reg, const uint8_t* bytes, size_t size) {
  for (; size > 0; --size, ++bytes) reg = (reg >> 8) ^ kTable[(reg ^ *bytes) & 0xFF];
  return reg;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// The `crc32` instruction takes 3 cycles and a new one can start every cycle, so one chain of them
// runs at a third of the instruction's throughput. Three chains over three neighbouring blocks run at
// all of it; the blocks' registers are then joined with kShift, which advances a register over a
// block of zeros (the CRC is linear: the register after A then B is A's advanced over |B| zero bytes,
// xor B's from zero). Three blocks of 8 KiB stay in L1.
constexpr size_t kStreamBlock = 8 << 10;

// kShift[k][b]: the register b << 8k advanced over kStreamBlock zero bytes. Built once from the 32
// single-bit registers, by linearity.
struct ShiftTable {
  std::array<std::array<uint32_t, 256>, 4> by_byte{};
  ShiftTable() {
    static const std::array<uint8_t, kStreamBlock> zeros{};
    std::array<uint32_t, 32> by_bit{};
    for (int bit = 0; bit < 32; ++bit) {
      by_bit[bit] = crc32c_register_portable(uint32_t{1} << bit, zeros.data(), zeros.size());
    }
    for (int k = 0; k < 4; ++k) {
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t shifted = 0;
        for (int bit = 0; bit < 8; ++bit) {
          if (b & (1u << bit)) shifted ^= by_bit[8 * k + bit];
        }
        by_byte[k][b] = shifted;
      }
    }
  }
  uint32_t advance(uint32_t reg) const {
    return by_byte[0][reg & 0xFF] ^ by_byte[1][(reg >> 8) & 0xFF] ^ by_byte[2][(reg >> 16) & 0xFF] ^
           by_byte[3][reg >> 24];
  }
};

uint64_t load_word(const uint8_t* bytes) {
  uint64_t word;
  std::memcpy(&word, bytes, 8);
  return word;
}

__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(uint32_t crc, const void* data, size_t size) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  uint64_t reg = ~crc;
  if (size >= 3 * kStreamBlock) {
    static const ShiftTable shift;
    for (; size >= 3 * kStreamBlock; size -= 3 * kStreamBlock, bytes += 3 * kStreamBlock) {
      uint64_t second = 0, third = 0;
      for (size_t at = 0; at < kStreamBlock; at += 8) {
        reg = __builtin_ia32_crc32di(reg, load_word(bytes + at));
        second = __builtin_ia32_crc32di(second, load_word(bytes + kStreamBlock + at));
        third = __builtin_ia32_crc32di(third, load_word(bytes + 2 * kStreamBlock + at));
      }
      reg = shift.advance(shift.advance(uint32_t(reg)) ^ uint32_t(second)) ^ uint32_t(third);
    }
  }
  for (; size >= 8; size -= 8, bytes += 8) reg = __builtin_ia32_crc32di(reg, load_word(bytes));
  auto reg32 = uint32_t(reg);
  for (; size > 0; --size, ++bytes) reg32 = __builtin_ia32_crc32qi(reg32, *bytes);
  return ~reg32;
}

bool cpu_has_sse42() {
  static const bool has = capability_ceiling() != CapabilityCeiling::Baseline && __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t crc32c_update_portable(uint32_t crc, const void* data, size_t size) {
  return ~crc32c_register_portable(~crc, static_cast<const uint8_t*>(data), size);
}

uint32_t crc32c_update(uint32_t crc, const void* data, size_t size) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (cpu_has_sse42()) return crc32c_sse42(crc, data, size);
#endif
  return crc32c_update_portable(crc, data, size);
}

}  // namespace recdev::store
