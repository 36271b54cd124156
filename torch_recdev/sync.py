"""Synchronous fleets: ``torch_recdev.optim.<X>(params, ..., sync=True)``.

Each table of a synchronous optimizer is seen through a deferring view (``store::DeferredTable``):
backward records its per-id gradient rows instead of applying them. ``step()`` then

1. checks that every rank of the default process group reached this step, through the group's own
   store, within the timeout; a rank that did not (dead or hung) is named in the error, and no row
   of the step has been applied anywhere;
2. gathers every rank's rows (``all_gather`` over the process group), in rank order;
3. applies them once: on the embedded store every rank applies all of them to its own replica (the
   replicas stay identical); on remote shards rank 0 applies them, one update per table, so each row
   is updated once and the optimizer's step counter advances once;
4. on shards, waits at a barrier, so that no rank's next lookup runs before the update is applied.

The table then moves exactly as in one process whose batch is every rank's batch, in rank order:
the store sums a row's duplicate gradients in that order either way.
"""

from __future__ import annotations

import datetime
import itertools

import torch
import torch.distributed as dist

from . import _C

_optimizer_ids = itertools.count()


class SyncTables:
    """The synchronous side of one fused optimizer: its tables' deferring views and its step count."""

    def __init__(self, params: list[torch.Tensor], timeout: float):
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError(
                "sync=True combines every rank's row gradients, so it needs the default process group: call "
                "torch.distributed.init_process_group (torchrun scripts do) before creating the optimizer")
        timeout = float(timeout)
        if not timeout > 0:
            raise ValueError(f"sync_timeout must be a positive number of seconds; got {timeout}")
        self.timeout = timeout
        self.key = f"torch_recdev/sync/{next(_optimizer_ids)}"
        self.step_count = 0
        self.params = list(params)
        # The tables as they were: an anonymous table lives as long as its first storage does.
        self.originals = [p.data for p in self.params]
        with torch.no_grad():
            for p in self.params:
                p.data = _C._sync_table(p.data)
        self.in_process = [_C._table_in_process(p) for p in self.params]

    def step(self) -> None:
        rank, world = dist.get_rank(), dist.get_world_size()
        self.step_count += 1
        self._wait_for_every_rank(rank, world)
        pending = [_C._take_pending_updates(p) for p in self.params]
        gathered = [_gather(ids, grads, world) for ids, grads in pending]
        for p, local, (ids, grads) in zip(self.params, self.in_process, gathered):
            if ids.numel() and (local or rank == 0):
                _C._apply_updates(p, ids, grads)
        if not all(self.in_process):
            dist.barrier()

    def _wait_for_every_rank(self, rank: int, world: int) -> None:
        store = dist.distributed_c10d._get_default_store()
        step_key = f"{self.key}/{self.step_count}"
        store.set(f"{step_key}/{rank}", b"1")
        keys = [f"{step_key}/{r}" for r in range(world)]
        try:
            store.wait(keys, datetime.timedelta(seconds=self.timeout))
        except Exception as error:  # noqa: BLE001 (the store's timeout error, re-raised with the ranks named)
            missing = [r for r in range(world) if not store.check([f"{step_key}/{r}"])]
            dropped = _C._take_pending_updates  # this step's rows are dropped: none was applied anywhere
            for p in self.params:
                dropped(p)
            raise RuntimeError(
                f"synchronous step {self.step_count} (rank {rank}): rank{'s' * (len(missing) > 1)} "
                f"{', '.join(map(str, missing))} of {world} did not reach it within {self.timeout:g} s (dead or hung); "
                "no row gradient of this step was applied") from error
        if self.step_count > 2:
            store.delete_key(f"{self.key}/{self.step_count - 2}/{rank}")


def _gather(ids: torch.Tensor, grads: torch.Tensor, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's (ids, grads), concatenated in rank order."""
    counts = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
    dist.all_gather(counts, torch.tensor([ids.numel()]))
    most = max(int(c) for c in counts)
    dim = grads.shape[1]
    padded_ids = torch.zeros(most, dtype=torch.long)
    padded_ids[: ids.numel()] = ids
    padded_grads = torch.zeros(most, dim)
    padded_grads[: ids.numel()] = grads
    all_ids = [torch.empty(most, dtype=torch.long) for _ in range(world)]
    all_grads = [torch.empty(most, dim) for _ in range(world)]
    dist.all_gather(all_ids, padded_ids)
    dist.all_gather(all_grads, padded_grads)
    n = [int(c) for c in counts]
    return (torch.cat([a[:k] for a, k in zip(all_ids, n)]), torch.cat([g[:k] for g, k in zip(all_grads, n)]))
