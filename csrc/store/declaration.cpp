#include "declaration.h"

#include <cstring>

namespace recdev::store {
namespace {

bool same_strategy(const InitRule& lhs, const InitRule& rhs) {
  InitRule unseeded = rhs;
  unseeded.seed = lhs.seed;
  return lhs == unseeded;
}

std::string strategy(const InitRule& rule) {
  // The seed is not part of what is compared, so it is not shown either.
  std::string text = describe(rule);
  const size_t seed = text.find(", seed=");
  if (seed != std::string::npos) return text.substr(0, seed) + ")";
  if (rule.kind == InitKind::Xavier) return "Xavier()";
  return text;
}

std::string kind_of(const OptimizerConfig& config) {
  const std::string text = describe(config);
  return text.substr(0, text.find('('));
}

}  // namespace

std::string declaration_mismatch(const TableConfig& existing, const OptimizerConfig& optimizer,
                                 const TableDeclaration& declared) {
  std::string differences;
  const auto add = [&](const std::string& what) { differences += (differences.empty() ? "" : "; ") + what; };
  // Shapes in elements, as the user declares them (TableConfig::dim counts 4-byte words).
  const uint32_t existing_dim = row_elements(existing);
  const uint32_t declared_dim = row_elements(declared.config);
  if (existing.num_rows != declared.config.num_rows || existing_dim != declared_dim) {
    add("shape: the table is " + std::to_string(existing.num_rows) + " x " + std::to_string(existing_dim) +
        ", declared " + std::to_string(declared.config.num_rows) + " x " + std::to_string(declared_dim));
  }
  if (existing.dtype != declared.config.dtype) {
    // Never converted on the way: a table's dtype is part of its identity.
    add(std::string("dtype: the table is ") + element_type_name(existing.dtype) + ", declared " +
        element_type_name(declared.config.dtype));
  }
  if (declared.declares_init && !same_strategy(existing.init, declared.config.init)) {
    add("init rule: the table has " + strategy(existing.init) + ", declared " + strategy(declared.config.init));
  }
  if (declared.optimizer && optimizer.kind != OptimizerKind::None && declared.optimizer->kind != optimizer.kind) {
    add("optimizer kind: the table has " + kind_of(optimizer) + ", declared " + kind_of(*declared.optimizer));
  }
  return differences;
}

std::optional<OptimizerConfig> declared_optimizer(const TableDeclaration& declared, const OptimizerConfig& existing) {
  if (!declared.optimizer) return std::nullopt;
  OptimizerConfig optimizer = *declared.optimizer;
  if (!declared.declares_rounding && existing.kind != OptimizerKind::None) {
    optimizer.stochastic_rounding = existing.stochastic_rounding;
    optimizer.rounding_seed = existing.rounding_seed;
  }
  return optimizer;
}

std::string declaration_error(const std::string& name, const std::string& mismatch) {
  return "table '" + name + "' already exists and differs from its declaration in " + mismatch +
         ". Declare it as it is to keep its rows, or pass reset=True to drop its rows and optimizer state and "
         "create it as declared";
}

}  // namespace recdev::store
