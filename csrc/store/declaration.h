// TableDeclaration: what a training script says a named table is (ops.init_embedding_table,
// share_tables). Declaring is idempotent, like CREATE TABLE IF NOT EXISTS: every rank of a fleet
// runs the same script, so the second declaration of a table must open it, not reset it, and a
// checkpoint loaded before the declaration must keep its rows.
#pragma once

#include <optional>
#include <string>

#include "optimizer.h"
#include "table.h"

namespace recdev::store {

struct TableDeclaration {
  TableConfig config;                        // num_rows and dim; init when declares_init (its seed is not compared)
  bool declares_init = false;                // false: the declaration says nothing about the init rule
  std::optional<OptimizerConfig> optimizer;  // none: says nothing about the optimizer
  // false: the declared optimizer says nothing about stochastic rounding, and the table keeps its
  // rounding mode and seed (another rank, share_tables, a script that predates the rounding).
  bool declares_rounding = false;
  bool reset = false;  // drop every row and optimizer state, whatever the table was
};

// What of `declared` differs from an existing table with `existing` config and `optimizer`; empty
// when the declaration keeps the table as it is. Compared: shape (num_rows, dim in elements); dtype; the init rule's kind
// and parameters when declared (not its seed, which each process draws from its own generator: the
// first declaration's seed stays); the optimizer's kind when declared and the table has one (an
// optimizer's hyperparameters may change, its kind would drop the state).
std::string declaration_mismatch(const TableConfig& existing, const OptimizerConfig& optimizer,
                                 const TableDeclaration& declared);

// The optimizer a declaration sets on a table whose optimizer is `existing`: the declared one, with
// the existing rounding mode and seed when the declaration does not name them; none when the
// declaration names no optimizer.
std::optional<OptimizerConfig> declared_optimizer(const TableDeclaration& declared, const OptimizerConfig& existing);

// The StoreError(InvalidArgument) text for a mismatch on table `name`.
std::string declaration_error(const std::string& name, const std::string& mismatch);

}  // namespace recdev::store
