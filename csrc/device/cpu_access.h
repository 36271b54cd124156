#pragma once
// A CPU tensor over the bytes of any tensor a kernel receives: CPU tensors as
// they are, recdev host storage through a zero-copy view, table storage
// through a window of the rows the view covers (written back on request).

#include "table_window.h"

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

namespace recdev::device {

class CpuAccess {
 public:
  // `what` names the operation if a table window would be too large.
  CpuAccess(const at::Tensor& t, const std::string& what);

  const at::Tensor& cpu() const { return cpu_; }
  // Writes a table window back to its table; nothing to do for host bytes.
  void write_back() const;

 private:
  std::optional<TableWindow> window_;
  at::Tensor cpu_;
};

}  // namespace recdev::device
