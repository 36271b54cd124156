// native_dropout has no generator argument, so through the fallback its CPU
// kernel would draw from the CPU generator. Dropout on recdev draws its mask
// from the recdev generator instead, like every other random op here, with
// the CPU kernel's semantics (mask is bool; kept values scaled by 1/(1-p)).

#include "device/cpu_access.h"
#include "device/cpu_view.h"
#include "device/generator.h"

#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

namespace recdev::kernels {

namespace {

std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  TORCH_CHECK(p >= 0 && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  const at::Tensor cpu = device::CpuAccess(input, "dropout").cpu();
  if (input.numel() == 0) {
    return {device::adopt_result(cpu.clone()), device::adopt_result(at::empty_like(cpu, at::kBool))};
  }
  if (!train.value_or(true) || p == 0) {
    return {device::adopt_result(cpu.clone()), device::adopt_result(at::ones_like(cpu, at::kBool))};
  }
  if (p == 1) {
    return {device::adopt_result(at::zeros_like(cpu)), device::adopt_result(at::zeros_like(cpu, at::kBool))};
  }
  at::Tensor mask = at::empty_like(cpu, at::kBool);
  mask.bernoulli_(1 - p, device::cpu_generator_for_op(std::nullopt));
  at::Tensor output = cpu.mul(mask).mul_(1.0 / (1.0 - p));
  return {device::adopt_result(output), device::adopt_result(mask)};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("native_dropout", native_dropout); }

}  // namespace recdev::kernels
