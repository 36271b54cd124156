#include "row_copier.h"

#include <cstdint>

#include "cpu_features.h"

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace recdev::store {
namespace {

#if defined(__SSE2__)
void stream_row_sse2(void* dest, const void* row, size_t bytes) {
  auto* to = static_cast<__m128i*>(dest);
  const auto* from = static_cast<const __m128i*>(row);
  for (size_t v = 0; v < bytes / sizeof(__m128i); ++v) _mm_stream_si128(to + v, _mm_loadu_si128(from + v));
}
#endif

#ifdef RECDEV_STORE_AVX2_KERNELS
__attribute__((target("avx2"))) void stream_row_avx2(void* dest, const void* row, size_t bytes) {
  auto* to = static_cast<__m256i*>(dest);
  const auto* from = static_cast<const __m256i*>(row);
  for (size_t v = 0; v < bytes / sizeof(__m256i); ++v) _mm256_stream_si256(to + v, _mm256_loadu_si256(from + v));
}

__attribute__((target("avx512f"))) void stream_row_avx512(void* dest, const void* row, size_t bytes) {
  auto* to = static_cast<__m512i*>(dest);
  const auto* from = static_cast<const __m512i*>(row);
  for (size_t v = 0; v < bytes / sizeof(__m512i); ++v) _mm512_stream_si512(to + v, _mm512_loadu_si512(from + v));
}
#endif

}  // namespace

template <class Fits>
size_t RowCopier::choose_stream(Fits fits) {
#ifdef RECDEV_STORE_AVX2_KERNELS
  if (cpu_has_avx512f() && fits(64)) {
    stream_ = &stream_row_avx512;
    return 64;
  }
  if (cpu_has_avx2() && fits(32)) {
    stream_ = &stream_row_avx2;
    return 32;
  }
#endif
#if defined(__SSE2__)
  if (fits(16)) {
    stream_ = &stream_row_sse2;
    return 16;
  }
#endif
  return 0;
}

RowCopier::RowCopier(const void* output, size_t output_bytes, size_t row_bytes) : row_bytes_(row_bytes) {
  if (output_bytes < kStreamingOutputBytes) return;
  // Every row must start at a multiple of the store width (the instructions require it).
  choose_stream(
      [&](size_t width) { return reinterpret_cast<uintptr_t>(output) % width == 0 && row_bytes % width == 0; });
}

RowCopier::RowCopier(ScatteredRows, size_t output_bytes, size_t row_bytes) : row_bytes_(row_bytes) {
  if (output_bytes < kStreamingOutputBytes) return;
  const size_t width = choose_stream([&](size_t candidate) { return row_bytes % candidate == 0; });
  if (width != 0) misaligned_ = width - 1;
}

RowCopier::~RowCopier() {
#if defined(__SSE2__)
  if (stream_ != nullptr) _mm_sfence();
#endif
}

}  // namespace recdev::store
