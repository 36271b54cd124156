// Embedding lookups on table storage run in the store: embedding,
// _embedding_bag (sum, mean, max; per_sample_weights; include_last_offset;
// padding_idx), index_select on dim 0, and weight[ids]. Only the rows touched
// move; outputs are host storage. Host-storage weights, and table views these
// kernels cannot read row by row, go to the CPU fallback.

#include "device/cpu_access.h"
#include "device/cpu_view.h"
#include "device/store_ranges.h"
#include "device/table_storage.h"
#include "fallback.h"
#include "table_rows.h"

#include "store/element_type.h"
#include "store/row_copier.h"
#include "store/table_handle.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/_embedding_bag.h>
#include <ATen/ops/_unique.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace recdev::kernels {

namespace {

// weight[ids] and index_select record PyTorch's own backward, whose dense
// gradient a fused optimizer never sees: the table would silently not train.
void check_not_trained_by_indexing(const at::Tensor& self, const char* op) {
  TORCH_CHECK(
      !(self.requires_grad() && at::GradMode::is_enabled() &&
        device::table_block(self.storage())->table().has_optimizer()),
      "recdev: ", op,
      " on a table trained by a fused optimizer would give it a dense gradient the optimizer never "
      "sees. Look rows up with F.embedding / F.embedding_bag (or nn.Embedding) so that their gradient goes to the "
      "store, or index inside torch.no_grad() to read rows.");
}

const at::Tensor& arg(c10::ArrayRef<c10::IValue> args, size_t i) { return args[i].toTensor(); }

// Each boxed kernel below handles the table case and hands the rest to the
// fallback, which keeps host-storage behaviour exactly CPU's.
void replace_args_with(torch::jit::Stack* stack, size_t n, at::Tensor result) {
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, std::move(result));
}

void embedding(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1, bool scale_grad_by_freq=False, bool sparse=False)
  const size_t n = op.schema().arguments().size();
  auto args = torch::jit::last(*stack, n);
  if (auto first = first_gatherable_row(arg(args, 0)); first && arg(args, 0).dim() == 2) {
    replace_args_with(stack, n, gather(arg(args, 0), *first, arg(args, 1), IdRule::Embedding, "embedding"));
    return;
  }
  cpu_fallback(op, stack);
}

void index_select(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // index_select(Tensor self, int dim, Tensor index)
  const size_t n = op.schema().arguments().size();
  auto args = torch::jit::last(*stack, n);
  const at::Tensor& self = arg(args, 0);
  if (auto first = first_gatherable_row(self); first && args[1].toInt() == 0 && arg(args, 2).dim() <= 1) {
    check_not_trained_by_indexing(self, "index_select");
    // index_select's result has one row per index even for a 0-d index.
    replace_args_with(stack, n, gather(self, *first, arg(args, 2).reshape({-1}), IdRule::Embedding, "index_select"));
    return;
  }
  cpu_fallback(op, stack);
}

void index(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // index.Tensor(Tensor self, Tensor?[] indices): weight[ids] is one integer index on dim 0.
  const size_t n = op.schema().arguments().size();
  auto args = torch::jit::last(*stack, n);
  const at::Tensor& self = arg(args, 0);
  auto indices = args[1].toOptionalTensorList();
  if (indices.size() == 1) {
    const std::optional<at::Tensor> ids = indices.get(0);
    const bool integer_ids =
        ids.has_value() && ids->defined() && (ids->scalar_type() == at::kLong || ids->scalar_type() == at::kInt);
    if (auto first = first_gatherable_row(self); first && integer_ids) {
      check_not_trained_by_indexing(self, "weight[ids]");
      replace_args_with(stack, n, gather(self, *first, *ids, IdRule::Indexing, "index"));
      return;
    }
  }
  cpu_fallback(op, stack);
}

// The offsets as contiguous int64 on the CPU (the tensor itself when it already is), checked as
// CPU's embedding_bag checks them.
at::Tensor offsets_for_store(const at::Tensor& offsets, size_t num_ids) {
  TORCH_CHECK(offsets.scalar_type() == at::kLong || offsets.scalar_type() == at::kInt,
              "embedding_bag: offsets must be Long or Int; got ", offsets.toString());
  TORCH_CHECK(offsets.dim() == 1, "offsets has to be a 1D Tensor, but got Tensor of dimension ", offsets.dim());
  at::Tensor result = on_cpu(offsets).to(at::kLong).contiguous();
  const int64_t* o = result.const_data_ptr<int64_t>();
  const int64_t count = result.numel();
  if (count > 0) {
    TORCH_CHECK(o[0] == 0,
                "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from position 0. "
                "However, got ",
                o[0]);
    TORCH_CHECK(o[count - 1] <= static_cast<int64_t>(num_ids), "offsets[-1] can not be greater than input's length ",
                num_ids, ", but got offsets[-1] of ", o[count - 1]);
    for (int64_t i = 1; i < count; ++i) {
      TORCH_CHECK(o[i - 1] <= o[i], "embedding_bag: offsets must be non-decreasing; offsets[", i, "] = ", o[i],
                  " < offsets[", i - 1, "] = ", o[i - 1]);
    }
  }
  return result;
}

// embedding_bag on a floating table the store does not pool (RowPathTraits::pools_rows: float64
// tables, and half tables on shards): the bags' distinct rows are gathered (only the rows touched
// move) and CPU's own _embedding_bag pools them, with ids renumbered into the gathered rows; its results are exactly
// those of F.embedding_bag on the whole table, max indices mapped back to row ids.
void embedding_bag_of_gathered_rows(const c10::OperatorHandle& op, torch::jit::Stack* stack, uint64_t first_row) {
  const size_t n = op.schema().arguments().size();
  auto args = torch::jit::last(*stack, n);
  const at::Tensor& weight = arg(args, 0);
  const at::Tensor& indices = arg(args, 1);
  TORCH_CHECK(indices.dim() == 1, "input has to be 1D or 2D Tensor, but got Tensor of dimension ", indices.dim());
  // Checks every id against the view's rows, with CPU's message, before anything moves.
  const RowIds checked(indices, weight.size(0), first_row, IdRule::EmbeddingBag, "embedding_bag");
  const at::Tensor ids = on_cpu(indices).to(at::kLong);
  const auto [distinct, position] = at::_unique(ids, /*sorted=*/false, /*return_inverse=*/true);
  const at::Tensor rows =
      device::CpuAccess(gather(weight, first_row, distinct, IdRule::EmbeddingBag, "embedding_bag"), "embedding_bag")
          .cpu();
  int64_t padding_idx = args[8].toInt();
  if (padding_idx >= 0) {
    const at::Tensor where_padding = distinct.eq(padding_idx).nonzero();
    padding_idx = where_padding.numel() > 0 ? where_padding.view(-1).item<int64_t>() : -1;
  }
  at::Tensor per_sample_weights;
  if (args[6].isTensor() && args[6].toTensor().defined()) per_sample_weights = on_cpu(args[6].toTensor());
  const int64_t mode = args[4].toInt();
  auto [out, offset2bag, bag_size, max_indices] = at::_embedding_bag(
      rows, position.to(indices.scalar_type()), on_cpu(arg(args, 2)), args[3].toBool(), mode, args[5].toBool(),
      per_sample_weights.defined() ? std::optional<at::Tensor>(per_sample_weights) : std::nullopt, args[7].toBool(),
      padding_idx);
  if (mode == 2 && max_indices.numel() > 0) {
    max_indices = distinct.to(max_indices.scalar_type()).index_select(0, max_indices.flatten()).view_as(max_indices);
  }
  // CPU's fast sum path leaves offset2bag empty (its backward rebuilds it); the store's backward
  // reads it, so it is filled here as the float32 kernel fills it: ids past the last bag go to it.
  if (offset2bag.numel() != ids.numel()) {
    const at::Tensor bounds = on_cpu(arg(args, 2)).to(at::kLong).contiguous();
    const int64_t* o = bounds.const_data_ptr<int64_t>();
    const int64_t count = ids.numel();
    const int64_t num_bags = args[7].toBool() ? bounds.numel() - 1 : bounds.numel();
    offset2bag = at::zeros({count}, at::kLong);
    int64_t* bag_of = offset2bag.data_ptr<int64_t>();
    for (int64_t b = 0; b < num_bags; ++b) {
      const int64_t end = b + 1 < bounds.numel() ? std::min(o[b + 1], count) : count;
      for (int64_t i = o[b]; i < end; ++i) bag_of[i] = b;
    }
    const int64_t pooled = num_bags > 0 ? (num_bags < bounds.numel() ? std::min(o[num_bags], count) : count) : 0;
    for (int64_t i = pooled; i < count; ++i) bag_of[i] = std::max<int64_t>(num_bags - 1, 0);
  }
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, device::adopt_result(out.contiguous()), device::adopt_result(offset2bag.contiguous()),
                   device::adopt_result(bag_size.contiguous()), device::adopt_result(max_indices.contiguous()));
}

// per_sample_weights (an optional argument) as float32 on the CPU, checked as CPU's kernel checks it;
// undefined without.
at::Tensor per_sample_weights_for_store(const c10::IValue& argument, const at::Tensor& weight, int64_t mode,
                                        size_t ids) {
  if (!argument.isTensor() || !argument.toTensor().defined()) return at::Tensor();
  const at::Tensor& per_sample_weights = argument.toTensor();
  TORCH_CHECK(
      mode == 0,
      "embedding_bag: per_sample_weights was not None. per_sample_weights is only supported for mode='sum' (got mode='",
      mode == 1 ? "mean" : "max", "'). Please open a feature request on GitHub.");
  // CPU's checkSameType message, with the types named as CPU's (Python shows CPUFloatType as
  // torch.FloatTensor), so that the table path fails exactly as host storage and the CPU do.
  const auto cpu_type = [](const at::Tensor& t) {
    return std::string("CPU") + c10::toString(t.scalar_type()) + "Type";
  };
  TORCH_CHECK(per_sample_weights.scalar_type() == weight.scalar_type(),
              "Expected tensor for argument #1 'weight' to have the same type as tensor for argument #1 "
              "'per_sample_weights'; but type ",
              cpu_type(weight), " does not equal ", cpu_type(per_sample_weights),
              " (while checking arguments for embedding_bag)");
  const at::Tensor weights = on_cpu(per_sample_weights).to(at::kFloat).contiguous();  // half weights widen exactly
  TORCH_CHECK(weights.numel() == static_cast<int64_t>(ids),
              "embedding_bag: expected per_sample_weights to be 1D with the same number of elements as input; got ",
              weights.numel(), " and ", ids);
  return weights;
}

// _embedding_bag's max_indices, shaped as the meta kernel says (torch.compile checks it): in max mode
// each maximum's row id; unused otherwise, where it is [num_bags] when offsets are on the CPU (as CPU's
// kernel gives) and empty otherwise.
at::Tensor max_indices_of(int64_t mode, int64_t num_bags, int64_t dim, const at::Tensor& offsets_arg,
                          const at::Tensor& indices, const at::Tensor& max_positions, size_t num_ids) {
  at::Tensor max_indices = mode == 2 ? at::zeros({num_bags, dim}, at::kLong)
                                     : at::zeros({offsets_arg.device().is_cpu() ? num_bags : 0}, at::kLong);
  if (mode == 2 && num_ids > 0) {
    const at::Tensor ids = on_cpu(indices).to(at::kLong);
    const at::Tensor positions = max_positions.clamp_min(0);
    max_indices = at::where(max_positions.ge(0), ids.index_select(0, positions.flatten()).view_as(positions),
                            at::zeros_like(positions));
  }
  return max_indices;
}

// offset2bag for bag b's ids [begin, end), and the bag's size (its ids that are not padding).
int64_t assign_bag(int64_t b, int64_t begin, int64_t end, const RowIds& rows, int64_t padding_row, int64_t* bag_of) {
  if (padding_row < 0) {
    std::fill(bag_of + begin, bag_of + end, b);
    return end - begin;
  }
  int64_t count = 0;
  for (int64_t i = begin; i < end; ++i) {
    bag_of[i] = b;
    count += static_cast<int64_t>(rows[i]) != padding_row;
  }
  return count;
}

// _embedding_bag on a table the store pools: ids validated as CPU validates them, the bags split over
// threads unless the table wants a batch whole (RowPathTraits), each task's bags pooled by the store
// into the output, a half table's rounded as CPU's kernel rounds them (store::PooledOutput).
void embedding_bag_in_store(const c10::OperatorHandle& op, torch::jit::Stack* stack, uint64_t first_row) {
  const size_t n = op.schema().arguments().size();
  auto args = torch::jit::last(*stack, n);
  const at::Tensor& weight = arg(args, 0);
  const at::Tensor& indices = arg(args, 1);
  TORCH_CHECK(indices.dim() == 1, "input has to be 1D or 2D Tensor, but got Tensor of dimension ", indices.dim());
  const int64_t mode = args[4].toInt();
  TORCH_CHECK(mode >= 0 && mode <= 2, "embedding_bag: mode must be 0 (sum), 1 (mean) or 2 (max); got ", mode);
  const bool include_last_offset = args[7].toBool();
  const int64_t padding_idx = args[8].toInt();
  const RowIds rows(indices, weight.size(0), first_row, IdRule::EmbeddingBag, "embedding_bag");
  const at::Tensor offsets_tensor = offsets_for_store(arg(args, 2), rows.size());
  const int64_t* offsets = offsets_tensor.const_data_ptr<int64_t>();
  const int64_t num_offsets = offsets_tensor.numel();
  TORCH_CHECK(!include_last_offset || num_offsets > 0, "include_last_offset: number of offset should be at least 1");
  const int64_t num_bags = include_last_offset ? num_offsets - 1 : num_offsets;
  // Where bag b ends: the next offset, and for the last bag (without include_last_offset) the end of the ids.
  const auto bag_end = [&](int64_t b) {
    return b + 1 < num_offsets ? offsets[b + 1] : static_cast<int64_t>(rows.size());
  };
  const at::Tensor weights = per_sample_weights_for_store(args[6], weight, mode, rows.size());
  const int64_t dim = weight.size(1);
  at::Tensor out = empty_host({num_bags, dim}, weight.scalar_type());
  // The auxiliary outputs CPU's kernel gives, for the backward pass: each id's bag, and each bag's
  // count of ids that are not padding.
  at::Tensor offset2bag = empty_host({static_cast<int64_t>(rows.size())}, at::kLong);
  at::Tensor bag_size = empty_host({num_bags}, at::kLong);
  at::Tensor max_positions = mode == 2 ? at::empty({num_bags, dim}, at::kLong) : at::Tensor();
  store::TableHandle& table = device::table_block(weight.storage())->table();
  void* out_data = device::cpu_view(out).data_ptr();
  const store::ElementType out_type = device::element_type_of(weight.scalar_type());
  int64_t* bag_of = device::cpu_view(offset2bag).data_ptr<int64_t>();
  int64_t* size_of = device::cpu_view(bag_size).data_ptr<int64_t>();
  int64_t* positions = mode == 2 ? max_positions.data_ptr<int64_t>() : nullptr;
  const float* weight_data = weights.defined() ? weights.const_data_ptr<float>() : nullptr;
  const int64_t padding_row = padding_idx < 0 ? -1 : static_cast<int64_t>(first_row) + padding_idx;
  // Ids past the last bag (include_last_offset) belong to none; CPU leaves them to the last.
  const int64_t pooled_ids = num_bags > 0 ? bag_end(num_bags - 1) : 0;
  std::fill(bag_of + pooled_ids, bag_of + rows.size(), std::max<int64_t>(num_bags - 1, 0));
  const bool one_request = table.row_path_traits().one_request_per_batch;
  const int64_t bags_per_task = one_request
                                    ? std::max<int64_t>(1, num_bags)
                                    : std::max<int64_t>(1, kRowsPerTask * num_bags / std::max<int64_t>(1, rows.size()));
  const bool streams = static_cast<size_t>(out.nbytes()) >= store::kStreamingOutputBytes;
  // Pools bags [begin, end) as a batch of their own (offsets from 0, closed by an end offset).
  const auto pool_bag_range = [&](int64_t begin, int64_t end) {
    const int64_t base = offsets[begin];
    std::vector<int64_t> local(end - begin + 1);
    for (int64_t b = begin; b < end; ++b) {
      local[b - begin] = offsets[b] - base;
    }
    local.back() = bag_end(end - 1) - base;
    // bfloat16 sums round with ties away from zero where CPU pools with fbgemm: without padding_idx.
    store::PooledOutput pooled(static_cast<std::byte*>(out_data) + begin * dim * out.element_size(), out_type,
                               /*bfloat16_ties_away=*/padding_idx < 0);
    pooled.streams = streams;
    table.gather_pooled(
        rows.data() + base, static_cast<size_t>(local.back()), local.data(), static_cast<size_t>(end - begin),
        static_cast<store::PoolingMode>(mode), weight_data ? weight_data + base : nullptr,
        /*include_last_offset=*/true, padding_row, pooled, positions ? positions + begin * dim : nullptr);
    if (positions != nullptr) {
      for (int64_t* p = positions + begin * dim; p != positions + end * dim; ++p) {
        *p = *p < 0 ? *p : *p + base;
      }
    }
    for (int64_t b = begin; b < end; ++b) size_of[b] = assign_bag(b, offsets[b], bag_end(b), rows, padding_row, bag_of);
  };
  const trace::Range range = device::pooled_gather_range(table, rows.size(), static_cast<size_t>(num_bags));
  run_in_tasks(num_bags, bags_per_task, pool_bag_range);

  at::Tensor max_indices = max_indices_of(mode, num_bags, dim, arg(args, 2), indices, max_positions, rows.size());
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, out, offset2bag, bag_size, device::adopt_result(max_indices));
}

void embedding_bag(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // _embedding_bag[_forward_only](Tensor weight, Tensor indices, Tensor offsets, bool scale_grad_by_freq=False,
  //   int mode=0, bool sparse=False, Tensor? per_sample_weights=None, bool include_last_offset=False,
  //   int padding_idx=-1) -> (Tensor, Tensor, Tensor, Tensor)
  const size_t n = op.schema().arguments().size();
  auto args = torch::jit::last(*stack, n);
  const at::Tensor& weight = arg(args, 0);
  auto first = first_gatherable_row(weight);
  // The store pools what it pools as CPU's kernel does (store::RowPathTraits::pools_rows); other
  // tables' rows are gathered and CPU pools them.
  const bool store_pools =
      first && weight.dim() == 2 && device::table_block(weight.storage())->table().row_path_traits().pools_rows;
  if (first && !store_pools && weight.dim() == 2 && at::isFloatingType(weight.scalar_type()) &&
      weight.scalar_type() != at::kFloat) {
    embedding_bag_of_gathered_rows(op, stack, *first);
    return;
  }
  if (!store_pools) {
    cpu_fallback(op, stack);
    return;
  }
  embedding_bag_in_store(op, stack, *first);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("embedding", torch::CppFunction::makeFromBoxedFunction<&embedding>());
  m.impl("index_select", torch::CppFunction::makeFromBoxedFunction<&index_select>());
  m.impl("index.Tensor", torch::CppFunction::makeFromBoxedFunction<&index>());
  m.impl("_embedding_bag", torch::CppFunction::makeFromBoxedFunction<&embedding_bag>());
  m.impl("_embedding_bag_forward_only", torch::CppFunction::makeFromBoxedFunction<&embedding_bag>());
}

// torch_recdev.embeddings' forward (torch_recdev/lookups.py, whose backward sends each table's
// gradient through recdev::table_embedding_backward).
TORCH_LIBRARY_FRAGMENT(recdev, m) { m.def("gather_tables(Tensor[] weights, Tensor[] indices) -> Tensor[]"); }

TORCH_LIBRARY_IMPL(recdev, PrivateUse1, m) { m.impl("gather_tables", gather_tables); }

}  // namespace recdev::kernels
