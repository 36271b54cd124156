// Row copies into large outputs with non-temporal (streaming) stores.
//
// Why: an output of many MiB written row by row at scattered places does not stay in cache, yet an
// ordinary store first reads each destination line in (read-for-ownership) only to overwrite all of
// it, so a third of the copy's memory traffic is that read. Streaming stores write whole lines
// without it, and the widest ones the CPU has do best: a 64-byte store fills a line at once, where
// narrower ones hold a write-combining buffer open until the line is complete. Measured with 65,536
// rows of 512 bytes on 2 cores, against ordinary stores, in alternating rounds: F.embedding on a
// table 1.09x faster with 16-byte streaming stores, 1.13x with 32-byte, 1.22x with 64-byte; a remote
// gather 18-20 -> 14-16 ms (16-byte). Small outputs keep ordinary stores, because their reader finds
// them in cache right after.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace recdev::store {

// Outputs from this size up are written with streaming stores: well past what stays in a core's
// cache by the time the output is read.
constexpr size_t kStreamingOutputBytes = size_t{4} << 20;

class RowCopier {
 public:
  // For an output of output_bytes in all, starting at `output`, whose rows are row_bytes apart.
  RowCopier(const void* output, size_t output_bytes, size_t row_bytes);
  // For output_bytes in all of rows anywhere (records of a table being filled): a row streams if it
  // starts at a multiple of the store width, and is copied with ordinary stores otherwise.
  struct ScatteredRows {};
  RowCopier(ScatteredRows, size_t output_bytes, size_t row_bytes);
  // Orders the streaming stores before whatever the thread stores next.
  ~RowCopier();
  RowCopier(const RowCopier&) = delete;
  RowCopier& operator=(const RowCopier&) = delete;

  // Copies one row to `dest`, a row of the output.
  void copy(void* dest, const void* row) const {
    if (stream_ != nullptr && (reinterpret_cast<uintptr_t>(dest) & misaligned_) == 0) {
      stream_(dest, row, row_bytes_);
    } else {
      std::memcpy(dest, row, row_bytes_);
    }
  }

 private:
  using StreamRow = void (*)(void* dest, const void* row, size_t bytes);
  // The widest streaming store this CPU has for which fits(width) holds; returns its width (0: none).
  template <class Fits>
  size_t choose_stream(Fits fits);
  size_t row_bytes_;
  StreamRow stream_ = nullptr;  // none: ordinary stores
  uintptr_t misaligned_ = 0;    // the address bits that must be 0 for stream_ (scattered rows only)
};

}  // namespace recdev::store
