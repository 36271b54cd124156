#pragma once
// Reading a table view row by row: what the lookup kernels (embedding.cpp)
// and their autograd (embedding_autograd.cpp) share.

#include "device/table_storage.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <vector>

namespace recdev::kernels {

// Rows per parallel task: enough to amortize the per-call locking over the
// table's sub-shards.
constexpr int64_t kRowsPerTask = 8192;

// work(begin, end) over [0, total) in tasks of per_task (the last one shorter), on the intra-op
// threads, each taking the next task as it finishes one. Not at::parallel_for's fixed share per
// thread: memory-bound shares finish at uneven speeds on a shared machine, and the thread done first
// spun in OpenMP's wait (9% of a pooled lookup's samples on two cores).
void run_in_tasks(int64_t total, int64_t per_task, const std::function<void(int64_t begin, int64_t end)>& work);

// Rows [first_row, first_row + size(0)) of the table, when `weight` is a
// [rows, ...] view the store can gather row by row.
std::optional<uint64_t> first_gatherable_row(const at::Tensor& weight);

// The bytes of an index or weight tensor (read only) as CPU.
at::Tensor on_cpu(const at::Tensor& t);

// How each op treats ids outside [0, rows): the same error type and message
// as its CPU kernel, and advanced indexing wraps negative ids.
enum class IdRule { Embedding, EmbeddingBag, Indexing };

// Row ids for the store, validated by `rule`, then shifted to the view's first row. The common
// lookup — int64 ids, all in range, into a view that starts at row 0 — reads the index tensor's own
// data: a copy of 65,536 ids cost a forward embedding_bag 4% (a fresh 512 KiB buffer faults in
// every call).
class RowIds {
 public:
  RowIds(const at::Tensor& indices, int64_t num_rows, uint64_t first_row, IdRule rule, const char* op);
  const uint64_t* data() const { return data_; }
  size_t size() const { return size_; }
  uint64_t operator[](size_t i) const { return data_[i]; }
  std::vector<uint64_t> to_vector() const { return {data_, data_ + size_}; }

 private:
  at::Tensor ids_;  // holds data_: the index tensor, or the shifted copy
  const uint64_t* data_ = nullptr;
  size_t size_ = 0;
};

// A recdev host-storage tensor, whatever the placement: lookup results.
at::Tensor empty_host(c10::IntArrayRef size, c10::ScalarType dtype);

// weight[ids] for a gatherable table view: ids.shape + weight.shape[1:].
at::Tensor gather(const at::Tensor& weight, uint64_t first_row, const at::Tensor& indices, IdRule rule, const char* op);

// embedding(weights[i], indices[i]) for every i, every weight a whole table (torch_recdev.embeddings):
// the requests of every table that answers later (a remote one) are sent before any answer is
// awaited, so that the lookups of several remote tables cost one round trip, not one each.
std::vector<at::Tensor> gather_tables(at::TensorList weights, at::TensorList indices);

}  // namespace recdev::kernels
