"""One trainer of the fleet tests (test_fleet_processes.py), started as a real process per rank with
torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): gloo on 127.0.0.1.

    python fleet_worker.py SCENARIO OUT_DIR

RECDEV_SERVERS is set on rank 0 only by the test: the other ranks must get the store through the
process group. Each rank writes what it saw to OUT_DIR/rank<r>.pt."""

import os
import sys

import torch
import torch.distributed as dist
from torch import nn

import torch_recdev
from torch_recdev import ops

STEPS = 5
KEYS = torch.tensor([0, 3, 3, 7, 500])  # 3 twice: duplicates within a batch sum too


def grads(rank: int, step: int) -> torch.Tensor:
    # Powers of two: every partial sum is exact in float32, so the order of updates cannot matter.
    return torch.full((len(KEYS), 4), 2.0 ** -(rank + 2)) * (step + 1)


def declare(name: str) -> torch.Tensor:
    return ops.init_embedding_table(name, 1000, 4, init=torch_recdev.Constant(1.0), optimizer=("sgd", {"lr": 0.5}))


def async_sums(out: dict) -> None:
    rank = dist.get_rank()
    out["store"] = torch_recdev.fleet_store()
    # Every rank declares every table with its init, as every training script does.
    tables = [declare(f"fleet.t{i}") for i in range(2)]
    dist.barrier()
    for step in range(STEPS):
        for table in tables:
            ops.emb_update(table, KEYS, grads(rank, step))
    dist.barrier()
    out["rows"] = [ops.emb_read(t, KEYS).cpu() for t in tables]


def overlap_published(out: dict) -> None:
    """Rank 0 connects with overlap_updates=True; the other ranks take its store, overlap included,
    and no update of a table both train through backward is lost."""
    rank = dist.get_rank()
    if rank == 0:
        torch_recdev.connect(os.environ["FLEET_CONNECT"], overlap_updates=True)
    out["store"] = torch_recdev.fleet_store()
    table = declare("fleet.overlap").requires_grad_(True)
    dist.barrier()
    for step in range(STEPS):
        (torch.nn.functional.embedding(KEYS, table).cpu() * grads(rank, step)).sum().backward()
    torch.recdev.synchronize()
    dist.barrier()
    out["rows"] = [ops.emb_read(table, KEYS).cpu()]


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        with torch_recdev.placement("table"):
            self.users = nn.Embedding(1000, 4, device="recdev")
            self.items = nn.EmbeddingBag(500, 4, mode="sum", device="recdev")
        self.head = nn.Linear(8, 1)

    def forward(self, users, items, offsets):
        return self.head(torch.cat([self.users(users).cpu(), self.items(items, offsets).cpu()], dim=1))


def shared_model(out: dict) -> None:
    rank = dist.get_rank()
    torch.manual_seed(100 + rank)  # unlike seeds: the first declaration's init values stand
    model = Model()
    torch_recdev.optim.SGD([model.users.weight, model.items.weight], lr=0.25)
    shared = torch_recdev.share_tables(model, prefix="fleet.model.")
    out["names"] = sorted(shared)
    users, items, offsets = torch.tensor([1, 2]), torch.tensor([5, 6, 7]), torch.tensor([0, 1])
    dist.barrier()
    before = (ops.emb_read(model.users.weight, users).cpu(), ops.emb_read(model.items.weight, items).cpu())
    dist.barrier()
    model(users, items, offsets).sum().backward()  # each rank one step: the tables get both
    dist.barrier()
    out["before"] = before
    out["after"] = (ops.emb_read(model.users.weight, users).cpu(), ops.emb_read(model.items.weight, items).cpu())
    out["head_weight"] = model.head.weight.detach().clone()


def checkpoint(out: dict) -> None:
    rank = dist.get_rank()
    path = os.path.join(os.environ["FLEET_OUT"], "tables.recdev")
    table = declare("fleet.ckpt")
    ops.emb_update(table, KEYS, grads(rank, 0))
    dist.barrier()
    saved = ops.emb_read(table, KEYS).cpu()
    if rank == 0:
        ops.save(path)
    dist.barrier()
    ops.emb_update(table, KEYS, grads(rank, 1))  # trained past the checkpoint
    dist.barrier()
    # Resume: rank 0 drops the table and loads the file; every rank then declares it again.
    if rank == 0:
        ops.init_embedding_table("fleet.ckpt", 1000, 4, reset=True)
        ops.load(path)
    dist.barrier()
    resumed = declare("fleet.ckpt")
    out["saved"], out["resumed"] = saved, ops.emb_read(resumed, KEYS).cpu()


SYNC_KINDS = ("Adagrad", "RowWiseAdagrad", "Adam")
# apply_optimizer_in_backward's optimizer classes for them.
IN_BACKWARD = {"Adagrad": torch.optim.Adagrad, "RowWiseAdagrad": torch_recdev.optim.RowWiseAdagrad,
               "Adam": torch.optim.SparseAdam}
SYNC_STEPS, SYNC_BATCH, SYNC_IDS = 50, 128, 300  # the global batch; ids from [0, SYNC_IDS): many duplicates


def sync_train(kind: str, rank: int, world: int, sync: bool, in_backward: bool = False, policy=None) -> torch.Tensor:
    """50 steps of two tables under one optimizer, each on this rank's share of the step's global
    batch (world 1: all of it, the single-process reference). in_backward: the optimizer of
    apply_optimizer_in_backward, with no step() call. Returns the rows the batches touch, both tables'."""
    torch.manual_seed(0)
    # Afresh: on shards rank 0 resets for all; on the embedded store each rank resets its own replica.
    reset = rank == 0 or torch_recdev.store_info()["kind"] == "embedded"
    # The same names with or without a policy: a named table's init values follow its name.
    tables = [ops.init_embedding_table(f"sync.{kind}.{t}", 10_000, 8, init=torch_recdev.Normal(0, 0.1), reset=reset,
                                       **(policy or {})).requires_grad_(True) for t in "ab"]
    if world > 1:
        dist.barrier()  # rank 0's reset before any rank trains
    kwargs = {"lr": 0.05, **({"sync": True} if sync else {})}
    if in_backward:
        torch_recdev.optim.apply_optimizer_in_backward(IN_BACKWARD[kind], tables, kwargs)
    else:
        optimizer = getattr(torch_recdev.optim, kind)(tables, **kwargs)
    share = SYNC_BATCH // world
    mine = slice(rank * share, (rank + 1) * share)
    for step in range(SYNC_STEPS):
        g = torch.Generator().manual_seed(1000 + step)
        ids, weights = torch.randint(0, SYNC_IDS, (SYNC_BATCH,), generator=g), torch.randn(SYNC_BATCH, 8, generator=g)
        # The second table sees other rows of the same batch, on other shards.
        looked_up = nn.functional.embedding(ids[mine], tables[0]).cpu() + nn.functional.embedding(
            (ids[mine] * 7 + 1) % SYNC_IDS, tables[1]).cpu()
        (looked_up * weights[mine]).sum().backward()
        if not in_backward:
            optimizer.step()
    # A copy to the CPU, not a lookup: no touch, so no budget to fit.
    return torch.cat([t.detach()[:SYNC_IDS].cpu() for t in tables])


def sync_reference(out: dict) -> None:
    out["sync"] = {kind: sync_train(kind, dist.get_rank(), dist.get_world_size(), True) for kind in SYNC_KINDS}
    out["sync_store"] = torch_recdev.store_info()["kind"]


# A memory tier of 200 of the 300 rows each table's steps touch (100 per shard): every step brings rows
# back from the shards' disks and sends others there.
SPILL = dict(max_rows=200, evict="lru", spill=True)


def sync_spilled(out: dict) -> None:
    out["sync_spilled"] = {kind: sync_train(kind, dist.get_rank(), dist.get_world_size(), True, policy=SPILL)
                           for kind in SYNC_KINDS}


def sync_versions(out: dict) -> None:
    """ops.checkpoint(fleet=True) between steps of a synchronous fleet: each version restores to exactly
    the tables as they were between those two steps."""
    rank, world = dist.get_rank(), dist.get_world_size()
    directory = os.path.join(os.environ["FLEET_OUT"], "versions")
    reset = rank == 0 or torch_recdev.store_info()["kind"] == "embedded"
    tables = [ops.init_embedding_table(f"versions.{t}", 10_000, 8, init=torch_recdev.Normal(0, 0.1), reset=reset,
                                       ).requires_grad_(True) for t in "ab"]
    dist.barrier()
    optimizer = torch_recdev.optim.RowWiseAdagrad(tables, lr=0.05, sync=True)
    share = SYNC_BATCH // world
    mine = slice(rank * share, (rank + 1) * share)
    states = {}
    for step in range(6):
        g = torch.Generator().manual_seed(2000 + step)
        ids, weights = torch.randint(0, SYNC_IDS, (SYNC_BATCH,), generator=g), torch.randn(SYNC_BATCH, 8, generator=g)
        looked_up = nn.functional.embedding(ids[mine], tables[0]).cpu() + nn.functional.embedding(
            (ids[mine] * 7 + 1) % SYNC_IDS, tables[1]).cpu()
        (looked_up * weights[mine]).sum().backward()
        optimizer.step()
        if step % 2 == 1:
            version = ops.checkpoint(directory, fleet=True)
            states[version] = [t.detach()[:SYNC_IDS].cpu().clone() for t in tables]  # nothing moves until all go on
            dist.barrier()
    dist.barrier()
    if rank == 0:
        out["versions_restored"] = {}
        for version, state in states.items():
            ops.restore(directory, version)
            out["versions_restored"][version] = all(torch.equal(t.detach()[:SYNC_IDS].cpu(), s)
                                                    for t, s in zip(tables, state))
    dist.barrier()


def sync_in_backward(out: dict) -> None:
    out["sync_in_backward"] = {kind: sync_train(kind, dist.get_rank(), dist.get_world_size(), True, in_backward=True)
                               for kind in SYNC_KINDS}


def sync_replicas_with_policy(out: dict) -> None:
    """Embedded replicas with a budget policy would evict by each rank's own lookups and drift apart:
    sync=True refuses such a table, and a policy is refused on a table already trained that way."""
    budgeted = ops.init_embedding_table("sync.policy.a", 1000, 4, init=torch_recdev.Zero(), reset=True,
                                        max_rows=4, evict="lru").requires_grad_(True)
    try:
        torch_recdev.optim.SGD([budgeted], lr=0.1, sync=True)
    except ValueError as error:
        out["sync_of_policy_error"] = str(error)
    plain = ops.init_embedding_table("sync.policy.b", 1000, 4, init=torch_recdev.Zero(), reset=True).requires_grad_(True)
    torch_recdev.optim.SGD([plain], lr=0.1, sync=True)
    try:
        torch_recdev.set_table_policy(plain, max_rows=4, evict="lru")
    except ValueError as error:
        out["policy_of_sync_error"] = str(error)
    out["policy_after_refusal"] = torch_recdev.table_policy(plain)


def sync_killed(out: dict) -> None:
    """Step 1 on both ranks, then rank 1 dies; rank 0's step 2 must fail naming it, both for an
    optimizer stepped by hand and for apply_optimizer_in_backward's (which fails in backward)."""
    rank = dist.get_rank()
    table = ops.init_embedding_table("sync.killed", 1000, 4, init=torch_recdev.Constant(1.0)).requires_grad_(True)
    optimizer = torch_recdev.optim.SGD([table], lr=1.0, sync=True, sync_timeout=3)
    in_backward = ops.init_embedding_table("sync.killed.in_backward", 1000, 4,
                                           init=torch_recdev.Constant(1.0)).requires_grad_(True)
    torch_recdev.optim.apply_optimizer_in_backward(torch.optim.SGD, [in_backward],
                                                   {"lr": 1.0, "sync": True, "sync_timeout": 3})
    nn.functional.embedding(torch.tensor([1, 2]), table).sum().backward()
    optimizer.step()
    nn.functional.embedding(torch.tensor([1, 2]), in_backward).sum().backward()
    out["after_step_1"] = ops.emb_read(table, torch.tensor([1, 2, 3])).cpu()
    out["in_backward_after_step_1"] = ops.emb_read(in_backward, torch.tensor([1, 2, 3])).cpu()
    if rank == 1:
        finish(out)  # dies before step 2: no further word to the others
    nn.functional.embedding(torch.tensor([2, 3]), table).sum().backward()
    try:
        optimizer.step()
    except RuntimeError as error:
        out["error"] = str(error)
    out["after_failed_step"] = ops.emb_read(table, torch.tensor([1, 2, 3])).cpu()
    try:
        nn.functional.embedding(torch.tensor([2, 3]), in_backward).sum().backward()
    except RuntimeError as error:
        out["in_backward_error"] = str(error)
    out["in_backward_after_failed_step"] = ops.emb_read(in_backward, torch.tensor([1, 2, 3])).cpu()
    finish(out)


def finish(out: dict) -> None:
    """Writes what this rank saw and exits at once (without the group's goodbye, which a dead peer would hang)."""
    torch.save(out, os.path.join(os.environ["FLEET_OUT"], f"rank{dist.get_rank()}.pt"))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    scenario, out_dir = sys.argv[1], sys.argv[2]
    os.environ["FLEET_OUT"] = out_dir
    dist.init_process_group("gloo")
    out = {}
    for name in scenario.split(","):
        globals()[name](out)
    torch.save(out, os.path.join(out_dir, f"rank{dist.get_rank()}.pt"))
    dist.barrier()
    dist.destroy_process_group()
