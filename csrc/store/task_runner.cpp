#include "task_runner.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace recdev::store {
namespace {

void launch_std_threads(size_t threads, const std::function<void()>& work) {
  std::vector<std::thread> helpers;
  try {
    for (size_t i = 1; i < threads; ++i) helpers.emplace_back(work);
  } catch (...) {
    // No more threads to be had (std::system_error, std::bad_alloc): the ones started and the caller
    // do all the tasks. Propagating would destroy joinable threads.
  }
  work();
  for (std::thread& helper : helpers) helper.join();
}

std::atomic<ThreadLauncher> launcher{&launch_std_threads};

}  // namespace

size_t threads_for(size_t items, size_t items_per_thread) {
  static const size_t hardware = std::max<size_t>(1, std::thread::hardware_concurrency());
  return std::clamp<size_t>(items / items_per_thread, 1, hardware);
}

void set_thread_launcher(ThreadLauncher new_launcher) {
  launcher.store(new_launcher != nullptr ? new_launcher : &launch_std_threads);
}

void run_tasks(size_t num_tasks, size_t threads, const std::function<void(size_t)>& body) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  const std::function<void()> work = [&] {
    try {
      for (size_t task; !failed.load(std::memory_order_relaxed) && (task = next.fetch_add(1)) < num_tasks;) {
        body(task);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      failed.store(true, std::memory_order_relaxed);
    }
  };
  // One thread per task at most; the caller is the first.
  const size_t busy_threads = std::min(std::max<size_t>(threads, 1), num_tasks);
  if (busy_threads <= 1) {
    work();
  } else {
    launcher.load()(busy_threads, work);
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace recdev::store
