// The store's batch operations (store/task_runner.h) run on PyTorch's intra-op thread pool in this
// process. After a parallel op, PyTorch's OpenMP workers spin for a while waiting for the next one;
// threads the store started for an update would compete with them for the same cores (on a
// two-core machine, a training step ran a third slower), while the pool's own workers pick the
// tasks up at once.

#include "store/task_runner.h"

#include "device/profiler_ranges.h"

namespace recdev::device {

namespace {

void launch_on_intra_op_pool(size_t threads, const std::function<void()>& work) {
  // One work() per pool thread; inside another parallel region, or with fewer pool threads, the
  // calls run one after another, and the first takes every task.
  parallel_for_profiled(0, static_cast<int64_t>(threads), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      work();
    }
  });
}

const bool installed = [] {
  store::set_thread_launcher(&launch_on_intra_op_pool);
  return true;
}();

}  // namespace

}  // namespace recdev::device
