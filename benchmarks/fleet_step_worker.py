"""One rank of bench_fleet's step-cost run (torchrun's environment, gloo on 127.0.0.1): the median time
of a training step of one table, IDS ids per rank, asynchronous and synchronous (sync=True) in
alternating rounds (so that drift in the machine's load affects both alike), then where a synchronous
step's time goes, from a profile of a few more steps. Rank 0 prints one line per round,
`round R async S sync S`, and one `phases` line of seconds per step.

    python fleet_step_worker.py IDS STEPS ROUNDS   (RECDEV_SERVERS on rank 0: the shards; else
                                                    each rank's embedded store, a replica in sync mode)
"""

import cProfile
import pstats
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import torch_recdev
from torch_recdev import ops


def train(sync_mode: bool, ids_per_rank: int, steps: int) -> list[float]:
    """Seconds of each step after two warm-up steps, on a table declared afresh (rank 0 resets it,
    so that the rows of earlier rounds do not pile up)."""
    rank = dist.get_rank()
    table = ops.init_embedding_table(f"bench.fleet.step.{sync_mode}", 10**8, 64, init=torch_recdev.Normal(0, 0.01),
                                     reset=rank == 0)
    dist.barrier()
    table.requires_grad_(True)
    opt = torch_recdev.optim.RowWiseAdagrad([table], lr=0.01, sync=sync_mode)
    g = torch.Generator().manual_seed(rank)
    times = []
    for _ in range(steps + 2):
        ids = torch.randint(0, 10**8, (ids_per_rank,), generator=g)
        dist.barrier()
        start = time.perf_counter()
        F.embedding(ids, table).sum().backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return times[2:]


def phases(ids_per_rank: int, steps: int) -> dict:
    """Seconds per synchronous step in each part: the lookup, backward (which records the rows); on
    shards the staging of every rank's rows (which waits for the slowest rank) and the commit that
    applies them; on replicas the check that every rank arrived, the exchange of rows and their apply."""
    profile = cProfile.Profile()
    profile.enable()
    train(True, ids_per_rank, steps)
    profile.disable()
    stats = pstats.Stats(profile).stats
    calls = steps + 2

    def seconds(module: str, name: str) -> float:
        """Cumulative seconds per step in the function `name` (or the built-in naming it) of `module`."""
        return sum(v[3] for (path, _, fn), v in stats.items()
                   if (fn == name or fn.startswith("<built-in") and name in fn) and path.endswith(module)) / calls

    parts = {"wait": seconds("sync.py", "_wait_for_every_rank"), "stage": seconds("~", "_stage_step"),
             "exchange": seconds("sync.py", "_gather"),
             "apply": seconds("~", "_apply_updates") + seconds("~", "_commit_step")}
    rest = seconds("sync.py", "step") - sum(parts.values())
    return {"lookup": seconds("functional.py", "embedding"), "backward": seconds("_tensor.py", "backward"), **parts,
            "rest": rest}


if __name__ == "__main__":
    ids_per_rank, steps, rounds = (int(a) for a in sys.argv[1:4])
    dist.init_process_group("gloo")
    torch_recdev.fleet_store()
    for r in range(rounds):
        async_s = statistics.median(train(False, ids_per_rank, steps))
        sync_s = statistics.median(train(True, ids_per_rank, steps))
        if dist.get_rank() == 0:
            print(f"round {r} async {async_s:.6f} sync {sync_s:.6f}", flush=True)
    parts = phases(ids_per_rank, max(2, steps // 2))
    if dist.get_rank() == 0:
        print("phases " + " ".join(f"{k.replace(' ', '_')}={v:.6f}" for k, v in parts.items()), flush=True)
    dist.barrier()
    dist.destroy_process_group()
