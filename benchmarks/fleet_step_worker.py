"""One rank of bench_fleet's step-cost run (torchrun's environment, gloo on 127.0.0.1): the median time
of a training step of one table, 65,536 ids per rank, asynchronous and then synchronous (sync=True).
Rank 0 prints `async S sync S`.

    python fleet_step_worker.py IDS STEPS      (RECDEV_SERVERS on rank 0: the shards)
"""

import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import torch_recdev
from torch_recdev import ops


def step_seconds(sync: bool, ids_per_rank: int, steps: int) -> float:
    rank = dist.get_rank()
    table = ops.init_embedding_table(f"bench.fleet.step.{sync}", 10**8, 64, init=torch_recdev.Normal(0, 0.01),
                                     reset=rank == 0)
    dist.barrier()
    table.requires_grad_(True)
    opt = torch_recdev.optim.RowWiseAdagrad([table], lr=0.01, sync=sync)
    g = torch.Generator().manual_seed(rank)
    times = []
    for step in range(steps + 2):
        ids = torch.randint(0, 10**8, (ids_per_rank,), generator=g)
        dist.barrier()
        start = time.perf_counter()
        F.embedding(ids, table).sum().backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:])


if __name__ == "__main__":
    ids_per_rank, steps = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo")
    torch_recdev.fleet_store()
    async_s = step_seconds(False, ids_per_rank, steps)
    sync_s = step_seconds(True, ids_per_rank, steps)
    if dist.get_rank() == 0:
        print(f"async {async_s:.6f} sync {sync_s:.6f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
