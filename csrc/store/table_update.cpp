// Table's fused optimizer: attaching one, and updates from per-row or pooled gradients.
#include "table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "coalesce.h"
#include "errors.h"
#include "gradient_check.h"
#include "pooled_gradients.h"
#include "prefetch.h"
#include "table_internals.h"
#include "task_runner.h"

namespace recdev::store {
namespace {

// Batches of at least this many ids spread an update over more than one thread.
constexpr size_t kUpdateIdsPerThread = 4096;

// Gradient rows per task of the finite check: 64 KiB at dim 128.
constexpr size_t kFiniteCheckRows = 128;

void require_optimizer(uint64_t table, OptimizerKind kind) {
  if (kind == OptimizerKind::None) {
    throw StoreError(ErrorCode::InvalidArgument, "table " + std::to_string(table) +
                                                     " has no optimizer: attach one with set_optimizer (" +
                                                     optimizer_names() + ") before update");
  }
}

}  // namespace

void Table::check_stochastic_rounding(const OptimizerConfig& config) const {
  if (!config.stochastic_rounding || dtype_ == ElementType::Float16 || dtype_ == ElementType::BFloat16) return;
  throw StoreError(ErrorCode::InvalidArgument,
                   "table " + std::to_string(id_) + " holds " + element_type_name(dtype_) +
                       " rows: stochastic_rounding applies to float16 and bfloat16 tables only (their float32 "
                       "update is rounded to 16 bits; " +
                       element_type_name(dtype_) + " rows are not rounded)");
}

void Table::set_optimizer(const OptimizerConfig& config) {
  validate_optimizer(config);
  if (config.kind != OptimizerKind::None) require_numeric(("attaching optimizer " + describe(config)).c_str());
  check_stochastic_rounding(config);
  const uint32_t new_state_words = optimizer_state_words(config.kind, dtype_, row_words_);
  check_record_words(new_state_words);
  // float64 tables keep the value exactly; the others hold it in float32.
  const double new_initial_state = config.kind == OptimizerKind::Adagrad ? config.initial_accumulator_value : 0.0;
  const uint32_t new_record_floats = row_words_ + new_state_words;

  std::vector<RowIndex> old_rows;  // freed after the locks are released
  std::unique_lock<std::mutex> policy_lock(policy_mutex_);
  // The rows on disk are re-laid first, into a new tier: a failing disk leaves the table as it was.
  std::unique_ptr<DiskTier> relaid_disk;
  {
    std::shared_lock<std::shared_mutex> request(request_mutex_);
    const bool kind_changed = config.kind != optimizer_.kind;
    if (disk_ &&
        (disk_->record_words() != new_record_floats || (kind_changed && new_state_words > 0 && disk_->size() > 0))) {
      relaid_disk = std::make_unique<DiskTier>(id_, new_record_floats, policy_->config().max_disk_bytes);
      std::vector<float> relaid(new_record_floats);
      disk_->for_each([&](uint64_t id, const float* record) {
        const uint32_t keep = kind_changed ? row_words_ : std::min(record_words_, new_record_floats);
        std::memcpy(relaid.data(), record, size_t{keep} * sizeof(float));
        fill_state_words(dtype_, relaid.data() + keep, new_record_floats - keep, new_initial_state);
        relaid_disk->stage(id, relaid.data());
      });
      relaid_disk->flush();
    }
  }
  std::unique_lock<std::shared_mutex> request(request_mutex_);
  auto locks = lock_all_shards();
  if (relaid_disk) disk_ = std::move(relaid_disk);
  const bool kind_changed = config.kind != optimizer_.kind;
  if (kind_changed || new_state_words != state_words_) forget_change_chains();
  if (new_state_words != state_words_) {
    // Build every new sub-shard before changing any, so that running out of memory leaves the table
    // as it was.
    std::vector<RowIndex> relaid;
    relaid.reserve(kNumShards);
    for (const Shard& shard : shards_) {
      RowIndex& index = relaid.emplace_back(new_record_floats);
      const uint32_t copy_floats = std::min(record_words_, new_record_floats);
      shard.rows.for_each([&](uint64_t row_id, const float* record) {
        float* destination = index.find_or_insert(row_id, hash_row_id(row_id)).first;
        std::memcpy(destination, record, size_t{copy_floats} * sizeof(float));
        // With the same kind (None with raw state only: an optimizer fixes its width) the state
        // that fits is kept; otherwise it restarts.
        const uint32_t keep = kind_changed ? row_words_ : copy_floats;
        fill_state_words(dtype_, destination + keep, new_record_floats - keep, new_initial_state);
      });
    }
    old_rows.reserve(kNumShards);
    for (size_t s = 0; s < kNumShards; ++s) {
      old_rows.push_back(std::move(shards_[s].rows));
      shards_[s].rows = std::move(relaid[s]);
    }
    reindex_all_rows();
  } else if (kind_changed && new_state_words > 0) {
    for (Shard& shard : shards_) {
      shard.rows.for_each([&](uint64_t, const float* record) {
        // for_each hands out const records of rows this thread holds exclusively.
        float* state = const_cast<float*>(record) + row_words_;
        fill_state_words(dtype_, state, new_state_words, new_initial_state);
      });
    }
  }
  {
    std::lock_guard<std::mutex> init_lock(init_mutex_);
    state_words_ = new_state_words;
    record_words_ = new_record_floats;
    initial_state_ = new_initial_state;
  }
  optimizer_ = config;
  if (kind_changed) step_.store(0);
  locks.clear();
  request.unlock();
  if (policy_) {
    // Wider records shrink a byte budget's rows.
    policy_->set_record_bytes(uint64_t{new_record_floats} * sizeof(float));
    if (policy_->config().evict != EvictKind::None) evict_now(policy_->enforce(steady_seconds(), held_rows()));
  }
}

OptimizerConfig Table::optimizer() const {
  std::shared_lock<std::shared_mutex> lock(request_mutex_);
  return optimizer_;
}

void Table::set_learning_rate(double lr) {
  std::unique_lock<std::shared_mutex> lock(request_mutex_);
  if (optimizer_.kind == OptimizerKind::None) {
    throw StoreError(ErrorCode::InvalidArgument,
                     "table " + std::to_string(id_) +
                         " has no optimizer to set the learning rate of; the optimizers are " + optimizer_names());
  }
  OptimizerConfig config = optimizer_;
  config.lr = lr;
  validate_optimizer(config);
  optimizer_ = config;
}

uint64_t Table::optimizer_step() const {
  std::shared_lock<std::shared_mutex> lock(request_mutex_);
  return step_.load();
}

void Table::set_optimizer_step(uint64_t step) {
  std::unique_lock<std::shared_mutex> lock(request_mutex_);
  step_.store(step);
}

void Table::update(const uint64_t* ids, size_t n, const void* grads) {
  check_ids(ids, n);
  require_numeric("update");
  const size_t elements = elements_;
  const size_t count = n * elements;
  const auto run = [&](const auto* values) {
    using G = std::remove_const_t<std::remove_pointer_t<decltype(values)>>;
    std::vector<const G*> rows(n);
    for (size_t i = 0; i < n; ++i) rows[i] = values + i * elements;
    apply_gradients_with_policy<G>(ids, n, rows.data(), values, count);
  };
  switch (dtype_) {
    case ElementType::Float32: run(static_cast<const float*>(grads)); return;
    case ElementType::Float64: {
      // Copied: a request's payload need not be 8-byte aligned.
      std::vector<double> wide(count);
      if (count > 0) std::memcpy(wide.data(), grads, count * sizeof(double));
      run(static_cast<const double*>(wide.data()));
      return;
    }
    default: run(static_cast<const uint16_t*>(grads)); return;  // half: widened as the rule loads them
  }
}

void Table::update_pooled(const uint64_t* ids, size_t num_ids, const int64_t* offsets, size_t num_bags,
                          PoolingMode mode, const float* per_sample_weights, bool include_last_offset,
                          int64_t padding_idx, const void* bag_grads) {
  if (!computes_in_float32(dtype_)) {
    throw StoreError(ErrorCode::InvalidArgument, "update_pooled of table " + std::to_string(id_) +
                                                     " refused: the store pools float32, float16 "
                                                     "and bfloat16 tables; a " +
                                                     describe(dtype_) + " table takes per-id gradients (update)");
  }
  const EmbeddingBag bag{ids, num_ids, offsets, num_bags, include_last_offset, mode, per_sample_weights, padding_idx};
  validate_embedding_bag(bag, num_rows_);
  check_ids(ids, num_ids);
  const auto run = [&](const auto* typed_bag_grads) {
    using G = std::remove_const_t<std::remove_pointer_t<decltype(typed_bag_grads)>>;
    const PooledGradients<G> gradients(bag, typed_bag_grads, elements_, dtype_);
    apply_gradients_with_policy<G>(gradients.ids(), gradients.size(), gradients.rows(), gradients.values(),
                                   gradients.value_count());
  };
  if (dtype_ == ElementType::Float32) {
    run(static_cast<const float*>(bag_grads));
  } else {
    run(static_cast<const uint16_t*>(bag_grads));
  }
}

template <class G>
void Table::apply_gradients(const uint64_t* ids, size_t n, const G* const* grads, const G* values, size_t value_count,
                            bool gradients_checked) {
  std::shared_lock<std::shared_mutex> request(request_mutex_);
  require_optimizer(id_, optimizer_.kind);
  const size_t threads = threads_for(n, kUpdateIdsPerThread);
  if (!gradients_checked) check_gradients(ids, n, grads, values, value_count, threads);
  apply_coalesced(coalesce_or_refuse(ids, n, grads, threads), threads);
}

template <class G>
CoalescedGradients<G> Table::coalesce_or_refuse(const uint64_t* ids, size_t n, const G* const* grads,
                                                size_t threads) const {
  CoalescedGradients<G> coalesced(ids, n, grads, dtype_, elements_, threads);
  if (const auto overflow = coalesced.first_overflow()) {
    refuse_overflowing_sum(overflow->row_id, overflow->column, "table " + std::to_string(id_));
  }
  return coalesced;
}

template <class G>
void Table::apply_coalesced(const CoalescedGradients<G>& coalesced, size_t threads) {
  const uint64_t step = step_.fetch_add(1) + 1;
  const RowUpdate rule(optimizer_, step, elements_);
  run_tasks(kNumShards, threads, [&](size_t s) { apply_update<G>(shards_[s], coalesced.rows(s), rule); });
  updates_.fetch_add(coalesced.size(), std::memory_order_relaxed);
}

template <class G>
void Table::apply_gradients_with_policy(const uint64_t* ids, size_t n, const G* const* grads, const G* values,
                                        size_t value_count) {
  PolicyPass pass = open_policy_pass();
  if (!pass.policed()) {
    apply_gradients<G>(ids, n, grads, values, value_count);
    return;
  }
  // Everything apply_gradients refuses (no optimizer, a non-finite gradient, a sum that overflows) is
  // refused before the policy counts a touch, evicts a row or admits one: a refused update changes
  // nothing.
  const size_t threads = threads_for(n, kUpdateIdsPerThread);
  std::optional<CoalescedGradients<G>> coalesced;
  {
    std::shared_lock<std::shared_mutex> request(request_mutex_);
    require_optimizer(id_, optimizer_.kind);
    check_gradients(ids, n, grads, values, value_count, threads);
    coalesced.emplace(coalesce_or_refuse(ids, n, grads, threads));
  }
  decide(pass, ids, n, Touch::Update);
  if (pass.decision->all_stored) {
    std::shared_lock<std::shared_mutex> request(request_mutex_);
    require_optimizer(id_, optimizer_.kind);
    apply_coalesced(*coalesced, threads);
    return;
  }
  // Rows pending admission keep their init value: their gradients are dropped (a row's sum is the
  // same in the subset, so it cannot overflow there).
  std::vector<uint64_t> stored_ids;
  std::vector<const G*> stored_grads;
  for (size_t i = 0; i < n; ++i) {
    if (!pass.decision->stored[i]) continue;
    stored_ids.push_back(ids[i]);
    stored_grads.push_back(grads[i]);
  }
  apply_gradients<G>(stored_ids.data(), stored_ids.size(), stored_grads.data(), values, value_count,
                     /*gradients_checked=*/true);
}

template <class G>
void Table::check_gradients(const uint64_t* ids, size_t n, const G* const* grads, const G* values, size_t value_count,
                            size_t threads) const {
  const size_t dim = elements_;
  const size_t chunk_floats = kFiniteCheckRows * dim;
  const size_t num_chunks = (value_count + chunk_floats - 1) / chunk_floats;
  std::atomic<bool> all_ok{true};
  run_tasks(num_chunks, threads, [&](size_t chunk) {
    const size_t first = chunk * chunk_floats;
    if (!all_finite_values(dtype_, values + first, std::min(chunk_floats, value_count - first))) {
      all_ok.store(false, std::memory_order_relaxed);
    }
  });
  if (all_ok.load()) return;
  // Name the first bad value in batch order (a bad value no id's row holds is harmless).
  refuse_first_non_finite(dtype_, ids, n, grads, elements_, "table " + std::to_string(id_));
}

template <class G>
void Table::apply_update(Shard& shard, const std::vector<typename CoalescedGradients<G>::Row>& rows,
                         const RowUpdate& rule) {
  using Sum = typename CoalescedGradients<G>::Sum;
  if (rows.empty()) return;
  std::unique_lock<std::shared_mutex> lock(shard.mutex);
  const size_t record_bytes = size_t{record_words_} * sizeof(float);
  const size_t grad_bytes = size_t{elements_} * sizeof(G);
  const size_t sum_bytes = size_t{elements_} * sizeof(Sum);
  const size_t state_words = record_words_ - row_words_;
  // Half rows are updated in float32 with their float32 state in place and rounded once (scratch:
  // the widened row and gradient); float64 records are copied out and back (a record's words need not
  // be 8-byte aligned for a double's access rules).
  std::vector<Sum> scratch(std::is_same_v<G, float> ? 0 : 2 * size_t{elements_});
  std::vector<double> state(std::is_same_v<G, double> ? state_words / 2 : 0);
  for_each_prefetched(
      shard.rows, rows.size(), record_bytes, [&](size_t k) { return rows[k].hash; },
      [&](size_t k) {
        if (rows[k].grad != nullptr) {
          prefetch_range(rows[k].grad, grad_bytes);
        } else {
          prefetch_range(rows[k].sum, sum_bytes);
        }
      },
      [&](size_t k, float* found) {
        const auto& row = rows[k];
        float* record = found != nullptr ? found : materialize(shard, row.id, row.hash);
        note_changed(shard, row.id);
        if constexpr (std::is_same_v<G, double>) {
          std::memcpy(scratch.data(), record, elements_ * sizeof(double));
          std::memcpy(state.data(), record + row_words_, state_words * sizeof(float));
          rule.apply(scratch.data(), state.data(), row.sum != nullptr ? row.sum : row.grad);
          std::memcpy(record, scratch.data(), elements_ * sizeof(double));
          std::memcpy(record + row_words_, state.data(), state_words * sizeof(float));
        } else if constexpr (std::is_same_v<G, float>) {
          rule.apply(record, record + row_words_, row.sum != nullptr ? row.sum : row.grad);
        } else if (rule.stochastic_rounding()) {
          const float* grad = row.sum;
          if (grad == nullptr) {
            widen_to_float(dtype_, row.grad, scratch.data() + elements_, elements_);
            grad = scratch.data() + elements_;
          }
          widen_to_float(dtype_, record, scratch.data(), elements_);
          rule.apply(scratch.data(), record + row_words_, grad);
          narrow_stochastic(dtype_, scratch.data(), record, elements_, rule.rounding_key(row.id));
        } else if (row.sum != nullptr) {
          rule.apply_half(dtype_, record, record + row_words_, row.sum, scratch.data());
        } else {
          rule.apply_half(dtype_, record, record + row_words_, row.grad, scratch.data());
        }
      });
}

uint32_t Table::gather_state(const uint64_t* ids, size_t n, std::vector<float>& out) const {
  check_ids(ids, n);
  // Shared: the state width cannot change meanwhile (set_optimizer and install are exclusive).
  std::shared_lock<std::shared_mutex> request(request_mutex_);
  const uint32_t width = state_words_;
  out.assign(n * width, 0.0f);
  if (width == 0) return 0;
  std::vector<float> on_disk(record_words_);
  find_each_read_locked(ids, n, [&](size_t position, const float* record) {
    float* destination = out.data() + position * width;
    if (record != nullptr) {
      std::memcpy(destination, record + row_words_, size_t{width} * sizeof(float));
    } else if (disk_ && disk_->read_one(ids[position], on_disk.data())) {
      std::memcpy(destination, on_disk.data() + row_words_, size_t{width} * sizeof(float));
    } else {
      fill_state_words(dtype_, destination, width, initial_state_);
    }
  });
  return width;
}

}  // namespace recdev::store
