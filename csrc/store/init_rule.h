// Init rules: how a row that was never written gets its value.
//
// A table does not store rows it has not materialized. Setting a whole-table init (normal_, uniform_,
// zero_, fill_, nn.init.*) only records the rule; a row's value is computed from the rule when the row
// is first read. The value is a pure function of (rule, table id, row id, element index) — see
// fill_row — so it is the same whichever thread, shard or process computes it, and whenever.
#pragma once

#include <cstdint>
#include <string>

namespace recdev::store {

// Numeric values are stored in checkpoint files: never renumber, only append.
enum class InitKind : uint32_t { Zero = 0, Constant = 1, Normal = 2, Uniform = 3, Xavier = 4 };

// The meaning of a and b depends on kind:
//   Zero      all zeros (a, b unused)
//   Constant  value a (any float, including inf and nan, as tensor.fill_ accepts)
//   Normal    mean a, standard deviation b >= 0
//   Uniform   [a, b) with a <= b
//   Xavier    uniform in [-bound, bound), bound = sqrt(6 / (fan_in + fan_out)), fan_in = dim and
//             fan_out = num_rows: torch.nn.init.xavier_uniform_ (gain 1) on a [num_rows, dim] weight.
//             (a, b unused; a gain other than 1 is a Uniform rule with the scaled bound.)
// seed selects the random stream of the random kinds; Zero and Constant ignore it.
struct InitRule {
  InitKind kind = InitKind::Zero;
  double a = 0.0;
  double b = 0.0;
  uint64_t seed = 0;
};

// Bitwise equality, so that a Constant nan rule equals itself.
bool operator==(const InitRule& lhs, const InitRule& rhs);
bool operator!=(const InitRule& lhs, const InitRule& rhs);

// A readable form for error messages, e.g. "Normal(mean=0, std=0.01, seed=7)".
std::string describe(const InitRule& rule);

// Throws StoreError(InvalidArgument) naming the problem unless the rule is well formed.
void validate_init_rule(const InitRule& rule);

// Writes the initial value of row `row_id` of table `table_id` (dim floats) to out.
// Precondition: validate_init_rule(rule) passed. num_rows is only used by Xavier.
void fill_row(const InitRule& rule, uint64_t table_id, uint64_t row_id, uint32_t dim, uint64_t num_rows, float* out);

}  // namespace recdev::store
