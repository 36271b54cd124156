"""The store operations in flight: ``ops.emb_prefetch`` and ``ops.emb_write_async`` run on one
thread, so that they complete in the order they were issued (a read issued after a write's future
completed sees the write). ``wait()`` returns once all of them have: a save, a load or a change of
store comes after every operation issued before it."""

from __future__ import annotations

import concurrent.futures

import torch

from . import _C

_worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="recdev-async")


def submit(fn, *args) -> torch.futures.Future:
    """Runs ``fn(*args)`` after every operation submitted before; a future of its result."""
    future = torch.futures.Future()
    caller_state = _C._ThreadLocalState()  # a profiler around the call sees the operation's ranges

    def run():
        try:
            future.set_result(_C._call_in_thread_local_state(caller_state, lambda: fn(*args)))
        except BaseException as error:  # noqa: BLE001 (handed to the waiter)
            future.set_exception(error)

    _worker.submit(run)
    return future


def wait() -> None:
    """Returns once every operation submitted so far has completed."""
    _worker.submit(lambda: None).result()
