// Init kernels on table storage. normal_, uniform_, zero_ and fill_ on a
// whole table set the table's init rule in O(1) instead of writing rows
// (DESIGN.md, "Lazy rows"); this is how nn.Embedding and nn.init.* initialize
// a 10^10-row table at once. Partial ranges, other dtypes and host storage go
// to the fallback, which writes the rows the op covers.

#include "device/generator.h"
#include "device/table_storage.h"
#include "fallback.h"

#include "store/table_handle.h"

#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <optional>

namespace recdev::kernels {

namespace {

bool covers_whole_table(const at::Tensor& t) {
  return t.storage_offset() == 0 && t.is_contiguous() &&
         static_cast<uint64_t>(t.numel()) * t.element_size() == device::table_block(t.storage())->nbytes;
}

std::optional<at::Generator> generator_arg(const c10::IValue& v) {
  return v.isGenerator() ? std::optional<at::Generator>(v.toGenerator()) : std::nullopt;
}

// The rule equivalent to `op` on the whole of a floating table (Zero fits
// every dtype: all bits zero), or nullopt. The store draws a row's init
// values in float32 and converts them to the table's type
// (store/element_type.h), so a constant of another type takes this path
// only if float32 holds it exactly.
std::optional<store::InitRule> rule_for(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                                        c10::ScalarType dtype) {
  const std::string& name = op.schema().name();
  const bool is_float = dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kDouble;
  if (name == "aten::fill_" && is_float && args[1].isScalar()) {
    // CPU's fill_ converts the value to the tensor's type first and raises if it overflows (fill_(1e5)
    // on float16); the rule's float32 constant would instead become inf in every row, silently.
    const at::Scalar value = args[1].toScalar();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "fill_", [&] { (void)value.to<scalar_t>(); });
  }
  store::InitRule rule;
  if (name == "aten::zero_" || (name == "aten::fill_" && args[1].isScalar() && args[1].toScalar().toDouble() == 0.0 &&
                                !std::signbit(args[1].toScalar().toDouble()))) {
    rule.kind = store::InitKind::Zero;
  } else if (name == "aten::fill_" && is_float && args[1].isScalar() &&
             (dtype == at::kFloat || static_cast<double>(static_cast<float>(args[1].toScalar().toDouble())) ==
                                         args[1].toScalar().toDouble())) {
    rule.kind = store::InitKind::Constant;
    rule.a = static_cast<float>(args[1].toScalar().toDouble());
  } else if (name == "aten::normal_" && is_float) {
    rule.kind = store::InitKind::Normal;
    rule.a = args[1].toDouble();
    rule.b = args[2].toDouble();
    TORCH_CHECK(rule.b >= 0.0, "normal expects std >= 0.0, but found std ", rule.b);
    rule.seed = device::draw_op_seed(generator_arg(args[3]));
  } else if (name == "aten::uniform_" && is_float) {
    rule.kind = store::InitKind::Uniform;
    rule.a = args[1].toDouble();
    rule.b = args[2].toDouble();
    TORCH_CHECK(rule.a <= rule.b, "uniform_ expects to return a [from, to) range, but found from=", rule.a,
                " > to=", rule.b);
    rule.seed = device::draw_op_seed(generator_arg(args[3]));
  } else {
    return std::nullopt;
  }
  return rule;
}

void init_table_or_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  auto args = torch::jit::last(*stack, n);
  const at::Tensor self = args[0].toTensor();
  if (device::is_table(self) && covers_whole_table(self)) {
    if (auto rule = rule_for(op, args, self.scalar_type())) {
      device::table_block(self.storage())->table().set_init(*rule);
      torch::jit::drop(*stack, n);
      torch::jit::push(*stack, self);
      return;
    }
  }
  cpu_fallback(op, stack);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* name : {"normal_", "uniform_", "zero_", "fill_.Scalar"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&init_table_or_fallback>());
  }
}

}  // namespace recdev::kernels
