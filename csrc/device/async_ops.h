// The progress of the async-op thread (torch_recdev/pending.py: ops.emb_prefetch, emb_write_async),
// which is the only work recdev does after a call returns: every kernel completes before it
// returns. Streams and events (guard.cpp) are therefore one timeline: an event recorded now is
// complete once the async operations issued before it are; synchronizing a stream or the device
// waits for every async operation issued so far.
#pragma once

#include <cstdint>
#include <functional>

namespace recdev::device {

// An operation was queued for the async-op thread; returns its ticket (1, 2, ... in issue order,
// which the caller keeps equal to the thread's run order).
uint64_t issue_async_op();
// The ticket of the last operation issued (0: none yet).
uint64_t last_async_op();
// Runs operation `ticket` on the async-op thread: marks the thread (a wait from it returns at once:
// what was issued before it is done, and what comes after cannot run while it waits), calls run(),
// then marks the ticket done, whether run() returned or threw.
void run_async_op(uint64_t ticket, const std::function<void()>& run);
bool async_ops_done_through(uint64_t ticket);
// Blocks until every operation up to `ticket` is done, through the blocking section below.
void wait_for_async_ops(uint64_t ticket);

// How to block the calling thread: the Python bindings set one that lets go of the interpreter lock
// while waiting (the async-op thread needs it to finish), whichever torch binding called the guard.
using BlockingSection = void (*)(const std::function<void()>& wait);
void set_blocking_section(BlockingSection section);

}  // namespace recdev::device
