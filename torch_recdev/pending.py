"""The store operations in flight: ``ops.emb_prefetch`` and ``ops.emb_write_async`` run on one
thread, so that they complete in the order they were issued (a read issued after a write's future
completed sees the write). ``wait()`` returns once all of them have: a save, a load or a change of
store comes after every operation issued before it.

Each operation has a ticket from the extension (csrc/device/async_ops.h), through which recdev's
streams and events see it: an event recorded after it completes with it, and synchronizing a stream
or the device (``torch.recdev.synchronize()``) waits for it."""

from __future__ import annotations

import concurrent.futures
import threading

import torch

from . import _C

_worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="recdev-async")
_issuing = threading.Lock()  # tickets in the order the thread runs the operations


def submit(fn, *args) -> torch.futures.Future:
    """Runs ``fn(*args)`` after every operation submitted before; a future of its result."""
    future = torch.futures.Future()
    caller_state = _C._ThreadLocalState()  # a profiler around the call sees the operation's ranges

    def run():
        try:
            future.set_result(fn(*args))
        except BaseException as error:  # noqa: BLE001 (handed to the waiter)
            future.set_exception(error)

    # The future completes before the ticket: a synchronize that returns has every future done.
    with _issuing:
        _worker.submit(_C._run_async_op, _C._issue_async_op(), caller_state, run)
    return future


def wait() -> None:
    """Returns once every operation submitted so far has completed (at once on the async-op thread,
    where the operations before the running one are done)."""
    _C._wait_for_async_ops()
