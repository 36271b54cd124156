#include "element_type.h"

#include <cmath>

#include "cpu_features.h"
#include "errors.h"
#ifdef RECDEV_STORE_AVX2_KERNELS
#include <immintrin.h>
#endif

namespace recdev::store {

const char* element_type_name(ElementType type) {
  switch (type) {
    case ElementType::Float32: return "float32";
    case ElementType::Float16: return "float16";
    case ElementType::BFloat16: return "bfloat16";
    case ElementType::Float64: return "float64";
    case ElementType::Bytes: return "bytes";
  }
  return "unknown";
}

std::string describe(ElementType type) {
  if (uint8_t(type) > kLastElementType) return "ElementType(" + std::to_string(unsigned(type)) + ")";
  return element_type_name(type);
}

size_t element_bytes(ElementType type) {
  switch (type) {
    case ElementType::Float16:
    case ElementType::BFloat16: return 2;
    case ElementType::Float64: return 8;
    case ElementType::Float32:
    case ElementType::Bytes: return 4;
  }
  return 4;
}

void validate_element_type(uint8_t value) {
  if (value > kLastElementType) {
    throw StoreError(ErrorCode::InvalidArgument,
                     "unknown element type " + std::to_string(unsigned(value)) +
                         "; the types are float32 (0), float16 (1), bfloat16 (2), float64 (3), bytes (4)");
  }
}

uint16_t float_to_half(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint16_t sign = uint16_t((bits >> 16) & 0x8000);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return uint16_t(sign | 0x7E00 | ((magnitude >> 13) & 0x3FF));  // nan
  if (magnitude >= 0x477FF000u) return uint16_t(sign | 0x7C00);  // rounds past the largest half: inf
  if (magnitude < 0x38800000u) {
    // Below the smallest normal half: a subnormal (or zero), rounded to nearest even. The float's
    // value times 2^24 is the half's mantissa; adding 0.5 (as float, exact here) rounds it.
    float scaled;
    const uint32_t m = magnitude;
    std::memcpy(&scaled, &m, sizeof(scaled));
    scaled *= 16777216.0f;  // 2^24, exact
    const uint32_t whole = uint32_t(scaled);
    const float rest = scaled - float(whole);
    uint32_t rounded = whole;
    if (rest > 0.5f || (rest == 0.5f && (whole & 1))) ++rounded;
    return uint16_t(sign | rounded);
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even.
  const uint32_t rebased = magnitude - 0x38000000u;
  const uint32_t rounded = rebased + 0x0FFFu + ((rebased >> 13) & 1);
  return uint16_t(sign | (rounded >> 13));
}

namespace {

#ifdef RECDEV_STORE_AVX2_KERNELS
// The leading count / 8 * 8 halves widened 8 at a time (every AVX2 CPU has F16C; the conversion is
// exact, as half_to_float's); returns how many.
__attribute__((target("avx2,f16c"))) size_t widen_halves_f16c(const uint16_t* src, float* out, size_t count) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
  return i;
}
#endif

}  // namespace

void widen_to_float(ElementType type, const void* src, float* out, size_t count) {
  const auto* halves = static_cast<const uint16_t*>(src);
  switch (type) {
    case ElementType::Float16: {
      size_t i = 0;
#ifdef RECDEV_STORE_AVX2_KERNELS
      if (cpu_has_avx2()) i = widen_halves_f16c(halves, out, count);
#endif
      for (; i < count; ++i) out[i] = half_to_float(halves[i]);
      return;
    }
    case ElementType::BFloat16:
      for (size_t i = 0; i < count; ++i) out[i] = bfloat16_to_float(halves[i]);
      return;
    default: std::memcpy(out, src, count * sizeof(float));
  }
}

void narrow_from_float(ElementType type, const float* src, void* out, size_t count) {
  auto* halves = static_cast<uint16_t*>(out);
  switch (type) {
    case ElementType::Float16:
      for (size_t i = 0; i < count; ++i) halves[i] = float_to_half(src[i]);
      return;
    case ElementType::BFloat16:
      for (size_t i = 0; i < count; ++i) halves[i] = float_to_bfloat16(src[i]);
      return;
    default: std::memcpy(out, src, count * sizeof(float));
  }
}

namespace {

uint64_t mix_bits(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// x rounded to one of its two neighbours in a sign-magnitude 16-bit format (to/from convert with
// round-to-nearest), the farther one with probability |x - nearest| / |other - nearest|, i.e. the
// upper one with probability (x - lower) / (upper - lower).
template <class To, class From>
uint16_t round_stochastic(float x, uint32_t random, To to, From from) {
  const uint16_t nearest = to(x);
  const float near_value = from(nearest);
  if (!std::isfinite(x) || !std::isfinite(near_value) || near_value == x) return nearest;
  // One step from nearest towards x, in magnitude (the sign bit stays: a half rounding to +-0 has
  // the sign of x, and then x is farther from zero).
  const bool away = std::fabs(x) > std::fabs(near_value);
  const uint16_t other = away ? uint16_t(nearest + 1) : uint16_t(nearest - 1);
  const float other_value = from(other);
  if (!std::isfinite(other_value)) return nearest;
  const double p = (double(x) - double(near_value)) / (double(other_value) - double(near_value));
  // random / 2^32 is uniform in [0, 1).
  return double(random) * 0x1p-32 < p ? other : nearest;
}

}  // namespace

void narrow_stochastic(ElementType type, const float* src, void* out, size_t count, uint64_t key) {
  auto* halves = static_cast<uint16_t*>(out);
  uint64_t bits = 0;
  for (size_t i = 0; i < count; ++i) {
    if (i % 2 == 0) bits = mix_bits(key ^ mix_bits(i / 2));
    const uint32_t random = i % 2 == 0 ? uint32_t(bits) : uint32_t(bits >> 32);
    switch (type) {
      case ElementType::Float16: halves[i] = round_stochastic(src[i], random, float_to_half, half_to_float); break;
      case ElementType::BFloat16:
        halves[i] = round_stochastic(src[i], random, float_to_bfloat16, bfloat16_to_float);
        break;
      default:
        throw StoreError(ErrorCode::InvalidArgument, std::string("stochastic rounding into ") +
                                                         element_type_name(type) + " elements: only float16 and bfloat16");
    }
  }
}

void store_init_values(ElementType type, const float* src, void* out, size_t count) {
  switch (type) {
    case ElementType::Float64: {
      auto* doubles = static_cast<double*>(out);
      for (size_t i = 0; i < count; ++i) {
        const double value = src[i];
        std::memcpy(doubles + i, &value, sizeof(value));
      }
      return;
    }
    case ElementType::Bytes: std::memset(out, 0, count * 4); return;
    default: narrow_from_float(type, src, out, count);
  }
}

}  // namespace recdev::store
