#include "element_type.h"

#include <algorithm>
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
// The AVX2 conversions below each do the leading count / 8 * 8 elements, 8 at a time, with the
// scalar conversions' results bit for bit (every AVX2 CPU has F16C: its widening is exact, and its
// narrowing rounds to nearest even, keeping a nan's sign and upper payload bits with the quiet bit
// set, as float_to_half does), and return how many they did. Updates of half rows convert every
// row twice, and pooling widens every row: one conversion at a time, that was most of their time.
using Words8 = uint32_t __attribute__((vector_size(32)));
using Halves8 = uint16_t __attribute__((vector_size(16)));

__attribute__((target("avx2,f16c"))) size_t widen_halves_f16c(const uint16_t* src, float* out, size_t count) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
  return i;
}

__attribute__((target("avx2,f16c"))) size_t narrow_halves_f16c(const float* src, uint16_t* out, size_t count) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  return i;
}

__attribute__((target("avx2"))) size_t widen_bfloat16s_avx2(const uint16_t* src, float* out, size_t count) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    Halves8 halves;
    std::memcpy(&halves, src + i, sizeof(halves));
    const Words8 bits = __builtin_convertvector(halves, Words8) << 16;
    std::memcpy(out + i, &bits, sizeof(bits));
  }
  return i;
}

// float_to_bfloat16, 8 lanes at a time.
__attribute__((target("avx2"))) size_t narrow_bfloat16s_avx2(const float* src, uint16_t* out, size_t count) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    Words8 bits;
    std::memcpy(&bits, src + i, sizeof(bits));
    const Words8 nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
    const Words8 rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    const Words8 quiet = (bits >> 16) | 0x0040u;
    const Halves8 halves = __builtin_convertvector((nan & quiet) | (~nan & rounded), Halves8);
    std::memcpy(out + i, &halves, sizeof(halves));
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
      if (cpu_has_avx2_f16c()) i = widen_halves_f16c(halves, out, count);
#endif
      for (; i < count; ++i) out[i] = half_to_float(halves[i]);
      return;
    }
    case ElementType::BFloat16: {
      size_t i = 0;
#ifdef RECDEV_STORE_AVX2_KERNELS
      if (cpu_has_avx2()) i = widen_bfloat16s_avx2(halves, out, count);
#endif
      for (; i < count; ++i) out[i] = bfloat16_to_float(halves[i]);
      return;
    }
    default: std::memcpy(out, src, count * sizeof(float));
  }
}

void narrow_from_float(ElementType type, const float* src, void* out, size_t count) {
  auto* halves = static_cast<uint16_t*>(out);
  switch (type) {
    case ElementType::Float16: {
      size_t i = 0;
#ifdef RECDEV_STORE_AVX2_KERNELS
      if (cpu_has_avx2_f16c()) i = narrow_halves_f16c(src, halves, count);
#endif
      for (; i < count; ++i) halves[i] = float_to_half(src[i]);
      return;
    }
    case ElementType::BFloat16: {
      size_t i = 0;
#ifdef RECDEV_STORE_AVX2_KERNELS
      if (cpu_has_avx2()) i = narrow_bfloat16s_avx2(src, halves, count);
#endif
      for (; i < count; ++i) halves[i] = float_to_bfloat16(src[i]);
      return;
    }
    default: std::memcpy(out, src, count * sizeof(float));
  }
}

void round_through(ElementType type, float* values, size_t count) {
  if (type == ElementType::Float32) return;
  // A block at a time, so that the narrowed copy stays in L1.
  constexpr size_t kBlock = 2048;
  uint16_t narrowed[kBlock];
  for (size_t begin = 0; begin < count; begin += kBlock) {
    const size_t n = std::min(kBlock, count - begin);
    narrow_from_float(type, values + begin, narrowed, n);
    widen_to_float(type, narrowed, values + begin, n);
  }
}

void round_through_bfloat16_ties_away(float* values, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &values[i], sizeof(bits));
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) continue;  // nan
    bits = (bits + 0x8000u) & 0xFFFF0000u;
    std::memcpy(&values[i], &bits, sizeof(bits));
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
                                                         element_type_name(type) +
                                                         " elements: only float16 and bfloat16");
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
