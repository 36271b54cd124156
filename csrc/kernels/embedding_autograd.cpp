// Autograd for embedding lookups (DESIGN.md, "Backward"). On a table with a
// fused optimizer, backward sends the output gradient to the store in one
// update, where duplicates are summed and the optimizer runs; the weight gets
// no .grad. Sum and mean bags send their bag gradients as they are (the store
// spreads them over the bags' ids); max bags and scale_grad_by_freq send a
// gradient row per id. A table without a fused optimizer is an error at
// backward that names the fused optimizers: the alternative, a dense
// gradient of the whole table, is what lazy tables exist to avoid. Host
// weights get PyTorch's own gradients (the formulas of derivatives.yaml).
//
// These kernels replace the AutogradPrivateUse1 entries of embedding and
// _embedding_bag; everything below autograd is the ordinary recdev kernel.

#include "device/cpu_access.h"
#include "device/cpu_view.h"
#include "device/store_ranges.h"
#include "table_rows.h"

#include "store/errors.h"
#include "store/table_handle.h"

#include <ATen/OpMathType.h>
#include <ATen/ops/_embedding_bag.h>
#include <ATen/ops/_embedding_bag_backward.h>
#include <ATen/ops/_embedding_bag_forward_only.h>
#include <ATen/ops/_embedding_bag_per_sample_weights_backward.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/embedding_backward.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>

#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace recdev::kernels {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool updates_in_store(const at::Tensor& weight) { return device::is_table(weight); }

store::TableHandle& table_of(const at::Tensor& weight) { return device::table_block(weight.storage())->table(); }

// The table of `weight`, which must have a fused optimizer to take a gradient.
store::TableHandle& trained_table(const at::Tensor& weight) {
  store::TableHandle& table = table_of(weight);
  TORCH_CHECK(table.has_optimizer(),
              "recdev: this embedding weight is a store table with no fused optimizer, so backward has nowhere to put "
              "its gradient (a dense gradient would be as large as the whole table). Attach one before training: "
              "torch_recdev.optim.SGD / Adagrad / RowWiseAdagrad / Adam([weight], lr=...), or "
              "torch_recdev.optim.apply_optimizer_in_backward(torch.optim.Adagrad, [weight], {\"lr\": ...}).");
  return table;
}

// Whether a remote table's update may leave its answer to the end of the backward pass running it:
// the autograd engine's final callback then reads the answers (TableHandle::wait_for_answers),
// so the updates of every table in the pass cross the network together instead of a round trip
// each, and backward() still raises a refused one. Outside a pass (the kernel called directly), and
// for tables that apply an update before send_update returns, there is nothing to wait for. With
// connect(..., overlap_updates=True) the pass does not wait either (wait_at_end_of_backward): the
// shards apply the updates while the step goes on, and the session's next request raises a refusal.
bool answer_at_end_of_backward(const store::TableHandle& table) {
  return table.row_path_traits().answers_later && torch::autograd::get_current_graph_task_id() != -1;
}

// The tables each running backward pass sent updates to, by graph task: one final callback per
// pass reads every table's answers before it throws the first failure (the engine runs no callback
// after one that throws). Weak: a pass that fails before its callbacks leaves no table alive.
struct PassesSending {
  std::mutex mutex;
  std::unordered_map<int, std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>>> tables;
};

PassesSending& passes_sending() {
  static PassesSending passes;
  return passes;
}

void wait_for_the_pass(int pass) {
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> tables;
  {
    std::lock_guard<std::mutex> lock(passes_sending().mutex);
    const auto found = passes_sending().tables.find(pass);
    if (found == passes_sending().tables.end()) return;
    tables = std::move(found->second);
    passes_sending().tables.erase(found);
  }
  std::exception_ptr first;
  size_t failed = 0;
  for (const auto& weak : tables) {
    const c10::intrusive_ptr<c10::StorageImpl> storage = weak.lock();
    if (!storage) continue;
    try {
      device::table_block(c10::Storage(storage))->table().wait_for_answers();
    } catch (...) {
      if (!first) first = std::current_exception();
      ++failed;
    }
  }
  if (failed <= 1) {
    if (first) std::rethrow_exception(first);
    return;
  }
  try {
    std::rethrow_exception(first);
  } catch (const store::StoreError& e) {
    throw store::StoreError(e.code(), std::string(e.what()) + " (and the updates of " + std::to_string(failed - 1) +
                                          " more tables in this backward failed)");
  }
}

void wait_at_end_of_backward(const at::Tensor& weight) {
  if (table_of(weight).row_path_traits().updates_answered_by_next_request) return;
  const int pass = torch::autograd::get_current_graph_task_id();
  {
    std::lock_guard<std::mutex> lock(passes_sending().mutex);
    auto [entry, first_in_pass] = passes_sending().tables.try_emplace(pass);
    entry->second.push_back(weight.storage().getWeakStorageImpl());
    if (!first_in_pass) return;
  }
  torch::autograd::Engine::get_default_engine().queue_callback([pass] { wait_for_the_pass(pass); });
}

// Sends per-row gradients (rows[i] gets grads[i], any duplicates) to the
// table's optimizer.
void update_rows(const at::Tensor& weight, const std::vector<uint64_t>& rows, const at::Tensor& grads) {
  store::TableHandle& table = trained_table(weight);
  // An empty update still counts as a step (Adam's bias correction and
  // Adagrad's lr_decay follow the step count, as in torch). Gradients go in
  // the table's own type, which the store widens to its compute type.
  const at::Tensor g = grads.to(device::scalar_type_of(table.dtype())).contiguous();
  const trace::Range range = device::update_range(table, rows.size(), 0);
  if (answer_at_end_of_backward(table)) {
    table.send_update(rows.data(), rows.size(), g.const_data_ptr());
    wait_at_end_of_backward(weight);
  } else {
    table.update(rows.data(), rows.size(), g.const_data_ptr());
  }
}

// scale_grad_by_freq: each id's gradient divided by how often it occurs in
// the batch, as CPU's backward does.
at::Tensor scale_by_frequency(const at::Tensor& grads, const std::vector<uint64_t>& rows) {
  std::unordered_map<uint64_t, int64_t> counts;
  for (uint64_t r : rows) {
    ++counts[r];
  }
  std::vector<float> scale(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    scale[i] = 1.0f / static_cast<float>(counts[rows[i]]);
  }
  return grads.mul(at::tensor(scale).unsqueeze(1));
}

// The gradient of per_sample_weights on a table: the dot product of each
// id's row with its bag's output gradient (rows gathered in the store, not
// the whole table); padding ids get zero.
at::Tensor per_sample_weights_grad(const at::Tensor& weight, const at::Tensor& indices, const at::Tensor& grad,
                                   const at::Tensor& offset2bag, int64_t padding_idx) {
  const at::Tensor rows = device::CpuAccess(gather(weight, *first_gatherable_row(weight), indices, IdRule::EmbeddingBag,
                                                   "per_sample_weights backward"),
                                            "per_sample_weights backward")
                              .cpu();
  const at::Tensor bag_grads = on_cpu(grad).index_select(0, on_cpu(offset2bag).to(at::kLong));
  // Each weight's gradient is a dot product in the accumulation type, rounded once, as CPU's
  // _embedding_bag_per_sample_weights_backward computes it: float16 and bfloat16 products rounded
  // one by one would land a step away.
  const c10::ScalarType accumulate = at::toOpMathType(rows.scalar_type());
  at::Tensor result = rows.to(accumulate).mul(bag_grads.to(accumulate)).sum(1).to(rows.scalar_type());
  if (padding_idx >= 0) {
    result = result.masked_fill(on_cpu(indices).eq(padding_idx), 0);
  }
  return device::adopt_result(result.contiguous());
}

// Drops the rows whose view row is padding_idx (they get no gradient).
void drop_padding(std::vector<uint64_t>& rows, at::Tensor& grads, uint64_t first_row, int64_t padding_idx) {
  if (padding_idx < 0) {
    return;
  }
  const uint64_t padding_row = first_row + static_cast<uint64_t>(padding_idx);
  std::vector<int64_t> keep;
  keep.reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] != padding_row) {
      keep.push_back(static_cast<int64_t>(i));
    }
  }
  if (keep.size() == rows.size()) {
    return;
  }
  std::vector<uint64_t> kept_rows;
  kept_rows.reserve(keep.size());
  for (int64_t i : keep) {
    kept_rows.push_back(rows[i]);
  }
  rows = std::move(kept_rows);
  grads = grads.index_select(0, at::tensor(keep, at::kLong));
}

// embedding's backward on a table: the rows' gradients to the store.
void table_embedding_backward(const at::Tensor& weight, const at::Tensor& indices, const at::Tensor& grad,
                              int64_t padding_idx, bool scale_grad_by_freq) {
  const auto first = first_gatherable_row(weight);
  TORCH_CHECK(first.has_value(), "recdev: embedding backward into the store needs a table weight");
  std::vector<uint64_t> rows =
      RowIds(indices, weight.size(0), *first, IdRule::Embedding, "embedding backward").to_vector();
  const int64_t row_width = weight.numel() / std::max<int64_t>(weight.size(0), 1);
  at::Tensor grads =
      device::CpuAccess(grad, "embedding backward").cpu().reshape({static_cast<int64_t>(rows.size()), row_width});
  if (scale_grad_by_freq) {
    grads = scale_by_frequency(grads, rows);
  }
  drop_padding(rows, grads, *first, padding_idx);
  update_rows(weight, rows, grads);
}

struct EmbeddingLookup : torch::autograd::Function<EmbeddingLookup> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& weight, const at::Tensor& indices,
                            int64_t padding_idx, bool scale_grad_by_freq, bool sparse) {
    ctx->saved_data["weight"] = weight;
    ctx->saved_data["indices"] = indices;
    ctx->saved_data["padding_idx"] = padding_idx;
    ctx->saved_data["scale_grad_by_freq"] = scale_grad_by_freq;
    ctx->saved_data["sparse"] = sparse;
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return at::embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor weight = ctx->saved_data["weight"].toTensor();
    const at::Tensor indices = ctx->saved_data["indices"].toTensor();
    const int64_t padding_idx = ctx->saved_data["padding_idx"].toInt();
    const bool scale_grad_by_freq = ctx->saved_data["scale_grad_by_freq"].toBool();
    const at::Tensor& grad = grad_outputs[0];
    if (!ctx->needs_input_grad(0)) {
      return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    }
    if (!updates_in_store(weight)) {
      return {at::embedding_backward(grad, indices, weight.size(0), padding_idx, scale_grad_by_freq,
                                     ctx->saved_data["sparse"].toBool()),
              at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    }
    table_embedding_backward(weight, indices, grad, padding_idx, scale_grad_by_freq);
    return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Per-id gradient rows of an embedding_bag: row p gets the gradient of its
// bag, scaled as the mode pooled it (for the bags the store cannot take as
// bag gradients: max, and scale_grad_by_freq).
at::Tensor bag_row_grads(const at::Tensor& grad, const at::Tensor& offset2bag, const at::Tensor& bag_size,
                         const at::Tensor& max_indices, const at::Tensor& ids, const at::Tensor& per_sample_weights,
                         int64_t mode) {
  const at::Tensor bag = offset2bag.to(at::kLong);
  at::Tensor rows = grad.index_select(0, bag);
  if (mode == 0 && per_sample_weights.defined()) {
    rows = rows.mul(per_sample_weights.to(at::kFloat).unsqueeze(1));
  } else if (mode == 1) {
    rows = rows.div(bag_size.index_select(0, bag).clamp_min(1).to(at::kFloat).unsqueeze(1));
  } else if (mode == 2) {
    // Each (bag, element) maximum came from the first position in its bag
    // holding the max row; only that position gets the element's gradient.
    const at::Tensor winners = max_indices.index_select(0, bag);  // [n, dim] row ids
    at::Tensor first_in_bag = at::ones({ids.numel()}, at::kBool);
    const int64_t* id = ids.const_data_ptr<int64_t>();
    const int64_t* b = bag.const_data_ptr<int64_t>();
    bool* first = first_in_bag.data_ptr<bool>();
    std::unordered_set<int64_t> seen;
    for (int64_t p = 0; p < ids.numel(); ++p) {
      if (p == 0 || b[p] != b[p - 1]) {
        seen.clear();
      }
      first[p] = seen.insert(id[p]).second;
    }
    rows = rows.mul(winners.eq(ids.unsqueeze(1)).logical_and(first_in_bag.unsqueeze(1)).to(at::kFloat));
  }
  return rows;
}

// Sum and mean bags: the store spreads each bag's gradient over the bag's
// ids itself while it sums duplicates, so no gradient row per id is
// written out here (a quarter of the bytes at bags of 4, and no more as bags
// grow).
void update_from_bag_grads(const at::Tensor& weight, uint64_t first_row, const std::vector<uint64_t>& rows,
                           const at::Tensor& offsets, const at::Tensor& grad, const at::Tensor& per_sample_weights,
                           int64_t mode, bool include_last_offset, int64_t padding_idx) {
  store::TableHandle& table = trained_table(weight);
  // In the table's type, as update's gradients (a half table's already are: no conversion).
  const at::Tensor bag_grads =
      device::CpuAccess(grad, "embedding_bag backward").cpu().to(device::scalar_type_of(table.dtype())).contiguous();
  const at::Tensor bag_offsets = on_cpu(offsets).to(at::kLong).contiguous();
  const at::Tensor weights =
      per_sample_weights.defined() ? on_cpu(per_sample_weights).to(at::kFloat).contiguous() : at::Tensor();
  const trace::Range range = device::update_range(table, rows.size(), static_cast<size_t>(bag_grads.size(0)));
  const bool answer_later = answer_at_end_of_backward(table);
  const auto update_pooled =
      answer_later ? &store::TableHandle::send_update_pooled : &store::TableHandle::update_pooled;
  (table.*update_pooled)(rows.data(), rows.size(), bag_offsets.const_data_ptr<int64_t>(),
                         static_cast<size_t>(bag_grads.size(0)), static_cast<store::PoolingMode>(mode),
                         weights.defined() ? weights.const_data_ptr<float>() : nullptr, include_last_offset,
                         padding_idx < 0 ? -1 : static_cast<int64_t>(first_row) + padding_idx,
                         bag_grads.const_data_ptr());
  if (answer_later) wait_at_end_of_backward(weight);
}

// _embedding_bag's backward on a table: each id's share of its bag's gradient to the store. With the
// bags' offsets (eager autograd has them; the compiled op's schema does not), sum and mean bags take
// update_from_bag_grads; max bags, scale_grad_by_freq and the compiled op expand a row per id.
void table_embedding_bag_backward_core(const at::Tensor& weight, const at::Tensor& indices, const at::Tensor& grad,
                                       const at::Tensor& offset2bag, const at::Tensor& bag_size,
                                       const at::Tensor& max_indices,
                                       const std::optional<at::Tensor>& per_sample_weights, int64_t mode,
                                       bool scale_grad_by_freq, int64_t padding_idx, const at::Tensor& offsets,
                                       bool include_last_offset) {
  const auto first = first_gatherable_row(weight);
  TORCH_CHECK(first.has_value(), "recdev: embedding_bag backward into the store needs a table weight");
  std::vector<uint64_t> rows =
      RowIds(indices, weight.size(0), *first, IdRule::EmbeddingBag, "embedding_bag backward").to_vector();
  const bool weighted = per_sample_weights.has_value() && per_sample_weights->defined();
  // The store takes the bag gradients of float32 tables, and of the embedded store's half ones
  // (TableHandle::pools_gradients); other tables expand a row per id.
  if (offsets.defined() && mode != 2 && !scale_grad_by_freq && table_of(weight).row_path_traits().pools_gradients) {
    update_from_bag_grads(weight, *first, rows, offsets, grad, weighted ? *per_sample_weights : at::Tensor(), mode,
                          include_last_offset, padding_idx);
    return;
  }
  const at::Tensor ids = on_cpu(indices).to(at::kLong).contiguous();
  at::Tensor grads =
      bag_row_grads(device::CpuAccess(grad, "embedding_bag backward").cpu(), on_cpu(offset2bag), on_cpu(bag_size),
                    on_cpu(max_indices), ids, weighted ? on_cpu(*per_sample_weights) : at::Tensor(), mode);
  if (scale_grad_by_freq) {
    grads = scale_by_frequency(grads, rows);
  }
  drop_padding(rows, grads, *first, padding_idx);
  update_rows(weight, rows, grads);
}

// The compiled graphs' op (registered below).
void table_embedding_bag_backward(const at::Tensor& weight, const at::Tensor& indices, const at::Tensor& grad,
                                  const at::Tensor& offset2bag, const at::Tensor& bag_size,
                                  const at::Tensor& max_indices, const std::optional<at::Tensor>& per_sample_weights,
                                  int64_t mode, bool scale_grad_by_freq, int64_t padding_idx) {
  table_embedding_bag_backward_core(weight, indices, grad, offset2bag, bag_size, max_indices, per_sample_weights, mode,
                                    scale_grad_by_freq, padding_idx, at::Tensor(), false);
}

struct EmbeddingBagLookup : torch::autograd::Function<EmbeddingBagLookup> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& weight, const at::Tensor& indices,
                               const at::Tensor& offsets, bool scale_grad_by_freq, int64_t mode, bool sparse,
                               const std::optional<at::Tensor>& per_sample_weights, bool include_last_offset,
                               int64_t padding_idx) {
    at::Tensor out, offset2bag, bag_size, max_indices;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      std::tie(out, offset2bag, bag_size, max_indices) =
          at::_embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
                             include_last_offset, padding_idx);
    }
    ctx->save_for_backward(
        {weight, indices, offsets, per_sample_weights.value_or(at::Tensor()), offset2bag, bag_size, max_indices});
    ctx->saved_data["mode"] = mode;
    ctx->saved_data["scale_grad_by_freq"] = scale_grad_by_freq;
    ctx->saved_data["sparse"] = sparse;
    ctx->saved_data["padding_idx"] = padding_idx;
    ctx->saved_data["include_last_offset"] = include_last_offset;
    ctx->mark_non_differentiable({offset2bag, bag_size, max_indices});
    return {out, offset2bag, bag_size, max_indices};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &weight = saved[0], &indices = saved[1], &offsets = saved[2], &per_sample_weights = saved[3],
                     &offset2bag = saved[4], &bag_size = saved[5], &max_indices = saved[6];
    const int64_t mode = ctx->saved_data["mode"].toInt();
    const int64_t padding_idx = ctx->saved_data["padding_idx"].toInt();
    const at::Tensor& grad = grad_outputs[0];
    at::Tensor grad_per_sample_weights;
    if (per_sample_weights.defined() && ctx->needs_input_grad(3)) {  // edges: weight, indices, offsets, weights
      grad_per_sample_weights = updates_in_store(weight)
                                    ? per_sample_weights_grad(weight, indices, grad, offset2bag, padding_idx)
                                    : at::_embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets,
                                                                                     offset2bag, mode, padding_idx);
    }
    if (!ctx->needs_input_grad(0)) {
      return {{}, {}, {}, {}, {}, {}, grad_per_sample_weights, {}, {}};
    }
    if (!updates_in_store(weight)) {
      const at::Tensor grad_weight = at::_embedding_bag_backward(
          grad, indices, offsets, offset2bag, bag_size, max_indices, weight.size(0),
          ctx->saved_data["scale_grad_by_freq"].toBool(), mode, ctx->saved_data["sparse"].toBool(),
          per_sample_weights.defined() ? std::optional<at::Tensor>(per_sample_weights) : std::nullopt, padding_idx);
      return {grad_weight, {}, {}, {}, {}, {}, grad_per_sample_weights, {}, {}};
    }
    table_embedding_bag_backward_core(
        weight, indices, grad, offset2bag, bag_size, max_indices,
        per_sample_weights.defined() ? std::optional<at::Tensor>(per_sample_weights) : std::nullopt, mode,
        ctx->saved_data["scale_grad_by_freq"].toBool(), padding_idx, offsets,
        ctx->saved_data["include_last_offset"].toBool());
    return {{}, {}, {}, {}, {}, {}, grad_per_sample_weights, {}, {}};
  }
};

// Forward-mode AD (torch.func.jvp, torch.autograd.forward_ad): a C++ autograd Function has no jvp,
// so the kernels below compute the output's tangent themselves, with the Functions run under
// forward AD turned off. A lookup is linear in the weight, and a sum or mean bag also in the
// per-sample weights: the tangent is the same lookup of the tangents.
at::Tensor embedding_autograd(const at::Tensor& weight, const at::Tensor& indices, c10::SymInt padding_idx,
                              bool scale_grad_by_freq, bool sparse) {
  const at::Tensor weight_tangent = weight._fw_grad(/*level=*/0);
  if (!weight_tangent.defined()) {
    return EmbeddingLookup::apply(weight, indices, padding_idx.expect_int(), scale_grad_by_freq, sparse);
  }
  at::Tensor out;
  {
    c10::AutoFwGradMode no_forward_ad(false);
    out = EmbeddingLookup::apply(weight, indices, padding_idx.expect_int(), scale_grad_by_freq, sparse);
  }
  at::Tensor tangent;
  {
    c10::AutoFwGradMode no_forward_ad(false);
    tangent = at::embedding(weight_tangent, indices, padding_idx.expect_int(), scale_grad_by_freq, sparse);
  }
  out._set_fw_grad(tangent, /*level=*/0, /*is_inplace_op=*/false);
  return out;
}

// The tangent of an embedding bag's output: in max mode each element is its maximum's row's tangent
// (max_indices says which row; an empty bag's output and tangent are 0), otherwise the bag of the weight's tangent plus
// the bag of the per-sample weights' tangent.
at::Tensor embedding_bag_tangent(const at::Tensor& weight, const at::Tensor& indices, const at::Tensor& offsets,
                                 bool scale_grad_by_freq, int64_t mode, const std::optional<at::Tensor>& weights,
                                 bool include_last_offset, int64_t padding_idx, const at::Tensor& bag_size,
                                 const at::Tensor& max_indices) {
  const at::Tensor weight_tangent = weight._fw_grad(/*level=*/0);
  const at::Tensor weights_tangent = weights.has_value() ? weights->_fw_grad(/*level=*/0) : at::Tensor();
  c10::AutoFwGradMode no_forward_ad(false);  // the tangent is a plain tensor: no tangent of its own
  const auto bag = [&](const at::Tensor& table, const std::optional<at::Tensor>& per_sample) {
    return std::get<0>(at::_embedding_bag(table, indices, offsets, scale_grad_by_freq, mode, /*sparse=*/false,
                                          per_sample, include_last_offset, padding_idx));
  };
  constexpr int64_t kMaxMode = 2;
  if (mode == kMaxMode) {
    if (!weight_tangent.defined()) {
      return {};
    }
    const at::Tensor picked = weight_tangent.gather(0, max_indices.clamp_min(0).to(at::kLong));
    return picked.masked_fill(bag_size.eq(0).unsqueeze(1), 0);
  }
  at::Tensor tangent;
  if (weight_tangent.defined()) {
    tangent = bag(weight_tangent, weights);
  }
  if (weights_tangent.defined()) {
    const at::Tensor from_weights = bag(weight, weights_tangent);
    tangent = tangent.defined() ? tangent.add(from_weights) : from_weights;
  }
  return tangent;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> embedding_bag_autograd(
    const at::Tensor& weight, const at::Tensor& indices, const at::Tensor& offsets, bool scale_grad_by_freq,
    int64_t mode, bool sparse, const std::optional<at::Tensor>& per_sample_weights, bool include_last_offset,
    int64_t padding_idx) {
  // An absent (or undefined) tensor must not be a Function input.
  const std::optional<at::Tensor> weights =
      per_sample_weights.has_value() && per_sample_weights->defined() ? per_sample_weights : std::nullopt;
  const bool forward_ad =
      weight._fw_grad(/*level=*/0).defined() || (weights.has_value() && weights->_fw_grad(/*level=*/0).defined());
  if (!forward_ad) {
    const auto outs = EmbeddingBagLookup::apply(weight, indices, offsets, scale_grad_by_freq, mode, sparse, weights,
                                                include_last_offset, padding_idx);
    return {outs[0], outs[1], outs[2], outs[3]};
  }
  torch::autograd::variable_list outs;
  {
    c10::AutoFwGradMode no_forward_ad(false);
    outs = EmbeddingBagLookup::apply(weight, indices, offsets, scale_grad_by_freq, mode, sparse, weights,
                                     include_last_offset, padding_idx);
  }
  const at::Tensor tangent = embedding_bag_tangent(weight, indices, offsets, scale_grad_by_freq, mode, weights,
                                                   include_last_offset, padding_idx, outs[2], outs[3]);
  if (tangent.defined()) {
    outs[0]._set_fw_grad(tangent, /*level=*/0, /*is_inplace_op=*/false);
  }
  return {outs[0], outs[1], outs[2], outs[3]};
}

// torch.embedding_bag calls _embedding_bag_forward_only when nothing requires a gradient, which
// includes a forward-AD dual: such a call goes through the kernel above, like any differentiable one.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> embedding_bag_forward_only_autograd(
    const at::Tensor& weight, const at::Tensor& indices, const at::Tensor& offsets, bool scale_grad_by_freq,
    int64_t mode, bool sparse, const std::optional<at::Tensor>& per_sample_weights, bool include_last_offset,
    int64_t padding_idx) {
  const bool weighted = per_sample_weights.has_value() && per_sample_weights->defined();
  const bool differentiable =
      weight.requires_grad() || weight._fw_grad(/*level=*/0).defined() ||
      (weighted && (per_sample_weights->requires_grad() || per_sample_weights->_fw_grad(/*level=*/0).defined()));
  if (differentiable) {
    return embedding_bag_autograd(weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
                                  include_last_offset, padding_idx);
  }
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return at::_embedding_bag_forward_only(weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
                                         include_last_offset, padding_idx);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("embedding", embedding_autograd);
  m.impl("_embedding_bag", embedding_bag_autograd);
  m.impl("_embedding_bag_forward_only", embedding_bag_forward_only_autograd);
}

// The table halves of the backward above as ops of their own, for graphs that torch.compile traces
// (torch_recdev/traced_lookups.py): a compiled backward calls them where eager autograd calls the
// functions. The two that update change the store through the table's fused optimizer and no tensor
// a graph reads (lookups read the store), so their schemas mutate nothing and traced_lookups.py
// registers them as side-effecting: declared as mutating the weight, AOTAutograd would functionalize
// them and clone the whole table on every step.
TORCH_LIBRARY_FRAGMENT(recdev, m) {
  m.def(
      "table_embedding_backward(Tensor weight, Tensor indices, Tensor grad, int padding_idx, "
      "bool scale_grad_by_freq) -> ()");
  m.def(
      "table_embedding_bag_backward(Tensor weight, Tensor indices, Tensor grad, Tensor offset2bag, "
      "Tensor bag_size, Tensor max_indices, Tensor? per_sample_weights, int pooling_mode, bool scale_grad_by_freq, "
      "int padding_idx) -> ()");
  m.def(
      "table_embedding_bag_per_sample_weights_backward(Tensor weight, Tensor indices, Tensor grad, "
      "Tensor offset2bag, int padding_idx) -> Tensor");
}

TORCH_LIBRARY_IMPL(recdev, PrivateUse1, m) {
  m.impl("table_embedding_backward", table_embedding_backward);
  m.impl("table_embedding_bag_backward", table_embedding_bag_backward);
  m.impl("table_embedding_bag_per_sample_weights_backward", per_sample_weights_grad);
}

}  // namespace recdev::kernels
