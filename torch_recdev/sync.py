"""Synchronous fleets: ``torch_recdev.optim.<X>(params, ..., sync=True)``.

Each table of a synchronous optimizer is seen through a deferring view (``store::DeferredTable``):
backward records its per-id gradient rows instead of applying them. A step then

1. checks that every rank of the default process group reached this step, through the group's own
   store, within the timeout; a rank that did not (dead or hung) is named in the error, and no row
   of the step has been applied anywhere;
2. brings every row's gradients of every rank together, in rank order, and applies them in one
   update per row:

   - on the embedded store every rank needs all of them for its own replica: they are gathered
     (``all_gather``) and every rank applies them all, so the replicas stay identical;
   - on remote shards the apply is split by shard: shard ``s`` of the optimizer's ``i``-th table is
     applied by rank ``(s + i) mod N``. Each rank sends every other rank only the rows of that
     rank's shards (gloo ``send``/``recv``; gloo has no ``all_to_all``) and applies what it holds in
     one UPDATE per shard of its own, empty ones included. Every shard thus gets one UPDATE per step,
     from one rank: its rows move once and its optimizer step counter (Adam's bias correction)
     advances once, like every other shard's. The ranks apply in parallel and each gradient crosses
     the network at most twice (to the rank that applies it, then to its shard), where a single
     applying rank would receive and send every rank's gradients;
3. on shards, applies only once every rank holds its rows (a second check through the group's store:
   a rank lost in the exchange leaves no shard updated), then waits at a barrier, so that no rank's
   next lookup runs before every shard's update.

The step runs at ``step()``, or, for ``apply_optimizer_in_backward(..., sync=True)``, when a backward
that reached one of the tables ends (``step_when_backward_ends``), with no ``step()`` to call.

The table then moves exactly as in one process whose batch is every rank's batch, in rank order: a
row's gradients reach its update in that order (each rank's in its own batch order), and the store
sums a row's duplicate gradients in that order either way.
"""

from __future__ import annotations

import datetime
import itertools
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
        with torch.no_grad():
            for p in self.params:
                p.data = _C._sync_table(p.data)
        self.in_process = [_C._table_in_process(p) for p in self.params]

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
        self._wait_for_every_rank("reached", "reach it", rank, world)
        pending = [_C._take_pending_updates(p) for p in self.params]
        replicas = [(p, *_gather(ids, grads, world))
                    for p, local, (ids, grads) in zip(self.params, self.in_process, pending) if local]
        on_shards = [(i, p, ids, grads)
                     for i, (p, local, (ids, grads)) in enumerate(zip(self.params, self.in_process, pending)) if not local]
        updates = []
        if on_shards:
            updates = _exchange_by_shard(on_shards, rank, world, self.timeout, f"synchronous step {self.step_count}")
            # Every rank holds its rows before any applies: a rank lost in the exchange leaves no shard
            # updated and the others not.
            self._wait_for_every_rank("exchanged", "get its rows of it", rank, world)
        for p, ids, grads in replicas:
            if ids.numel():
                _C._apply_updates(p, ids, grads)
        for p, ids, grads, shards in updates:
            _C._apply_updates(p, ids, grads, shards)
        if on_shards:
            dist.barrier()

    def _wait_for_every_rank(self, phase: str, doing: str, rank: int, world: int) -> None:
        """Waits until every rank has marked `phase` of this step in the group's store; names those that
        did not (they did not do `doing`)."""
        store = dist.distributed_c10d._get_default_store()
        step_key = f"{self.key}/{self.step_count}/{phase}"
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
                f"{', '.join(map(str, missing))} of {world} did not {doing} within "
                f"{self.timeout:g} s (dead or hung); no row gradient of this step was applied") from error
        if self.step_count > 2:
            store.delete_key(f"{self.key}/{self.step_count - 2}/{phase}/{rank}")


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


def _exchange_by_shard(tables: list, rank: int, world: int, timeout: float, step: str) -> list:
    """Step 2 on remote shards for ``tables``, (index in the optimizer, table, ids, grads) each: the
    rows of shard s of table i go to rank (s + i) mod N. Returns what this rank applies:
    (table, ids, grads, its shards) per table that some rank recorded rows of."""
    outgoing = []  # per table, per rank: the (ids, grads) of this rank's batch that it applies
    for i, p, ids, grads in tables:
        applier = (_C._row_shards(p, ids) + i) % world
        # One stable sort and one gather of the rows (each rank's share keeps its batch order), where a
        # boolean mask per rank would read every row once per rank.
        order = torch.argsort(applier, stable=True)
        sizes = torch.bincount(applier, minlength=world).tolist()
        outgoing.append(list(zip(ids[order].split(sizes), grads.index_select(0, order).split(sizes))))
    counts = torch.tensor([[len(ids) for ids, _ in per_rank] for per_rank in outgoing])
    every = [torch.empty_like(counts) for _ in range(world)]
    dist.all_gather(every, counts)  # every[q][t, r]: rows of table t that rank q sends rank r
    sends, receives, incoming = [], [], []
    for t, ((_, _, _, grads), per_rank) in enumerate(zip(tables, outgoing)):
        parts = []
        for q in range(world):
            if q == rank:
                parts.append(per_rank[rank])
                continue
            ids_out, grads_out = per_rank[q]
            if ids_out.numel():
                sends += [dist.isend(ids_out, q, tag=2 * t), dist.isend(grads_out, q, tag=2 * t + 1)]
            n = int(every[q][t, rank])
            ids_in, grads_in = torch.empty(n, dtype=torch.long), torch.empty(n, grads.shape[1])
            if n:
                receives += [(q, dist.irecv(ids_in, q, tag=2 * t)), (q, dist.irecv(grads_in, q, tag=2 * t + 1))]
            parts.append((ids_in, grads_in))
        incoming.append(parts)
    for q, receive in receives:
        try:
            receive.wait(datetime.timedelta(seconds=timeout))
        except RuntimeError as error:
            raise RuntimeError(f"{step} (rank {rank}): rank {q} of {world} did not send its rows within "
                               f"{timeout:g} s (dead or hung); no row gradient of this step was applied") from error
    for send in sends:
        send.wait(datetime.timedelta(seconds=timeout))
    updates = []
    for t, (i, p, _, _) in enumerate(tables):
        # No rank's backward recorded a row: no update anywhere, as in one process.
        if not any(int(c[t].sum()) for c in every):
            continue
        shards = [s for s in range(_C._table_shards(p)) if (s + i) % world == rank]
        if shards:
            parts = incoming[t]
            updates.append((p, torch.cat([ids for ids, _ in parts]), torch.cat([g for _, g in parts]), shards))
    return updates
