"""Embedding lookups on a recdev table (issue: store engine and table storage).

1M × 128 float32 table, every row materialized (steady state of training),
65,536 uniform ids, fixed seed. Peers: torch CPU on a dense tensor. The float16 rows measure the
same table in float16 against float32, in the same run (issue 17)."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

import torch_recdev
from harness import Fact, Row, compare

NUM_ROWS, DIM, NUM_IDS, BAG = 1_000_000, 128, 65_536, 4


def _tables(quick: bool):
    rows = NUM_ROWS // 10 if quick else NUM_ROWS
    torch.manual_seed(0)
    dense = torch.randn(rows, DIM)
    with torch_recdev.placement("table"):
        table = torch.empty(rows, DIM, device="recdev")
    table.copy_(dense)  # materializes every row
    ids = torch.randint(0, rows, (NUM_IDS,))
    return dense, table, ids


def _float16_rows(dense, table, ids, offsets, repeat) -> list:
    """The same table in float16: memory per row and gather throughput against float32's."""
    with torch_recdev.placement("table"):
        half = torch.empty(dense.shape, dtype=torch.float16, device="recdev")
    half.copy_(dense.half())
    rows = []
    half_s, float_s = compare(lambda: F.embedding(ids, half), lambda: F.embedding(ids, table), repeat=repeat)
    rows.append(Row("F.embedding float16, 65,536 ids", half_s, "same on the float32 table", float_s, "≥ 1.6×", 1.6))
    half_s, float_s = compare(
        lambda: F.embedding_bag(ids, half, offsets, mode="sum"),
        lambda: F.embedding_bag(ids, table, offsets, mode="sum"),
        repeat=repeat,
    )
    rows.append(Row("embedding_bag sum float16, bags of 4", half_s, "same on the float32 table", float_s, "≥ 1.6×", 1.6))
    half_stats, float_stats = torch_recdev.table_stats(half), torch_recdev.table_stats(table)
    ratio = (half_stats["bytes"] / half_stats["rows"]) / (float_stats["bytes"] / float_stats["rows"])
    rows.append(Fact("memory per materialized dim-128 row, float16 / float32", f"{ratio:.3f}×", "≤ 0.55×", ratio <= 0.55))
    return rows


def run(quick: bool = False) -> list:
    dense, table, ids = _tables(quick)
    repeat = 3 if quick else 15
    out = torch.empty(NUM_IDS, DIM)
    offsets = torch.arange(0, NUM_IDS, BAG)
    rows = []
    recdev_s, cpu_s = compare(lambda: F.embedding(ids, table), lambda: F.embedding(ids, dense), repeat=repeat)
    rows.append(Row("F.embedding, 65,536 ids", recdev_s, "torch CPU F.embedding", cpu_s, "≥ 5×", 5.0))
    _, select_s = compare(
        lambda: F.embedding(ids, table), lambda: torch.index_select(dense, 0, ids, out=out), repeat=repeat
    )
    rows.append(
        Row("F.embedding vs memory-bound limit", recdev_s, "index_select into a preallocated output", select_s,
            "within 1.5× (≥ 0.67)", 1 / 1.5)
    )
    recdev_s, cpu_s = compare(
        lambda: F.embedding_bag(ids, table, offsets, mode="sum"),
        lambda: F.embedding_bag(ids, dense, offsets, mode="sum"),
        repeat=repeat,
    )
    rows.append(Row("embedding_bag sum, bags of 4", recdev_s, "torch CPU nn.EmbeddingBag (fbgemm)", cpu_s, "≥ 0.7×", 0.7))

    rows += _float16_rows(dense, table, ids, offsets, repeat)

    stats = torch_recdev.table_stats(table)
    per_row = stats["bytes"] / stats["rows"]
    ratio = per_row / stats["row_bytes"]
    rows.append(Fact("memory per materialized row (dim 128)", f"{per_row:.0f} B = {ratio:.3f}× raw", "≤ 1.3× raw", ratio <= 1.3))
    start = time.perf_counter()
    huge = torch.nn.Embedding(10**10, DIM, device="recdev")
    created_s = time.perf_counter() - start
    held = torch_recdev.table_stats(huge.weight)["bytes"]
    rows.append(
        Fact("create nn.Embedding(10^10, 128) on recdev", f"{created_s * 1e3:.2f} ms, {held} bytes held",
             "O(1): no row materialized", torch_recdev.table_stats(huge.weight)["rows"] == 0)
    )
    return rows


if __name__ == "__main__":
    import harness

    print(harness.markdown("Embedding lookups on a table", run()))
