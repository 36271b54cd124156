"""Pooled lookups against torch's dense nn.EmbeddingBag (suite pooling, issue 38).

`embedding_bag` sum over 65,536 uniform ids on a 1M x 128 table whose every row is materialized,
float32 and float16, bags of 1, 4 and 32, with and without per_sample_weights: the grid the issue
sets at >= 1.0x, each case timed against the same call on the dense tensor holding the same rows, in
alternating rounds. Run alone: `python benchmarks/run.py --suites pooling --name pooling`."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import torch_recdev
from harness import Row, compare

NUM_ROWS, DIM, NUM_IDS = 1_000_000, 128, 65_536
BAGS = (1, 4, 32)


def run(quick: bool = False) -> list:
    rows = NUM_ROWS // 20 if quick else NUM_ROWS
    repeat = 2 if quick else 9
    torch.manual_seed(0)
    values = torch.randn(rows, DIM)
    ids = torch.randint(0, rows, (NUM_IDS,))
    results = []
    for dtype in (torch.float32, torch.float16):
        dense = values.to(dtype)
        with torch_recdev.placement("table"):
            table = torch.empty(rows, DIM, dtype=dtype, device="recdev")
        table.copy_(dense)  # materializes every row
        for bag in BAGS:
            offsets = torch.arange(0, NUM_IDS, bag)
            for weighted in (False, True):
                weights = torch.rand(NUM_IDS, dtype=dtype) if weighted else None

                def pooled(weight):
                    return F.embedding_bag(ids, weight, offsets, mode="sum", per_sample_weights=weights)

                recdev_s, dense_s = compare(lambda: pooled(table), lambda: pooled(dense), repeat=repeat)
                name = f"embedding_bag sum {str(dtype).removeprefix('torch.')}, bags of {bag}" + (
                    ", per_sample_weights" if weighted else ""
                )
                results.append(
                    Row(name, recdev_s, "torch CPU nn.EmbeddingBag on a dense tensor", dense_s, "≥ 1.0×", 1.0)
                )
    return results
