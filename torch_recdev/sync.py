"""Synchronous fleets: ``torch_recdev.optim.<X>(params, ..., sync=True)``.

Each table of a synchronous optimizer is seen through a deferring view (``store::DeferredTable``):
backward records its per-id gradient rows instead of applying them. A step then brings every row's
gradients of every rank together, in rank order, and applies them in one update per row:

- on remote shards the shards do it (docs/protocol.md, "Synchronous steps"): each rank stages its
  rows of each table on every shard as its part of the step (STAGE_UPDATE, empty parts included),
  and each shard answers once every rank's part is in; then each rank commits (COMMIT_UPDATE), the
  first commit applies the parts, in rank order, as one update, and each answer comes once the shard
  applied. Every shard thus gets one update per step: its rows move once and its optimizer step
  counter (Adam's bias correction) advances once, like every other shard's. A rank commits only
  once its parts were staged on every shard, so every shard holds every part before any applies; a
  rank that never sends its part (dead or hung) is named by the shards when the timeout passes, and
  no rank commits, so nothing of the step is applied. Each gradient crosses the network once, and
  no rank's next lookup runs before its commits returned, that is before every shard applied;
- on the embedded store every rank needs all of them for its own replica: after checking through
  the default process group's store that every rank reached the step (a rank that did not within
  the timeout is named, and nothing is applied), they are gathered (``all_gather``) and every rank
  applies them all, so the replicas stay identical.

The step runs at ``step()``, or, for ``apply_optimizer_in_backward(..., sync=True)``, when a backward
that reached one of the tables ends (``step_when_backward_ends``), with no ``step()`` to call.

The table then moves exactly as in one process whose batch is every rank's batch, in rank order: a
row's gradients reach its update in that order (each rank's in its own batch order), and the store
sums a row's duplicate gradients in that order either way.
"""

from __future__ import annotations

import datetime
import itertools
import os
import weakref

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
        self.after_backward = False
        self._queued_for = None  # the backward (autograd graph task) whose end runs the step
        self.params = list(params)
        # The tables as they were: an anonymous table lives as long as its first storage does.
        self.originals = [p.data for p in self.params]
        _refuse_replicas_with_policy(self.params)
        with torch.no_grad():
            for p in self.params:
                p.data = _C._sync_table(p.data)
        self.in_process = [_C._table_in_process(p) for p in self.params]
        self.fleet = self._fleet_id() if not all(self.in_process) else 0

    def _fleet_id(self) -> int:
        """Rank 0's random 64-bit id of this optimizer's steps, shared through the group's store: the
        shards tell this fleet's parts from any other job's."""
        store = dist.distributed_c10d._get_default_store()
        if dist.get_rank() == 0:
            store.set(f"{self.key}/fleet", str(int.from_bytes(os.urandom(8), "little")))
        return int(store.get(f"{self.key}/fleet"))

    def step_when_backward_ends(self) -> None:
        """From now on the step runs at the end of every backward that records a row gradient of one
        of the tables (an autograd final callback, queued by the first recording of that backward),
        and ``step()`` is not to be called. A step's failure is raised by that ``backward()``."""
        self.after_backward = True
        # The tables hold the hook; a weak reference, so that they do not keep this object alive.
        hook = _recorded_hook(weakref.ref(self))
        for p in self.params:
            _C._set_record_hook(p, hook)

    def _recorded(self) -> None:
        backward = torch._C._current_graph_task_id()
        # Rows recorded outside any backward (ops.emb_update on the table) go with the next backward's step.
        if backward == -1 or backward == self._queued_for:
            return
        self._queued_for = backward
        torch.autograd.Variable._execution_engine.queue_callback(self.step)

    def step(self) -> None:
        rank, world = dist.get_rank(), dist.get_world_size()
        self.step_count += 1
        local = [p for p, in_process in zip(self.params, self.in_process) if in_process]
        if local:
            self._wait_for_every_rank(rank, world)
        pending = [_C._take_pending_updates(p) for p in self.params]
        for p, in_process, (ids, grads) in zip(self.params, self.in_process, pending):
            if in_process:
                ids, grads = _gather(ids, grads, world)
                if ids.numel():
                    _C._apply_updates(p, ids, grads)
        on_shards = [(p, ids, grads) for p, in_process, (ids, grads) in zip(self.params, self.in_process, pending)
                     if not in_process]
        if on_shards:
            self._step_on_shards(*map(list, zip(*on_shards)), rank, world)

    def _step_on_shards(self, tables: list, ids: list, grads: list, rank: int, world: int) -> None:
        tag = (self.fleet, self.step_count, rank, world)
        try:
            _C._stage_step(tables, ids, grads, *tag, self.timeout)
        except Exception as error:  # noqa: BLE001 (the shard's error, re-raised with the step and rank named)
            raise RuntimeError(f"synchronous step {self.step_count} (rank {rank}): no row gradient of this step "
                               f"was applied: {error}") from error
        try:
            _C._commit_step(tables, *tag, self.timeout)
        except Exception as error:  # noqa: BLE001 (the shards' error, re-raised with the step and rank named)
            raise RuntimeError(f"synchronous step {self.step_count} (rank {rank}): {error}") from error

    def _wait_for_every_rank(self, rank: int, world: int) -> None:
        """Waits until every rank has reached this step (marked it in the group's store); names those
        that did not."""
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
                f"{', '.join(map(str, missing))} of {world} did not reach it within "
                f"{self.timeout:g} s (dead or hung); no row gradient of this step was applied") from error
        if self.step_count > 2:
            store.delete_key(f"{self.key}/{self.step_count - 2}/{rank}")


def _refuse_replicas_with_policy(params: list[torch.Tensor]) -> None:
    """Embedded replicas stay identical only if every rank's table changes alike, but a budget policy
    evicts and admits by the lookups it sees, which are each rank's own: the replicas would drift
    apart. Refused, as budgets.set_table_policy refuses the converse."""
    if dist.get_world_size() < 2:
        return
    for i, p in enumerate(params):
        if _C._table_in_process(p) and _C._table_has_policy(p):
            raise ValueError(
                f"sync=True on the embedded store keeps one identical replica of each table per rank, but "
                f"parameter {i} has a budget policy (torch_recdev.table_policy), whose evictions follow each "
                "rank's own lookups and would make the replicas differ. Remove the policy "
                "(torch_recdev.set_table_policy(weight)) or train on recdev-server shards, where every rank "
                "shares one table")


def _recorded_hook(tables: weakref.ref):
    def recorded() -> None:
        alive = tables()
        if alive is not None:
            alive._recorded()
    return recorded


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
