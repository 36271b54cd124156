// run_tasks: a batch operation's independent pieces (sub-shards, chunks of a buffer) spread over a
// few threads for the duration of one call.
//
// Plain std::threads started per call rather than a pool: a start costs tens of microseconds, which
// the batches worth splitting (milliseconds of work) do not notice, and nothing outlives the call.
#pragma once

#include <cstddef>
#include <functional>

namespace recdev::store {

// How many threads a batch of `items` items should use, given that a thread is worth starting for
// `items_per_thread` items or more: at least 1, at most the hardware threads.
size_t threads_for(size_t items, size_t items_per_thread);

// Calls body(task) once for every task in [0, num_tasks), on `threads` threads (the caller's and
// threads - 1 started for the call), each taking the next task not yet taken. If a task throws,
// the threads take no new tasks, and once they have all finished, the first exception is rethrown.
void run_tasks(size_t num_tasks, size_t threads, const std::function<void(size_t task)>& body);

}  // namespace recdev::store
