#include "embedding_bag.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cpu_features.h"
#include "errors.h"
#include "prefetch.h"

namespace recdev::store {
namespace {

[[noreturn]] void invalid(const std::string& message) {
  throw StoreError(ErrorCode::InvalidArgument, "embedding_bag: " + message);
}

// The row additions of Sum and Mean bags, the bulk of embedding_bag's compute. Each adds `count`
// rows onto `from`, element by element in row order — from[d] + rows[0][d] + rows[1][d] + ..., or
// with per-sample weights from[d] + weights[0] * rows[0][d] + ..., each product rounded before its
// addition (the empty asm keeps GCC from fusing the two into a multiply-add where the target has one,
// which would change results) — starting from 0 when from is null, and stores the sums in `to`
// (which may be from). The sums stay in registers across a bag's rows, a block of columns at a time,
// instead of a load and a store per row: 65,536 ids in bags of 4 of rows in cache pooled in 0.85 ms
// instead of 0.94 (2 threads).
//
// The build targets baseline x86-64, whose 16-byte vectors left pooling compute-bound: with 64-byte
// ones a pooled gather of 1M x 128 rows measured 25% faster. Each element gets the same float32
// operations at every width.
//
// Half rows are widened as they are loaded, in registers: widening a row into a buffer and summing
// the buffer took as long as reading the rows from memory (float16 pooled no faster than float32).
// Widening is exact, so the sums are those of the widened rows whichever way.
//
// Before a summer reads the first vector of each cache line of a row, it prefetches the same line of the
// run's row ahead: one prefetch between loads instead of a burst of a row's lines, which stalled
// every load behind it once the core's outstanding misses ran out (perf: 90% of pooling's time on
// its prefetches). A/B, 1M x 128 rows: bags of 4 and 32 pooled in 0.93x and 0.90x the time.
//
// A half table's bag is rounded into its output as the summer stores its registers (a Sink), as
// fbgemm does, instead of stored as float32 and read back by a narrowing pass: the read-back of sums
// just stored (store forwarding) took 16% of a float16 pooled gather of bags of 1 (perf, one thread).
//
// weights: one per row, or null (no per-sample weights).
using SumRows = void (*)(const float* from, void* to, const RowRun& rows, const float* weights, size_t count,
                         uint32_t dim);
struct FinalSums {
  SumRows to_float;               // float32 sums
  SumRows to_own_type;            // rounded to nearest even into the rows' type
  SumRows to_own_type_ties_away;  // bfloat16: ties away from zero (PooledOutput); others: to_own_type's
};
struct RowSummer {
  FinalSums cached;    // ordinary stores; cached.to_float also stores a large bag's partial sums
  FinalSums streamed;  // streaming stores, into an output far larger than the caches (PooledOutput)
};

inline float scaled(float weight, float value) {
  float product = weight * value;
  asm("" : "+x"(product));
  return product;
}

// How a sink puts a vector of lanes in memory: with an ordinary store (Cached), or with a streaming
// one (Streamed), for outputs too large to stay in cache until they are read: an ordinary store
// first reads the line it overwrites (RowCopier says more). Streamed vectors are the AVX ones, 32
// and 64 bytes (VEX and EVEX vmovntps, in asm for the reason Float16Elements gives); narrower ones,
// in the AVX2 half summers and the portable ones, are stored as usual. A streamed vector must be
// aligned to its size: pool_bags streams only rows that start at a multiple of 64 bytes and fill
// whole vectors.
struct Cached {
  template <class Lanes>
  static void put(void* to, const Lanes& lanes) {
    std::memcpy(to, &lanes, sizeof(Lanes));
  }
};
struct Streamed {
  template <class Lanes>
  static void put(void* to, const Lanes& lanes) {
    struct Bytes {
      unsigned char bytes[sizeof(Lanes)];
    };
    if constexpr (sizeof(Lanes) == 64) {
      asm("vmovntps %g1, %0" : "=m"(*static_cast<Bytes*>(to)) : "v"(lanes));
    } else if constexpr (sizeof(Lanes) == 32) {
      asm("vmovntps %t1, %0" : "=m"(*static_cast<Bytes*>(to)) : "x"(lanes));
    } else {
      std::memcpy(to, &lanes, sizeof(Lanes));
    }
  }
};

// How a summer stores its sums: element e of `to` onwards, a vector of them (store) or one (one).
template <class Stores>
struct FloatSink {
  template <class Vector>
  static void store(void* to, uint32_t e, const Vector& sums) {
    Stores::put(static_cast<float*>(to) + e, sums);
  }
  static void one(void* to, uint32_t e, float sum) { static_cast<float*>(to)[e] = sum; }
};

// The bits of a vector of floats (Words), and as many 16-bit lanes (Halves).
template <size_t kVectorBytes>
struct LanesOf;
template <>
struct LanesOf<16> {
  using Words = uint32_t __attribute__((vector_size(16)));
  using Halves = uint16_t __attribute__((vector_size(8)));
};
template <>
struct LanesOf<32> {
  using Words = uint32_t __attribute__((vector_size(32)));
  using Halves = uint16_t __attribute__((vector_size(16)));
};
template <>
struct LanesOf<64> {
  using Words = uint32_t __attribute__((vector_size(64)));
  using Halves = uint16_t __attribute__((vector_size(32)));
};

// To nearest even, as narrow_from_float rounds; vcvtps2ph needs F16C, which every float16 summer has.
template <class Stores>
struct Float16Sink {
  template <class Vector>
  static void store(void* to, uint32_t e, const Vector& sums) {
    typename LanesOf<sizeof(Vector)>::Halves halves;
    if constexpr (sizeof(Vector) == 32) {
      asm("vcvtps2ph $8, %t1, %x0" : "=x"(halves) : "x"(sums));
    } else {
      static_assert(sizeof(Vector) == 64, "float16 sums are stored 8 or 16 lanes at a time");
      asm("vcvtps2ph $8, %g1, %t0" : "=v"(halves) : "v"(sums));
    }
    Stores::put(static_cast<uint16_t*>(to) + e, halves);
  }
  static void one(void* to, uint32_t e, float sum) { static_cast<uint16_t*>(to)[e] = float_to_half(sum); }
};

// To nearest even (float_to_bfloat16), or with ties away from zero (round_through_bfloat16_ties_away);
// a nan stays a nan, made quiet.
template <bool kTiesAway, class Stores>
struct BFloat16Sink {
  template <class Vector>
  static void store(void* to, uint32_t e, const Vector& sums) {
    using Words = typename LanesOf<sizeof(Vector)>::Words;
    using Halves = typename LanesOf<sizeof(Vector)>::Halves;
    Words bits;
    std::memcpy(&bits, &sums, sizeof(bits));
    const Words nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
    const Words rounded = kTiesAway ? (bits + 0x8000u) >> 16 : (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    const Words chosen = (nan & ((bits >> 16) | 0x0040u)) | (~nan & rounded);
    const Halves halves = __builtin_convertvector(chosen, Halves);
    Stores::put(static_cast<uint16_t*>(to) + e, halves);
  }
  static void one(void* to, uint32_t e, float sum) {
    uint32_t bits;
    std::memcpy(&bits, &sum, sizeof(bits));
    const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
    static_cast<uint16_t*>(to)[e] =
        kTiesAway && !nan ? uint16_t((bits + 0x8000u) >> 16) : float_to_bfloat16(sum);  // quiets a nan alike
  }
};

// How a summer reads element e of a row of each element type: a vector of them (load) or one (one),
// and how it rounds sums into the type (Rounded, RoundedTiesAway). Vectors are GCC vectors of floats,
// so the widening compiles for the target function it is inlined into (vcvtph2ps with F16C).
struct FloatElements {
  template <class Stores>
  using Rounded = FloatSink<Stores>;
  template <class Stores>
  using RoundedTiesAway = FloatSink<Stores>;
  static constexpr size_t kBytes = sizeof(float);
  template <class Vector>
  static void load(Vector& to, const void* row, uint32_t e) {
    std::memcpy(&to, static_cast<const float*>(row) + e, sizeof(Vector));
  }
  static float one(const void* row, uint32_t e) { return static_cast<const float*>(row)[e]; }
};

// Float16 rows need F16C's vcvtph2ps, spelled in asm: GCC scalarizes __builtin_convertvector of
// _Float16 vectors, and an intrinsic cannot be inlined into a template compiled without the target
// (the summers that instantiate this one all have F16C).
struct Float16Elements {
  template <class Stores>
  using Rounded = Float16Sink<Stores>;
  template <class Stores>
  using RoundedTiesAway = Float16Sink<Stores>;
  static constexpr size_t kBytes = sizeof(uint16_t);
  template <class Vector>
  static void load(Vector& to, const void* row, uint32_t e) {
    struct Halves {
      uint16_t lanes[sizeof(Vector) / sizeof(float)];
    };
    const auto& halves = *reinterpret_cast<const Halves*>(static_cast<const uint16_t*>(row) + e);
    if constexpr (sizeof(Vector) == 32) {
      asm("vcvtph2ps %1, %t0" : "=x"(to) : "m"(halves));
    } else {
      static_assert(sizeof(Vector) == 64, "float16 rows are summed 8 or 16 lanes at a time");
      asm("vcvtph2ps %1, %g0" : "=v"(to) : "m"(halves));
    }
  }
  static float one(const void* row, uint32_t e) { return half_to_float(static_cast<const uint16_t*>(row)[e]); }
};

struct BFloat16Elements {
  template <class Stores>
  using Rounded = BFloat16Sink<false, Stores>;
  template <class Stores>
  using RoundedTiesAway = BFloat16Sink<true, Stores>;
  static constexpr size_t kBytes = sizeof(uint16_t);
  template <class Vector>
  static void load(Vector& to, const void* row, uint32_t e) {
    constexpr size_t kLanes = sizeof(Vector) / sizeof(float);
    uint16_t halves[kLanes];
    uint32_t bits[kLanes];
    std::memcpy(halves, static_cast<const uint16_t*>(row) + e, sizeof(halves));
    for (size_t lane = 0; lane < kLanes; ++lane) bits[lane] = uint32_t{halves[lane]} << 16;
    std::memcpy(&to, bits, sizeof(to));
  }
  static float one(const void* row, uint32_t e) { return bfloat16_to_float(static_cast<const uint16_t*>(row)[e]); }
};

// Sums columns [d, d + kRegisters * width) of the rows onto from and stores them in to, kRegisters
// vectors of sums that stay in registers across the rows (the loops are unrolled for that: as an
// array the sums would live on the stack). Vector is a GCC vector of floats, compiled for the
// instruction set of the target function this is inlined into.
template <class Vector, class Elements, class Sink, size_t kRegisters, bool kScaled>
__attribute__((always_inline)) inline void sum_columns(const float* from, void* to, const RowRun& rows,
                                                       const float* weights, size_t count, uint32_t d) {
  constexpr uint32_t kWidth = sizeof(Vector) / sizeof(float);
  constexpr size_t kVectorBytes = kWidth * Elements::kBytes;
  Vector sums[kRegisters];
#pragma GCC unroll 16
  for (size_t r = 0; r < kRegisters; ++r) {
    if (from == nullptr) {
      sums[r] = Vector{};
    } else {
      std::memcpy(&sums[r], from + d + r * kWidth, sizeof(Vector));
    }
  }
  for (size_t k = 0; k < count; ++k) {
    const bool prefetches = k < rows.ahead_count;
#pragma GCC unroll 16
    for (size_t r = 0; r < kRegisters; ++r) {
      if ((r * kVectorBytes) % kCacheLineBytes == 0 && prefetches) {
        prefetch(reinterpret_cast<const std::byte*>(rows.ahead[k]) + (d + r * kWidth) * Elements::kBytes);
      }
      Vector add;
      Elements::load(add, rows.rows[k], d + r * kWidth);
      if constexpr (kScaled) {
        add *= weights[k];
        asm("" : "+v"(add));
      }
      sums[r] += add;
    }
  }
#pragma GCC unroll 16
  for (size_t r = 0; r < kRegisters; ++r) Sink::store(to, d + r * kWidth, sums[r]);
}

// One body for every vector width: blocks of 8 vectors of columns, then of 4, 2 and 1 (a row of 64
// floats is 4 AVX-512 vectors, not 64 single floats), then the last columns one at a time.
template <class Vector, class Elements, class Sink, bool kScaled>
__attribute__((always_inline)) inline void sum_rows_vectors(const float* from, void* to, const RowRun& rows,
                                                            const float* weights, size_t count, uint32_t dim) {
  constexpr uint32_t kWidth = sizeof(Vector) / sizeof(float);
  uint32_t d = 0;
  for (; d + 8 * kWidth <= dim; d += 8 * kWidth) {
    sum_columns<Vector, Elements, Sink, 8, kScaled>(from, to, rows, weights, count, d);
  }
  if (d + 4 * kWidth <= dim) {
    sum_columns<Vector, Elements, Sink, 4, kScaled>(from, to, rows, weights, count, d);
    d += 4 * kWidth;
  }
  if (d + 2 * kWidth <= dim) {
    sum_columns<Vector, Elements, Sink, 2, kScaled>(from, to, rows, weights, count, d);
    d += 2 * kWidth;
  }
  if (d + kWidth <= dim) {
    sum_columns<Vector, Elements, Sink, 1, kScaled>(from, to, rows, weights, count, d);
    d += kWidth;
  }
  for (; d < dim; ++d) {
    float sum = from == nullptr ? 0.0f : from[d];
    const bool line_starts = d * Elements::kBytes % kCacheLineBytes == 0;
    for (size_t k = 0; k < count; ++k) {
      if (line_starts && k < rows.ahead_count) {
        prefetch(reinterpret_cast<const std::byte*>(rows.ahead[k]) + d * Elements::kBytes);
      }
      const float value = Elements::one(rows.rows[k], d);
      sum += kScaled ? scaled(weights[k], value) : value;
    }
    Sink::one(to, d, sum);
  }
}

// A summer's entry point for one sink, the unscaled and scaled loops compiled into it.
template <class Vector, class Elements, class Sink>
__attribute__((always_inline)) inline void sum_rows(const float* from, void* to, const RowRun& rows,
                                                    const float* weights, size_t count, uint32_t dim) {
  if (weights != nullptr) {
    sum_rows_vectors<Vector, Elements, Sink, true>(from, to, rows, weights, count, dim);
  } else {
    sum_rows_vectors<Vector, Elements, Sink, false>(from, to, rows, nullptr, count, dim);
  }
}

// A summer's entry points for one vector width and element type, each compiled for `target`: three
// roundings, each with ordinary and with streaming stores. (A float32 summer's three of either kind
// are one function: its rows' type is float32.)
#define RECDEV_ROW_SUMMER(name, target, Vector, Elements)                                                     \
  template <class Sink>                                                                                       \
  target void name##_sum(const float* from, void* to, const RowRun& rows, const float* weights, size_t count, \
                         uint32_t dim) {                                                                      \
    sum_rows<Vector, Elements, Sink>(from, to, rows, weights, count, dim);                                    \
  }                                                                                                           \
  constexpr RowSummer name{{&name##_sum<FloatSink<Cached>>, &name##_sum<Elements::Rounded<Cached>>,           \
                            &name##_sum<Elements::RoundedTiesAway<Cached>>},                                  \
                           {&name##_sum<FloatSink<Streamed>>, &name##_sum<Elements::Rounded<Streamed>>,       \
                            &name##_sum<Elements::RoundedTiesAway<Streamed>>}};

// 16-byte vectors: the baseline x86-64 build's own width. Without F16C a float16 element widens in
// software, so baseline float16 rows are widened into a buffer first (FloatRows).
using Floats4 = float __attribute__((vector_size(16)));
RECDEV_ROW_SUMMER(float32_portable, , Floats4, FloatElements)
RECDEV_ROW_SUMMER(bfloat16_portable, , Floats4, BFloat16Elements)

#ifdef RECDEV_STORE_AVX2_KERNELS
using Floats8 = float __attribute__((vector_size(32)));
using Floats16 = float __attribute__((vector_size(64)));
RECDEV_ROW_SUMMER(float32_avx2, __attribute__((target("avx2"))), Floats8, FloatElements)
RECDEV_ROW_SUMMER(float16_avx2, __attribute__((target("avx2,f16c"))), Floats8, Float16Elements)
RECDEV_ROW_SUMMER(bfloat16_avx2, __attribute__((target("avx2"))), Floats8, BFloat16Elements)
RECDEV_ROW_SUMMER(float32_avx512, __attribute__((target("avx512f"))), Floats16, FloatElements)
RECDEV_ROW_SUMMER(float16_avx512, __attribute__((target("avx512f,f16c"))), Floats16, Float16Elements)
RECDEV_ROW_SUMMER(bfloat16_avx512, __attribute__((target("avx512f"))), Floats16, BFloat16Elements)
#endif
#undef RECDEV_ROW_SUMMER

// The fastest summer of rows of `type` this CPU runs, or none (float16 without F16C).
const RowSummer* best_row_summer(ElementType type) {
#ifdef RECDEV_STORE_AVX2_KERNELS
  const bool avx512 = cpu_has_avx512f();
  switch (type) {
    case ElementType::Float32: return avx512 ? &float32_avx512 : cpu_has_avx2() ? &float32_avx2 : &float32_portable;
    case ElementType::Float16:
      return avx512 && cpu_has_avx2_f16c() ? &float16_avx512 : cpu_has_avx2_f16c() ? &float16_avx2 : nullptr;
    case ElementType::BFloat16: return avx512 ? &bfloat16_avx512 : cpu_has_avx2() ? &bfloat16_avx2 : &bfloat16_portable;
    default: return nullptr;
  }
#else
  switch (type) {
    case ElementType::Float32: return &float32_portable;
    case ElementType::BFloat16: return &bfloat16_portable;
    default: return nullptr;
  }
#endif
}

// Rows go to the summer kGroup at a time: a bag of any size in a fixed buffer.
constexpr size_t kGroup = 32;

// The rows of a bag as float32: a float32 row as it is, a half row widened into `widened` (kGroup
// rows of dim floats, 16 KiB at dim 128: it stays in L1 while the summer reads it back), or as it is
// when `widened` is null (a summer that widens as it loads).
struct FloatRows {
  ElementType type;
  uint32_t dim;
  float* widened;

  const float* take(const float* row, size_t slot) const {
    if (widened == nullptr) return row;
    float* wide = widened + slot * dim;
    widen_to_float(type, row, wide, dim);
    return wide;
  }
};

// Sums every non-skipped row of a bag, scaled by its per-sample weight when there is one, stores the
// sums in `to` as `last_sum` stores them, and returns how many rows it took: each row as `as_summed`
// takes it. Rows go to the summer kGroup at a time; a larger bag's sums wait in `partial` (dim
// floats, which may be `to` when it holds float32) between groups, stored there by `partial_sum`.
// Rows the summer reads where they are go to it as runs, so that it prefetches the rows ahead.
size_t sum_bag(const EmbeddingBag& bag, size_t begin, size_t end, RowPointers& rows, SumRows partial_sum,
               SumRows last_sum, const FloatRows& as_summed, float* partial, void* to) {
  const bool widens = as_summed.widened != nullptr;
  if (bag.padding_idx < 0 && !widens) {
    // Nothing skipped, rows summed where they are: the bag's rows and weights are runs as they stand,
    // taken kGroup at a time as below, without a pass over its positions. A/B, whole 1M x 128 table,
    // 65,536 ids: float32 bags of 4 and 32 in 0.99x and 0.96x the time, float16 bags of 1 and 4 in
    // 0.97x and 0.95x.
    const size_t count = end - begin;
    const float* weights = bag.per_sample_weights != nullptr ? bag.per_sample_weights + begin : nullptr;
    size_t done = 0;
    do {  // once for an empty bag, which still gets its zeros
      const size_t group = std::min(kGroup, count - done);
      const bool last = done + group == count;
      (last ? last_sum : partial_sum)(done == 0 ? nullptr : partial, last ? to : partial, rows.take(group),
                                      weights != nullptr ? weights + done : nullptr, group, as_summed.dim);
      done += group;
    } while (done < count);
    return count;
  }
  const float* group[kGroup];
  float weights[kGroup];
  const float* bag_weights = bag.per_sample_weights;
  size_t grouped = 0;
  size_t count = 0;
  const auto flush = [&](SumRows sum, void* sums_to) {
    const RowRun run = widens ? RowRun{group, nullptr, 0} : rows.take(grouped);
    sum(count == grouped ? nullptr : partial, sums_to, run, bag_weights != nullptr ? weights : nullptr, grouped,
        as_summed.dim);
    grouped = 0;
  };
  for (size_t position = begin; position < end; ++position) {
    if (bag.skips(position)) continue;
    if (grouped == kGroup) flush(partial_sum, partial);  // only now is it known that more rows follow
    if (widens) group[grouped] = as_summed.take(rows.next(), grouped);
    if (bag_weights != nullptr) weights[grouped] = bag_weights[position];
    ++grouped;
    ++count;
  }
  flush(last_sum, to);  // an empty bag still gets its zeros
  return count;
}

// Each element's maximum over the bag's non-skipped rows, the first of equal ones; the first row's
// value stands whatever follows, so a nan there stays (CPU's embedding_bag), and a later nan never
// counts. With ignore_nan no nan counts, and max_positions (then required) tells which elements
// took a value (-1: none).
void max_bag(const EmbeddingBag& bag, size_t begin, size_t end, RowPointers& rows, const FloatRows& as_float,
             float* out, int64_t* max_positions, bool ignore_nan) {
  const uint32_t dim = as_float.dim;
  bool first = true;
  for (size_t position = begin; position < end; ++position) {
    if (bag.skips(position)) continue;
    const float* row = as_float.take(rows.next(), 0);
    for (uint32_t d = 0; d < dim; ++d) {
      const bool take =
          ignore_nan ? !std::isnan(row[d]) && (max_positions[d] < 0 || row[d] > out[d]) : first || row[d] > out[d];
      if (take) {
        out[d] = row[d];
        if (max_positions != nullptr) max_positions[d] = int64_t(position);
      }
    }
    first = false;
  }
}

// A half table's bag, pooled in float32 into sums, rounded into `to` as PooledOutput says; mean_size
// is the bag's size for Mean, 0 otherwise. (Max values are the type's own, so they round exactly.)
void round_pooled_bag(const PooledOutput& out, float* sums, uint32_t dim, size_t mean_size, void* to) {
  if (out.type == ElementType::BFloat16 && out.bfloat16_ties_away) {
    round_through_bfloat16_ties_away(sums, dim);  // then exact, unless divided below
  } else if (mean_size > 0) {
    round_through(out.type, sums, dim);
  }
  if (mean_size > 0) {
    float divisor = float(mean_size);
    round_through(out.type, &divisor, 1);
    for (float* value = sums; value != sums + dim; ++value) *value /= divisor;
  }
  narrow_from_float(out.type, sums, to, dim);
}

}  // namespace

void validate_embedding_bag(const EmbeddingBag& bag, uint64_t num_rows) {
  const size_t num_offsets = bag.num_bags + (bag.include_last_offset ? 1 : 0);
  if (num_offsets > 0 && bag.offsets[0] != 0) {
    invalid("offsets[0] has to be 0, i.e., the first bag has to start at position 0, but got " +
            std::to_string(bag.offsets[0]));
  }
  for (size_t i = 1; i < num_offsets; ++i) {
    if (bag.offsets[i] < bag.offsets[i - 1]) {
      invalid("offsets must be non-decreasing, but offsets[" + std::to_string(i - 1) +
              "] = " + std::to_string(bag.offsets[i - 1]) + " > offsets[" + std::to_string(i) +
              "] = " + std::to_string(bag.offsets[i]));
    }
  }
  if (num_offsets > 0 && uint64_t(bag.offsets[num_offsets - 1]) > bag.num_ids) {
    invalid("offsets[-1] can not be greater than input's length " + std::to_string(bag.num_ids) +
            " but got offsets[-1] of " + std::to_string(bag.offsets[num_offsets - 1]));
  }
  if (bag.per_sample_weights != nullptr && bag.mode != PoolingMode::Sum) {
    invalid("per_sample_weights is only supported for mode='sum'");
  }
  if (bag.ignore_nan != nullptr && bag.mode != PoolingMode::Max) {
    invalid("nan can only be ignored in mode='max'");
  }
  if (bag.padding_idx < -1 || (bag.padding_idx >= 0 && uint64_t(bag.padding_idx) >= num_rows)) {
    invalid("padding_idx must be -1 (none) or a row id in [0, " + std::to_string(num_rows) + "), got " +
            std::to_string(bag.padding_idx));
  }
}

void pool_bags(const EmbeddingBag& bag, size_t first_bag, size_t end_bag, RowPointers& rows, ElementType type,
               uint32_t dim, const PooledOutput& out, int64_t* max_positions) {
  // Rows of `type` summed as they are, or widened first where this CPU has no summer for them; the
  // maximum of half rows always compares them widened.
  const RowSummer* direct = best_row_summer(type);
  const RowSummer& summer = direct != nullptr ? *direct : *best_row_summer(ElementType::Float32);
  const bool widens = type != ElementType::Float32 && (bag.mode == PoolingMode::Max || direct == nullptr);
  std::vector<float> widened(widens ? kGroup * size_t{dim} : 0);
  const FloatRows as_float{type, dim, widens ? widened.data() : nullptr};
  const FloatRows as_summed{type, dim, direct != nullptr ? nullptr : as_float.widened};
  // A half output's Sum bags are rounded by a summer of their own type as it stores them; its other
  // bags are pooled into `sums` (in L1) and rounded from there.
  const bool half_out = out.type != ElementType::Float32;
  const bool summer_rounds = half_out && direct != nullptr && bag.mode == PoolingMode::Sum;
  const size_t out_row_bytes = size_t{dim} * element_bytes(out.type);
  // Sum bags' sums stream into a large output when every row starts a line and fills whole vectors.
  const bool streams = out.streams && bag.mode == PoolingMode::Sum && (!half_out || summer_rounds) &&
                       reinterpret_cast<uintptr_t>(out.data) % kCacheLineBytes == 0 &&
                       out_row_bytes % kCacheLineBytes == 0;
  const FinalSums& final_sums = streams ? summer.streamed : summer.cached;
  const SumRows last_sum = !summer_rounds           ? final_sums.to_float
                           : out.bfloat16_ties_away ? final_sums.to_own_type_ties_away
                                                    : final_sums.to_own_type;
  std::vector<float> sums(half_out ? dim : 0);
  for (size_t b = first_bag; b < end_bag; ++b) {
    std::byte* out_row = static_cast<std::byte*>(out.data) + b * out_row_bytes;
    float* bag_out = half_out ? sums.data() : reinterpret_cast<float*>(out_row);
    int64_t* bag_positions = max_positions != nullptr ? max_positions + b * dim : nullptr;
    const size_t begin = bag.bag_begin(b);
    const size_t end = bag.bag_end(b);
    if (bag.mode == PoolingMode::Max) {
      std::fill(bag_out, bag_out + dim, 0.0f);
      if (bag_positions != nullptr) std::fill(bag_positions, bag_positions + dim, int64_t{-1});
      const bool ignore_nan = bag.ignore_nan != nullptr && bag.ignore_nan[b] != 0;
      max_bag(bag, begin, end, rows, as_float, bag_out, bag_positions, ignore_nan);
      if (half_out) round_pooled_bag(out, bag_out, dim, 0, out_row);
      continue;
    }
    const size_t count = sum_bag(bag, begin, end, rows, summer.cached.to_float, last_sum, as_summed, bag_out,
                                 summer_rounds ? out_row : static_cast<void*>(bag_out));
    if (half_out && !summer_rounds) {
      round_pooled_bag(out, bag_out, dim, bag.mode == PoolingMode::Mean ? std::max<size_t>(count, 1) : 0, out_row);
    } else if (bag.mode == PoolingMode::Mean && count > 0) {
      for (uint32_t d = 0; d < dim; ++d) bag_out[d] /= float(count);
    }
  }
#if defined(__x86_64__)
  if (streams) __builtin_ia32_sfence();  // the streamed sums before whatever this thread stores next
#endif
}

}  // namespace recdev::store
