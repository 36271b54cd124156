"""Fleets: many trainer processes (``torchrun``) training one model whose tables live in one store.

``share_tables(model)`` turns every table parameter of a model into a named table, declared (not
reset) in the current store, so that every rank, running the same model code, trains the same rows:

    model = Model()                 # nn.Embedding / nn.EmbeddingBag weights on recdev table storage
    torch_recdev.share_tables(model)

The store is named once: ``RECDEV_SERVERS`` (or ``connect()``) on rank 0 is published through the
default process group's own store, and the other ranks connect to the same servers the first time
they declare a table (``share_tables``, ``ops.init_embedding_table``) or call ``fleet_store()``.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from . import _C
from .tables import is_table

__all__ = ["share_tables", "fleet_store"]

# The key under which rank 0 publishes its store in the default process group's store.
_STORE_KEY = "torch_recdev/servers"
# The process group whose ranks already agree on the store (the default group, once it exists).
_agreed_with: Optional[object] = None
# Set by ops.connect(): this rank chose its store itself and does not take rank 0's.
_connected_explicitly = False


def _default_group():
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return None
    return torch.distributed.distributed_c10d._get_default_group()


def fleet_store() -> dict:
    """Makes this rank's store the one rank 0 named, and returns ``store_info()``.

    Under an initialized default process group: rank 0 publishes its store (``RECDEV_SERVERS``,
    ``connect()`` or the embedded store) in the group's store; another rank that set neither connects
    to the same servers (with its own ``RECDEV_TOKEN``: the token is not published). Waits for rank 0
    at most the process group's timeout. Without a process group, the current store as it is.
    Declarations call this first, so a script rarely needs to."""
    from . import ops

    global _agreed_with
    group = _default_group()
    if group is None or _agreed_with is group:
        return ops.store_info()
    store = torch.distributed.distributed_c10d._get_default_store()
    if torch.distributed.get_rank() == 0:
        info = ops.store_info()  # connects RECDEV_SERVERS now, so a bad list fails on rank 0 first
        published = ",".join(info["servers"]) if info["kind"] == "remote" else "embedded"
        timeout = str(info.get("timeout", 30.0))
        store.set(_STORE_KEY, f"{published};{timeout}")
    elif not _connected_explicitly and not os.environ.get("RECDEV_SERVERS", "").strip():
        try:
            servers, timeout = store.get(_STORE_KEY).decode().split(";")
        except RuntimeError as error:
            raise RuntimeError(
                f"rank {torch.distributed.get_rank()}: rank 0 did not publish its recdev store in time ({error}). "
                "Rank 0 publishes it when it declares a table, calls share_tables, connect or fleet_store; "
                "or set RECDEV_SERVERS on every rank."
            ) from error
        if servers != "embedded":
            ops.connect(servers, token=os.environ.get("RECDEV_TOKEN") or None, timeout=float(timeout))
    _agreed_with = group
    return ops.store_info()


def _published_after_connect() -> None:
    """ops.connect() on rank 0 of an initialized group publishes at once (a later connect replaces it)."""
    global _agreed_with, _connected_explicitly
    _connected_explicitly = True
    group = _default_group()
    if group is not None and torch.distributed.get_rank() == 0:
        _agreed_with = None
        fleet_store()


def share_tables(module: torch.nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """Makes every table parameter of ``module`` the named table ``prefix + <its state_dict key>``.

    A table parameter is one on recdev table storage (``torch_recdev.is_table``), such as the weight
    of an ``nn.Embedding`` or ``nn.EmbeddingBag`` made on recdev. Each is declared with
    ``ops.init_embedding_table``: its shape, its init rule (from the module's own initialization) and
    the fused optimizer already attached to it, if any. The first rank to declare a table creates it;
    the others open it with every row kept (a table loaded from a checkpoint before, too). The
    parameter object stays the same, now backed by the named table, so optimizers that hold it keep
    working. Rows written into the anonymous table before (an ``nn.Embedding``'s ``padding_idx`` row,
    say) are not carried over: the named table's rows follow its init rule until trained. A table
    that exists with another shape, init rule or optimizer kind is a ``ValueError`` naming it.

    Returns the named tables by name."""
    from . import ops
    from .init import Constant, Normal, Uniform, Xavier, Zero

    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"share_tables takes an nn.Module; got {type(module).__name__}")
    if not isinstance(prefix, str):
        raise TypeError(f"share_tables: prefix must be a string; got {type(prefix).__name__}")
    fleet_store()
    strategies = {
        "normal": lambda a, b: Normal(a, b),
        "uniform": lambda a, b: Uniform(a, b),
        "constant": lambda a, b: Constant(a),
        "zero": lambda a, b: Zero(),
        "xavier": lambda a, b: Xavier(),
    }
    shared = {}
    for key, param in module.named_parameters():
        if not is_table(param):
            continue
        if param.dim() != 2:
            raise ValueError(f"share_tables: {key} is a {param.dim()}-D table; only 2-D tables (rows x dim) can be named")
        (kind, a, b), optimizer = _C._table_declaration(param)
        if optimizer is not None:
            hp = dict(optimizer[1])
            if optimizer[0] == "adam":
                hp["betas"] = (hp.pop("beta1"), hp.pop("beta2"))
            if "stochastic_rounding" in hp:
                hp["stochastic_rounding"] = True
                hp["rounding_seed"] = int(hp["rounding_seed"])
            optimizer = (optimizer[0], hp)
        named = ops.init_embedding_table(
            prefix + key, param.shape[0], param.shape[1], init=strategies[kind](a, b), optimizer=optimizer,
            dtype=param.dtype,
        )
        with torch.no_grad():
            param.data = named
        shared[prefix + key] = named
    return shared
