"""Which store tables go to: the embedded store of this process, or ``recdev-server`` shards; and
under torchrun, the one rank 0 named.

``connect(servers)`` (or ``RECDEV_SERVERS`` at import) makes the remote store current; ``connect()``
goes back to the embedded store; ``store_info()`` says which is current. In a fleet the store is
named once: rank 0's choice is published through the default process group's own store, and another
rank that chose none connects to the same servers the first time it declares a table
(``ops.init_embedding_table``, ``share_tables``) or calls ``fleet_store()``.

Every other module asks this one; it imports none of them but the extension and ``pending``.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Optional

import torch

from . import _C, pending

__all__ = ["connect", "store_info", "fleet_store", "server_stats", "StoreFullError"]

# What a store raises when it is out of memory (a MemoryError and a RuntimeError).
StoreFullError = _C.StoreFullError

# The key under which rank 0 publishes its store in the default process group's store.
_STORE_KEY = "torch_recdev/servers"
# The process group whose ranks already agree on the store (the default group, once it exists).
_agreed_with: Optional[object] = None
# Set by connect(): this rank chose its store itself and does not take rank 0's.
_connected_explicitly = False


def connect(servers: Optional[str] = None, *, token: Optional[str] = None, timeout: float = 30.0,
            read_only: bool = False, overlap_updates: bool = False) -> dict:
    """Chooses the store that new tables, named tables, ``save`` and ``load`` go to; returns
    ``store_info()``.

    ``servers`` is ``"tcp://h1:7070,tcp://h2:7071"``: one ``recdev-server`` per shard, listed in
    shard order (docs/remote.md). ``None`` (or ``"embedded"``) goes back to the in-process store.
    Under torchrun, rank 0's choice is published to the other ranks (``fleet_store``).
    ``token`` is the servers' ``--token-file`` token; ``timeout`` (seconds) bounds every wait for a
    server, so a dead one gives a ``ConnectionError`` naming it instead of a hang. Every server is
    reached now: a bad address, a wrong token or nothing listening fails here. Tables created
    before keep working with the store they live in.

    ``read_only=True`` is for inference (serving shards, ``recdev-server --serve``, docs/online.md):
    lookups only; a declaration (``ops.init_embedding_table``, ``share_tables``) opens the existing
    table of that name, checking its shape and dtype; anything that would change a table raises
    ``PermissionError`` before it is sent.

    ``overlap_updates=True`` is for training loops: ``backward()`` returns once its tables' updates
    are sent, without waiting for the shards to apply them, so that they apply them while the step
    goes on (the dense optimizer, the next batch). Every later request of this process still sees
    them (it reads their answers before it is sent). An update the shards refuse is then raised by
    the next request (the next step's lookups) or by ``torch.recdev.synchronize()``, not by
    ``backward()`` (docs/remote.md, "Overlapping updates with the next step")."""
    if servers is not None and not isinstance(servers, str):
        raise TypeError(f"connect: servers must be a string like 'tcp://host:7070,tcp://host:7071' or None; got {servers!r}")
    if token is not None and not isinstance(token, str):
        raise TypeError(f"connect: token must be a string or None; got {type(token).__name__}")
    timeout = float(timeout)
    if not timeout > 0:
        raise ValueError(f"connect: timeout must be a positive number of seconds; got {timeout}")
    pending.wait()  # operations in flight go to the store they were issued to
    if not isinstance(read_only, bool):
        raise TypeError(f"connect: read_only must be True or False; got {read_only!r}")
    if read_only and servers in (None, "embedded"):
        raise ValueError("connect: read_only=True needs servers (the embedded store is this process's own)")
    if not isinstance(overlap_updates, bool):
        raise TypeError(f"connect: overlap_updates must be True or False; got {overlap_updates!r}")
    if overlap_updates and servers in (None, "embedded"):
        raise ValueError("connect: overlap_updates=True needs servers (the embedded store applies an update before "
                         "backward goes on)")
    _C._connect(None if servers in (None, "embedded") else servers, token or "", timeout, read_only, overlap_updates)
    _publish_after_connect()
    return store_info()


def store_info() -> dict:
    """The current store: ``kind`` ("embedded" or "remote"), ``servers`` (``tcp://`` addresses, in
    shard order; empty when embedded), ``shards`` (how many), and ``timeout`` and
    ``overlap_updates`` (remote only: ``connect``'s)."""
    return dict(_C._store_info())


def server_stats(address: str, *, token: str = "", timeout: float = 10.0) -> dict:
    """One running ``recdev-server``'s STATS (what ``recdev-server --stats`` prints) as a dict:
    ``rows``, ``bytes``, ``max_memory``, ``requests``, ``errors``, ``connections``, ``sessions``,
    ``uptime_seconds``, ``tables``, and ``table_counters`` (each table's rows, evicted, admitted,
    pending, budget, and disk tier: spill, rows_on_disk, disk_bytes, disk_reads, disk_writes); for a
    serving shard (``--serve``), ``serving_dir``, ``serving_version`` (0 before its first) and
    ``serving_age_seconds`` (since that version was written); ``staged_steps`` and ``staged_bytes``
    (synchronous steps held); ``opcodes``, per opcode answered (by name, e.g. ``"GATHER"``):
    ``requests``, ``errors``, ``rows``, ``bytes_received``, ``bytes_sent``, ``latency_seconds`` (their
    sum) and ``latency_buckets`` (bucket k counts the requests that took at most
    ``latency_bucket_bounds_us[k]`` microseconds, the last one the slower ones). ``requests`` and
    ``errors`` count the requests answered before this one. ``address`` is ``HOST:PORT``; ``token``
    the server's ``--token-file`` token."""
    return dict(_C._server_stats(address, token, timeout))


_PID = os.getpid()


@atexit.register
def _report_updates_never_answered() -> None:
    """At exit, reads the answers of the updates backward did not wait for (``overlap_updates``): a
    refused one that no request raised since is said on stderr, as an exit cannot raise it. Not in a
    forked child (a DataLoader worker exiting with sys.exit): the answers are its parent's, and a
    lock another thread of the parent held at the fork would never be released in it."""
    if os.getpid() != _PID:
        return
    try:
        _C._wait_for_store_answers()
    except Exception as error:  # noqa: BLE001 - any failure is reported, none may stop the exit
        print(f"torch_recdev: at exit: {error}", file=sys.stderr, flush=True)


def _connect_from_environment() -> None:
    """``RECDEV_SERVERS`` (with ``RECDEV_TOKEN``, ``RECDEV_TIMEOUT``, and ``RECDEV_OVERLAP_UPDATES=1``
    for ``connect``'s ``overlap_updates``) makes the remote store current at import; the servers are reached at the store's first use (a table, an ops call,
    ``store_info()``), so that ``import torch`` opens no socket. An unreachable server is an error
    there, naming RECDEV_SERVERS."""
    servers = os.environ.get("RECDEV_SERVERS", "").strip()
    if not servers:
        return
    timeout = float(os.environ.get("RECDEV_TIMEOUT", "30"))
    if not timeout > 0:
        raise ValueError(f"RECDEV_TIMEOUT must be a positive number of seconds; got {timeout}")
    overlap = os.environ.get("RECDEV_OVERLAP_UPDATES", "0")
    if overlap not in ("0", "1"):
        raise ValueError(f"RECDEV_OVERLAP_UPDATES must be 0 or 1; got {overlap!r}")
    _C._connect_from_environment(servers, os.environ.get("RECDEV_TOKEN", ""), timeout, overlap == "1")


def _default_group():
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return None
    return torch.distributed.distributed_c10d._get_default_group()


def fleet_store() -> dict:
    """Makes this rank's store the one rank 0 named, and returns ``store_info()``.

    Under an initialized default process group: rank 0 publishes its store (``RECDEV_SERVERS``,
    ``connect()`` or the embedded store) in the group's store; another rank that set neither connects
    to the same servers, with the same ``timeout`` and ``overlap_updates`` (and its own
    ``RECDEV_TOKEN``: the token is not published). Waits for rank 0
    at most the process group's timeout. Without a process group, the current store as it is.
    Declarations call this first, so a script rarely needs to."""
    global _agreed_with
    group = _default_group()
    if group is None or _agreed_with is group:
        return store_info()
    store = torch.distributed.distributed_c10d._get_default_store()
    if torch.distributed.get_rank() == 0:
        info = store_info()  # connects RECDEV_SERVERS now, so a bad list fails on rank 0 first
        published = ",".join(info["servers"]) if info["kind"] == "remote" else "embedded"
        timeout = str(info.get("timeout", 30.0))
        store.set(_STORE_KEY, f"{published};{timeout};{int(info.get('overlap_updates', False))}")
    elif not _connected_explicitly and not os.environ.get("RECDEV_SERVERS", "").strip():
        try:
            servers, timeout, overlap = store.get(_STORE_KEY).decode().split(";")
        except RuntimeError as error:
            raise RuntimeError(
                f"rank {torch.distributed.get_rank()}: rank 0 did not publish its recdev store in time ({error}). "
                "Rank 0 publishes it when it declares a table, calls share_tables, connect or fleet_store; "
                "or set RECDEV_SERVERS on every rank."
            ) from error
        if servers != "embedded":
            connect(servers, token=os.environ.get("RECDEV_TOKEN") or None, timeout=float(timeout),
                    overlap_updates=overlap == "1")
    _agreed_with = group
    return store_info()


def _publish_after_connect() -> None:
    """connect() on rank 0 of an initialized group publishes at once (a later connect replaces it)."""
    global _agreed_with, _connected_explicitly
    _connected_explicitly = True
    group = _default_group()
    if group is not None and torch.distributed.get_rank() == 0:
        _agreed_with = None
        fleet_store()
