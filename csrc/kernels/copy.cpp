// Copies between recdev and the CPU, and within recdev. Host storage is host
// memory, so a copy is a CPU copy between views of the same bytes; a table
// view is copied through a window of the rows it covers (never the whole
// table unless the view is the whole table). A whole table copied into a
// whole table of the same layout copies the table itself: init rule and
// materialized rows (device/table_copy.h). Copies are synchronous:
// non_blocking=True is accepted and completes at once.

#include "device/cpu_access.h"
#include "device/table_copy.h"

#include <ATen/ops/_to_copy_native.h>
#include <ATen/ops/copy.h>
#include <ATen/ops/resize_native.h>
#include <torch/library.h>

namespace recdev::kernels {

namespace {

using device::CpuAccess;

void check_copy_device(const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu() || t.is_privateuseone(), "recdev can copy to and from the CPU only; got a tensor on ",
              t.device());
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  check_copy_device(self);
  check_copy_device(dst);
  // load_state_dict of a table into a table: rows touched, not num_rows.
  if (device::copy_whole_table(self, dst)) {
    return dst;
  }
  CpuAccess source(self, "copying a table view");
  CpuAccess target(dst, "copying into a table view");
  at::Tensor target_cpu = target.cpu();
  target_cpu.copy_(source.cpu(), non_blocking);
  target.write_back();
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

// .cpu() / .to("cpu") of a table view: refuse past max_fallback_bytes before
// the CPU destination is allocated, not after.
at::Tensor to_copy(const at::Tensor& self, std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                   std::optional<c10::Device> device, std::optional<bool> pin_memory, bool non_blocking,
                   std::optional<c10::MemoryFormat> memory_format) {
  if (device::is_table(self) && device.has_value() && device->is_cpu()) {
    const device::ByteRange range = device::covered_bytes(self);
    device::check_fallback_size(range.end - range.begin, "copying a table to the CPU (.cpu(), .to(), torch.save)");
  }
  return at::native::_to_copy(self, dtype, layout, device, pin_memory, non_blocking, memory_format);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  CpuAccess access(self, "item()");
  return access.cpu().item();
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("_to_copy", to_copy);
}

// The CPU copy resolves conjugate and negative bits itself; without these
// fallthroughs the math-bit fallbacks would materialize the source with
// clone(), which calls _copy_from again, forever.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) { m.impl("_copy_from", torch::CppFunction::makeFallthrough()); }
TORCH_LIBRARY_IMPL(aten, Negative, m) { m.impl("_copy_from", torch::CppFunction::makeFallthrough()); }

}  // namespace recdev::kernels
