#include "table_copy.h"

#include "table_storage.h"

#include "store/table_handle.h"

namespace recdev::device {

namespace {

// Whole, and its bytes are its values: no lazy conjugate or negative bit to resolve while copying.
bool is_whole_table(const at::Tensor& t) {
  return is_table(t) && !t.is_conj() && !t.is_neg() && t.storage_offset() == 0 && t.is_contiguous() &&
         static_cast<uint64_t>(t.numel()) * t.itemsize() == table_block(t.storage())->nbytes;
}

}  // namespace

bool copy_whole_table(const at::Tensor& src, const at::Tensor& dst) {
  if (!is_whole_table(src) || !is_whole_table(dst) || src.dtype() != dst.dtype() || src.sizes() != dst.sizes()) {
    return false;
  }
  const TableBlock& from = *table_block(src.storage());
  const TableBlock& to = *table_block(dst.storage());
  if (from.row_bytes != to.row_bytes || from.nbytes != to.nbytes) {
    return false;
  }
  if (from.same_table(to)) {
    return true;
  }
  store::TableHandle& destination = to.table();
  if (from.install_pending_into(destination)) {
    return true;  // a table torch.load just rebuilt: its rows went from the file straight to dst
  }
  store::TableSnapshot snapshot = from.table().snapshot();
  const store::TableScanHeader& h = snapshot.header;
  destination.install(snapshot.rows, h.config.init, h.init_stream, h.optimizer, h.optimizer_step);
  return true;  // the snapshot now holds dst's old rows, freed here outside the table's locks
}

}  // namespace recdev::device
