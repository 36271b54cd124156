#include "table_window.h"

#include "store/table_handle.h"

#include <ATen/ops/empty.h>
#include <c10/core/TensorImpl.h>

#include <string>

namespace recdev::device {

ByteRange covered_bytes(const at::Tensor& t) {
  const uint64_t item = t.element_size();
  const uint64_t begin = static_cast<uint64_t>(t.storage_offset()) * item;
  if (t.numel() == 0) {
    return {begin, begin};
  }
  uint64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    last += static_cast<uint64_t>(t.size(d) - 1) * static_cast<uint64_t>(t.stride(d));
  }
  return {begin, begin + (last + 1) * item};
}

TableWindow::TableWindow(const at::Tensor& t, const std::string& what)
    : block_(table_block(t.storage())), range_(covered_bytes(t)) {
  TORCH_INTERNAL_ASSERT(block_ != nullptr);
  const uint64_t nbytes = range_.end - range_.begin;
  check_fallback_size(nbytes, what);
  at::Tensor buffer = at::empty({static_cast<int64_t>(nbytes)}, at::TensorOptions().dtype(at::kByte));
  if (nbytes > 0) {
    block_->table().read_bytes(range_.begin, nbytes, buffer.data_ptr());
  }
  cpu_ = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(buffer.storage()),
                                                  c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  c10::TensorImpl* impl = cpu_.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(t.sizes(), t.strides(),
                              t.storage_offset() - static_cast<int64_t>(range_.begin / t.element_size()));
  impl->_set_conj(t.is_conj());
  impl->_set_neg(t.is_neg());
}

void TableWindow::write_back() const {
  const uint64_t nbytes = range_.end - range_.begin;
  if (nbytes > 0) {
    block_->table().write_bytes(range_.begin, nbytes, cpu_.storage().data());
  }
}

}  // namespace recdev::device
