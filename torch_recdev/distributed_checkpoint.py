"""``torch.distributed.checkpoint`` (DCP) of models with recdev tables: the planners to pass it.

    import torch.distributed.checkpoint as dcp
    from torch_recdev.distributed_checkpoint import TableLoadPlanner, TableSavePlanner

    dcp.save({"model": model.state_dict(), "optim": opt.state_dict()}, checkpoint_id=path,
             planner=TableSavePlanner())
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    dcp.load(state, checkpoint_id=path, planner=TableLoadPlanner())   # tables loaded in place
    opt.load_state_dict(state["optim"])

A table is not a dense tensor: DCP's default planners would copy every one of its ``num_embeddings``
rows to the CPU (refused past ``max_fallback_bytes``). These planners are DCP's default ones but for
the tables in the state dict: each table becomes one BYTE_IO item holding ``torch.save`` of it (the
store's own serialization, ``serialization.py``: its header — shape, init rule, optimizer and step —
and only its held rows' ids and records, weight and optimizer state, each under a CRC-32), made only
by the rank that writes it, when DCP writes it. Everything else (the dense layers, the optimizers'
``state_dict``) goes through DCP as usual.

Who writes and who installs a table (the default process group's ranks; rank 0 of 1 without one):

- a table on recdev-server shards is one table for the whole fleet: written by rank
  ``crc32(key) % world`` (the tables' work spread over the ranks), installed by rank 0 alone;
- a table of the embedded store is a replica each rank holds (identical in a synchronous fleet):
  written by rank 0, installed by every rank into its own.

So a checkpoint holds each table once, and loads into a fleet of any number of ranks or shards
(the rows are routed to the shards they belong to now). DCP's load ends with a collective, so every
rank returns from ``dcp.load`` after the tables are installed.
"""

from __future__ import annotations

import dataclasses
import io
import zlib

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import DefaultLoadPlanner, DefaultSavePlanner

from . import _C, pending
from .tables import is_table

__all__ = ["TableSavePlanner", "TableLoadPlanner", "writer_rank"]


def _rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _is_table(value) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "recdev" and is_table(value)


def _on_shards(table: torch.Tensor) -> bool:
    return not _C._table_in_process(table)


def writer_rank(key: str, table: torch.Tensor, world: int) -> int:
    """The rank that writes ``table`` (state-dict key ``key``) into a checkpoint of ``world`` ranks."""
    return zlib.crc32(key.encode()) % world if _on_shards(table) else 0


class _HeldRows:
    """A table in the save plan: a BYTE_IO item whose bytes are made when DCP writes it."""

    def __init__(self, table: torch.Tensor):
        self.table = table


class TableSavePlanner(DefaultSavePlanner):
    """DCP's ``DefaultSavePlanner``, writing each recdev table once, as its held rows."""

    def set_up_planner(self, state_dict, storage_meta=None, is_coordinator: bool = False) -> None:
        super().set_up_planner(state_dict, storage_meta, is_coordinator)
        self.state_dict = {key: _HeldRows(value) if _is_table(value) else value
                           for key, value in self.state_dict.items()}

    def create_local_plan(self):
        rank, world = _rank_and_world()
        plan = super().create_local_plan()
        # Only the writer plans a table's item: a key every rank planned would be written by whichever
        # rank DCP's deduplication picks (by the planned bytes, which for a BYTE_IO item it does not know).
        mine = [item for item in plan.items
                if not isinstance(rows := self.state_dict.get(item.index.fqn), _HeldRows)
                or writer_rank(item.index.fqn, rows.table, world) == rank]
        self.plan = dataclasses.replace(plan, items=mine)
        return self.plan

    def transform_object(self, write_item, object):
        if not isinstance(object, _HeldRows):
            return super().transform_object(write_item, object)
        pending.wait()  # the async writes issued before the save are in it
        data = io.BytesIO()
        torch.save(object.table, data)
        return data


class TableLoadPlanner(DefaultLoadPlanner):
    """DCP's ``DefaultLoadPlanner``, installing each recdev table of the state dict in place: a table
    on shards by rank 0, a replica by every rank."""

    def set_up_planner(self, state_dict, metadata=None, is_coordinator: bool = False) -> None:
        super().set_up_planner(state_dict, metadata, is_coordinator)
        rank, _ = _rank_and_world()
        tables = {key: value for key, value in self.state_dict.items() if _is_table(value)}
        self._installs = {key: table for key, table in tables.items() if rank == 0 or not _on_shards(table)}
        self._skips = set(tables) - set(self._installs)

    def create_local_plan(self):
        # Filtered here, not out of the state dict: DCP takes keys missing from it for an old checkpoint's.
        plan = super().create_local_plan()
        return dataclasses.replace(plan, items=[item for item in plan.items if item.dest_index.fqn not in self._skips])

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        key = read_item.dest_index.fqn
        table = self._installs.get(key)
        if table is None:
            return super().load_bytes(read_item, value)
        try:
            loaded = torch.load(value, weights_only=True)
        except Exception as error:
            raise RuntimeError(
                f"recdev table {key!r}: its part of the checkpoint cannot be read, so it is damaged (or was not "
                f"written by TableSavePlanner); nothing of the table was installed. Load an earlier checkpoint. "
                f"({type(error).__name__}: {error})"
            ) from error
        if not _is_table(loaded) or loaded.shape != table.shape or loaded.dtype != table.dtype:
            raise ValueError(
                f"recdev table {key!r}: the checkpoint holds a {list(loaded.shape)} {loaded.dtype} tensor, the state "
                f"dict a {list(table.shape)} {table.dtype} table; declare the model's table as it was saved"
            )
        pending.wait()  # no async write issued before the load lands after it
        with torch.no_grad():
            table.copy_(loaded)  # the checkpoint's rows go straight into the table (table_copy.cpp)
