// Convolutions. ATen routes every backend other than CPU/CUDA/MKLDNN to the
// *_overrideable ops, whose default kernels only raise, so the fallback never
// sees them. Here they run the CPU convolution on CPU views.

#include "device/cpu_access.h"
#include "device/cpu_view.h"

#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <torch/library.h>

namespace recdev::kernels {

namespace {

using device::adopt_result;

// Convolution inputs are read, never written.
at::Tensor cpu_view(const at::Tensor& t) { return device::CpuAccess(t, "convolution").cpu(); }

at::Tensor cpu_view_or_undefined(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? cpu_view(*t) : at::Tensor();
}

at::Tensor convolution_overrideable(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                                    c10::IntArrayRef output_padding, int64_t groups) {
  return adopt_result(at::convolution(cpu_view(input), cpu_view(weight), cpu_view_or_undefined(bias), stride, padding,
                                      dilation, transposed, output_padding, groups));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  auto [grad_input, grad_weight, grad_bias] = at::convolution_backward(
      cpu_view(grad_output), cpu_view(input), cpu_view(weight), std::vector<int64_t>{grad_output.size(1)}, stride,
      padding, dilation, transposed, output_padding, groups, output_mask);
  return {adopt_result(grad_input), adopt_result(grad_weight), adopt_result(grad_bias)};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", convolution_overrideable);
  m.impl("convolution_backward_overrideable", convolution_backward_overrideable);
}

}  // namespace recdev::kernels
