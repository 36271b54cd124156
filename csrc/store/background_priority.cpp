#include "background_priority.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <system_error>
#include <thread>

namespace recdev::store {
namespace {

constexpr int kDefaultBackgroundNice = 19;

int background_nice() {
  static const int nice = [] {
    const char* text = std::getenv("RECDEV_BACKGROUND_NICE");
    if (text == nullptr || *text == '\0') return kDefaultBackgroundNice;
    char* end = nullptr;
    const long value = std::strtol(text, &end, 10);
    // A setting that is not a niceness leaves the default: background work is never refused for it.
    return *end == '\0' && value >= 0 && value <= 19 ? int(value) : kDefaultBackgroundNice;
  }();
  return nice;
}

}  // namespace

void lower_to_background_priority() {
  const int nice = background_nice();
  if (nice == 0) return;
  // On Linux a thread's niceness is its own (PRIO_PROCESS with a thread id). Failing to lower it
  // (a sandbox that forbids it) costs training time, not correctness, so the work runs anyway.
  const pid_t thread = pid_t(::syscall(SYS_gettid));
  const int current = ::getpriority(PRIO_PROCESS, id_t(thread));
  if (current < nice) ::setpriority(PRIO_PROCESS, id_t(thread), nice);
}

void run_at_background_priority(const std::function<void()>& work) {
  std::exception_ptr error;
  std::thread worker;
  try {
    worker = std::thread([&] {
      lower_to_background_priority();
      try {
        work();
      } catch (...) {
        error = std::current_exception();
      }
    });
  } catch (const std::system_error&) {
    work();  // no thread to be had: the work is still done, at the caller's priority
    return;
  }
  worker.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace recdev::store
