// The fallback for every aten op without a recdev kernel: run the CPU kernel
// on CPU views of the same bytes. For host storage nothing is copied in or out
// (unlike at::native::cpu_fallback): in-place and out= variants write through,
// and outputs that alias an input come back as views of the recdev storage.
// For table storage the rows a view covers are copied to a CPU window and,
// when the op writes them, back (never more than max_fallback_bytes).
//
// Per call:
//   1. Arguments: recdev tensors become CPU views (or table windows); recdev
//      devices become CPU; random ops get a CPU generator drawn from the
//      recdev generator.
//      A CPU tensor mixed in (other than a 0-dim scalar or an index) is the
//      same error CUDA raises.
//   2. The CPU kernel runs.
//   3. Mutated arguments: table windows are written back; a CPU kernel may
//      have resized (reallocated) or set_ an out= view; the recdev tensor
//      follows it.
//   4. Returns: a CPU tensor on a viewed storage becomes a recdev view of it;
//      a fresh CPU tensor is adopted by a recdev storage (zero copy), or
//      copied into a table when the placement rules say so.

#include "fallback.h"
#include "device/cpu_view.h"
#include "device/generator.h"
#include "device/placement.h"
#include "device/table_window.h"

#include <ATen/SparseTensorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <deque>

namespace recdev::kernels {

namespace {

using device::cpu_view;

struct MutatedArgument {
  at::Tensor recdev;
  at::Tensor cpu;
  const c10::StorageImpl* cpu_storage_before;
  size_t nbytes_before;
  const device::TableWindow* window;  // null for host storage
};

// A CPU storage standing for (part of) a recdev storage during the call.
struct StorageLink {
  const c10::StorageImpl* cpu;
  c10::Storage recdev;
  uint64_t byte_shift;  // where the CPU bytes start in the recdev storage
};

class FallbackCall {
 public:
  explicit FallbackCall(const c10::OperatorHandle& op) : op_(op) {}

  void convert_arguments(torch::jit::Stack& stack);
  void sync_mutated_arguments();
  void convert_returns(torch::jit::Stack& stack);

 private:
  at::Tensor to_cpu(const at::Tensor& t, const c10::Argument& arg, bool is_index);
  at::Tensor sparse_to_cpu(const at::Tensor& t, const c10::Argument& arg);
  at::Tensor to_recdev(const at::Tensor& t);
  at::Tensor sparse_to_recdev(const at::Tensor& t);
  // The link of the storage under `cpu_tensor`; a storage the call did not
  // view is a fresh result, placed by the placement rules.
  const StorageLink& link_for(const at::Tensor& cpu_tensor);

  const c10::OperatorHandle& op_;
  // CPU storages viewed, windowed or adopted in this call.
  std::deque<StorageLink> links_;
  std::deque<device::TableWindow> windows_;
  c10::SmallVector<MutatedArgument, 2> mutated_;
  bool saw_recdev_ = false;
  // A recdev tensor other than an index: with none, a CPU tensor indexed by recdev indices is
  // refused as CUDA refuses it.
  bool saw_recdev_data_ = false;
  std::optional<std::string> cpu_argument_;
  // Sparse COO arguments: the recdev tensor and the CPU twin its kernel sees.
  c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 2> sparse_mutated_;

 public:
  bool saw_sparse = false;
};

at::SparseTensorImpl* sparse_impl(const at::Tensor& t) {
  return static_cast<at::SparseTensorImpl*>(t.unsafeGetTensorImpl());
}

// A sparse COO tensor of `key` with the geometry of `like` over these
// indices and values (built directly: the factory ops would dispatch back here).
// Reads `like` through its impl, never through ops, which would dispatch.
at::Tensor make_sparse(c10::DispatchKey key, const at::Tensor& like, at::Tensor indices, at::Tensor values) {
  const at::SparseTensorImpl* from = sparse_impl(like);
  at::Tensor t = at::detail::make_tensor<at::SparseTensorImpl>(c10::DispatchKeySet(key), like.dtype());
  at::SparseTensorImpl* impl = sparse_impl(t);
  impl->resize_(from->sparse_dim(), from->dense_dim(), like.sizes());
  impl->set_indices_and_values_unsafe(indices, values);
  impl->set_coalesced(from->coalesced());
  return t;
}

bool is_generator(const c10::Argument& arg) {
  c10::TypePtr type = arg.type();
  if (auto optional = type->cast<c10::OptionalType>()) {
    type = optional->getElementType();
  }
  return type->kind() == c10::TypeKind::GeneratorType;
}

// Integer index arguments may stay on the CPU, as indices do on CUDA: a
// parameter server's ids usually come straight from a CPU data loader.
bool is_index_argument(const c10::Argument& arg, const at::Tensor& t) {
  const std::string& name = arg.name();
  return (name == "indices" || name == "index" || name == "offsets") &&
         c10::isIntegralType(t.scalar_type(), /*includeBool=*/false);
}

bool is_layout(const c10::Argument& arg) {
  c10::TypePtr type = arg.real_type();  // type() says int: layouts travel as ints
  if (auto optional = type->cast<c10::OptionalType>()) {
    type = optional->getElementType();
  }
  return type->kind() == c10::TypeKind::LayoutType;
}

bool is_write(const c10::Argument& arg) { return arg.alias_info() != nullptr && arg.alias_info()->isWrite(); }

at::Tensor FallbackCall::sparse_to_cpu(const at::Tensor& t, const c10::Argument& arg) {
  saw_sparse = true;
  if (!t.is_privateuseone()) {
    return t;
  }
  const at::SparseTensorImpl* impl = sparse_impl(t);
  at::Tensor cpu = make_sparse(c10::DispatchKey::SparseCPU, t, to_cpu(impl->indices(), arg, false),
                               to_cpu(impl->values(), arg, false));
  if (is_write(arg)) {
    sparse_mutated_.emplace_back(t, cpu);
  }
  return cpu;
}

at::Tensor FallbackCall::sparse_to_recdev(const at::Tensor& t) {
  for (const auto& [recdev, cpu] : sparse_mutated_) {
    if (cpu.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
      return recdev;
    }
  }
  const at::SparseTensorImpl* impl = sparse_impl(t);
  return make_sparse(c10::DispatchKey::SparsePrivateUse1, t, to_recdev(impl->indices()), to_recdev(impl->values()));
}

at::Tensor FallbackCall::to_cpu(const at::Tensor& t, const c10::Argument& arg, bool is_index) {
  if (!t.defined()) {
    return t;
  }
  if (t.layout() == c10::kSparse) {
    return sparse_to_cpu(t, arg);
  }
  if (!t.is_privateuseone()) {
    // As on CUDA, 0-dim CPU tensors act as scalars and indices may stay on
    // the CPU; any other CPU tensor is a device mismatch, and so is every
    // CPU tensor written to (an out= tensor is never a scalar).
    if ((t.dim() > 0 || is_write(arg)) && !is_index && !cpu_argument_) {
      cpu_argument_ = arg.name();
    }
    return t;
  }
  saw_recdev_ = true;
  saw_recdev_data_ = saw_recdev_data_ || !is_index;
  const device::TableWindow* window = nullptr;
  at::Tensor cpu;
  if (device::is_table(t)) {
    window = &windows_.emplace_back(t, op_.schema().operator_name().name);
    cpu = window->cpu();
  } else {
    cpu = cpu_view(t);
  }
  links_.push_back({cpu.storage().unsafeGetStorageImpl(), t.storage(), window ? window->shift() : 0});
  if (is_write(arg)) {
    mutated_.push_back({t, cpu, cpu.storage().unsafeGetStorageImpl(), cpu.storage().nbytes(), window});
  }
  return cpu;
}

void FallbackCall::convert_arguments(torch::jit::Stack& stack) {
  const auto& arguments = op_.schema().arguments();
  const size_t first = stack.size() - arguments.size();
  for (size_t i = 0; i < arguments.size(); ++i) {
    const c10::Argument& arg = arguments[i];
    c10::IValue& value = stack[first + i];
    if (value.isTensor()) {
      const at::Tensor& t = value.toTensor();
      value = to_cpu(t, arg, t.defined() && is_index_argument(arg, t));
    } else if (value.isTensorList()) {
      auto list = value.toTensorList();
      for (size_t j = 0; j < list.size(); ++j) {
        list.set(j, to_cpu(list.get(j), arg, /*is_index=*/false));
      }
    } else if (value.isOptionalTensorList()) {
      // Tensor?[] is how indices are passed (x[idx], index_put_).
      auto list = value.toOptionalTensorList();
      for (size_t j = 0; j < list.size(); ++j) {
        std::optional<at::Tensor> item = list.get(j);
        if (item.has_value()) {
          list.set(j, to_cpu(*item, arg, /*is_index=*/true));
        }
      }
    } else if (is_layout(arg) && value.isInt() && value.toInt() == static_cast<int64_t>(c10::kSparse)) {
      saw_sparse = true;  // a sparse factory: its CPU kernel is SparseCPU's
    } else if (value.isDevice() && value.toDevice().is_privateuseone()) {
      saw_recdev_ = saw_recdev_data_ = true;
      value = c10::IValue(c10::Device(c10::kCPU));
    } else if (is_generator(arg)) {
      std::optional<at::Generator> generator;
      if (value.isGenerator()) {
        generator = value.toGenerator();
      }
      value = c10::IValue(device::cpu_generator_for_op(generator));
    }
  }
  if (saw_recdev_ && cpu_argument_) {
    TORCH_CHECK_INDEX(saw_recdev_data_,
                      "indices should be either on cpu or on the same device as the indexed tensor (cpu)");
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but got ", *cpu_argument_,
                " is on cpu, different from other tensors on recdev:0 (when checking "
                "argument in method ",
                op_.schema().operator_name(), "). Move it with .to('recdev') or move the others with .cpu().");
  }
}

const StorageLink& FallbackCall::link_for(const at::Tensor& cpu_tensor) {
  const c10::StorageImpl* key = cpu_tensor.storage().unsafeGetStorageImpl();
  for (const StorageLink& link : links_) {
    if (link.cpu == key) {
      return link;
    }
  }
  return links_.emplace_back(StorageLink{key, device::result_storage(cpu_tensor), 0});
}

void FallbackCall::sync_mutated_arguments() {
  for (const StorageLink& link : links_) {
    device::resync_after_cpu_resize(link.recdev);
  }
  // A sparse kernel may give its output new indices, values, sizes or a
  // coalesced flag; the recdev tensor takes them over.
  for (auto& [recdev, cpu] : sparse_mutated_) {
    const at::SparseTensorImpl* from = sparse_impl(cpu);
    at::SparseTensorImpl* impl = sparse_impl(recdev);
    impl->resize_(from->sparse_dim(), from->dense_dim(), cpu.sizes());
    impl->set_indices_and_values_unsafe(to_recdev(from->indices()), to_recdev(from->values()));
    impl->set_coalesced(from->coalesced());
  }
  for (MutatedArgument& m : mutated_) {
    const bool same_storage = m.cpu.storage().unsafeGetStorageImpl() == m.cpu_storage_before;
    const bool same_geometry = m.cpu.sizes() == m.recdev.sizes() && m.cpu.strides() == m.recdev.strides();
    if (m.window != nullptr) {
      TORCH_CHECK(same_storage && same_geometry, "recdev: ", op_.schema().operator_name(),
                  " would resize an output on table storage; tables have a fixed size. "
                  "Pass an output of the right shape.");
      m.window->write_back();
      continue;
    }
    c10::TensorImpl* recdev = m.recdev.unsafeGetTensorImpl();
    const bool grown = same_storage && m.cpu.storage().nbytes() > m.nbytes_before;
    if (!same_storage) {
      recdev->set_storage_keep_dtype(link_for(m.cpu).recdev);
    } else if (grown && device::place_in_table(m.cpu.storage().nbytes())) {
      // An out= tensor grown by the kernel (arange(n, device=...) fills an
      // empty one) is a new allocation: it goes where placement says.
      recdev->set_storage_keep_dtype(device::result_storage(m.cpu));
    }
    if (!same_geometry || m.cpu.storage_offset() != m.recdev.storage_offset()) {
      recdev->set_sizes_and_strides(m.cpu.sizes(), m.cpu.strides(), m.cpu.storage_offset());
    }
  }
}

at::Tensor FallbackCall::to_recdev(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu()) {
    return t;
  }
  if (t.layout() == c10::kSparse) {
    return sparse_to_recdev(t);
  }
  for (const MutatedArgument& m : mutated_) {
    if (m.cpu.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
      return m.recdev;  // in-place and out= return their argument itself
    }
  }
  const StorageLink& link = link_for(t);
  return device::recdev_tensor_on(link.recdev, t, link.byte_shift);
}

void FallbackCall::convert_returns(torch::jit::Stack& stack) {
  const size_t count = op_.schema().returns().size();
  for (size_t i = stack.size() - count; i < stack.size(); ++i) {
    c10::IValue& value = stack[i];
    if (value.isTensor()) {
      value = to_recdev(value.toTensor());
    } else if (value.isTensorList()) {
      auto list = value.toTensorList();
      for (size_t j = 0; j < list.size(); ++j) {
        list.set(j, to_recdev(list.get(j)));
      }
    }
  }
}

}  // namespace

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  FallbackCall call(op);
  call.convert_arguments(*stack);
  // Sparse arguments need the SparseCPU kernel, which handles dense ones too.
  const c10::DispatchKeySet cpu_keys = call.saw_sparse
                                           ? c10::DispatchKeySet({c10::DispatchKey::SparseCPU, c10::DispatchKey::CPU})
                                           : c10::DispatchKeySet(c10::DispatchKey::CPU);
  op.redispatchBoxed(cpu_keys, stack);
  call.sync_mutated_arguments();
  call.convert_returns(*stack);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>()); }

// Sparse COO tensors on recdev (the gradients of nn.Embedding(sparse=True) on
// host storage): indices and values are recdev host tensors, and every op
// runs as the SparseCPU kernel on CPU twins of them. Each op with a SparseCPU
// kernel is registered for SparsePrivateUse1 by name, because many also have
// a CompositeExplicitAutograd kernel, which would win over a fallback.
TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>()); }

namespace {
const bool sparse_ops_registered = [] {
  static torch::Library library(torch::Library::IMPL, "aten", c10::DispatchKey::SparsePrivateUse1, __FILE__, __LINE__);
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    auto op = c10::Dispatcher::singleton().findOp(name);
    if (name.name.rfind("aten::", 0) == 0 && op && op->hasKernelForDispatchKey(c10::DispatchKey::SparseCPU) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::SparsePrivateUse1)) {
      const std::string full = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
      library.impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
    }
  }
  return true;
}();
}  // namespace

// These ops have a CompositeExplicitAutograd decomposition, which the
// dispatcher prefers to a backend fallback, and a dedicated CPU kernel.
// Routing them to the CPU kernel is faster and gives CPU's exact numerics.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* name : {"native_layer_norm", "native_group_norm", "addr", "addr.out"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
  }
}

}  // namespace recdev::kernels
