// run_tasks: a batch operation's independent pieces (sub-shards, chunks of a buffer) spread over a
// few threads for the duration of one call.
//
// Where the threads come from is the embedder's choice (set_thread_launcher). By default they are
// plain std::threads started per call: a start costs tens of microseconds, which the batches worth
// splitting (milliseconds of work) do not notice, and nothing outlives the call. A process that
// already keeps a thread pool — the recdev device, inside PyTorch, whose OpenMP workers spin for a
// while after every parallel op — installs a launcher that runs on that pool instead: fresh threads
// would compete with the pool's spinning workers for the same cores.
#pragma once

#include <cstddef>
#include <functional>

namespace recdev::store {

// How many threads a batch of `items` items should use, given that a thread is worth starting for
// `items_per_thread` items or more: at least 1, at most the hardware threads.
size_t threads_for(size_t items, size_t items_per_thread);

// Calls body(task) once for every task in [0, num_tasks), on `threads` threads (the caller's and
// threads - 1 more), each taking the next task not yet taken. If a task throws, the threads take no
// new tasks, and once they have all finished, the first exception is rethrown.
void run_tasks(size_t num_tasks, size_t threads, const std::function<void(size_t task)>& body);

// Runs work() `threads` times, concurrently where it can (the caller's thread among them), and
// returns when every call has returned. work never throws; it takes tasks until none is left, so
// calls that run one after another (a pool with fewer threads) still do all the work.
using ThreadLauncher = void (*)(size_t threads, const std::function<void()>& work);

// Replaces the launcher run_tasks uses (nullptr: the default, std::threads per call). Set once, at
// startup, before any table is used.
void set_thread_launcher(ThreadLauncher launcher);

}  // namespace recdev::store
