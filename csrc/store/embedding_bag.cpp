#include "embedding_bag.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "cpu_features.h"
#include "errors.h"
#include "prefetch.h"


namespace recdev::store {
namespace {

[[noreturn]] void invalid(const std::string& message) {
  throw StoreError(ErrorCode::InvalidArgument, "embedding_bag: " + message);
}

// out[d] += scale(row[d]) for d in [0, dim), kBlock elements at a time through local copies: -O2
// vectorizes a loop of fixed count over unaliased arrays, not the plain loop. Each element gets the
// same operations either way.
template <class Scale>
void add_row(float* out, const float* row, uint32_t dim, Scale scale) {
  constexpr uint32_t kBlock = 16;
  uint32_t d = 0;
  for (; d + kBlock <= dim; d += kBlock) {
    float sum[kBlock];
    float add[kBlock];
    std::memcpy(sum, out + d, sizeof(sum));
    std::memcpy(add, row + d, sizeof(add));
    for (uint32_t k = 0; k < kBlock; ++k) sum[k] += scale(add[k]);
    std::memcpy(out + d, sum, sizeof(sum));
  }
  for (; d < dim; ++d) out[d] += scale(row[d]);
}

// The row additions of Sum and Mean bags, the bulk of embedding_bag's compute: out[d] += row[d], and
// out[d] += weight * row[d] with per-sample weights, for d in [0, dim). The build targets baseline
// x86-64, whose 16-byte vectors left pooling compute-bound: with 64-byte ones a pooled gather of
// 1M x 128 rows measured 25% faster. Each element gets the same float32 operations at every width: a
// weighted row's product is rounded before the addition (the empty asm keeps GCC from fusing the two
// into a multiply-add where the target has one, which would change results).
struct RowAdders {
  void (*add)(float* out, const float* row, uint32_t dim);
  void (*add_scaled)(float* out, const float* row, uint32_t dim, float weight);
};

// out[d] += weight * row[d] for d in [first, dim), each product rounded before its addition.
inline void add_scaled_tail(float* out, const float* row, uint32_t first, uint32_t dim, float weight) {
  for (uint32_t d = first; d < dim; ++d) {
    float product = weight * row[d];
    asm("" : "+x"(product));
    out[d] += product;
  }
}

void add_row_portable(float* out, const float* row, uint32_t dim) {
  add_row(out, row, dim, [](float value) { return value; });
}

void add_scaled_row_portable(float* out, const float* row, uint32_t dim, float weight) {
  add_row(out, row, dim, [weight](float value) { return weight * value; });
}

#ifdef RECDEV_STORE_AVX2_KERNELS
// One body for every vector width: Vector is a GCC vector of floats, compiled for the instruction set
// of the target function it is inlined into. out[d] += row[d], or with kScaled out[d] += weight *
// row[d], each product rounded before its addition, for d in [0, dim).
template <class Vector, bool kScaled>
__attribute__((always_inline)) inline void add_row_vectors(float* out, const float* row, uint32_t dim, float weight) {
  constexpr uint32_t kWidth = sizeof(Vector) / sizeof(float);
  uint32_t d = 0;
  for (; d + kWidth <= dim; d += kWidth) {
    Vector sum;
    Vector add;
    std::memcpy(&sum, out + d, sizeof(sum));
    std::memcpy(&add, row + d, sizeof(add));
    if constexpr (kScaled) {
      add *= weight;
      asm("" : "+v"(add));
    }
    sum += add;
    std::memcpy(out + d, &sum, sizeof(sum));
  }
  if constexpr (kScaled) {
    add_scaled_tail(out, row, d, dim, weight);
  } else {
    for (; d < dim; ++d) out[d] += row[d];
  }
}

using Floats8 = float __attribute__((vector_size(32)));
using Floats16 = float __attribute__((vector_size(64)));

__attribute__((target("avx2"))) void add_row_avx2(float* out, const float* row, uint32_t dim) {
  add_row_vectors<Floats8, false>(out, row, dim, 1.0f);
}
__attribute__((target("avx2"))) void add_scaled_row_avx2(float* out, const float* row, uint32_t dim, float weight) {
  add_row_vectors<Floats8, true>(out, row, dim, weight);
}
__attribute__((target("avx512f"))) void add_row_avx512(float* out, const float* row, uint32_t dim) {
  add_row_vectors<Floats16, false>(out, row, dim, 1.0f);
}
__attribute__((target("avx512f"))) void add_scaled_row_avx512(float* out, const float* row, uint32_t dim,
                                                              float weight) {
  add_row_vectors<Floats16, true>(out, row, dim, weight);
}
#endif

RowAdders best_row_adders() {
#ifdef RECDEV_STORE_AVX2_KERNELS
  if (cpu_has_avx512f()) return {&add_row_avx512, &add_scaled_row_avx512};
  if (cpu_has_avx2()) return {&add_row_avx2, &add_scaled_row_avx2};
#endif
  return {&add_row_portable, &add_scaled_row_portable};
}

// Adds every non-skipped row of a bag into out, scaled by its per-sample weight when there is one,
// and returns how many rows it took.
size_t sum_bag(const EmbeddingBag& bag, size_t begin, size_t end, RowPointers& rows, uint32_t dim, float* out) {
  static const RowAdders adders = best_row_adders();
  size_t count = 0;
  for (size_t position = begin; position < end; ++position) {
    if (bag.skips(position)) continue;
    const float* row = rows.next();
    if (bag.per_sample_weights != nullptr) {
      adders.add_scaled(out, row, dim, bag.per_sample_weights[position]);
    } else {
      adders.add(out, row, dim);
    }
    ++count;
  }
  return count;
}

// Each element's maximum over the bag's non-skipped rows, the first of equal ones; the first row's
// value stands whatever follows, so a nan there stays (CPU's embedding_bag), and a later nan never
// counts. With ignore_nan no nan counts, and max_positions (then required) tells which elements
// took a value (-1: none).
void max_bag(const EmbeddingBag& bag, size_t begin, size_t end, RowPointers& rows, uint32_t dim, float* out,
             int64_t* max_positions, bool ignore_nan) {
  bool first = true;
  for (size_t position = begin; position < end; ++position) {
    if (bag.skips(position)) continue;
    const float* row = rows.next();
    for (uint32_t d = 0; d < dim; ++d) {
      const bool take = ignore_nan ? !std::isnan(row[d]) && (max_positions[d] < 0 || row[d] > out[d])
                                   : first || row[d] > out[d];
      if (take) {
        out[d] = row[d];
        if (max_positions != nullptr) max_positions[d] = int64_t(position);
      }
    }
    first = false;
  }
}

}  // namespace

RowPointers::RowPointers(const float* const* rows, size_t count, uint32_t dim)
    : rows_(rows), count_(count), row_bytes_(size_t{dim} * sizeof(float)) {
  for (size_t k = 0; k < std::min(count, kAhead); ++k) prefetch_range(rows_[k], row_bytes_);
}

const float* RowPointers::next() {
  if (next_ + kAhead < count_) prefetch_range(rows_[next_ + kAhead], row_bytes_);
  return rows_[next_++];
}

void validate_embedding_bag(const EmbeddingBag& bag, uint64_t num_rows) {
  const size_t num_offsets = bag.num_bags + (bag.include_last_offset ? 1 : 0);
  if (num_offsets > 0 && bag.offsets[0] != 0) {
    invalid("offsets[0] has to be 0, i.e., the first bag has to start at position 0, but got " +
            std::to_string(bag.offsets[0]));
  }
  for (size_t i = 1; i < num_offsets; ++i) {
    if (bag.offsets[i] < bag.offsets[i - 1]) {
      invalid("offsets must be non-decreasing, but offsets[" + std::to_string(i - 1) + "] = " +
              std::to_string(bag.offsets[i - 1]) + " > offsets[" + std::to_string(i) +
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

void pool_bags(const EmbeddingBag& bag, size_t first_bag, size_t end_bag, RowPointers& rows, uint32_t dim, float* out,
               int64_t* max_positions) {
  for (size_t b = first_bag; b < end_bag; ++b) {
    float* bag_out = out + b * dim;
    int64_t* bag_positions = max_positions != nullptr ? max_positions + b * dim : nullptr;
    std::fill(bag_out, bag_out + dim, 0.0f);
    if (bag_positions != nullptr) std::fill(bag_positions, bag_positions + dim, int64_t{-1});
    const size_t begin = bag.bag_begin(b);
    const size_t end = bag.bag_end(b);
    if (bag.mode == PoolingMode::Max) {
      const bool ignore_nan = bag.ignore_nan != nullptr && bag.ignore_nan[b] != 0;
      max_bag(bag, begin, end, rows, dim, bag_out, bag_positions, ignore_nan);
      continue;
    }
    const size_t count = sum_bag(bag, begin, end, rows, dim, bag_out);
    if (bag.mode == PoolingMode::Mean && count > 0) {
      for (uint32_t d = 0; d < dim; ++d) bag_out[d] /= float(count);
    }
  }
}

}  // namespace recdev::store
