#pragma once
// A CPU copy of the bytes a view of table storage covers, so that CPU kernels
// can run on it. Only the covered rows move, and never more than
// max_fallback_bytes; a window opened for writing is written back.

#include "table_storage.h"

#include <ATen/core/Tensor.h>

#include <string>

namespace recdev::device {

struct ByteRange {
  uint64_t begin = 0;
  uint64_t end = 0;  // one past the last byte
};

// The bytes of its storage that a strided view reaches.
ByteRange covered_bytes(const at::Tensor& t);

class TableWindow {
 public:
  // `what` names the operation in the error when the window is too large.
  TableWindow(const at::Tensor& t, const std::string& what);

  // A CPU tensor with t's geometry over the copied bytes.
  const at::Tensor& cpu() const { return cpu_; }
  // Byte offset of the window within the table storage.
  uint64_t shift() const { return range_.begin; }
  void write_back() const;

 private:
  TableBlock* block_;
  ByteRange range_;
  at::Tensor cpu_;
};

}  // namespace recdev::device
