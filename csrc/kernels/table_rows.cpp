#include "table_rows.h"

#include "device/allocator.h"
#include "device/cpu_access.h"
#include "device/cpu_view.h"
#include "device/store_ranges.h"

#include "store/id_check.h"
#include "store/table_handle.h"
#include "store/task_runner.h"

#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

namespace recdev::kernels {

// Rows [first_row, first_row + size(0)) of the table, when `weight` is a
// [rows, ...] view the store can gather row by row.
std::optional<uint64_t> first_gatherable_row(const at::Tensor& weight) {
  if (!device::is_table(weight) || weight.dim() < 2 || !weight.is_contiguous()) {
    return std::nullopt;
  }
  const device::TableBlock* block = device::table_block(weight.storage());
  const uint64_t row_bytes = static_cast<uint64_t>(weight.stride(0)) * weight.element_size();
  const uint64_t offset_bytes = static_cast<uint64_t>(weight.storage_offset()) * weight.element_size();
  if (row_bytes != block->row_bytes || offset_bytes % row_bytes != 0) {
    return std::nullopt;
  }
  return offset_bytes / row_bytes;
}

// The bytes of an index or weight tensor (read only) as CPU.
void run_in_tasks(int64_t total, int64_t per_task, const std::function<void(int64_t, int64_t)>& work) {
  if (total <= 0) return;
  const int64_t tasks = (total + per_task - 1) / per_task;
  store::run_tasks(static_cast<size_t>(tasks), static_cast<size_t>(at::get_num_threads()), [&](size_t task) {
    const int64_t begin = static_cast<int64_t>(task) * per_task;
    work(begin, std::min(total, begin + per_task));
  });
}

at::Tensor on_cpu(const at::Tensor& t) { return device::CpuAccess(t, "reading lookup indices").cpu(); }

RowIds::RowIds(const at::Tensor& indices, int64_t num_rows, uint64_t first_row, IdRule rule, const char* op) {
  TORCH_CHECK(indices.scalar_type() == at::kLong || indices.scalar_type() == at::kInt,
              "Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int; "
              "but got ",
              indices.toString(), " instead (while checking arguments for ", op, ")");
  const at::Tensor ids = on_cpu(indices).to(at::kLong).contiguous();
  const int64_t* data = ids.const_data_ptr<int64_t>();
  size_ = static_cast<size_t>(ids.numel());
  if (first_row == 0 &&
      store::all_ids_below(reinterpret_cast<const uint64_t*>(data), size_, static_cast<uint64_t>(num_rows))) {
    ids_ = ids;
    data_ = reinterpret_cast<const uint64_t*>(data);
    return;
  }
  ids_ = at::empty({static_cast<int64_t>(size_)}, ids.options());
  uint64_t* rows = reinterpret_cast<uint64_t*>(ids_.data_ptr<int64_t>());
  for (size_t i = 0; i < size_; ++i) {
    int64_t id = data[i];
    switch (rule) {
      case IdRule::Embedding: TORCH_CHECK_INDEX(id >= 0 && id < num_rows, "index out of range in self"); break;
      case IdRule::EmbeddingBag:
        TORCH_CHECK(id >= 0 && id < num_rows, "Index ", i, " of input takes value ", id,
                    " which is not in the valid range [0, ", num_rows, ")");
        break;
      case IdRule::Indexing:
        TORCH_CHECK_INDEX(id >= -num_rows && id < num_rows, "index ", id,
                          " is out of bounds for dimension 0 with size ", num_rows);
        id = id < 0 ? id + num_rows : id;
        break;
    }
    rows[i] = first_row + static_cast<uint64_t>(id);
  }
  data_ = rows;
}

at::Tensor empty_host(c10::IntArrayRef size, c10::ScalarType dtype) {
  return at::detail::empty_generic(size, &device::host_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   dtype, std::nullopt);
}

// weight[ids] for a gatherable table view: ids.shape + weight.shape[1:].
at::Tensor gather(const at::Tensor& weight, uint64_t first_row, const at::Tensor& indices, IdRule rule,
                  const char* op) {
  const RowIds rows(indices, weight.size(0), first_row, rule, op);
  std::vector<int64_t> size = indices.sizes().vec();
  size.insert(size.end(), weight.sizes().begin() + 1, weight.sizes().end());
  at::Tensor out = empty_host(size, weight.scalar_type());
  store::TableHandle& table = device::table_block(weight.storage())->table();
  float* dst = static_cast<float*>(device::cpu_view(out).data_ptr());
  const size_t words = table.row_words();
  const bool one_request = table.row_path_traits().one_request_per_batch;
  const int64_t rows_per_task = one_request ? std::max<int64_t>(1, rows.size()) : kRowsPerTask;
  const trace::Range range = device::gather_range(table, rows.size());
  run_in_tasks(static_cast<int64_t>(rows.size()), rows_per_task, [&](int64_t begin, int64_t end) {
    table.gather(rows.data() + begin, static_cast<size_t>(end - begin), dst + static_cast<size_t>(begin) * words);
  });
  return out;
}

std::vector<at::Tensor> gather_tables(at::TensorList weights, at::TensorList indices) {
  TORCH_CHECK(weights.size() == indices.size(), "torch_recdev.embeddings: ", indices.size(), " index tensors for ",
              weights.size(), " tables; give one index tensor per table");
  for (size_t i = 0; i < weights.size(); ++i) {
    const at::Tensor& weight = weights[i];
    TORCH_CHECK(device::is_table(weight) && first_gatherable_row(weight) == 0 && weight.dim() == 2 &&
                    weight.size(0) == static_cast<int64_t>(device::table_block(weight.storage())->table().num_rows()),
                "torch_recdev.embeddings: table ", i, " is not a whole 2-D store table (got a ", weight.device().str(),
                " tensor of shape ", weight.sizes(),
                "); look up other weights, or slices of a table, with F.embedding");
  }
  std::vector<at::Tensor> outs;
  std::vector<store::TableHandle*> sent;
  try {
    for (size_t i = 0; i < weights.size(); ++i) {
      store::TableHandle& table = device::table_block(weights[i].storage())->table();
      if (!table.row_path_traits().answers_later) {
        outs.push_back(gather(weights[i], 0, indices[i], IdRule::Embedding, "embedding"));
        continue;
      }
      const RowIds rows(indices[i], weights[i].size(0), 0, IdRule::Embedding, "embedding");
      std::vector<int64_t> size = indices[i].sizes().vec();
      size.push_back(weights[i].size(1));
      outs.push_back(empty_host(size, weights[i].scalar_type()));
      const trace::Range range = device::gather_range(table, rows.size());
      table.send_gather(rows.data(), rows.size(), static_cast<float*>(device::cpu_view(outs.back()).data_ptr()));
      sent.push_back(&table);
    }
    for (store::TableHandle* table : sent) table->wait_for_answers();
  } catch (...) {
    // No answer may land in an output once it is freed: every one is read before they go.
    for (store::TableHandle* table : sent) {
      try {
        table->wait_for_answers();
      } catch (...) {}
    }
    throw;
  }
  return outs;
}

}  // namespace recdev::kernels
