"""Fleets: many trainer processes (``torchrun``) training one model whose tables live in one store.

``share_tables(model)`` turns every table parameter of a model into a named table, declared (not
reset) in the current store, so that every rank, running the same model code, trains the same rows:

    model = Model()                 # nn.Embedding / nn.EmbeddingBag weights on recdev table storage
    torch_recdev.share_tables(model)

Which store that is, is rank 0's choice (``torch_recdev.stores``: ``RECDEV_SERVERS`` or ``connect()``
on rank 0, published to the other ranks).
"""

from __future__ import annotations

import torch

from . import _C, ops
from .init import Constant, Normal, Uniform, Xavier, Zero
from .stores import fleet_store
from .tables import is_table

__all__ = ["share_tables", "fleet_store"]


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
            optimizer = (optimizer.kind, optimizer.hyperparameters())
        named = ops.init_embedding_table(
            prefix + key, param.shape[0], param.shape[1], init=strategies[kind](a, b), optimizer=optimizer,
            dtype=param.dtype,
        )
        with torch.no_grad():
            param.data = named
        shared[prefix + key] = named
    return shared
