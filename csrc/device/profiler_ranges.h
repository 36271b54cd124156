// Store work in torch.profiler traces: the tracer that turns trace::Range (store/trace_range.h) into
// USER_SCOPE RecordFunction ranges named recdev::<name>, installed when the extension loads; and
// the way to keep a profiler's ranges on the threads store work runs on. A profiler records the
// thread that started it and the threads its thread-local state is carried to (autograd's engine,
// at::launch); at::parallel_for's workers and the async-op thread get it from here.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <ATen/record_function.h>

namespace recdev::device {

// at::parallel_for, with this thread's profiler on the workers while one records this thread.
template <class Work>
void parallel_for_profiled(int64_t begin, int64_t end, int64_t grain, const Work& work) {
  if (!at::hasThreadLocalCallbacks()) {
    at::parallel_for(begin, end, grain, work);
    return;
  }
  const at::ThreadLocalState state;
  at::parallel_for(begin, end, grain, [&](int64_t first, int64_t last) {
    at::ThreadLocalStateGuard guard(state);
    work(first, last);
  });
}

}  // namespace recdev::device
