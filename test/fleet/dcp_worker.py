"""One trainer of test_distributed_checkpoint.py, run as a real process per rank by fleet_processes.py
(gloo on 127.0.0.1): a model with two shared tables under fused optimizers and a dense head, saved or
loaded with torch.distributed.checkpoint and torch_recdev's planners.

    python dcp_worker.py SCENARIO OUT_DIR      (DCP_DIR: the checkpoint; DCP_PREFIX: the tables' names)

Each rank writes what it saw to OUT_DIR/rank<r>.pt."""

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch import nn

import torch_recdev
from torch_recdev import _C
from torch_recdev.distributed_checkpoint import TableLoadPlanner, TableSavePlanner

UNTOUCHED = torch.tensor([99_999, 54_321])  # rows no step touches: their init rule must come back too


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        with torch_recdev.placement("table"):
            self.users = nn.Embedding(10**6, 8, device="recdev")
            self.items = nn.EmbeddingBag(10**5, 8, mode="sum", device="recdev")
        self.head = nn.Linear(16, 1)

    def forward(self, users, items, offsets):
        return self.head(torch.cat([self.users(users).cpu(), self.items(items, offsets).cpu()], dim=1))


def build(seed: int):
    """The model on named tables (prefix DCP_PREFIX), Adagrad on one table and Adam on the other."""
    torch.manual_seed(seed)
    model = Model()
    optimizers = [torch_recdev.optim.Adagrad([model.users.weight], lr=0.1),
                  torch_recdev.optim.Adam([model.items.weight], lr=0.01)]
    torch_recdev.share_tables(model, prefix=os.environ["DCP_PREFIX"])
    return model, optimizers


def state_of(model, optimizers) -> dict:
    """DCP's usual state dict: the optimizers' state keyed by parameter name (torch.optim's own keys,
    ints, would come back as strings from DCP's flattening)."""
    model_state, optimizer_state = get_state_dict(model, optimizers)
    return {"model": model_state, "optim": optimizer_state}


def seen(model, optimizers) -> dict:
    """Each table's held rows (ids sorted, records: weight then optimizer state) and header, its
    untouched rows, the head and the optimizers' steps."""
    tables = {}
    for name in ("users", "items"):
        weight = getattr(model, name).weight
        header, ids, records = _C._table_snapshot(weight)
        order = ids.argsort()
        tables[name] = {"ids": ids[order], "records": records[order],
                        **{k: header[k] for k in ("init", "init_seed", "init_stream", "optimizer", "optimizer_step")}}
        # Copies to the CPU, not lookups: they hold no row (another rank may be snapshotting the table).
        tables[name]["untouched"] = torch.stack([weight.detach()[i].cpu() for i in UNTOUCHED])
    return {"tables": tables, "head": {k: v.clone() for k, v in model.head.state_dict().items()},
            "optim": [o.state_dict() for o in optimizers], "grads": [p.grad for p in model.parameters()]}


def save(out: dict) -> None:
    rank = dist.get_rank()
    model, optimizers = build(seed=0)
    dist.barrier()  # every rank declared: no rank trains a table another has yet to open
    for step in range(3):  # each rank its own ids, overlapping the next rank's: 30 users, 30 bags of 2 items
        users = torch.arange(50 * rank, 50 * rank + 30) + 7 * step
        items = torch.arange(40 * rank, 40 * rank + 60) + 3 * step
        model(users, items, torch.arange(0, 60, 2)).sum().backward()
    dist.barrier()  # every rank's updates are in before any rank reads or saves
    out.update(seen(model, optimizers))
    out["held"] = {name: torch_recdev.table_stats(getattr(model, name).weight)["rows"] for name in ("users", "items")}
    dist.barrier()  # every rank read its tables before any writes (the save reads only)
    dcp.save(state_of(model, optimizers), checkpoint_id=os.environ["DCP_DIR"], planner=TableSavePlanner())


def load(out: dict) -> None:
    model, optimizers = build(seed=1)  # another init and head: all of it must come from the checkpoint
    state = state_of(model, optimizers)
    dcp.load(state, checkpoint_id=os.environ["DCP_DIR"], planner=TableLoadPlanner())
    set_state_dict(model, optimizers, model_state_dict=state["model"], optim_state_dict=state["optim"])
    out.update(seen(model, optimizers))


if __name__ == "__main__":
    scenario, out_dir = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    out = {"store": torch_recdev.fleet_store()["kind"]}
    for name in scenario.split(","):
        globals()[name](out)
    torch.save(out, os.path.join(out_dir, f"rank{dist.get_rank()}.pt"))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
