#include "cpu_view.h"

#include "allocator.h"
#include "placement.h"
#include "storage_context.h"
#include "table_storage.h"

#include "store/table_handle.h"

#include <ATen/core/TensorBase.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>

namespace recdev::device {

namespace {

at::Tensor tensor_on(c10::Storage storage, c10::DispatchKey key, const at::Tensor& geometry, int64_t offset_shift = 0) {
  auto tensor =
      at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key), geometry.dtype());
  c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(geometry.sizes(), geometry.strides(), geometry.storage_offset() + offset_shift);
  // Lazy conjugation and negation are bits on the tensor, not in the bytes.
  impl->_set_conj(geometry.is_conj());
  impl->_set_neg(geometry.is_neg());
  return tensor;
}

}  // namespace

c10::Storage cpu_storage_of(const c10::Storage& recdev_storage) {
  StorageContext* context = storage_context(recdev_storage.data_ptr());
  if (context == nullptr) {
    // Foreign bytes (an empty storage or memory wrapped by someone else):
    // borrow them for the duration of the call.
    return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
        c10::StorageImpl::use_byte_size_t(), recdev_storage.nbytes(),
        c10::DataPtr(const_cast<void*>(recdev_storage.data()), c10::Device(c10::kCPU)), nullptr,
        /*resizable=*/false));
  }
  TORCH_CHECK(context->kind == StorageKind::Host,
              "recdev: this tensor lives in a store table and cannot be viewed as CPU "
              "memory; copy the rows you need with .cpu() or index it");
  return static_cast<HostBlock*>(context)->cpu;
}

at::Tensor cpu_view(const at::Tensor& t) { return tensor_on(cpu_storage_of(t.storage()), c10::DispatchKey::CPU, t); }

c10::Storage adopt_cpu_storage(const c10::Storage& cpu_storage) {
  const size_t nbytes = cpu_storage.nbytes();
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                            host_data_ptr(cpu_storage, 0), &host_allocator(),
                                                            /*resizable=*/true));
}

at::Tensor recdev_tensor_on(const c10::Storage& recdev_storage, const at::Tensor& geometry, uint64_t byte_shift) {
  const auto offset_shift = static_cast<int64_t>(byte_shift / geometry.element_size());
  return tensor_on(recdev_storage, c10::DispatchKey::PrivateUse1, geometry, offset_shift);
}

c10::Storage result_storage(const at::Tensor& cpu_result) {
  const c10::Storage& cpu = cpu_result.storage();
  if (!place_in_table(cpu.nbytes())) {
    return adopt_cpu_storage(cpu);
  }
  c10::Storage table = make_table_storage(cpu.nbytes(), table_row_bytes(cpu_result.sizes(), cpu_result.scalar_type()),
                                          element_type_of(cpu_result.scalar_type()));
  table_block(table)->table().write_bytes(0, cpu.nbytes(), cpu.data());
  return table;
}

at::Tensor adopt_result(const at::Tensor& cpu_result) {
  if (!cpu_result.defined()) {
    return cpu_result;
  }
  return recdev_tensor_on(result_storage(cpu_result), cpu_result);
}

void resync_after_cpu_resize(const c10::Storage& recdev_storage) {
  StorageContext* context = storage_context(recdev_storage.data_ptr());
  if (context == nullptr || context->kind != StorageKind::Host) {
    return;
  }
  const c10::Storage& cpu = static_cast<HostBlock*>(context)->cpu;
  c10::StorageImpl* impl = recdev_storage.unsafeGetStorageImpl();
  if (impl->data() == cpu.data() && impl->nbytes() == cpu.nbytes()) {
    return;
  }
  // The context stays; only the address it describes moved.
  void* moved_context = impl->mutable_data_ptr().release_context();
  impl->set_data_ptr_noswap(
      c10::DataPtr(const_cast<void*>(cpu.data()), moved_context, &delete_storage_context, impl->device()));
  impl->set_nbytes(cpu.nbytes());
}

}  // namespace recdev::device
