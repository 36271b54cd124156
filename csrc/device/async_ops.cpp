#include "async_ops.h"

#include <condition_variable>
#include <mutex>

namespace recdev::device {

namespace {

std::mutex mutex;
std::condition_variable done_changed;
uint64_t issued = 0;
uint64_t done = 0;  // tickets run in issue order (pending.py issues and queues under one lock)
thread_local bool on_async_thread = false;

void block_directly(const std::function<void()>& wait) { wait(); }

BlockingSection blocking_section = &block_directly;

}  // namespace

uint64_t issue_async_op() {
  std::lock_guard<std::mutex> lock(mutex);
  return ++issued;
}

uint64_t last_async_op() {
  std::lock_guard<std::mutex> lock(mutex);
  return issued;
}

void run_async_op(uint64_t ticket, const std::function<void()>& run) {
  on_async_thread = true;
  struct MarkDone {
    uint64_t ticket;
    ~MarkDone() {
      {
        std::lock_guard<std::mutex> lock(mutex);
        done = ticket;
      }
      done_changed.notify_all();
    }
  } mark{ticket};
  run();
}

bool async_ops_done_through(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mutex);
  return done >= ticket;
}

void wait_for_async_ops(uint64_t ticket) {
  if (on_async_thread || async_ops_done_through(ticket)) {
    return;
  }
  blocking_section([ticket] {
    std::unique_lock<std::mutex> lock(mutex);
    done_changed.wait(lock, [ticket] { return done >= ticket; });
  });
}

void set_blocking_section(BlockingSection section) { blocking_section = section; }

}  // namespace recdev::device
