"""The store API (the CommonOp surface) on recdev tables.

Each operation is a ``torch.ops.recdev.*`` custom op with a fake kernel, so
``torch.compile`` can trace it; the functions here are the Python front door.
Keys are 1-D int64 or uint64 tensors of row ids; rows are float32
``[len(keys), embedding_dim]`` tensors.

    table = torch_recdev.ops.init_embedding_table("user_id", 10**9, 64,
                                                  init=torch_recdev.Normal(0, 0.01),
                                                  optimizer=("adagrad", {"lr": 0.05}))
    rows = torch_recdev.ops.emb_read(table, keys)
    torch_recdev.ops.emb_update(table, keys, grads)     # through the table's optimizer
    torch_recdev.ops.save("/ckpt/store.recdev")
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from . import _C, budgets, optim, pending
from .init import InitStrategy
from .stores import connect, fleet_store, store_info  # noqa: F401 (ops.connect, ops.store_info)

__all__ = [
    "init_embedding_table",
    "emb_init",
    "emb_read",
    "emb_write",
    "emb_prefetch",
    "emb_write_async",
    "emb_update",
    "emb_exists",
    "emb_delete",
    "save",
    "load",
    "checkpoint",
    "restore",
    "versions",
    "wait_for_compaction",
    "version_files",
    "export_tables",
    "connect",
    "store_info",
]

_OPTIMIZERS = {
    "sgd": optim.SGD,
    "adagrad": optim.Adagrad,
    "rowwise_adagrad": optim.RowWiseAdagrad,
    "adam": optim.Adam,
}


# --- custom ops: what torch.compile sees -------------------------------------------------------


@torch.library.custom_op("recdev::emb_read", mutates_args=())
def _emb_read(table: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    return _C._read_rows(table, keys).to(table.device)


@_emb_read.register_fake
def _(table, keys):
    return table.new_empty((keys.shape[0], table.shape[1]))


@torch.library.custom_op("recdev::emb_write", mutates_args=("table",))
def _emb_write(table: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
    _C._write_rows(table, keys, values.cpu())


@_emb_write.register_fake
def _(table, keys, values):
    return None


@torch.library.custom_op("recdev::emb_update", mutates_args=("table",))
def _emb_update(table: torch.Tensor, keys: torch.Tensor, grads: torch.Tensor) -> None:
    _C._update_rows(table, keys, grads.cpu())


@_emb_update.register_fake
def _(table, keys, grads):
    return None


@torch.library.custom_op("recdev::emb_init", mutates_args=("table",))
def _emb_init(table: torch.Tensor, keys: torch.Tensor, kind: str, a: float, b: float) -> None:
    _C._init_rows(table, keys, kind, a, b)


@_emb_init.register_fake
def _(table, keys, kind, a, b):
    return None


@torch.library.custom_op("recdev::emb_exists", mutates_args=())
def _emb_exists(table: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    return _C._exists(table, keys)


@_emb_exists.register_fake
def _(table, keys):
    return torch.empty(keys.shape[0], dtype=torch.bool, device="cpu")


@torch.library.custom_op("recdev::emb_delete", mutates_args=("table",))
def _emb_delete(table: torch.Tensor, keys: torch.Tensor) -> None:
    _C._erase(table, keys)


@_emb_delete.register_fake
def _(table, keys):
    return None


# --- the Python API ----------------------------------------------------------------------------


def init_embedding_table(
    name: str,
    num_embeddings: int,
    embedding_dim: int,
    *,
    init: Optional[InitStrategy] = None,
    optimizer: Optional[tuple[str, dict]] = None,
    dtype: torch.dtype = torch.float32,
    reset: bool = False,
    max_rows: Optional[int] = None,
    max_bytes: Optional[int] = None,
    evict: Optional[str] = None,
    ttl=None,
    admit_after: int = 1,
    half_life: Optional[float] = None,
    spill: bool = False,
    max_disk_bytes: Optional[int] = None,
) -> torch.Tensor:
    """Declares the named table ``name``: a ``[num_embeddings, embedding_dim]`` recdev tensor of
    ``dtype`` (float32, float16, bfloat16 or float64; half types need an even ``embedding_dim``).

    A declaration, like ``CREATE TABLE IF NOT EXISTS``: the first creates the table; declaring an
    existing table (another rank of a fleet, the same script run again, a table loaded from a
    checkpoint) opens it with every row and optimizer state kept, provided the shape, dtype, the
    ``init`` strategy and the optimizer kind agree. A difference is a ``ValueError`` naming it;
    ``reset=True`` is the only way to drop the rows (and to change the shape, dtype, init or optimizer
    kind). ``init`` sets the rule every untouched row follows (O(1)); ``optimizer`` is
    ``(kind, hyperparameters)`` with kind one of sgd, adagrad, rowwise_adagrad, adam, e.g.
    ``("adagrad", {"lr": 0.05})``; an existing table's optimizer takes the declared hyperparameters and
    keeps its state. ``max_rows``, ``max_bytes``, ``evict``, ``ttl``, ``admit_after``, ``half_life``,
    ``spill`` and ``max_disk_bytes`` set its budget, eviction, admission and disk tier, as
    :func:`torch_recdev.set_table_policy` does (when any is given)."""
    if not isinstance(name, str) or not name:
        raise ValueError("init_embedding_table: name must be a non-empty string")
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"init_embedding_table: dtype must be a torch.dtype; got {dtype!r}")
    policy = dict(max_rows=max_rows, max_bytes=max_bytes, evict=evict, ttl=ttl, admit_after=admit_after,
                  half_life=half_life, spill=spill, max_disk_bytes=max_disk_bytes)
    policy_given = (any(v is not None for k, v in policy.items() if k not in ("admit_after", "spill"))
                    or admit_after != 1 or spill is not False)
    policy_keywords = budgets.policy_keywords(**policy) if policy_given else None  # checked before any change
    rule = None
    if init is not None:
        if not isinstance(init, InitStrategy):
            raise TypeError(f"init must be a torch_recdev init strategy (Normal, Uniform, ...); got {init!r}")
        rule = init._rule()
    fused, declares_rounding = (None, False) if optimizer is None else _optimizer_declaration(optimizer)
    fleet_store()  # under torchrun, the store rank 0 named
    table = _C._declare_table(name, int(num_embeddings), int(embedding_dim), rule, fused, declares_rounding,
                              bool(reset), dtype)
    if policy_keywords is not None:
        _C._set_table_policy(table, policy_keywords)
    return table


_ROUNDING_KEYS = ("stochastic_rounding", "rounding_seed")


def _optimizer_declaration(optimizer: tuple[str, dict]) -> tuple[_C.OptimizerConfig, bool]:
    """``(kind, hyperparameters)`` as the store takes it, with whether it names the rounding mode:
    torch.optim's defaults for what is not given.

    ``stochastic_rounding`` is part of the declaration only when named: a declaration that leaves it
    out keeps the table's rounding mode. Named True without a ``rounding_seed``, the seed is drawn from
    the recdev generator now, as ``torch_recdev.optim`` does."""
    kind, hyperparameters = optimizer
    fused = _OPTIMIZERS.get(kind)
    if fused is None:
        raise ValueError(f"unknown optimizer {kind!r}; choose one of {sorted(_OPTIMIZERS)}")
    unknown = set(hyperparameters) - set(fused.defaults_for_store) - set(_ROUNDING_KEYS)
    if unknown:
        raise ValueError(f"{kind} takes {sorted(fused.defaults_for_store) + list(_ROUNDING_KEYS)}; "
                         f"got unknown {sorted(unknown)}")
    config = {**fused.defaults_for_store, **hyperparameters}
    betas = config.pop("betas", None)
    if betas is not None:
        config["beta1"], config["beta2"] = betas
    if "rounding_seed" in config and "stochastic_rounding" not in config:
        raise ValueError(f"{kind}: rounding_seed is used with stochastic_rounding=True only; name both")
    declares_rounding = "stochastic_rounding" in config
    if declares_rounding:
        rounding = config.pop("stochastic_rounding")
        if not isinstance(rounding, bool):
            raise TypeError(f"{kind}: stochastic_rounding must be True or False; got {rounding!r}")
        seed = config.pop("rounding_seed", None)
        config.update(optim._rounding_defaults(rounding) if seed is None or not rounding
                      else {"stochastic_rounding": True, "rounding_seed": optim._rounding_seed(seed)})
    rounding = {k: config.pop(k) for k in _ROUNDING_KEYS if k in config}
    return _C.OptimizerConfig(kind, **{k: float(v) for k, v in config.items()}, **rounding), declares_rounding


def emb_init(table: torch.Tensor, keys: torch.Tensor, values_or_strategy) -> None:
    """Sets rows: to given values ([len(keys), dim] of the table's dtype), or by an init strategy."""
    if isinstance(values_or_strategy, InitStrategy):
        torch.ops.recdev.emb_init(table, keys, *values_or_strategy._rule())
    elif isinstance(values_or_strategy, torch.Tensor):
        torch.ops.recdev.emb_write(table, keys, values_or_strategy)
    else:
        raise TypeError(f"emb_init takes a tensor of rows or an init strategy; got {type(values_or_strategy).__name__}")


def emb_read(table: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """The rows of ``keys`` ([len(keys), dim] of the table's dtype, on recdev host storage)."""
    return torch.ops.recdev.emb_read(table, keys)


def emb_write(table: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
    torch.ops.recdev.emb_write(table, keys, values)


def emb_update(table: torch.Tensor, keys: torch.Tensor, grads: torch.Tensor) -> None:
    """Applies gradients to rows through the table's fused optimizer (duplicates summed)."""
    torch.ops.recdev.emb_update(table, keys, grads)


def emb_exists(table: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """A bool per key: is the row materialized (touched and not deleted)?"""
    return torch.ops.recdev.emb_exists(table, keys)


def emb_delete(table: torch.Tensor, keys: torch.Tensor) -> None:
    """Dematerializes rows: the next read gives their init value again."""
    torch.ops.recdev.emb_delete(table, keys)


def emb_prefetch(table: torch.Tensor, keys: torch.Tensor) -> torch.futures.Future:
    """Starts reading rows; returns a ``torch.futures.Future`` of them."""
    keys = keys.clone()
    return pending.submit(emb_read, table, keys)


def emb_write_async(table: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.futures.Future:
    """Starts writing rows; the future completes (with None) when they are written."""
    keys, values = keys.clone(), values.clone()
    return pending.submit(emb_write, table, keys, values)


def save(path: str | os.PathLike) -> None:
    """Writes every named table, with its optimizer state, to one checkpoint file (atomically)."""
    pending.wait()  # async writes first
    _C._save_store(os.fspath(path))


def load(path: str | os.PathLike) -> list[str]:
    """Restores the named tables of a checkpoint file; returns their names. A corrupt,
    truncated or mismatched file is refused and nothing is loaded."""
    pending.wait()
    return list(_C._load_store(os.fspath(path)))


def checkpoint(directory: str | os.PathLike, *, fleet: bool = False) -> int:
    """Writes the next numbered version of every named table into ``directory`` and returns its
    number: a base with every row first (1 in an empty directory), then deltas holding only the
    rows changed since the version before. Each version is one file, written atomically; training
    goes on while it is written (docs/online.md).

    ``fleet=True``: every rank of the default process group calls it between the same two steps;
    rank 0 writes the version once all ranks have arrived, and every rank gets its number. In a
    synchronous fleet (``sync=True``) the version is then one consistent model (docs/fleet.md)."""
    pending.wait()
    path = os.fspath(directory)
    if not fleet:
        return int(_C._checkpoint_version(path))
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("ops.checkpoint(fleet=True) needs torch.distributed's default process group (torchrun); "
                           "without one, call ops.checkpoint(directory)")
    dist.barrier()  # every rank's last step is in: the version is cut between the same two steps
    outcome = [None]
    if dist.get_rank() == 0:
        try:
            outcome[0] = int(_C._checkpoint_version(path))
        except Exception as error:  # noqa: BLE001 - every rank raises it, after the broadcast
            outcome[0] = f"{type(error).__name__}: {error}"
    dist.broadcast_object_list(outcome, src=0)  # and the other ranks wait for the version
    if isinstance(outcome[0], str):
        raise RuntimeError(f"ops.checkpoint(fleet=True): rank 0 could not write the version: {outcome[0]}")
    return outcome[0]


def restore(directory: str | os.PathLike, version: int | None = None) -> int:
    """Restores the named tables to the newest version in ``directory`` (or ``version``), exactly
    as they were when it was written; returns the version restored. A damaged file is refused,
    naming it, and nothing is loaded."""
    pending.wait()
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 1):
        raise ValueError(f"version must be a positive int (ops.versions lists them), not {version!r}")
    restored, _ = _C._restore_version(os.fspath(directory), version)
    return int(restored)


def export_tables(directory: str | os.PathLike, dtype: torch.dtype | None = None) -> int:
    """Writes every named table's rows for inference into ``directory``, as a version a serving
    shard (``recdev-server --serve``) loads: without optimizer state, and narrowed to ``dtype``
    (``torch.float16`` or ``torch.bfloat16``, from float32 tables, rounded to nearest) if given.
    Returns the version's number; the next ``checkpoint`` into the same directory is a base."""
    pending.wait()
    if dtype is not None and dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise ValueError(f"export_tables: dtype must be torch.float16 or torch.bfloat16 (or None); got {dtype}")
    return int(_C._export_tables(os.fspath(directory), dtype))


def versions(directory: str | os.PathLike) -> list[int]:
    """The versions in ``directory`` that ``restore`` can reach, oldest first."""
    return [int(v) for v in _C._list_versions(os.fspath(directory))]


def wait_for_compaction(directory: str | os.PathLike) -> None:
    """Returns once the compaction of ``directory`` that this process's checkpoints started in the
    background (if any) has finished, and raises what it failed with. Call it before removing or
    copying the directory: a compaction still running writes a new base into it."""
    _C._wait_version_compaction(os.fspath(directory))


def version_files(directory: str | os.PathLike) -> list[dict]:
    """Every version file of ``directory``: path, version, kind ("base" or "delta"), bytes and
    written_unix_ms, ordered by version."""
    return list(_C._version_files(os.fspath(directory)))
