"""Bounded memory for unbounded ids: a table's budget, eviction and admission (docs/budgets.md).

    torch_recdev.set_table_policy(weight, max_rows=10**6, evict="lru", admit_after=2)
    torch_recdev.table_policy(weight)   # {"max_rows": 1000000, "evict": "lru", ...}

The store keeps the policy with the table (csrc/store/table_policy.h says how it decides)."""

from __future__ import annotations

import datetime
import numbers
import os
from typing import Optional, Union

import torch

from . import _C

_EVICT = (None, "lru", "lfu", "ttl")


def _positive_int(name: str, value) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name} must be a positive int or None (no budget); got {value!r}")
    return int(value)


def policy_keywords(
    *,
    max_rows: Optional[int] = None,
    max_bytes: Optional[int] = None,
    evict: Optional[str] = None,
    ttl: Union[int, datetime.timedelta, None] = None,
    admit_after: int = 1,
    half_life: Optional[float] = None,
    spill: bool = False,
    max_disk_bytes: Optional[int] = None,
) -> dict:
    """The policy keywords checked and in the store's terms (what ``_C._set_table_policy`` takes)."""
    keywords = {"max_rows": _positive_int("max_rows", max_rows), "max_bytes": _positive_int("max_bytes", max_bytes)}
    if evict not in _EVICT:
        raise ValueError(f"unknown evict policy {evict!r}; choose 'lru', 'lfu', 'ttl' or None")
    keywords["evict"] = evict
    if ttl is not None:
        if evict != "ttl":
            raise ValueError(f"ttl={ttl!r} needs evict='ttl' (got evict={evict!r})")
        if isinstance(ttl, datetime.timedelta):
            if ttl.total_seconds() <= 0:
                raise ValueError(f"ttl must be positive; got {ttl!r}")
            keywords["ttl_seconds"] = ttl.total_seconds()
        elif isinstance(ttl, numbers.Integral) and not isinstance(ttl, bool) and ttl > 0:
            keywords["ttl_steps"] = int(ttl)
        else:
            raise ValueError(
                f"ttl must be a positive int (optimizer steps of the table) or a datetime.timedelta; got {ttl!r}"
            )
    elif evict == "ttl":
        raise ValueError("evict='ttl' needs ttl= (an int number of steps, or a datetime.timedelta)")
    if evict in ("lru", "lfu") and max_rows is None and max_bytes is None:
        raise ValueError(f"evict={evict!r} needs a budget: max_rows= or max_bytes=")
    if half_life is not None:
        if evict != "lfu":
            raise ValueError(f"half_life is lfu's decay (in steps); it needs evict='lfu' (got evict={evict!r})")
        if isinstance(half_life, bool) or not isinstance(half_life, numbers.Real) or not half_life > 0:
            raise ValueError(f"half_life must be a positive number of steps; got {half_life!r}")
        keywords["half_life"] = float(half_life)
    if isinstance(admit_after, bool) or not isinstance(admit_after, numbers.Integral) or not 1 <= admit_after <= 65535:
        raise ValueError(f"admit_after must be an int in [1, 65535]; got {admit_after!r}")
    keywords["admit_after"] = int(admit_after)
    if not isinstance(spill, bool):
        raise ValueError(f"spill must be True or False; got {spill!r}")
    if spill and evict is None:
        raise ValueError("spill=True keeps the rows a budget evicts on disk: give it evict='lru', 'lfu' or 'ttl' "
                         "(and max_rows= or max_bytes=)")
    if max_disk_bytes is not None and not spill:
        raise ValueError("max_disk_bytes bounds the disk tier: it needs spill=True")
    if spill:
        keywords["spill"] = True
        keywords["max_disk_bytes"] = _positive_int("max_disk_bytes", max_disk_bytes)
    return keywords


def set_disk_dir(path: Union[str, os.PathLike]) -> None:
    """Where tables with ``spill=True`` keep the rows their budget evicts, on the embedded store (a
    server shard's is its ``--disk-dir``). Without a call, ``RECDEV_DISK_DIR`` is used. The directory
    is created if missing and must be writable; each spilling table keeps its files in a directory of
    its own in it, removed with the table, and what processes that died left there is removed now."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ValueError(f"set_disk_dir expects a directory path; got {path!r}")
    _C._set_disk_dir(os.fspath(path))


def set_table_policy(
    weight: torch.Tensor,
    *,
    max_rows: Optional[int] = None,
    max_bytes: Optional[int] = None,
    evict: Optional[str] = None,
    ttl: Union[int, datetime.timedelta, None] = None,
    admit_after: int = 1,
    half_life: Optional[float] = None,
    spill: bool = False,
    max_disk_bytes: Optional[int] = None,
) -> None:
    """Sets the budget, eviction and admission of a recdev table (all defaults: removes the policy).

    max_rows / max_bytes: the budget (max_bytes counts each row's record plus 128 bytes of index and
    touch metadata); evict: "lru", "lfu" (half_life in steps, default 1000) or "ttl" (ttl= steps, or
    a datetime.timedelta); admit_after=k: a row is stored only from its k-th lookup on. Rows over a
    new budget are evicted at once. spill=True: evicted rows go to the disk tier (set_disk_dir) with
    their optimizer state and come back exactly on their next touch; max_disk_bytes bounds it
    (docs/disk_tier.md)."""
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"set_table_policy expects a recdev table tensor; got {type(weight).__name__}")
    keywords = policy_keywords(
        max_rows=max_rows, max_bytes=max_bytes, evict=evict, ttl=ttl, admit_after=admit_after, half_life=half_life,
        spill=spill, max_disk_bytes=max_disk_bytes,
    )
    _refuse_policy_on_replicas(weight, keywords)
    _C._set_table_policy(weight, keywords)


def _refuse_policy_on_replicas(weight: torch.Tensor, keywords: dict) -> None:
    """A synchronous optimizer keeps one replica of an embedded table per rank; a policy would evict by
    each rank's own lookups and make them differ (see sync.py)."""
    import torch.distributed as dist

    if not (_C._table_is_sync(weight) and _C._table_in_process(weight)):
        return
    if dist.is_initialized() and dist.get_world_size() > 1 and keywords != policy_keywords():
        raise ValueError(
            "set_table_policy: this table is trained with sync=True on the embedded store, where each rank keeps "
            "an identical replica; a budget policy evicts by each rank's own lookups and would make the replicas "
            "differ. Train on recdev-server shards to give a synchronous table a budget")


def table_policy(weight: torch.Tensor) -> dict:
    """The table's policy: max_rows, max_bytes, evict, ttl (steps, a timedelta, or None), admit_after,
    half_life (lfu only), spill and max_disk_bytes (spilling tables only)."""
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"table_policy expects a recdev table tensor; got {type(weight).__name__}")
    return _public(_C._table_policy(weight))


def _public(raw: dict) -> dict:
    ttl = raw["ttl_steps"] if raw["ttl_steps"] is not None else None
    if raw["ttl_seconds"] is not None:
        ttl = datetime.timedelta(seconds=raw["ttl_seconds"])
    policy = {
        "max_rows": raw["max_rows"],
        "max_bytes": raw["max_bytes"],
        "evict": raw["evict"],
        "ttl": ttl,
        "admit_after": raw["admit_after"],
    }
    if raw["evict"] == "lfu":
        policy["half_life"] = raw["half_life"]
    if raw["spill"]:
        policy["spill"] = True
        policy["max_disk_bytes"] = raw["max_disk_bytes"]
    return policy
