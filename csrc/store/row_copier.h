// Row copies into large outputs with non-temporal (streaming) stores.
//
// Why: an output of many MiB written row by row at scattered places does not stay in cache, yet an
// ordinary store first reads each destination line in (read-for-ownership) only to overwrite all of
// it, so a third of the copy's memory traffic is that read. Streaming stores write whole lines
// without it: a remote gather's answers went 18-20 -> 14-16 ms for 65,536 rows of 512 bytes. Small
// outputs keep ordinary stores, because their reader finds them in cache right after.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace recdev::store {

// Outputs from this size up are written with streaming stores: well past what stays in a core's
// cache by the time the output is read.
constexpr size_t kStreamingOutputBytes = size_t{4} << 20;

class RowCopier {
 public:
  // For an output of output_bytes in all whose rows are row_bytes apart, starting at `output`.
  RowCopier(const void* output, size_t output_bytes, size_t row_bytes)
      : row_bytes_(row_bytes),
        streaming_(kStreamingAvailable && output_bytes >= kStreamingOutputBytes &&
                   reinterpret_cast<uintptr_t>(output) % kVectorBytes == 0 && row_bytes % kVectorBytes == 0) {}
  // Orders the streaming stores before whatever the thread stores next (sfence).
  ~RowCopier() {
#if defined(__SSE2__)
    if (streaming_) _mm_sfence();
#endif
  }
  RowCopier(const RowCopier&) = delete;
  RowCopier& operator=(const RowCopier&) = delete;

  void copy(void* dest, const void* row) const {
#if defined(__SSE2__)
    if (streaming_) {
      auto* to = static_cast<__m128i*>(dest);
      const auto* from = static_cast<const __m128i*>(row);
      for (size_t v = 0; v < row_bytes_ / kVectorBytes; ++v) _mm_stream_si128(to + v, _mm_loadu_si128(from + v));
      return;
    }
#endif
    std::memcpy(dest, row, row_bytes_);
  }

 private:
#if defined(__SSE2__)
  static constexpr bool kStreamingAvailable = true;
#else
  static constexpr bool kStreamingAvailable = false;
#endif
  static constexpr size_t kVectorBytes = 16;
  size_t row_bytes_;
  bool streaming_;
};

}  // namespace recdev::store
