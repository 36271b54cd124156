"""How gather and update throughput scale (issue: the main job and the benchmark
suite): against table size (rows touched sparsely), batch size, embedding dim
and the number of server shards, with the physical limits measured in the same
run: memory bandwidth, a dense random-row gather, a raw loopback TCP stream.
docs/performance.md reads these tables."""

from __future__ import annotations

import itertools
import time

import numpy as np
import torch
import torch.nn.functional as F

import torch_recdev
from bench_remote import RawLoopbackStream
from harness import Fact, Grid, median_seconds

_names = itertools.count()


def _table(num_rows: int, dim: int) -> torch.Tensor:
    return torch_recdev.ops.init_embedding_table(
        f"bench_scaling_{next(_names)}", num_rows, dim, init=torch_recdev.Normal(0.0, 0.01),
        optimizer=("adagrad", {"lr": 0.05}))


def _rate(count: int, seconds: float) -> str:
    return f"{count / seconds / 1e6:.2f} M/s"


def _gather_and_update(table: torch.Tensor, ids: torch.Tensor, repeat: int) -> tuple[float, float]:
    grads = torch.full((ids.numel(), table.shape[1]), 1e-3)
    gather_s = median_seconds(lambda: F.embedding(ids, table), repeat=repeat)
    update_s = median_seconds(lambda: torch_recdev.ops.emb_update(table, ids, grads), repeat=repeat)
    return gather_s, update_s


def physical_limits(quick: bool) -> list:
    n = (64 if quick else 256) << 20
    src = np.ones(n // 4, dtype=np.float32)
    dst = np.empty_like(src)
    copy_s = median_seconds(lambda: np.copyto(dst, src), repeat=5)
    dense = torch.randn(1_000_000 // (10 if quick else 1), 128)
    ids = torch.randint(0, dense.shape[0], (65_536,))
    out = torch.empty(65_536, 128)
    select_s = median_seconds(lambda: torch.index_select(dense, 0, ids, out=out), repeat=5)
    payload = 32 << 20
    with RawLoopbackStream() as raw:
        loopback_s = median_seconds(lambda: raw.receive(payload), repeat=5)
    return [
        Fact("memory bandwidth (numpy copy, read + write)", f"{2 * n / copy_s / 2**30:.1f} GiB/s", "(physical limit)", True),
        Fact("dense random-row gather (index_select, dim 128, preallocated)",
             f"{_rate(65_536, select_s)} rows ({65_536 * 512 / select_s / 2**30:.1f} GiB/s)", "(physical limit)", True),
        Fact("raw loopback TCP stream, one connection", f"{payload / loopback_s / 2**30:.2f} GiB/s", "(physical limit)", True),
    ]


def by_table_size(quick: bool) -> Grid:
    sizes = [10**6, 10**7] if quick else [10**6, 10**7, 10**8, 10**9]
    batch, dim, repeat = 65_536, 128, 3 if quick else 7
    rows = []
    for size in sizes:
        table = _table(size, dim)
        gen = torch.Generator().manual_seed(size)
        fresh = [torch.randint(0, size, (batch,), generator=gen) for _ in range(repeat + 2)]
        batches = iter(fresh)
        first_touch_s = median_seconds(lambda table=table: F.embedding(next(batches), table), repeat=repeat)
        gather_s, update_s = _gather_and_update(table, fresh[0], repeat)
        stats = torch_recdev.table_stats(table)
        rows.append([f"{size:.0e}", _rate(batch, first_touch_s), _rate(batch, gather_s), _rate(batch, update_s),
                     f"{stats['rows']:,}", f"{stats['bytes'] / 2**20:.0f} MiB"])
        del table
    return Grid(f"Embedded store, dim {dim}, {batch:,} uniform ids per batch: throughput against table size",
                ["num_embeddings", "gather, first touch (rows/s)", "gather, touched rows", "Adagrad update",
                 "rows materialized", "memory held"], rows)


def by_batch_size(quick: bool) -> Grid:
    size, dim, repeat = 10**6 // (10 if quick else 1), 128, 3 if quick else 7
    table = _table(size, dim)
    torch_recdev.ops.emb_write(table, torch.arange(size), torch.zeros(size, dim))  # all rows materialized
    rows = []
    for batch in [1024, 8192, 65_536, 262_144]:
        ids = torch.randint(0, size, (batch,), generator=torch.Generator().manual_seed(batch))
        gather_s, update_s = _gather_and_update(table, ids, repeat)
        rows.append([f"{batch:,}", _rate(batch, gather_s), _rate(batch, update_s),
                     f"{gather_s * 1e3:.2f} ms"])
    return Grid(f"Embedded store, {size:,} × {dim} table, every row materialized: throughput against batch size",
                ["ids per batch", "gather (rows/s)", "Adagrad update (rows/s)", "gather latency"], rows)


def by_dim(quick: bool) -> Grid:
    size, batch, repeat = 10**6 // (10 if quick else 1), 65_536, 3 if quick else 7
    rows = []
    for dim in [16, 64, 128, 256]:
        table = _table(size, dim)
        torch_recdev.ops.emb_write(table, torch.arange(size), torch.zeros(size, dim))
        ids = torch.randint(0, size, (batch,), generator=torch.Generator().manual_seed(dim))
        gather_s, update_s = _gather_and_update(table, ids, repeat)
        rows.append([str(dim), _rate(batch, gather_s), f"{batch * dim * 4 / gather_s / 2**30:.2f} GiB/s",
                     _rate(batch, update_s)])
        del table
    return Grid(f"Embedded store, {size:,} rows, {batch:,} ids: throughput against embedding dim",
                ["dim", "gather (rows/s)", "gather (payload)", "Adagrad update (rows/s)"], rows)


def by_shards(quick: bool) -> Grid:
    from local_servers import local_recdev_servers

    size, dim, batch, repeat = 10**6 // (10 if quick else 1), 128, 65_536, 3 if quick else 7
    counts = [1, 2] if quick else [1, 2, 4]
    rows = []
    for shards in counts:
        with local_recdev_servers(shards) as addresses:
            torch_recdev.connect(",".join(addresses))
            try:
                table = _table(size, dim)
                for start in range(0, size, 65_536):
                    keys = torch.arange(start, min(start + 65_536, size))
                    torch_recdev.ops.emb_write(table, keys, torch.zeros(keys.numel(), dim))
                ids = torch.randint(0, size, (batch,), generator=torch.Generator().manual_seed(shards))
                gather_s, update_s = _gather_and_update(table, ids, repeat)
                rows.append([str(shards), _rate(batch, gather_s), f"{batch * dim * 4 / gather_s / 2**30:.2f} GiB/s",
                             _rate(batch, update_s)])
                del table
            finally:
                torch_recdev.connect(None)
    return Grid(f"Remote store on loopback, 1 client, {size:,} × {dim} table, {batch:,} ids: throughput against "
                "server shards (all on this machine's 2 cores)",
                ["shards", "gather (rows/s)", "gather (payload)", "Adagrad update (rows/s)"], rows)


def run(quick: bool = False) -> list:
    start = time.perf_counter()
    results = physical_limits(quick) + [by_table_size(quick), by_batch_size(quick), by_dim(quick), by_shards(quick)]
    results.append(Fact("scaling suite wall time", f"{time.perf_counter() - start:.0f} s", "-", True))
    return results


if __name__ == "__main__":
    import sys

    import harness

    print(harness.markdown("Scaling", run(quick="--quick" in sys.argv)))
