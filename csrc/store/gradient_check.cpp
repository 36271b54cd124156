#include "gradient_check.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "coalesce.h"
#include "errors.h"

namespace recdev::store {
namespace {

// One pass over count values read as Bits, branch-free so that it vectorizes (also with the
// baseline build's SSE2, which has no unsigned 32-bit max): whether none has an exponent field of
// all ones (inf or nan: such a field, and only that, carries into the sign bit when its lowest bit,
// exponent_low, is added), and the OR of their magnitudes' bits, which as an integer is at least
// the largest of them, and so as a value (where it is finite) at least the largest magnitude.
template <class Bits>
struct BitScan {
  bool finite;
  Bits magnitude_bound;
};

template <class Bits>
BitScan<Bits> scan_bits(const void* values, size_t count, Bits exponent, Bits exponent_low) {
  constexpr size_t kBlock = 64;  // a fixed inner trip count, which -O2 vectorizes
  constexpr Bits kSign = Bits(Bits{1} << (8 * sizeof(Bits) - 1));
  const auto* bytes = static_cast<const unsigned char*>(values);
  Bits carry = 0;
  Bits magnitudes = 0;
  size_t i = 0;
  for (; i + kBlock <= count; i += kBlock) {
    Bits bits[kBlock];
    std::memcpy(bits, bytes + i * sizeof(Bits), sizeof(bits));
    for (size_t k = 0; k < kBlock; ++k) {
      carry |= Bits((bits[k] & exponent) + exponent_low);
      magnitudes |= bits[k];
    }
  }
  for (; i < count; ++i) {
    Bits bits;
    std::memcpy(&bits, bytes + i * sizeof(Bits), sizeof(bits));
    carry |= Bits((bits & exponent) + exponent_low);
    magnitudes |= bits;
  }
  return {(carry & kSign) == 0, Bits(magnitudes & ~kSign)};
}

// scan_bits for count values of `type` (as all_finite_values reads them), the bound as a double:
// inf or nan where the OR's exponent field is all ones (the values may still all be finite).
template <class G>
std::pair<bool, double> scan_values(ElementType type, const G* values, size_t count) {
  if constexpr (std::is_same_v<G, float>) {
    const auto scan = scan_bits<uint32_t>(values, count, 0x7F800000u, 0x00800000u);
    float bound;
    std::memcpy(&bound, &scan.magnitude_bound, sizeof(bound));
    return {scan.finite, bound};
  } else if constexpr (std::is_same_v<G, uint16_t>) {
    if (type == ElementType::Float16) {
      const auto scan = scan_bits<uint16_t>(values, count, 0x7C00, 0x0400);
      return {scan.finite, half_to_float(scan.magnitude_bound)};
    }
    const auto scan = scan_bits<uint16_t>(values, count, 0x7F80, 0x0080);
    return {scan.finite, bfloat16_to_float(scan.magnitude_bound)};
  } else {
    const auto scan = scan_bits<uint64_t>(values, count, 0x7FF0000000000000u, 0x0010000000000000u);
    double bound;
    std::memcpy(&bound, &scan.magnitude_bound, sizeof(bound));
    return {scan.finite, bound};
  }
}

// An element of a gradient row as a double (exactly): widened from `type` for half rows.
template <class G>
double element_value(ElementType type, G value) {
  if constexpr (std::is_same_v<G, uint16_t>) {
    return type == ElementType::Float16 ? half_to_float(value) : bfloat16_to_float(value);
  } else {
    return value;
  }
}

template <class G>
void check_packed_rows(ElementType type, const G* values, uint32_t elements, const uint64_t* ids, size_t n,
                       const std::string& label) {
  std::vector<const G*> rows(n);
  for (size_t i = 0; i < n; ++i) rows[i] = values + i * elements;
  const auto [finite, bound] = scan_values(type, values, n * size_t{elements});
  if (!finite) refuse_first_non_finite(type, ids, n, rows.data(), elements, label);
  // No sum of a row's duplicates can overflow when 2n times a bound M of the magnitudes stays finite
  // in the type they are summed in: k rounded additions of values of at most M stay within
  // k M (1 + u)^k, and (1 + u)^k < 2 for k up to 2^23 (u = 2^-24 in float32, less in float64). Then
  // the ids need not be coalesced (a hash map of the batch) just to check: the common case.
  using Sum = typename CoalescedGradients<G>::Sum;
  if (n <= (size_t{1} << 23) && 2.0 * double(n) * bound <= double(std::numeric_limits<Sum>::max())) return;
  if (const auto overflow = CoalescedGradients<G>(ids, n, rows.data(), type, elements, 1).first_overflow()) {
    refuse_overflowing_sum(overflow->row_id, overflow->column, label);
  }
}

}  // namespace

template <class G>
bool all_finite_values(ElementType type, const G* values, size_t count) {
  return scan_values(type, values, count).first;
}

template <class G>
void refuse_first_non_finite(ElementType type, const uint64_t* ids, size_t n, const G* const* rows, uint32_t elements,
                             const std::string& label) {
  for (size_t i = 0; i < n; ++i) {
    for (uint32_t d = 0; d < elements; ++d) {
      if (const double value = element_value(type, rows[i][d]); !std::isfinite(value)) {
        throw StoreError(ErrorCode::InvalidArgument, "update of " + label + " refused: the gradient of row id " +
                                                         std::to_string(ids[i]) + " (ids[" + std::to_string(i) +
                                                         "]) holds " + (std::isnan(value) ? "nan" : "inf") +
                                                         " at column " + std::to_string(d) + "; nothing was applied");
      }
    }
  }
}

void refuse_overflowing_sum(uint64_t row_id, uint32_t column, const std::string& label) {
  throw StoreError(ErrorCode::InvalidArgument, "update of " + label + " refused: the summed gradient of row id " +
                                                   std::to_string(row_id) + " overflows to inf at column " +
                                                   std::to_string(column) + "; nothing was applied");
}

void check_update_gradients(ElementType dtype, uint32_t elements, const uint64_t* ids, size_t n, const void* grads,
                            const std::string& label) {
  switch (dtype) {
    case ElementType::Float32:
      check_packed_rows(dtype, static_cast<const float*>(grads), elements, ids, n, label);
      return;
    case ElementType::Float64: {
      // A copy: a request's payload need not be 8-byte aligned, as a double's access rules want.
      std::vector<double> aligned(n * size_t{elements});
      if (!aligned.empty()) std::memcpy(aligned.data(), grads, aligned.size() * sizeof(double));
      check_packed_rows(dtype, aligned.data(), elements, ids, n, label);
      return;
    }
    case ElementType::Float16:
    case ElementType::BFloat16:
      check_packed_rows(dtype, static_cast<const uint16_t*>(grads), elements, ids, n, label);
      return;
    case ElementType::Bytes:
      throw StoreError(ErrorCode::InvalidArgument, "update of " + label +
                                                       " refused: its rows are of a non-floating dtype, which the "
                                                       "store cannot train");
  }
}

template bool all_finite_values<float>(ElementType, const float*, size_t);
template bool all_finite_values<uint16_t>(ElementType, const uint16_t*, size_t);
template bool all_finite_values<double>(ElementType, const double*, size_t);
template void refuse_first_non_finite<float>(ElementType, const uint64_t*, size_t, const float* const*, uint32_t,
                                             const std::string&);
template void refuse_first_non_finite<uint16_t>(ElementType, const uint64_t*, size_t, const uint16_t* const*, uint32_t,
                                                const std::string&);
template void refuse_first_non_finite<double>(ElementType, const uint64_t*, size_t, const double* const*, uint32_t,
                                              const std::string&);

}  // namespace recdev::store
