#include "gradient_check.h"

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "coalesce.h"
#include "errors.h"

namespace recdev::store {
namespace {

template <class T>
void check_rows(const T* values, uint32_t elements, const uint64_t* ids, size_t n, const std::string& label) {
  for (size_t i = 0; i < n; ++i) {
    const T* row = values + i * elements;
    for (uint32_t d = 0; d < elements; ++d) {
      if (!std::isfinite(row[d])) {
        throw StoreError(ErrorCode::InvalidArgument,
                         "update of " + label + " refused: the gradient of row id " + std::to_string(ids[i]) +
                             " (ids[" + std::to_string(i) + "]) holds " + (std::isnan(row[d]) ? "nan" : "inf") +
                             " at column " + std::to_string(d) + "; nothing was applied");
      }
    }
  }
  constexpr ElementType type = std::is_same_v<T, double> ? ElementType::Float64 : ElementType::Float32;
  std::vector<const T*> rows(n);
  for (size_t i = 0; i < n; ++i) rows[i] = values + i * elements;
  if (const auto overflow = CoalescedGradients<T>(ids, n, rows.data(), type, elements, 1).first_overflow()) {
    throw StoreError(ErrorCode::InvalidArgument, "update of " + label + " refused: the summed gradient of row id " +
                                                     std::to_string(overflow->row_id) + " overflows to inf at column " +
                                                     std::to_string(overflow->column) + "; nothing was applied");
  }
}

}  // namespace

void check_update_gradients(ElementType dtype, uint32_t elements, const uint64_t* ids, size_t n, const void* grads,
                            const std::string& label) {
  const size_t count = n * size_t{elements};
  switch (dtype) {
    case ElementType::Float32: check_rows(static_cast<const float*>(grads), elements, ids, n, label); return;
    case ElementType::Float64: {
      std::vector<double> wide(count);
      if (count > 0) std::memcpy(wide.data(), grads, count * sizeof(double));
      check_rows(wide.data(), elements, ids, n, label);
      return;
    }
    case ElementType::Float16:
    case ElementType::BFloat16: {
      std::vector<float> wide(count);
      widen_to_float(dtype, grads, wide.data(), count);
      check_rows(wide.data(), elements, ids, n, label);
      return;
    }
    case ElementType::Bytes:
      throw StoreError(ErrorCode::InvalidArgument, "update of " + label +
                                                       " refused: its rows are of a non-floating dtype, which the "
                                                       "store cannot train");
  }
}

}  // namespace recdev::store
