#include "python/optimizer_binding.h"

#include <pybind11/stl.h>

#include <string>
#include <utility>

#include "store/optimizer.h"

namespace py = pybind11;

namespace recdev::python {

using store::OptimizerConfig;
using store::OptimizerKind;

namespace {

constexpr std::pair<OptimizerKind, const char*> kKindNames[] = {
    {OptimizerKind::SGD, "sgd"},
    {OptimizerKind::Adagrad, "adagrad"},
    {OptimizerKind::RowWiseAdagrad, "rowwise_adagrad"},
    {OptimizerKind::Adam, "adam"},
};

OptimizerKind parse_kind(const std::string& name) {
  for (const auto& [kind, kind_name] : kKindNames) {
    if (name == kind_name) return kind;
  }
  throw py::value_error("unknown optimizer '" + name + "'; choose sgd, adagrad, rowwise_adagrad or adam");
}

std::string kind_name(OptimizerKind kind) {
  for (const auto& [known, name] : kKindNames) {
    if (kind == known) return name;
  }
  return "none";
}

OptimizerConfig make_config(const std::string& kind, double lr, double weight_decay, double eps, double lr_decay,
                            double initial_accumulator_value, double beta1, double beta2, bool stochastic_rounding,
                            uint64_t rounding_seed) {
  if (!stochastic_rounding && rounding_seed != 0) {
    throw py::value_error("rounding_seed is used with stochastic_rounding=True only");
  }
  return OptimizerConfig{
      parse_kind(kind),    lr,           weight_decay, eps, lr_decay, initial_accumulator_value, beta1, beta2,
      stochastic_rounding, rounding_seed};
}

// The hyperparameters under torch.optim's names, for the kind (Adam's betas as a pair), with the
// rounding settings when the optimizer rounds stochastically: what init_embedding_table takes.
py::dict hyperparameters(const OptimizerConfig& config) {
  py::dict hp;
  hp["lr"] = config.lr;
  if (config.kind != OptimizerKind::Adam) hp["weight_decay"] = config.weight_decay;
  if (config.kind != OptimizerKind::SGD) hp["eps"] = config.eps;
  if (config.kind == OptimizerKind::Adagrad) {
    hp["lr_decay"] = config.lr_decay;
    hp["initial_accumulator_value"] = config.initial_accumulator_value;
  }
  if (config.kind == OptimizerKind::Adam) hp["betas"] = py::make_tuple(config.beta1, config.beta2);
  if (config.stochastic_rounding) {
    hp["stochastic_rounding"] = true;
    hp["rounding_seed"] = config.rounding_seed;
  }
  return hp;
}

}  // namespace

void bind_optimizer_config(py::module_& m) {
  const OptimizerConfig defaults;
  py::class_<OptimizerConfig>(m, "OptimizerConfig", "A fused optimizer of a store table (store/optimizer.h).")
      .def(py::init(&make_config), py::arg("kind"), py::kw_only(), py::arg("lr") = defaults.lr,
           py::arg("weight_decay") = defaults.weight_decay, py::arg("eps") = defaults.eps,
           py::arg("lr_decay") = defaults.lr_decay,
           py::arg("initial_accumulator_value") = defaults.initial_accumulator_value, py::arg("beta1") = defaults.beta1,
           py::arg("beta2") = defaults.beta2, py::arg("stochastic_rounding") = false, py::arg("rounding_seed") = 0)
      .def_property_readonly("kind", [](const OptimizerConfig& c) { return kind_name(c.kind); })
      .def_readonly("lr", &OptimizerConfig::lr)
      .def_readonly("weight_decay", &OptimizerConfig::weight_decay)
      .def_readonly("eps", &OptimizerConfig::eps)
      .def_readonly("lr_decay", &OptimizerConfig::lr_decay)
      .def_readonly("initial_accumulator_value", &OptimizerConfig::initial_accumulator_value)
      .def_readonly("beta1", &OptimizerConfig::beta1)
      .def_readonly("beta2", &OptimizerConfig::beta2)
      .def_readonly("stochastic_rounding", &OptimizerConfig::stochastic_rounding)
      .def_readonly("rounding_seed", &OptimizerConfig::rounding_seed)
      .def("hyperparameters", &hyperparameters)
      .def("__eq__", [](const OptimizerConfig& a, const OptimizerConfig& b) { return a == b; })
      .def("__repr__", [](const OptimizerConfig& c) {
        return "OptimizerConfig(" + kind_name(c.kind) + ", " + py::repr(hyperparameters(c)).cast<std::string>() + ")";
      });
}

}  // namespace recdev::python
