// ElementType: what the weight bytes of a table's rows are. A table's type is part of its identity
// everywhere (kernels, wire, checkpoints): the store never reads a row's bytes as another type.
//
// The store sizes rows in 4-byte words (TableConfig::dim): a row of dim words holds
// dim * 4 / element_bytes(type) elements. The arithmetic the store does on rows (init values,
// fused optimizers) runs in a compute type: float32 for Float32, Float16 and BFloat16 tables,
// float64 for Float64. Half-precision rows are widened exactly, updated in float32 with float32
// optimizer state, and rounded once per step (to nearest even, as fbgemm and PyTorch's own
// conversions do). Bytes tables (any other torch dtype, e.g. integers) are held and copied as bytes
// only: no arithmetic, so no optimizer, no pooling in the store, and zero init only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace recdev::store {

// Numeric values are stored in checkpoints and sent on the wire: never renumber, only append.
enum class ElementType : uint8_t { Float32 = 0, Float16 = 1, BFloat16 = 2, Float64 = 3, Bytes = 4 };

constexpr uint8_t kLastElementType = uint8_t(ElementType::Bytes);

// "float32", "float16", "bfloat16", "float64", "bytes".
const char* element_type_name(ElementType type);
// 4, 2, 2, 8, and 4 for Bytes (such rows are sized in whole words).
size_t element_bytes(ElementType type);
// Whether the store can compute on rows of this type (init values other than zero, optimizers).
inline bool is_numeric(ElementType type) { return type != ElementType::Bytes; }
// Whether the store pools rows of this type and takes their bag gradients (float32 arithmetic):
// Float32, Float16, BFloat16.
inline bool computes_in_float32(ElementType type) {
  return type == ElementType::Float32 || type == ElementType::Float16 || type == ElementType::BFloat16;
}
// The compute type's size: 8 for Float64, else 4.
inline size_t compute_bytes(ElementType type) { return type == ElementType::Float64 ? 8 : 4; }

// Throws StoreError(InvalidArgument) unless the value names an ElementType.
void validate_element_type(uint8_t value);

// A readable name, or "ElementType(n)" for an unknown value.
std::string describe(ElementType type);

// Scalar conversions, exact one way, rounded to nearest even the other; nan stays nan, inf stays inf.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1F;
  uint32_t mantissa = h & 0x3FF;
  uint32_t bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalized
    uint32_t e = 113;
    while ((mantissa & 0x400) == 0) {
      mantissa <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((mantissa & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t float_to_half(float f);

inline float bfloat16_to_float(uint16_t b) {
  const uint32_t bits = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint16_t float_to_bfloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((bits >> 16) | 0x0040);  // quiet nan
  bits += 0x7FFFu + ((bits >> 16) & 1);
  return uint16_t(bits >> 16);
}

// count elements of `type` at src widened to float32 (Float32, Float16, BFloat16).
void widen_to_float(ElementType type, const void* src, float* out, size_t count);
// count float32 values rounded into elements of `type` at out (Float32, Float16, BFloat16).
void narrow_from_float(ElementType type, const float* src, void* out, size_t count);
// count float32 values replaced by their value rounded into `type` (Float16, BFloat16; Float32
// leaves them): what a float32 value becomes when it is sent as an element of `type` and widened.
void round_through(ElementType type, float* values, size_t count);
// count float32 values replaced by their value rounded to bfloat16 with ties away from zero (nan
// stays nan): how fbgemm, and so CPU's embedding_bag, rounds pooled bfloat16 sums. Sums of a few
// bfloat16 rows meet ties often, so to nearest even they would differ from CPU's.
void round_through_bfloat16_ties_away(float* values, size_t count);
// count float32 values rounded stochastically into elements of `type` at out (Float16, BFloat16):
// each value becomes the upper of the two values of `type` around it with probability
// (x - lower) / (upper - lower), else the lower (values exactly representable, non-finite, or past
// the largest finite value round as narrow_from_float does). Element d's 32 random bits come from
// (key, d) alone.
void narrow_stochastic(ElementType type, const float* src, void* out, size_t count, uint64_t key);
// count float32 init values into elements of `type` at out: rounded for half types, widened exactly
// for Float64; Bytes tables start at zero only (validated with their init rule), so zeros.
void store_init_values(ElementType type, const float* src, void* out, size_t count);

}  // namespace recdev::store
