#pragma once
// Zero-copy bridges between recdev host storage and CPU tensors. CPU kernels
// run on host storage through these views; nothing is copied in or out.

#include <ATen/core/Tensor.h>

namespace recdev::device {

// The CPU storage holding the bytes of a recdev host storage.
c10::Storage cpu_storage_of(const c10::Storage& recdev_storage);

// A CPU tensor with the geometry of `t` over the same bytes. `t` must be on
// recdev host storage.
at::Tensor cpu_view(const at::Tensor& t);

// A recdev storage that owns (shares) the bytes of a CPU storage.
c10::Storage adopt_cpu_storage(const c10::Storage& cpu_storage);

// Where the storage of a fresh CPU result goes on recdev, by the placement
// rules: adopted as host storage (zero copy), or copied into a new table when
// it is large enough or placement("table") is in force.
c10::Storage result_storage(const at::Tensor& cpu_result);

// A recdev tensor on `recdev_storage` with the dtype, sizes, strides and
// offset of `geometry` (a CPU tensor), its offset moved by `byte_shift` (where
// geometry's storage is a window into the recdev storage).
at::Tensor recdev_tensor_on(const c10::Storage& recdev_storage, const at::Tensor& geometry, uint64_t byte_shift = 0);

// A fresh CPU tensor (a kernel's result) as a recdev tensor owning the same
// bytes. Undefined stays undefined.
at::Tensor adopt_result(const at::Tensor& cpu_result);

// A CPU kernel may reallocate a CPU storage in place (resizing an out=
// argument). Re-points the recdev storage that owns it at the new bytes.
void resync_after_cpu_resize(const c10::Storage& recdev_storage);

}  // namespace recdev::device
