#pragma once
// The CPU fallback (fallback.cpp), for kernels that handle some cases
// themselves (table storage) and hand every other case to it.

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace recdev::kernels {

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace recdev::kernels
