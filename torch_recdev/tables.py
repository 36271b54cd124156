"""Where recdev tensors live: host storage or store tables (DESIGN.md, "Memory model").

A new recdev allocation becomes a table when it is at least
``table_min_bytes`` (default 64 MiB, env ``RECDEV_TABLE_MIN_BYTES``), or
inside ``with torch_recdev.placement("table")``; ``placement("host")`` forces
host storage. Table rows are lazy: they cost memory only once touched.
"""

from __future__ import annotations

import contextlib

import torch

from . import _C


def set_table_min_bytes(nbytes: int) -> None:
    """Allocations of at least ``nbytes`` become store tables."""
    if int(nbytes) < 0:
        raise ValueError(f"table_min_bytes must be >= 0; got {nbytes}")
    _C._set_table_min_bytes(int(nbytes))


def table_min_bytes() -> int:
    return _C._table_min_bytes()


def set_max_fallback_bytes(nbytes: int) -> None:
    """The most bytes an op without a table kernel (or a copy) may move out of a table."""
    if int(nbytes) < 0:
        raise ValueError(f"max_fallback_bytes must be >= 0; got {nbytes}")
    _C._set_max_fallback_bytes(int(nbytes))


def max_fallback_bytes() -> int:
    return _C._max_fallback_bytes()


@contextlib.contextmanager
def placement(kind: str):
    """Forces where recdev allocations in this thread go: ``"table"`` or ``"host"``.

    >>> with torch_recdev.placement("table"):
    ...     weight = torch.empty(1000, 64, device="recdev")
    """
    if kind not in ("table", "host"):
        raise ValueError(f"placement must be 'table' or 'host'; got {kind!r}")
    previous = _C._placement()
    _C._set_placement(kind)
    try:
        yield
    finally:
        _C._set_placement(previous)


def is_table(tensor: torch.Tensor) -> bool:
    """True when the tensor's storage is a store table."""
    return isinstance(tensor, torch.Tensor) and _C._is_table(tensor)


def table_stats(tensor: torch.Tensor) -> dict:
    """num_embeddings, embedding_dim, rows (materialized), bytes (held), row_bytes, reads, writes,
    updates; for budgets (docs/budgets.md) evicted, admitted, pending and policy; for the disk tier
    (docs/disk_tier.md) rows_in_memory, rows_on_disk, disk_bytes (its files), disk_live_bytes (the
    records of the rows on disk), disk_reads and disk_writes (rows read back, rows spilled) and
    disk_read_ops (the blocks read for them)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"table_stats expects a tensor; got {type(tensor).__name__}")
    return _C._table_stats(tensor)
