#include "python/async_ops_binding.h"

#include "device/async_ops.h"

#include <ATen/ThreadLocalState.h>
#include <torch/csrc/utils/pybind.h>

namespace recdev::python {

namespace {

// Bound through a type of this module's own: at::ThreadLocalState is exported, pybind11's bases are not.
struct CallerState {
  at::ThreadLocalState state;
};

// torch's bindings may call the guard (Stream.synchronize, Event.wait, ...) holding the interpreter
// lock, which the async-op thread needs to finish the operation waited for.
void block_without_the_interpreter_lock(const std::function<void()>& wait) {
  if (PyGILState_Check()) {
    py::gil_scoped_release released;
    wait();
  } else {
    wait();
  }
}

}  // namespace

void bind_async_ops(py::module_& m) {
  device::set_blocking_section(&block_without_the_interpreter_lock);
  // The calling thread's state (a profiler recording it, grad mode, autocast), for the async-op
  // thread to run each operation in, as autograd's engine runs a backward in its caller's.
  py::class_<CallerState>(m, "_ThreadLocalState").def(py::init<>());
  m.def("_issue_async_op", &device::issue_async_op);
  m.def("_run_async_op", [](uint64_t ticket, const CallerState& caller, const py::function& call) {
    py::object result;
    device::run_async_op(ticket, [&] {
      const at::ThreadLocalStateGuard guard(caller.state);
      result = call();
    });
    return result;
  });
  m.def(
      "_wait_for_async_ops", [] { device::wait_for_async_ops(device::last_async_op()); },
      py::call_guard<py::gil_scoped_release>());
}

}  // namespace recdev::python
