// Fused optimizers: the update rule a table applies to its rows (Table::update), with its per-row
// state kept after the weight in the row's record (table.h).
//
// Every optimizer is lazy, like PyTorch's sparse-gradient optimizers: an update moves only the rows
// it names; the others, and their state, stay exactly as they were. Duplicate ids in one update are
// summed first, in float32 and in batch order, as torch's sparse coalesce does (its sort is not
// stable, so with three or more duplicates torch's sum may differ in the last bit), then the rule
// runs once per distinct row. `step` is per table: every Table::update call increments it once,
// before the rows move (an empty update included, as optimizer.step() on a present but empty sparse
// gradient does).
//
// Per row, with g the row's summed gradient, w its weight, and float32 math in torch's order of
// operations (scalars computed in double, then rounded to float, as torch does; torch's
// a.add(b, alpha=s) is one fused multiply-add, std::fma here):
//
//   SGD             torch.optim.SGD without momentum:
//                     g += weight_decay * w;  w += (-lr) * g
//                   (torch decays every row when weight_decay != 0, even for sparse gradients; here,
//                   as everywhere in the store, only the rows of the update move.)
//   Adagrad         torch.optim.Adagrad, sparse-gradient branch of _single_tensor_adagrad:
//                     clr = lr / (1 + (step - 1) * lr_decay)
//                     sum += g * g;  w += (-clr) * (g / (sqrt(sum) + eps))
//                   state: sum (dim floats), which starts at initial_accumulator_value.
//                   weight_decay: torch refuses it with sparse gradients; here it is supported as
//                   g += weight_decay * w before the rest (the dense branch's L2 term), on the rows of
//                   the update only.
//   RowWiseAdagrad  fbgemm_gpu's EXACT_ROWWISE_ADAGRAD with weight_decay_mode = 1 (L2), as in
//                   rowwise_adagrad() of fbgemm_gpu/codegen/genscript/optimizers.py (pytorch/FBGEMM),
//                   CPU kernel (split_weight_update_cpu), accumulating in double:
//                     g' = g + weight_decay * w                    (only for the mean square)
//                     acc += mean over the row of g'^2              (one accumulator per row: the mean,
//                                                                    not the sum)
//                     multiplier = lr / (sqrt(acc) + eps)           (eps outside the sqrt)
//                     correction = 1 - multiplier * weight_decay
//                     w = correction * w - multiplier * g           (= w - multiplier * g')
//                   state: acc (1 float), starting at 0.
//   Adam            torch.optim.SparseAdam (torch/optim/_functional.py sparse_adam):
//                     m += (g - m) * (1 - beta1);  v += (g * g - v) * (1 - beta2)
//                     step_size = lr * sqrt(1 - beta2^step) / (1 - beta1^step)
//                     w += (-step_size) * (m / (sqrt(v) + eps))
//                   state: m (dim floats) then v (dim floats), starting at 0.
//
// Stochastic rounding (float16 and bfloat16 tables only; Table::set_optimizer refuses it on the
// others): the float32 result of the update is rounded to one of the two half values around it, the
// upper with probability (x - lower) / (upper - lower), so that the rounding is unbiased: updates
// smaller than half a unit in the last place, which round-to-nearest drops every time, move the row
// on average as the float32 math does. The random bits are a pure function of (rounding_seed, row
// id, step, column) (rounding_bits below): the caller draws a seed per table, and a run repeats.
//
// A parameter the kind does not use must keep its default value (an Adam with weight_decay would
// otherwise silently not decay); validate_optimizer refuses anything else.
#pragma once

#include <cstdint>
#include <string>

#include "element_type.h"

namespace recdev::store {

// Numeric values are stored in checkpoint files: never renumber, only append.
enum class OptimizerKind : uint32_t { None = 0, SGD = 1, Adagrad = 2, RowWiseAdagrad = 3, Adam = 4 };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::None;
  double lr = 0.01;
  double weight_decay = 0;               // SGD, Adagrad, RowWiseAdagrad
  double eps = 1e-10;                    // Adagrad, RowWiseAdagrad, Adam
  double lr_decay = 0;                   // Adagrad
  double initial_accumulator_value = 0;  // Adagrad
  double beta1 = 0.9;                    // Adam
  double beta2 = 0.999;                  // Adam
  bool stochastic_rounding = false;      // any kind but None; float16/bfloat16 tables
  uint64_t rounding_seed = 0;            // with stochastic_rounding only (0 otherwise)
};

// Bitwise equality of every field.
bool operator==(const OptimizerConfig& lhs, const OptimizerConfig& rhs);
bool operator!=(const OptimizerConfig& lhs, const OptimizerConfig& rhs);

// Optimizer-state words per row: None and SGD 0, Adagrad dim, RowWiseAdagrad 1, Adam 2 * dim.
uint32_t optimizer_state_elements(OptimizerKind kind, uint32_t dim);

// The value every state float of a newly materialized row starts at (Adagrad:
// initial_accumulator_value; otherwise 0).
float optimizer_initial_state(const OptimizerConfig& config);

// "SGD, Adagrad, RowWiseAdagrad, Adam": for error messages.
const char* optimizer_names();

// Throws StoreError(InvalidArgument) naming the problem unless: the kind is known; lr, eps,
// weight_decay, lr_decay and initial_accumulator_value are finite and >= 0; 0 <= beta1, beta2 < 1;
// and every parameter the kind does not use has its default value.
void validate_optimizer(const OptimizerConfig& config);

// A readable form with the parameters the kind uses, e.g. "Adagrad(lr=0.1, lr_decay=0, ...)".
std::string describe(const OptimizerConfig& config);

// The key of one row's rounding bits in one step: a hash of (seed, row id, step).
uint64_t rounding_key(uint64_t seed, uint64_t row_id, uint64_t step);

// One update's rule, with its per-update scalars computed once: apply() moves one row.
// Precondition: validate_optimizer(config) passed and config.kind != None.
class RowUpdate {
 public:
  RowUpdate(const OptimizerConfig& config, uint64_t step, uint32_t dim);
  // weight: dim floats, state: optimizer_state_elements(kind, dim) floats, grad: dim floats (the row's
  // summed gradient).
  void apply(float* weight, float* state, const float* grad) const;
  // The same rule in float64, for float64 tables: every scalar and every operation in double (torch's
  // float64 optimizers), the state in double too.
  void apply(double* weight, double* state, const double* grad) const;
  // A Float16 or BFloat16 row: widened, updated as apply(float*) updates it, each weight rounded once
  // to nearest even. scratch: dim floats the rule may use for the widened row.
  void apply_half(ElementType type, void* weight, float* state, const float* grad, float* scratch) const;
  // The same with the gradient in the row's own type (widened exactly: the same update as with its
  // float32 values). scratch: 2 * dim floats.
  void apply_half(ElementType type, void* weight, float* state, const uint16_t* grad, float* scratch) const;
  bool stochastic_rounding() const { return stochastic_rounding_; }
  // The key of the rounding bits of row_id in this update (with stochastic_rounding()).
  uint64_t rounding_key(uint64_t row_id) const { return store::rounding_key(rounding_seed_, row_id, step_); }

 private:
  // RowWiseAdagrad on a half row in registers (where the CPU has AVX2, FMA and F16C): whether it did.
  template <class Grad>
  bool rowwise_half_in_registers(ElementType type, void* weight, float* state, const Grad* grad) const;
  // Any other rule on a half row: widened into scratch (dim floats), apply(float*), narrowed back.
  void apply_widened(ElementType type, void* weight, float* state, const float* grad, float* scratch) const;

  OptimizerKind kind_;
  uint32_t dim_;
  bool stochastic_rounding_;
  uint64_t rounding_seed_;
  uint64_t step_;
  double lr_;
  double eps_;
  double weight_decay_;
  double beta1_;
  double beta2_;
  float lr_f_;             // SGD
  float weight_decay_f_;   // SGD, Adagrad
  float eps_f_;            // Adagrad, Adam
  float neg_clr_f_;        // Adagrad: -clr
  float one_minus_beta1_;  // Adam
  float one_minus_beta2_;  // Adam
  float neg_step_size_f_;  // Adam: -step_size
  double neg_clr_;         // Adagrad, float64
  double neg_step_size_;   // Adam, float64

  template <class T>
  void apply_scalar(T* weight, T* state, const T* grad, uint32_t done, T lr, T weight_decay, T eps, T neg_clr,
                    T one_minus_beta1, T one_minus_beta2, T neg_step_size) const;
};

}  // namespace recdev::store
