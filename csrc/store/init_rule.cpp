#include "init_rule.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu_features.h"
#include "errors.h"
#include "mix64.h"
#include "philox.h"

#ifdef RECDEV_STORE_AVX2_KERNELS
#include <immintrin.h>
#endif

namespace recdev::store {
namespace {

constexpr double kTwoPi = 6.283185307179586476925286766559;
constexpr double kInvTwoPow32 = 1.0 / 4294967296.0;
constexpr double kInvTwoPow24 = 1.0 / 16777216.0;

// The Philox key is the seed with the table id mixed in, so two tables with the same rule draw
// independent streams; the counter is (element block, 0, row id). Element e of a row comes from
// word e % 4 of block e / 4 (Uniform) or from the Box-Muller pair that word belongs to (Normal).
PhiloxKey philox_key(uint64_t seed, uint64_t table_id) {
  const uint64_t key = seed ^ mix64(table_id);
  return {uint32_t(key), uint32_t(key >> 32)};
}

PhiloxCounter philox_counter(uint32_t block, uint64_t row_id) {
  return {block, 0u, uint32_t(row_id), uint32_t(row_id >> 32)};
}

// Normal: Box-Muller in double precision, rounded to float at the end. Element e of a row comes
// from the pair of Philox words (w1, w2) = words 2p and 2p + 1 of block e / 4, p = (e % 4) / 2:
//
//   u1 = (w1 + 1) / 2^32 in (0, 1],  u2 = w2 / 2^32 in [0, 1)
//   radius = sqrt(-2 log(u1)),  angle = 2 pi u2
//   element = float(mean + std * radius * cos(angle))   for even e
//             float(mean + std * radius * sin(angle))   for odd e
//
// with the C library's log, cos and sin. Doing it in double means the floats do not depend on the
// last-ulp behaviour of the platform's log/cos/sin.
struct BoxMullerPair {
  double radius;
  double angle;
};

BoxMullerPair box_muller_pair(uint32_t word1, uint32_t word2) {
  const double u1 = (double(word1) + 1.0) * kInvTwoPow32;  // (0, 1]: log is finite
  const double u2 = double(word2) * kInvTwoPow32;          // [0, 1)
  return {std::sqrt(-2.0 * std::log(u1)), kTwoPi * u2};
}

// Never inlined: the vector kernel below calls it for its fixups, and compiled there, with FMA
// enabled, mean + std * radius * trig would be fused into an fma, which rounds differently.
[[gnu::noinline]] float box_muller_element(double mean, double std, const BoxMullerPair& pair, bool sine) {
  return float(mean + std * pair.radius * (sine ? std::sin(pair.angle) : std::cos(pair.angle)));
}

void fill_normal_reference(double mean, double std, PhiloxKey key, uint64_t row_id, uint32_t dim, float* out) {
  for (uint32_t first = 0, block = 0; first < dim; first += 4, ++block) {
    const PhiloxCounter words = philox4x32_10(philox_counter(block, row_id), key);
    for (uint32_t e = first; e < first + 4 && e < dim; e += 2) {
      const BoxMullerPair pair = box_muller_pair(words[e - first], words[e - first + 1]);
      out[e] = box_muller_element(mean, std, pair, false);
      if (e + 1 < dim) out[e + 1] = box_muller_element(mean, std, pair, true);
    }
  }
}

#ifdef RECDEV_STORE_AVX2_KERNELS
// The library calls take most of the time of materializing a row, so where AVX2 and FMA are
// available, fill_normal computes 16 elements at a time with its own vectorized log, sin and cos,
// and still gives the reference's floats, exactly:
//
//  - Its log and sin/cos are within 2^-50 of the library's (relative for log, absolute for sin/cos)
//    over every possible word, with the same signs and the same zeros — checked exhaustively against
//    glibc over all 2^32 words each. (Most of that is the reference rounding 2 pi u2 to double; the
//    library functions themselves are within an ulp of exact.)
//  - So the value it computes in double is within a known bound of the reference's value, and when
//    the whole interval value +- bound rounds to a single float, that float is the reference's.
//  - When the interval straddles a rounding boundary (about once in 10^5 elements), or the value is
//    not finite, that element is recomputed the reference way.

// sin and cos of 2 pi k / 256, k in [0, 256], computed as the reference computes the angle.
struct TurnTable {
  std::array<double, 257> sin;
  std::array<double, 257> cos;
  TurnTable() {
    for (uint32_t k = 0; k <= 256; ++k) {
      const double angle = kTwoPi * (double(uint64_t{k} << 24) * kInvTwoPow32);
      sin[k] = std::sin(angle);
      cos[k] = std::cos(angle);
    }
  }
};

// Four small integers (|i| < 2^51, one per 64-bit lane) as doubles: AVX2 has no such conversion, but
// adding i to the bits of 1.5 * 2^52 puts it in the low mantissa bits.
RECDEV_STORE_AVX2_FMA __m256d small_ints_to_double(__m256i i) {
  const __m256i magic_bits = _mm256_set1_epi64x(0x4338000000000000);
  return _mm256_sub_pd(_mm256_castsi256_pd(_mm256_add_epi64(i, magic_bits)), _mm256_set1_pd(0x1.8p52));
}

// c[0] + c[1] v + c[2] v^2 + ... by Horner's rule.
template <size_t N>
RECDEV_STORE_AVX2_FMA __m256d polynomial(__m256d v, const std::array<double, N>& c) {
  __m256d sum = _mm256_set1_pd(c[N - 1]);
  for (size_t i = N - 1; i-- > 0;) sum = _mm256_fmadd_pd(sum, v, _mm256_set1_pd(c[i]));
  return sum;
}

// Philox4x32-10's round keys of one row's key, broadcast: the same for every block of the row, so
// computed once per row rather than once per four blocks.
struct PhiloxRoundKeys {
  __m256i key0[kPhiloxRounds];
  __m256i key1[kPhiloxRounds];
};

RECDEV_STORE_AVX2_FMA PhiloxRoundKeys philox_round_keys(PhiloxKey key) {
  PhiloxRoundKeys keys;
  for (int round = 0; round < kPhiloxRounds; ++round) {
    keys.key0[round] = _mm256_set1_epi64x(key[0]);
    keys.key1[round] = _mm256_set1_epi64x(key[1]);
    key[0] += kPhiloxWeyl0;
    key[1] += kPhiloxWeyl1;
  }
  return keys;
}

// Philox4x32-10 of blocks first_block .. first_block + 3 of a row: words[j] holds word j of the four
// blocks, one block per 64-bit lane, so that one _mm256_mul_epu32 makes four 32 x 32 -> 64-bit
// products. _mm256_mul_epu32 reads only the low half of each lane, so the rounds leave garbage in the
// high halves and one mask at the end clears it.
[[gnu::always_inline]] inline RECDEV_STORE_AVX2_FMA void philox_4_blocks(uint32_t first_block, uint64_t row_id,
                                                                         const PhiloxRoundKeys& keys,
                                                                         __m256i words[4]) {
  const __m256i multiplier0 = _mm256_set1_epi64x(kPhiloxMultiplier0);
  const __m256i multiplier1 = _mm256_set1_epi64x(kPhiloxMultiplier1);
  __m256i c0 = _mm256_add_epi64(_mm256_set1_epi64x(first_block), _mm256_setr_epi64x(0, 1, 2, 3));
  __m256i c1 = _mm256_setzero_si256();
  __m256i c2 = _mm256_set1_epi64x(uint32_t(row_id));
  __m256i c3 = _mm256_set1_epi64x(uint32_t(row_id >> 32));
  for (int round = 0; round < kPhiloxRounds; ++round) {
    const __m256i product0 = _mm256_mul_epu32(multiplier0, c0);
    const __m256i product1 = _mm256_mul_epu32(multiplier1, c2);
    c0 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(product1, 32), c1), keys.key0[round]);
    c1 = product1;
    c2 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(product0, 32), c3), keys.key1[round]);
    c3 = product0;
  }
  const __m256i low_half = _mm256_set1_epi64x(0xFFFFFFFF);
  words[0] = _mm256_and_si256(c0, low_half);
  words[1] = _mm256_and_si256(c1, low_half);
  words[2] = _mm256_and_si256(c2, low_half);
  words[3] = _mm256_and_si256(c3, low_half);
}

// log(u1) for u1 = (word + 1) / 2^32, 4 lanes: fdlibm's e_log.c (x = 2^k m with m in [sqrt(1/2),
// sqrt(2)), log(m) = log(1 + f) = 2 atanh(f / (2 + f))) without its special cases, which these
// inputs cannot reach.
RECDEV_STORE_AVX2_FMA __m256d log_of_unit(__m256i word) {
  const __m256i mantissa_bits = _mm256_set1_epi64x((int64_t{1} << 52) - 1);
  const __m256i one_bits = _mm256_set1_epi64x(0x3FF0000000000000);  // the exponent field of 1.0
  const __m256d two_pow_52 = _mm256_set1_pd(0x1p52);
  // word + 1 <= 2^32, exact in the low bits of 2^52's mantissa; scaling by 2^-32 is exact.
  const __m256i n = _mm256_add_epi64(word, _mm256_set1_epi64x(1));
  const __m256d x =
      _mm256_mul_pd(_mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(n, _mm256_castpd_si256(two_pow_52))), two_pow_52),
                    _mm256_set1_pd(kInvTwoPow32));
  const __m256i bits = _mm256_castpd_si256(x);
  const __m256i mantissa = _mm256_and_si256(bits, mantissa_bits);
  // 1 where the mantissa is sqrt(2)'s or more: m is then taken in [sqrt(1/2), 1), k one higher.
  const __m256i halve = _mm256_srli_epi64(_mm256_cmpgt_epi64(mantissa, _mm256_set1_epi64x(0x6A09E667F3BCC)), 63);
  const __m256i exponent_of_m = _mm256_sub_epi64(one_bits, _mm256_slli_epi64(halve, 52));
  const __m256d m = _mm256_castsi256_pd(_mm256_or_si256(mantissa, exponent_of_m));
  const __m256d k = small_ints_to_double(
      _mm256_sub_epi64(_mm256_add_epi64(_mm256_srli_epi64(bits, 52), halve), _mm256_set1_epi64x(1023)));

  const __m256d f = _mm256_sub_pd(m, _mm256_set1_pd(1.0));
  const __m256d s = _mm256_div_pd(f, _mm256_add_pd(_mm256_set1_pd(2.0), f));
  const __m256d z = _mm256_mul_pd(s, s);
  const __m256d w = _mm256_mul_pd(z, z);
  // fdlibm's Lg1 .. Lg7: log(1 + f) = f - f^2/2 + s (f^2/2 + z (Lg1 + Lg3 w + ...) + w (Lg2 + ...)).
  constexpr std::array<double, 4> kOdd = {6.666666666666735130e-01, 2.857142874366239149e-01, 1.818357216161805012e-01,
                                          1.479819860511658591e-01};
  constexpr std::array<double, 3> kEven = {3.999999999940941908e-01, 2.222219843214978396e-01,
                                           1.531383769920937332e-01};
  const __m256d odd = _mm256_mul_pd(z, polynomial(w, kOdd));
  const __m256d even = _mm256_mul_pd(w, polynomial(w, kEven));
  const __m256d r = _mm256_add_pd(odd, even);
  const __m256d half_f_squared = _mm256_mul_pd(_mm256_set1_pd(0.5), _mm256_mul_pd(f, f));
  const __m256d ln2_hi = _mm256_set1_pd(6.93147180369123816490e-01);  // k * ln2_hi is exact
  const __m256d ln2_lo = _mm256_set1_pd(1.90821492927058770002e-10);
  // k ln2_hi - ((f^2/2 - (s (f^2/2 + r) + k ln2_lo)) - f)
  const __m256d tail = _mm256_fmadd_pd(s, _mm256_add_pd(half_f_squared, r), _mm256_mul_pd(k, ln2_lo));
  return _mm256_fmsub_pd(k, ln2_hi, _mm256_sub_pd(_mm256_sub_pd(half_f_squared, tail), f));
}

// sin and cos of word / 2^32 turns, 4 lanes: the nearest 1/256 turn a from the table, the rest
// x (|x| <= pi / 256) by Taylor polynomials whose first omitted terms are below 2^-64, then
// sin(a + x) and cos(a + x).
RECDEV_STORE_AVX2_FMA void sincos_of_turns(const TurnTable& table, __m256i word, __m256d& sine, __m256d& cosine) {
  const __m256i rounded = _mm256_add_epi64(word, _mm256_set1_epi64x(1 << 23));
  const __m256i k = _mm256_srli_epi64(rounded, 24);  // in [0, 256]
  const __m256i offset = _mm256_sub_epi64(_mm256_and_si256(rounded, _mm256_set1_epi64x((1 << 24) - 1)),
                                          _mm256_set1_epi64x(1 << 23));  // in [-2^23, 2^23)
  const __m256d x = _mm256_mul_pd(small_ints_to_double(offset), _mm256_set1_pd(kTwoPi * kInvTwoPow32));
  const __m256d x2 = _mm256_mul_pd(x, x);
  constexpr std::array<double, 3> kSin = {-1.0 / 6, 1.0 / 120, -1.0 / 5040};  // sin x = x + x^3 (...)
  constexpr std::array<double, 4> kCos = {1.0, -1.0 / 2, 1.0 / 24, -1.0 / 720};
  const __m256d sin_x = _mm256_fmadd_pd(_mm256_mul_pd(x, x2), polynomial(x2, kSin), x);
  const __m256d cos_x = polynomial(x2, kCos);
  const __m256d sin_a = _mm256_i64gather_pd(table.sin.data(), k, 8);
  const __m256d cos_a = _mm256_i64gather_pd(table.cos.data(), k, 8);
  sine = _mm256_fmadd_pd(sin_a, cos_x, _mm256_mul_pd(cos_a, sin_x));
  cosine = _mm256_fmsub_pd(cos_a, cos_x, _mm256_mul_pd(sin_a, sin_x));
}

// float(mean + scale * trig) in each lane, and a 4-bit mask of the lanes where that is certainly the
// reference's float (see above).
RECDEV_STORE_AVX2_FMA __m128 round_to_float(__m256d mean, __m256d scale, __m256d trig, int& certain) {
  // The value's distance from the reference's, with a wide margin: the radius and trig differences
  // (below 2^-49 relative to scale), the double roundings (2^-52 of each operand, and 2^-1074 each
  // where they underflow), and the reference's rounding of its last product to a zero of either
  // sign, which the floor makes the interval around a zero value straddle. The floor is 2^-200, not
  // a subnormal just above those 2^-1074s: a subnormal operand makes every fma here a microcode
  // assist on Intel cores (56% of this kernel's time), and any floor far below float's 2^-149 only
  // sends values within it of a rounding boundary (around zero) to the fixups.
  const __m256d scale_error = _mm256_set1_pd(0x1p-44);
  const __m256d value_error = _mm256_set1_pd(0x1p-50);
  const __m256d underflow_error = _mm256_set1_pd(0x1p-200);
  const __m256d sign_bit = _mm256_set1_pd(-0.0);
  const __m256d value = _mm256_fmadd_pd(scale, trig, mean);
  const __m256d bound =
      _mm256_fmadd_pd(_mm256_andnot_pd(sign_bit, scale), scale_error,
                      _mm256_fmadd_pd(_mm256_andnot_pd(sign_bit, value), value_error, underflow_error));
  const __m128 low = _mm256_cvtpd_ps(_mm256_sub_pd(value, bound));
  const __m128 high = _mm256_cvtpd_ps(_mm256_add_pd(value, bound));
  // Equal as floats (which fails for a nan) and as bits (which fails for -0 and +0).
  const __m128 same = _mm_and_ps(_mm_cmpeq_ps(low, high),
                                 _mm_castsi128_ps(_mm_cmpeq_epi32(_mm_castps_si128(low), _mm_castps_si128(high))));
  certain = _mm_movemask_ps(same);
  return low;
}

// Elements [first, first + 16) of a row, i.e. blocks first / 4 .. first / 4 + 3, into out[0, 16).
RECDEV_STORE_AVX2_FMA void normal_16(const TurnTable& table, double mean, double std, const PhiloxRoundKeys& keys,
                                     uint64_t row_id, uint32_t first, float* out) {
  __m256i words[4];
  philox_4_blocks(first / 4, row_id, keys, words);
  // Pair 0 of each block is (word 0, word 1), pair 1 (word 2, word 3).
  __m128 lanes[4];  // cos and sin of pair 0, cos and sin of pair 1: element j of each block in lanes[j]
  int certain[4];
  for (int pair = 0; pair < 2; ++pair) {
    const __m256d radius = _mm256_sqrt_pd(_mm256_mul_pd(_mm256_set1_pd(-2.0), log_of_unit(words[2 * pair])));
    const __m256d scale = _mm256_mul_pd(_mm256_set1_pd(std), radius);
    __m256d sine;
    __m256d cosine;
    sincos_of_turns(table, words[2 * pair + 1], sine, cosine);
    lanes[2 * pair] = round_to_float(_mm256_set1_pd(mean), scale, cosine, certain[2 * pair]);
    lanes[2 * pair + 1] = round_to_float(_mm256_set1_pd(mean), scale, sine, certain[2 * pair + 1]);
  }
  _MM_TRANSPOSE4_PS(lanes[0], lanes[1], lanes[2], lanes[3]);  // now block b's elements in lanes[b]
  for (int block = 0; block < 4; ++block) _mm_storeu_ps(out + 4 * block, lanes[block]);
  if ((certain[0] & certain[1] & certain[2] & certain[3]) == 0xF) return;
  alignas(32) uint64_t word[4][4];
  for (int j = 0; j < 4; ++j) _mm256_store_si256(reinterpret_cast<__m256i*>(word[j]), words[j]);
  for (int j = 0; j < 4; ++j) {
    for (int block = 0; block < 4; ++block) {
      if (certain[j] & (1 << block)) continue;
      const int pair = j / 2;
      out[4 * block + j] = box_muller_element(
          mean, std, box_muller_pair(uint32_t(word[2 * pair][block]), uint32_t(word[2 * pair + 1][block])), j % 2 == 1);
    }
  }
}

RECDEV_STORE_AVX2_FMA void fill_normal_avx2(double mean, double std, PhiloxKey key, uint64_t row_id, uint32_t dim,
                                            float* out) {
  static const TurnTable table;
  const PhiloxRoundKeys keys = philox_round_keys(key);
  uint32_t first = 0;
  for (; first + 16 <= dim; first += 16) normal_16(table, mean, std, keys, row_id, first, out + first);
  if (first < dim) {
    float tail[16];
    normal_16(table, mean, std, keys, row_id, first, tail);
    std::memcpy(out + first, tail, (dim - first) * sizeof(float));
  }
}

// The compiler may not fuse a multiply into the add that uses `product`: an fma rounds once where the
// reference rounds twice.
RECDEV_STORE_AVX2_FMA __m256d rounded_product(__m256d product) {
  asm("" : "+x"(product));
  return product;
}

// Elements [first, first + 16) of a Uniform row into out[0, 16): fill_uniform_reference's floats, 16 at
// a time.
RECDEV_STORE_AVX2_FMA void uniform_16(double lower, double width, float upper, float below_upper,
                                      const PhiloxRoundKeys& keys, uint64_t row_id, uint32_t first, float* out) {
  __m256i words[4];
  philox_4_blocks(first / 4, row_id, keys, words);
  __m128 lanes[4];  // element j of each block in lanes[j]
  for (int j = 0; j < 4; ++j) {
    const __m256d unit =
        _mm256_mul_pd(small_ints_to_double(_mm256_srli_epi64(words[j], 8)), _mm256_set1_pd(kInvTwoPow24));
    const __m256d offset = rounded_product(_mm256_mul_pd(_mm256_set1_pd(width), unit));
    const __m128 value = _mm256_cvtpd_ps(_mm256_add_pd(_mm256_set1_pd(lower), offset));
    lanes[j] = _mm_blendv_ps(value, _mm_set1_ps(below_upper), _mm_cmpge_ps(value, _mm_set1_ps(upper)));
  }
  _MM_TRANSPOSE4_PS(lanes[0], lanes[1], lanes[2], lanes[3]);  // now block b's elements in lanes[b]
  for (int block = 0; block < 4; ++block) _mm_storeu_ps(out + 4 * block, lanes[block]);
}

RECDEV_STORE_AVX2_FMA void fill_uniform_avx2(double lower, double upper, float upper_f, float below_upper,
                                             PhiloxKey key, uint64_t row_id, uint32_t dim, float* out) {
  const PhiloxRoundKeys keys = philox_round_keys(key);
  const double width = upper - lower;
  uint32_t first = 0;
  for (; first + 16 <= dim; first += 16)
    uniform_16(lower, width, upper_f, below_upper, keys, row_id, first, out + first);
  if (first < dim) {
    float tail[16];
    uniform_16(lower, width, upper_f, below_upper, keys, row_id, first, tail);
    std::memcpy(out + first, tail, (dim - first) * sizeof(float));
  }
}
#endif

void fill_normal(double mean, double std, PhiloxKey key, uint64_t row_id, uint32_t dim, float* out) {
#ifdef RECDEV_STORE_AVX2_KERNELS
  if (cpu_has_avx2_fma()) return fill_normal_avx2(mean, std, key, row_id, dim, out);
#endif
  fill_normal_reference(mean, std, key, row_id, dim, out);
}

// Element e of a row is float(lower + (upper - lower) * unit), unit = the top 24 bits of word e % 4 of
// block e / 4, over 2^24.
void fill_uniform_reference(double lower, double upper, float upper_f, float below_upper, PhiloxKey key,
                            uint64_t row_id, uint32_t dim, float* out) {
  for (uint32_t first = 0, block = 0; first < dim; first += 4, ++block) {
    const PhiloxCounter words = philox4x32_10(philox_counter(block, row_id), key);
    for (uint32_t lane = 0; lane < 4 && first + lane < dim; ++lane) {
      const double unit = double(words[lane] >> 8) * kInvTwoPow24;  // 24 bits: a float's precision
      const float value = float(lower + (upper - lower) * unit);
      out[first + lane] = value >= upper_f ? below_upper : value;
    }
  }
}

void fill_uniform(double lower, double upper, PhiloxKey key, uint64_t row_id, uint32_t dim, float* out) {
  const float lower_f = float(lower);
  const float upper_f = float(upper);
  // Rounding to float can land exactly on upper; the largest float below it keeps the range half-open.
  const float below_upper = std::max(lower_f, std::nextafter(upper_f, -std::numeric_limits<float>::infinity()));
#ifdef RECDEV_STORE_AVX2_KERNELS
  if (cpu_has_avx2_fma()) return fill_uniform_avx2(lower, upper, upper_f, below_upper, key, row_id, dim, out);
#endif
  fill_uniform_reference(lower, upper, upper_f, below_upper, key, row_id, dim, out);
}

std::string format_number(double value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

[[noreturn]] void invalid(const InitRule& rule, const std::string& problem) {
  throw StoreError(ErrorCode::InvalidArgument, "invalid init rule " + describe(rule) + ": " + problem);
}

}  // namespace

bool operator==(const InitRule& lhs, const InitRule& rhs) {
  return lhs.kind == rhs.kind && std::memcmp(&lhs.a, &rhs.a, sizeof(double)) == 0 &&
         std::memcmp(&lhs.b, &rhs.b, sizeof(double)) == 0 && lhs.seed == rhs.seed;
}

bool operator!=(const InitRule& lhs, const InitRule& rhs) { return !(lhs == rhs); }

std::string describe(const InitRule& rule) {
  const std::string seed = ", seed=" + std::to_string(rule.seed) + ")";
  switch (rule.kind) {
    case InitKind::Zero: return "Zero()";
    case InitKind::Constant: return "Constant(value=" + format_number(rule.a) + ")";
    case InitKind::Normal: return "Normal(mean=" + format_number(rule.a) + ", std=" + format_number(rule.b) + seed;
    case InitKind::Uniform: return "Uniform(lower=" + format_number(rule.a) + ", upper=" + format_number(rule.b) + seed;
    case InitKind::Xavier: return "Xavier(seed=" + std::to_string(rule.seed) + ")";
  }
  return "UnknownInitKind(" + std::to_string(uint32_t(rule.kind)) + ")";
}

void validate_init_rule(const InitRule& rule) {
  switch (rule.kind) {
    case InitKind::Zero:
    case InitKind::Constant:
    case InitKind::Xavier: return;
    case InitKind::Normal:
      if (!std::isfinite(rule.a) || !std::isfinite(rule.b)) invalid(rule, "mean and std must be finite");
      if (rule.b < 0) invalid(rule, "std must be >= 0");
      return;
    case InitKind::Uniform:
      if (!std::isfinite(rule.a) || !std::isfinite(rule.b)) invalid(rule, "bounds must be finite");
      if (rule.a > rule.b) invalid(rule, "lower must be <= upper");
      if (!std::isfinite(rule.b - rule.a)) invalid(rule, "upper - lower overflows");
      return;
  }
  invalid(rule, "unknown init kind");
}

void fill_row(const InitRule& rule, uint64_t table_id, uint64_t row_id, uint32_t dim, uint64_t num_rows, float* out) {
  switch (rule.kind) {
    case InitKind::Zero: std::fill(out, out + dim, 0.0f); return;
    case InitKind::Constant: std::fill(out, out + dim, float(rule.a)); return;
    case InitKind::Normal: fill_normal(rule.a, rule.b, philox_key(rule.seed, table_id), row_id, dim, out); return;
    case InitKind::Uniform: fill_uniform(rule.a, rule.b, philox_key(rule.seed, table_id), row_id, dim, out); return;
    case InitKind::Xavier: {
      const double bound = std::sqrt(6.0 / (double(dim) + double(num_rows)));
      fill_uniform(-bound, bound, philox_key(rule.seed, table_id), row_id, dim, out);
      return;
    }
  }
}

}  // namespace recdev::store
