#include "optimizer.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>

#include "cpu_features.h"
#include "errors.h"
#ifdef RECDEV_STORE_AVX2_KERNELS
#include <immintrin.h>
#endif

namespace recdev::store {
namespace {

constexpr uint32_t kLastKind = uint32_t(OptimizerKind::Adam);

std::string format_number(double value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

const char* kind_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::None: return "None";
    case OptimizerKind::SGD: return "SGD";
    case OptimizerKind::Adagrad: return "Adagrad";
    case OptimizerKind::RowWiseAdagrad: return "RowWiseAdagrad";
    case OptimizerKind::Adam: return "Adam";
  }
  return nullptr;
}

// Which parameters a kind uses.
struct Uses {
  bool lr, weight_decay, eps, lr_decay, initial_accumulator_value, betas;
};

Uses uses(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::None: return {false, false, false, false, false, false};
    case OptimizerKind::SGD: return {true, true, false, false, false, false};
    case OptimizerKind::Adagrad: return {true, true, true, true, true, false};
    case OptimizerKind::RowWiseAdagrad: return {true, true, true, false, false, false};
    case OptimizerKind::Adam: return {true, false, true, false, false, true};
  }
  return {};
}

// splitmix64's finalizer.
uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

bool same_bits(double lhs, double rhs) { return std::memcmp(&lhs, &rhs, sizeof(double)) == 0; }

// RowWiseAdagrad (see RowUpdate::apply): the decayed gradient's squares of elements [begin, end),
// summed in order into sum_square. Without weight decay the weights are not read (as torch.optim
// adds no decay term then), which only a non-finite weight could tell apart: 0 * inf or 0 * nan
// made the whole row's square sum nan, where now only that element stays nan.
template <class T>
double rowwise_square_sum(const T* weight, const T* grad, uint32_t begin, uint32_t end, double weight_decay,
                          double sum_square) {
  for (uint32_t d = begin; d < end; ++d) {
    const double g = weight_decay != 0 ? double(grad[d]) + weight_decay * double(weight[d]) : double(grad[d]);
    sum_square += g * g;
  }
  return sum_square;
}

// RowWiseAdagrad's per-row scalars: adds the row's mean square to its accumulator (state[0]) and
// returns {multiplier, correction}, the weight's new value being correction * w - multiplier * g.
template <class T>
std::pair<double, double> rowwise_scalars(T* state, double sum_square, uint32_t dim, double lr, double weight_decay,
                                          double eps) {
  const double accumulator = double(state[0]) + sum_square / dim;
  state[0] = T(accumulator);
  const double multiplier = lr / (std::sqrt(accumulator) + eps);
  return {multiplier, 1.0 - multiplier * weight_decay};
}

// Adagrad's rule (see RowUpdate::apply) on elements [begin, end) of a row.
template <class T>
void adagrad(T* weight, T* state, const T* grad, uint32_t begin, uint32_t end, T weight_decay, T eps, T neg_clr) {
  for (uint32_t d = begin; d < end; ++d) {
    T g = grad[d];
    if (weight_decay != 0) g = std::fma(weight_decay, weight[d], g);
    const T sum = state[d] + g * g;
    state[d] = sum;
    const T std = std::sqrt(sum) + eps;
    weight[d] = std::fma(neg_clr, g / std, weight[d]);
  }
}

#ifdef RECDEV_STORE_AVX2_KERNELS
// adagrad() on the row's first dim / 8 * 8 elements, 8 at a time; returns how many it did. The same
// operations in the same order: float +, *, /, sqrt and fma are correctly rounded at any vector width,
// so the results are bit-identical. (Without the hardware fma, std::fma is a library call per
// element, which dominated the update.)
RECDEV_STORE_AVX2_FMA uint32_t adagrad_avx2(float* weight, float* state, const float* grad, uint32_t dim,
                                            float weight_decay, float eps, float neg_clr) {
  const __m256 decay = _mm256_set1_ps(weight_decay);
  const __m256 epsilon = _mm256_set1_ps(eps);
  const __m256 step = _mm256_set1_ps(neg_clr);
  uint32_t d = 0;
  for (; d + 8 <= dim; d += 8) {
    const __m256 w = _mm256_loadu_ps(weight + d);
    __m256 g = _mm256_loadu_ps(grad + d);
    if (weight_decay != 0) g = _mm256_fmadd_ps(decay, w, g);
    __m256 square = _mm256_mul_ps(g, g);
    // Opaque to the optimizer, so that it cannot contract the multiply and the add below into an fma.
    asm("" : "+x"(square));
    const __m256 sum = _mm256_add_ps(_mm256_loadu_ps(state + d), square);
    _mm256_storeu_ps(state + d, sum);
    const __m256 std = _mm256_add_ps(_mm256_sqrt_ps(sum), epsilon);
    _mm256_storeu_ps(weight + d, _mm256_fmadd_ps(step, _mm256_div_ps(g, std), w));
  }
  return d;
}

// The GCC vectors of a kernel kLanes elements wide (4: AVX2, 8: AVX-512); they compile for the
// target of the kernel they are used in. (typedefs: GCC drops a vector_size that depends on a
// template parameter from a `using` alias.)
template <size_t kLanes>
struct Lanes {
  typedef float Floats __attribute__((vector_size(kLanes * sizeof(float))));
  typedef double Doubles __attribute__((vector_size(kLanes * sizeof(double))));
  typedef uint32_t Words __attribute__((vector_size(kLanes * sizeof(uint32_t))));
  typedef uint16_t Halves __attribute__((vector_size(kLanes * sizeof(uint16_t))));
};

// How the vector rules read a row's weights and gradients and write its weights, stored as float32,
// float16 or bfloat16: widened exactly as they are loaded, rounded to nearest even as they are stored
// (what widen_to_float and narrow_from_float do), L::Floats at a time (load, store) or one (load1,
// store1).
struct Float32Elements {
  using Element = float;
  template <class L>
  [[gnu::always_inline]] static void load(typename L::Floats& to, const float* row) {
    std::memcpy(&to, row, sizeof(to));
  }
  template <class L>
  [[gnu::always_inline]] static void store(float* row, const typename L::Floats& values) {
    std::memcpy(row, &values, sizeof(values));
  }
  static float load1(const float* row) { return *row; }
  static void store1(float* row, float value) { *row = value; }
};

// F16C's conversions spelled in asm (as embedding_bag.cpp's): GCC scalarizes __builtin_convertvector
// of _Float16 vectors. Rounding mode 8: to nearest even, exceptions suppressed.
struct Float16Elements {
  using Element = uint16_t;
  template <class L>
  [[gnu::always_inline]] static void load(typename L::Floats& to, const uint16_t* row) {
    const auto& halves = *reinterpret_cast<const typename L::Halves*>(row);
    if constexpr (sizeof(to) == 16) {
      asm("vcvtph2ps %1, %x0" : "=x"(to) : "m"(halves));
    } else {
      asm("vcvtph2ps %1, %t0" : "=x"(to) : "m"(halves));
    }
  }
  template <class L>
  [[gnu::always_inline]] static void store(uint16_t* row, const typename L::Floats& values) {
    auto& halves = *reinterpret_cast<typename L::Halves*>(row);
    if constexpr (sizeof(values) == 16) {
      asm("vcvtps2ph $8, %x1, %0" : "=m"(halves) : "x"(values));
    } else {
      asm("vcvtps2ph $8, %t1, %0" : "=m"(halves) : "x"(values));
    }
  }
  static float load1(const uint16_t* row) { return half_to_float(*row); }
  static void store1(uint16_t* row, float value) { *row = float_to_half(value); }
};

struct BFloat16Elements {
  using Element = uint16_t;
  template <class L>
  [[gnu::always_inline]] static void load(typename L::Floats& to, const uint16_t* row) {
    typename L::Halves halves;
    std::memcpy(&halves, row, sizeof(halves));
    const typename L::Words bits = __builtin_convertvector(halves, typename L::Words) << 16;
    std::memcpy(&to, &bits, sizeof(to));
  }
  // float_to_bfloat16 lane by lane: nan becomes a quiet nan, anything else rounds to nearest even.
  template <class L>
  [[gnu::always_inline]] static void store(uint16_t* row, const typename L::Floats& values) {
    using Words = typename L::Words;
    Words bits;
    std::memcpy(&bits, &values, sizeof(bits));
    const Words nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
    const Words rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    const Words quiet = (bits >> 16) | 0x0040u;
    const typename L::Halves halves = __builtin_convertvector((nan & quiet) | (~nan & rounded), typename L::Halves);
    std::memcpy(row, &halves, sizeof(halves));
  }
  static float load1(const uint16_t* row) { return bfloat16_to_float(*row); }
  static void store1(uint16_t* row, float value) { *row = float_to_bfloat16(value); }
};

// L::Doubles from as many of a row's elements, at `row`. (Vectors go by reference: by value, a
// function compiled without the kernels' target would pass them differently.)
template <class L, class Elements>
[[gnu::always_inline]] inline void load_widened(typename L::Doubles& to, const typename Elements::Element* row) {
  typename L::Floats floats;
  Elements::template load<L>(floats, row);
  // In asm: GCC's __builtin_convertvector widens each half of the vector and joins them.
  if constexpr (sizeof(to) == 64) {
    asm("vcvtps2pd %t1, %g0" : "=v"(to) : "v"(floats));
  } else {
    asm("vcvtps2pd %x1, %t0" : "=x"(to) : "x"(floats));
  }
}

// RowWiseAdagrad's rule (see RowUpdate::apply) on a row of Weights with a gradient of Grads (float32,
// or the row's own half type), kLanes doubles per vector: 4 (AVX2) or 8 (AVX-512). The same double
// operations per element as the scalar rule, and each weight rounded once to float32 (and a half
// row's then to its type, as the widened row's update would be); only the mean square sums in 8
// lanes instead of one running sum, which may move a double's last bits, far below the float32
// rounding of the accumulator. The 8 lanes add up in one order at both widths, so the two kernels
// give the same bits. One running sum is a chain of dim dependent adds: at dim 128 it was the largest
// single cost of a RowWiseAdagrad training step. Half rows and gradients are widened and rounded in
// registers: widening into a buffer first cost more. kDecay: weight_decay != 0. Without it the first
// pass reads no weight and the second multiplies none by the correction (exactly 1): a third fewer
// operations, which a half row's step, needing half the cache lines of a float32 one, is bound on.
template <size_t kLanes, class Weights, class Grads, bool kDecay>
[[gnu::always_inline]] inline void rowwise_adagrad_lanes(typename Weights::Element* weight, float* state,
                                                         const typename Grads::Element* grad, uint32_t dim, double lr,
                                                         double weight_decay, double eps) {
  using L = Lanes<kLanes>;
  using Doubles = typename L::Doubles;
  constexpr size_t kSums = 8 / kLanes;  // the 8 lanes of sums: two vectors of 4, or one of 8
  // In registers of their own, the loop unrolled: as an array indexed in a loop the sums lived on
  // the stack, every add waiting on the store of the one before.
  Doubles sums[kSums] = {};
  uint32_t d = 0;
  for (; d + 8 <= dim; d += 8) {
#pragma GCC unroll 2
    for (size_t s = 0; s < kSums; ++s) {
      Doubles g;
      load_widened<L, Grads>(g, grad + d + s * kLanes);
      if constexpr (kDecay) {
        Doubles decayed;
        load_widened<L, Weights>(decayed, weight + d + s * kLanes);
        decayed *= weight_decay;
        // Opaque, here and below, so that no multiply and add contract into an fma the scalar rule lacks.
        asm("" : "+v"(decayed));
        g += decayed;
      }
      Doubles square = g * g;
      asm("" : "+v"(square));
      sums[s] += square;
    }
  }
  double lanes[8];
  std::memcpy(lanes, sums, sizeof(lanes));
  double sum_square = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
  for (uint32_t rest = d; rest < dim; ++rest) {
    double g = double(Grads::load1(grad + rest));
    if constexpr (kDecay) {
      double decayed = weight_decay * double(Weights::load1(weight + rest));
      asm("" : "+x"(decayed));
      g += decayed;
    }
    double square = g * g;
    asm("" : "+x"(square));
    sum_square += square;
  }
  const auto [multiplier, correction] = rowwise_scalars(state, sum_square, dim, lr, weight_decay, eps);
  d = 0;
  for (; d + kLanes <= dim; d += kLanes) {
    Doubles kept;
    load_widened<L, Weights>(kept, weight + d);
    if constexpr (kDecay) kept *= correction;
    Doubles moved;
    load_widened<L, Grads>(moved, grad + d);
    moved *= multiplier;
    asm("" : "+v"(kept), "+v"(moved));
    Weights::template store<L>(weight + d, __builtin_convertvector(kept - moved, typename L::Floats));
  }
  for (; d < dim; ++d) {
    double kept = correction * double(Weights::load1(weight + d));
    double moved = double(Grads::load1(grad + d)) * multiplier;
    asm("" : "+x"(kept), "+x"(moved));
    Weights::store1(weight + d, float(kept - moved));
  }
}

// rowwise_adagrad_lanes for a row of Weights and a gradient of Grads, with or without weight decay,
// at the widest vectors this CPU has.
template <class Weights, class Grads, size_t kLanes>
[[gnu::always_inline]] inline void rowwise_adagrad_any_decay(typename Weights::Element* weight, float* state,
                                                             const typename Grads::Element* grad, uint32_t dim,
                                                             double lr, double weight_decay, double eps) {
  if (weight_decay != 0) {
    rowwise_adagrad_lanes<kLanes, Weights, Grads, true>(weight, state, grad, dim, lr, weight_decay, eps);
  } else {
    rowwise_adagrad_lanes<kLanes, Weights, Grads, false>(weight, state, grad, dim, lr, weight_decay, eps);
  }
}

template <class Weights, class Grads>
RECDEV_STORE_AVX2_FMA_F16C void rowwise_adagrad_avx2(typename Weights::Element* weight, float* state,
                                                     const typename Grads::Element* grad, uint32_t dim, double lr,
                                                     double weight_decay, double eps) {
  rowwise_adagrad_any_decay<Weights, Grads, 4>(weight, state, grad, dim, lr, weight_decay, eps);
}

template <class Weights, class Grads>
RECDEV_STORE_AVX512_F16C void rowwise_adagrad_avx512(typename Weights::Element* weight, float* state,
                                                     const typename Grads::Element* grad, uint32_t dim, double lr,
                                                     double weight_decay, double eps) {
  rowwise_adagrad_any_decay<Weights, Grads, 8>(weight, state, grad, dim, lr, weight_decay, eps);
}

// RowWiseAdagrad's rule on a row of Weights: the AVX-512 kernel where the CPU has it, else the AVX2
// one (whose CPUs cpu_has_avx2_fma_f16c admits).
template <class Weights, class Grads>
void rowwise_adagrad_vectors(typename Weights::Element* weight, float* state, const typename Grads::Element* grad,
                             uint32_t dim, double lr, double weight_decay, double eps) {
  if (cpu_has_avx512f_f16c()) {
    rowwise_adagrad_avx512<Weights, Grads>(weight, state, grad, dim, lr, weight_decay, eps);
  } else {
    rowwise_adagrad_avx2<Weights, Grads>(weight, state, grad, dim, lr, weight_decay, eps);
  }
}

// rowwise_adagrad_vectors on a Float16 or BFloat16 row, with a float32 gradient or one of the row's type.
template <class Grad>
void rowwise_adagrad_half(ElementType type, uint16_t* weight, float* state, const Grad* grad, uint32_t dim, double lr,
                          double weight_decay, double eps) {
  constexpr bool kFloatGrad = std::is_same_v<Grad, float>;
  if (type == ElementType::Float16) {
    using Grads = std::conditional_t<kFloatGrad, Float32Elements, Float16Elements>;
    rowwise_adagrad_vectors<Float16Elements, Grads>(weight, state, grad, dim, lr, weight_decay, eps);
  } else {
    using Grads = std::conditional_t<kFloatGrad, Float32Elements, BFloat16Elements>;
    rowwise_adagrad_vectors<BFloat16Elements, Grads>(weight, state, grad, dim, lr, weight_decay, eps);
  }
}
#endif

}  // namespace

bool operator==(const OptimizerConfig& lhs, const OptimizerConfig& rhs) {
  return lhs.kind == rhs.kind && same_bits(lhs.lr, rhs.lr) && same_bits(lhs.weight_decay, rhs.weight_decay) &&
         same_bits(lhs.eps, rhs.eps) && same_bits(lhs.lr_decay, rhs.lr_decay) &&
         same_bits(lhs.initial_accumulator_value, rhs.initial_accumulator_value) && same_bits(lhs.beta1, rhs.beta1) &&
         same_bits(lhs.beta2, rhs.beta2) && lhs.stochastic_rounding == rhs.stochastic_rounding &&
         lhs.rounding_seed == rhs.rounding_seed;
}

uint64_t rounding_key(uint64_t seed, uint64_t row_id, uint64_t step) {
  return mix64(mix64(mix64(seed) ^ row_id) ^ step);
}

bool operator!=(const OptimizerConfig& lhs, const OptimizerConfig& rhs) { return !(lhs == rhs); }

uint32_t optimizer_state_elements(OptimizerKind kind, uint32_t elements) {
  switch (kind) {
    case OptimizerKind::None:
    case OptimizerKind::SGD: return 0;
    case OptimizerKind::Adagrad: return elements;
    case OptimizerKind::RowWiseAdagrad: return 1;
    case OptimizerKind::Adam: return 2 * elements;  // callers bound elements so that this cannot overflow
  }
  return 0;
}

float optimizer_initial_state(const OptimizerConfig& config) {
  return config.kind == OptimizerKind::Adagrad ? float(config.initial_accumulator_value) : 0.0f;
}

const char* optimizer_names() { return "SGD, Adagrad, RowWiseAdagrad, Adam"; }

std::string describe(const OptimizerConfig& config) {
  const char* name = kind_name(config.kind);
  if (name == nullptr) return "OptimizerKind(" + std::to_string(uint32_t(config.kind)) + ")";
  const Uses used = uses(config.kind);
  std::string text = name;
  if (config.kind == OptimizerKind::None) return text;
  std::string separator = "(";
  const auto add = [&](bool use, const char* field, double value) {
    if (!use) return;
    text += separator + field + "=" + format_number(value);
    separator = ", ";
  };
  add(used.lr, "lr", config.lr);
  add(used.lr_decay, "lr_decay", config.lr_decay);
  add(used.betas, "beta1", config.beta1);
  add(used.betas, "beta2", config.beta2);
  add(used.weight_decay, "weight_decay", config.weight_decay);
  add(used.eps, "eps", config.eps);
  add(used.initial_accumulator_value, "initial_accumulator_value", config.initial_accumulator_value);
  if (config.stochastic_rounding) text += separator + "stochastic_rounding=True";
  return text + ")";
}

void validate_optimizer(const OptimizerConfig& config) {
  if (uint32_t(config.kind) > kLastKind) {
    throw StoreError(ErrorCode::InvalidArgument, "unknown optimizer kind " + std::to_string(uint32_t(config.kind)) +
                                                     "; the optimizers are None, " + optimizer_names());
  }
  const auto invalid = [&](const std::string& problem) {
    throw StoreError(ErrorCode::InvalidArgument, "invalid optimizer " + describe(config) + ": " + problem);
  };
  const OptimizerConfig defaults;
  const Uses used = uses(config.kind);
  // Unused parameters first: a config whose describe() leaves out the offending value names it here.
  const auto unused = [&](bool use, const char* field, double value, double default_value) {
    if (!use && !same_bits(value, default_value)) {
      invalid(std::string(kind_name(config.kind)) + " does not use " + field + " (got " + format_number(value) +
              "); leave it at its default " + format_number(default_value));
    }
  };
  unused(used.lr, "lr", config.lr, defaults.lr);
  unused(used.weight_decay, "weight_decay", config.weight_decay, defaults.weight_decay);
  unused(used.eps, "eps", config.eps, defaults.eps);
  unused(used.lr_decay, "lr_decay", config.lr_decay, defaults.lr_decay);
  unused(used.initial_accumulator_value, "initial_accumulator_value", config.initial_accumulator_value,
         defaults.initial_accumulator_value);
  unused(used.betas, "beta1", config.beta1, defaults.beta1);
  unused(used.betas, "beta2", config.beta2, defaults.beta2);

  const auto non_negative = [&](const char* field, double value) {
    // Written so that nan fails too.
    if (!(value >= 0 && std::isfinite(value))) {
      invalid(std::string(field) + " must be finite and >= 0 (got " + format_number(value) + ")");
    }
  };
  non_negative("lr", config.lr);
  non_negative("weight_decay", config.weight_decay);
  non_negative("eps", config.eps);
  non_negative("lr_decay", config.lr_decay);
  non_negative("initial_accumulator_value", config.initial_accumulator_value);
  const auto beta = [&](const char* field, double value) {
    if (!(value >= 0 && value < 1))
      invalid(std::string(field) + " must be in [0, 1) (got " + format_number(value) + ")");
  };
  beta("beta1", config.beta1);
  beta("beta2", config.beta2);
  if (config.stochastic_rounding && config.kind == OptimizerKind::None) {
    invalid("stochastic_rounding needs an optimizer to round the updates of");
  }
  if (!config.stochastic_rounding && config.rounding_seed != 0) {
    invalid("rounding_seed is used with stochastic_rounding only; leave it at 0");
  }
}

RowUpdate::RowUpdate(const OptimizerConfig& config, uint64_t step, uint32_t dim)
    : kind_(config.kind),
      dim_(dim),
      stochastic_rounding_(config.stochastic_rounding),
      rounding_seed_(config.rounding_seed),
      step_(step),
      lr_(config.lr),
      eps_(config.eps),
      weight_decay_(config.weight_decay),
      beta1_(config.beta1),
      beta2_(config.beta2),
      lr_f_(float(config.lr)),
      weight_decay_f_(float(config.weight_decay)),
      eps_f_(float(config.eps)),
      neg_clr_f_(0),
      one_minus_beta1_(float(1.0 - config.beta1)),
      one_minus_beta2_(float(1.0 - config.beta2)),
      neg_step_size_f_(0),
      neg_clr_(0),
      neg_step_size_(0) {
  const double t = double(step);
  // torch keeps Adagrad's step in a float32 tensor and reads it back as a Python float; that is exact
  // up to 2^24 steps, as here.
  const double clr = config.lr / (1 + (t - 1) * config.lr_decay);
  neg_clr_f_ = float(-clr);
  neg_clr_ = -clr;
  // SparseAdam: Python floats, beta ** step with an int step.
  const double bias_correction1 = 1 - std::pow(config.beta1, t);
  const double bias_correction2 = 1 - std::pow(config.beta2, t);
  const double step_size = config.lr * std::sqrt(bias_correction2) / bias_correction1;
  neg_step_size_f_ = float(-step_size);
  neg_step_size_ = -step_size;
}

void RowUpdate::apply(float* weight, float* state, const float* grad) const {
  uint32_t done = 0;
#ifdef RECDEV_STORE_AVX2_KERNELS
  if (kind_ == OptimizerKind::Adagrad && cpu_has_avx2_fma()) {
    done = adagrad_avx2(weight, state, grad, dim_, weight_decay_f_, eps_f_, neg_clr_f_);
  }
  if (kind_ == OptimizerKind::RowWiseAdagrad && cpu_has_avx2_fma_f16c()) {
    rowwise_adagrad_vectors<Float32Elements, Float32Elements>(weight, state, grad, dim_, lr_, weight_decay_, eps_);
    return;
  }
#endif
  apply_scalar<float>(weight, state, grad, done, lr_f_, weight_decay_f_, eps_f_, neg_clr_f_, one_minus_beta1_,
                      one_minus_beta2_, neg_step_size_f_);
}

template <class Grad>
bool RowUpdate::rowwise_half_in_registers(ElementType type, void* weight, float* state, const Grad* grad) const {
#ifdef RECDEV_STORE_AVX2_KERNELS
  if (kind_ == OptimizerKind::RowWiseAdagrad && cpu_has_avx2_fma_f16c()) {
    rowwise_adagrad_half(type, static_cast<uint16_t*>(weight), state, grad, dim_, lr_, weight_decay_, eps_);
    return true;
  }
#endif
  return false;
}

void RowUpdate::apply_widened(ElementType type, void* weight, float* state, const float* grad, float* scratch) const {
  widen_to_float(type, weight, scratch, dim_);
  apply(scratch, state, grad);
  narrow_from_float(type, scratch, weight, dim_);
}

void RowUpdate::apply_half(ElementType type, void* weight, float* state, const float* grad, float* scratch) const {
  if (!rowwise_half_in_registers(type, weight, state, grad)) apply_widened(type, weight, state, grad, scratch);
}

void RowUpdate::apply_half(ElementType type, void* weight, float* state, const uint16_t* grad, float* scratch) const {
  if (rowwise_half_in_registers(type, weight, state, grad)) return;
  widen_to_float(type, grad, scratch + dim_, dim_);
  apply_widened(type, weight, state, scratch + dim_, scratch);
}

void RowUpdate::apply(double* weight, double* state, const double* grad) const {
  apply_scalar<double>(weight, state, grad, 0, lr_, weight_decay_, eps_, neg_clr_, 1.0 - beta1_, 1.0 - beta2_,
                       neg_step_size_);
}

// The rules in T; `done` leading elements of an Adagrad row were already updated (by a vector kernel).
template <class T>
void RowUpdate::apply_scalar(T* weight, T* state, const T* grad, uint32_t done, T lr, T weight_decay, T eps, T neg_clr,
                             T one_minus_beta1, T one_minus_beta2, T neg_step_size) const {
  const uint32_t dim = dim_;
  switch (kind_) {
    case OptimizerKind::None: return;
    case OptimizerKind::SGD: {
      // grad = grad.add(param, alpha=weight_decay); param.add_(grad, alpha=-lr). torch computes
      // a.add(b, alpha) as one fused multiply-add, a + alpha * b rounded once.
      const T neg_lr = -lr;
      for (uint32_t d = 0; d < dim; ++d) {
        T g = grad[d];
        if (weight_decay != 0) g = std::fma(weight_decay, weight[d], g);
        weight[d] = std::fma(neg_lr, g, weight[d]);
      }
      return;
    }
    case OptimizerKind::Adagrad: {
      // state_sum.add_(g.pow(2)); std = state_sum.sqrt_().add_(eps); param.add_(g / std, alpha=-clr)
      // (torch's float sqrt is not always correctly rounded, so the results may differ from torch's
      // in the last bit.)
      adagrad<T>(weight, state, grad, done, dim, weight_decay, eps, neg_clr);
      return;
    }
    case OptimizerKind::RowWiseAdagrad: {
      const double sum_square = rowwise_square_sum(weight, grad, 0, dim, weight_decay_, 0.0);
      const auto [multiplier, correction] = rowwise_scalars(state, sum_square, dim, lr_, weight_decay_, eps_);
      for (uint32_t d = 0; d < dim; ++d) {
        weight[d] = T(correction * double(weight[d]) - double(grad[d]) * multiplier);
      }
      return;
    }
    case OptimizerKind::Adam: {
      T* exp_avg = state;
      T* exp_avg_sq = state + dim;
      for (uint32_t d = 0; d < dim; ++d) {
        const T g = grad[d];
        const T old_avg = exp_avg[d];
        const T old_avg_sq = exp_avg_sq[d];
        // exp_avg_update = (g - old) * (1 - beta1); exp_avg += update; numer = update + old
        const T avg = (g - old_avg) * one_minus_beta1 + old_avg;
        const T avg_sq = (g * g - old_avg_sq) * one_minus_beta2 + old_avg_sq;
        exp_avg[d] = avg;
        exp_avg_sq[d] = avg_sq;
        const T denom = std::sqrt(avg_sq) + eps;
        weight[d] = weight[d] + neg_step_size * (avg / denom);
      }
      return;
    }
  }
}

}  // namespace recdev::store
