"""First touch of new ids (issue: bounded memory for unbounded ids).

Under a budget every new id is a first touch: its row is computed from the init
rule and inserted. Each round gathers 10^6 ids never seen before from a fresh
10^10-row table (F.embedding, which materializes them) and, in the same round,
fills a fresh torch tensor of the same shape with torch's normal_ / uniform_ —
the cost of making that many random rows at all. Target: first touch at least
0.7x torch's fill rate."""

from __future__ import annotations

import gc
import statistics
import time

import torch
import torch.nn.functional as F

import torch_recdev
from harness import Row

NUM_ROWS = 10**10
RULES = {
    "Normal": (lambda w: w.normal_(0.0, 0.01), lambda x: x.normal_(0.0, 0.01)),
    "Uniform": (lambda w: w.uniform_(-0.05, 0.05), lambda x: x.uniform_(-0.05, 0.05)),
}


def _one_round(num_ids: int, dim: int, init_table, fill_tensor) -> tuple[float, float]:
    with torch_recdev.placement("table"):
        table = torch.empty(NUM_ROWS, dim, device="recdev")
    init_table(table)
    ids = torch.randint(0, NUM_ROWS, (num_ids,))
    gc.collect()
    start = time.perf_counter()
    rows = F.embedding(ids, table)
    recdev_s = time.perf_counter() - start
    del rows, table  # frees the rows outside the timed part
    start = time.perf_counter()
    filled = fill_tensor(torch.empty(num_ids, dim))
    peer_s = time.perf_counter() - start
    del filled
    return recdev_s, peer_s


def run(quick: bool = False) -> list:
    num_ids = 100_000 if quick else 1_000_000
    rounds = 2 if quick else 7
    rows = []
    for dim in (64, 128):
        for name, (init_table, fill_tensor) in RULES.items():
            _one_round(num_ids // 10, dim, init_table, fill_tensor)  # warm-up: pools, page cache, threads
            times = [_one_round(num_ids, dim, init_table, fill_tensor) for _ in range(rounds)]
            recdev_s = statistics.median(t for t, _ in times)
            peer_s = statistics.median(t for _, t in times)
            rows.append(
                Row(f"first touch, {num_ids:,} new ids, {name}, dim {dim} "
                    f"({num_ids / recdev_s / 1e6:.2f} M rows/s)",
                    recdev_s, f"torch.empty({num_ids:,}, {dim}).{name.lower()}_()", peer_s, "≥ 0.7×", 0.7)
            )
    return rows
