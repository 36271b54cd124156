// Background work (writing checkpoint versions, compacting them) at a lower CPU priority than the
// requests it runs beside.
//
// A version is written while training goes on, and on a host whose cores training keeps busy, a
// writer at the same priority takes a core's share from every step (on 2 cores, a step on both of
// them took 1.8x as long beside one busy thread). At nice 19, the lowest priority short of
// SCHED_IDLE, the scheduler gives the writer about 1/70 of what a request thread gets when both want
// a core, and everything a core has spare (as RocksDB lowers its compaction threads): versions are
// written from the time training leaves, and take longer while it leaves little.
// The work that holds a table's locks (a cut) stays on the caller's thread at its own priority: a
// lowered thread holding locks that requests wait for would slow them down instead.
//
// RECDEV_BACKGROUND_NICE (0 to 19; default 19) sets the niceness; 0 runs background work at the
// caller's priority.
#pragma once

#include <functional>

namespace recdev::store {

// Lowers the calling thread's priority to the background niceness, for good: an unprivileged
// thread cannot raise it again, so call it only on a thread started for background work.
void lower_to_background_priority();

// Runs work() on a thread of its own at the background priority and returns when it has returned,
// rethrowing what it threw.
void run_at_background_priority(const std::function<void()>& work);

}  // namespace recdev::store
