// The kernels every PrivateUse1 backend must provide itself: allocation,
// views (metadata over a shared storage, exactly as on CUDA), resizing and
// set_. Everything else reaches the CPU through fallback.cpp.

#include "device/allocator.h"
#include "device/cpu_view.h"
#include "device/placement.h"
#include "device/table_storage.h"

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/TensorOptions.h>
#include <torch/library.h>

namespace recdev::kernels {

namespace {

constexpr c10::DispatchKeySet kRecdevKeys(c10::DispatchKey::PrivateUse1);

void check_factory_options(std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                           std::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "recdev supports strided tensors only; got layout ", c10::layout_or_default(layout));
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory),
              "pin_memory=True is for CPU tensors; recdev host storage is already host memory");
  const c10::Device d = c10::device_or_default(device);
  TORCH_CHECK(d.is_privateuseone() && d.index() <= 0, "recdev has one device, recdev:0; got ", d);
}

// A tensor of these sizes and strides over a new anonymous table.
at::Tensor empty_in_table(c10::IntArrayRef size, c10::IntArrayRef stride, c10::ScalarType dtype) {
  const uint64_t nbytes = at::detail::computeStorageNbytes(size, stride, c10::elementSize(dtype));
  c10::Storage storage =
      device::make_table_storage(nbytes, device::table_row_bytes(size, dtype), device::element_type_of(dtype));
  auto tensor =
      at::detail::make_tensor<c10::TensorImpl>(std::move(storage), kRecdevKeys, c10::scalarTypeToTypeMeta(dtype));
  tensor.unsafeGetTensorImpl()->set_sizes_and_strides(size, stride);
  return tensor;
}

// Under torch.use_deterministic_algorithms(True) with fill_uninitialized_memory (the default), the
// CPU fills a new empty tensor with NaN (floating, complex) or the dtype's maximum (integers, bool:
// true), so that reading memory nothing wrote gives the same values on every run; recdev does too.
at::Tensor fill_if_deterministic(at::Tensor t) {
  const at::Context& context = at::globalContext();
  if (C10_LIKELY(!context.deterministicAlgorithms() || !context.deterministicFillUninitializedMemory())) {
    return t;
  }
  if (!device::is_table(t)) {
    at::Tensor bytes = device::cpu_view(t);
    at::native::fill_empty_deterministic_(bytes);
    return t;
  }
  // A table is filled as a whole (strides aside) so that table_init.cpp records the fill as the
  // table's Constant init rule in O(1). Only float32 has such a rule; a table of another dtype keeps
  // its zero rows, deterministic too, rather than have every row materialized.
  if (t.scalar_type() == at::kFloat) {
    const auto elements = static_cast<int64_t>(device::table_block(t.storage())->nbytes / sizeof(float));
    at::Tensor whole = t.as_strided({elements}, {1}, 0);
    at::native::fill_empty_deterministic_(whole);
  }
  return t;
}

uint64_t nbytes_of(c10::IntArrayRef size, c10::ScalarType dtype) {
  return at::detail::computeStorageNbytesContiguous(size, c10::elementSize(dtype));
}

std::vector<int64_t> row_major_strides(c10::IntArrayRef size) {
  std::vector<int64_t> strides(size.size());
  int64_t stride = 1;
  for (size_t i = size.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<int64_t>(size[i], 1);
  }
  return strides;
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  check_factory_options(layout, device, pin_memory);
  const c10::ScalarType scalar_type = c10::dtype_or_default(dtype);
  if (device::place_in_table(nbytes_of(size, scalar_type))) {
    // Tables are row-major: a memory format asks for a layout rows cannot keep.
    return fill_if_deterministic(empty_in_table(size, row_major_strides(size), scalar_type));
  }
  return fill_if_deterministic(at::detail::empty_generic(size, &device::host_allocator(), kRecdevKeys,
                                                         c10::dtype_or_default(dtype), memory_format));
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  check_factory_options(layout, device, pin_memory);
  const c10::ScalarType scalar_type = c10::dtype_or_default(dtype);
  if (device::place_in_table(nbytes_of(size, scalar_type))) {
    return fill_if_deterministic(empty_in_table(size, stride, scalar_type));
  }
  return fill_if_deterministic(at::detail::empty_strided_generic(size, stride, &device::host_allocator(), kRecdevKeys,
                                                                 c10::dtype_or_default(dtype)));
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) { return at::native::view(self, size); }

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(!device::is_table(self) || static_cast<size_t>((c10::multiply_integers(size) + self.storage_offset()) *
                                                             self.element_size()) <= self.storage().nbytes(),
              "recdev: a tensor on table storage cannot grow past its table (", self.storage().nbytes(),
              " bytes); create a larger tensor instead");
  // at::native::resize_ grows host storage through resizePrivateUse1Bytes.
  return at::native::resize_(self, size, memory_format);
}

at::Tensor& set_storage_offset(at::Tensor& self, c10::Storage storage, int64_t storage_offset, c10::IntArrayRef size,
                               c10::IntArrayRef stride) {
  // The CPU implementation only touches metadata and grows the storage through
  // its own allocator, which for a recdev storage is the recdev allocator.
  return at::native::set_storage_cpu_(self, std::move(storage), storage_offset, size, stride);
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage storage) { return at::native::set_(self, std::move(storage)); }

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) { return at::native::set_tensor_(self, source); }

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, &device::host_allocator(), /*resizable=*/true);
  return at::native::set_storage_cpu_(self, std::move(empty), 0, {0}, {});
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage_storage_offset", set_storage_offset);
  m.impl("set_.source_Storage", set_storage);
  m.impl("set_.source_Tensor", set_tensor);
  m.impl("set_", set_empty);
}

}  // namespace recdev::kernels
