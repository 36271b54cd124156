"""A/B of two builds of torch_recdev on the same workloads: each build is the Python of its own
checkout's venv, run in a fresh process per round, A and B in turn so that a machine's drift falls on
both. Prints each workload's median milliseconds per call over the rounds and the ratio B/A (below 1:
B is faster).

    python benchmarks/ab_builds.py --a ../old/.venv/bin/python --b .venv/bin/python --rounds 7

A round runs `python benchmarks/ab_builds.py --run WORKLOAD`, which times the workload in that
build's process and prints its median; the workloads are defined below, the same for both builds.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import torch_recdev  # the build of the python running this file

ROWS, DIM, BATCH, BAG = 10**6, 128, 65_536, 4


def _timed(call, reps):
    for _ in range(3):
        call()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _table_embedding(cls, **kwargs):
    with torch_recdev.placement("table"):
        module = cls(ROWS, DIM, device="recdev", **kwargs)
    ids = torch.randint(0, ROWS, (BATCH,)).to("recdev")
    return module, ids


def lookup():
    emb, ids = _table_embedding(torch.nn.Embedding)
    return _timed(lambda: emb(ids), 30)


def pooled_lookup():
    bag, ids = _table_embedding(torch.nn.EmbeddingBag, mode="sum")
    offsets = torch.arange(0, BATCH, BAG).to("recdev")
    return _timed(lambda: bag(ids, offsets), 30)


def pooled_lookup_whole_table(bag_size, dtype):
    """bench_embedding's pooled rows: every row of the table materialized (1M rows spread over 512 MiB
    in float32), not only the batch's."""
    with torch_recdev.placement("table"):
        table = torch.empty(ROWS, DIM, dtype=dtype, device="recdev")
    table.copy_(torch.randn(ROWS, DIM).to(dtype))
    ids = torch.randint(0, ROWS, (BATCH,))
    offsets = torch.arange(0, BATCH, bag_size)
    return _timed(lambda: torch.nn.functional.embedding_bag(ids, table, offsets, mode="sum"), 30)


def training_step():
    bag, ids = _table_embedding(torch.nn.EmbeddingBag, mode="sum")
    offsets = torch.arange(0, BATCH, BAG).to("recdev")
    opt = torch_recdev.optim.Adagrad([bag.weight], lr=0.01)

    def step():
        bag(ids, offsets).sum().backward()
        opt.step()

    return _timed(step, 20)


def _saved_rows_model():
    """A 10^9 x 64 nn.Embedding with 10^6 rows written: bench_serialization's table."""
    model = torch.nn.Embedding(10**9, 64, device="recdev")
    ids = torch.randint(0, 10**9, (10**6,)).unique()
    torch_recdev.ops.emb_write(model.weight, ids, torch.randn(len(ids), 64))
    return model


def save():
    """torch.save with PyTorch's zip CRC-32 off: the table's own checksums are the integrity."""
    model = _saved_rows_model()
    torch.serialization.set_crc32_options(False)
    with tempfile.TemporaryDirectory() as tmp:
        return _timed(lambda: torch.save(model.state_dict(), os.path.join(tmp, "m.pt")), 5)


def load():
    """torch.load(mmap=True) + load_state_dict, which checks the table's checksums."""
    model = _saved_rows_model()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.pt")
        torch.save(model.state_dict(), path)
        del model
        destination = torch.nn.Embedding(10**9, 64, device="recdev")
        return _timed(lambda: destination.load_state_dict(torch.load(path, mmap=True)), 5)


def store_checkpoint():
    """ops.save and then ops.load of a store holding a 10^9 x 64 table with 10^6 rows written (the
    whole-store checkpoint file, which ends in its checksum)."""
    table = torch_recdev.ops.init_embedding_table("ab_checkpoint", 10**9, 64)
    ids = torch.randint(0, 10**9, (10**6,)).unique()
    torch_recdev.ops.emb_write(table, ids, torch.randn(len(ids), 64))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "store.recdev")

        def save_and_load():
            torch_recdev.ops.save(path)
            torch_recdev.ops.load(path)

        return _timed(save_and_load, 5)


def remote_gather():
    """bench_remote's gather: 65,536 ids of a 1M x 128 float32 table on 2 local recdev-server shards of
    this build, every row written."""
    from local_servers import local_recdev_servers

    with local_recdev_servers(2) as addresses:
        torch_recdev.connect(",".join(addresses))
        try:
            table = torch_recdev.ops.init_embedding_table("ab_remote", ROWS, DIM)
            for start in range(0, ROWS, BATCH):
                keys = torch.arange(start, min(start + BATCH, ROWS))
                torch_recdev.ops.emb_write(table, keys, torch.randn(len(keys), DIM))
            ids = torch.randint(0, ROWS, (BATCH,))
            return _timed(lambda: torch.nn.functional.embedding(ids, table), 30)
        finally:
            torch_recdev.connect(None)


WORKLOADS = {
    "store_checkpoint": store_checkpoint,
    "remote_gather": remote_gather,
    "lookup": lookup,
    "pooled_lookup": pooled_lookup,
    **{f"pooled_whole_table_{str(dtype)[6:]}_bag{size}": functools.partial(pooled_lookup_whole_table, size, dtype)
       for dtype in (torch.float32, torch.float16) for size in (1, 4, 32)},
    "training_step": training_step,
    "save": save,
    "load": load,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", help="build A's python (the old build)")
    parser.add_argument("--b", default=sys.executable, help="build B's python (default: this one)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workload", action="append", choices=sorted(WORKLOADS))
    parser.add_argument("--run", choices=sorted(WORKLOADS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        torch.manual_seed(0)
        print(f"{WORKLOADS[args.run]():.4f}")
        return
    if not args.a:
        parser.error("--a: the old build's python is needed")
    script = os.path.abspath(__file__)
    print("| workload | A ms | B ms | B/A |\n|---|---|---|---|")
    for workload in args.workload or sorted(WORKLOADS):
        times = {"a": [], "b": []}
        for _ in range(args.rounds):
            for build in ("a", "b"):
                python = getattr(args, build)
                out = subprocess.run([python, script, "--run", workload], capture_output=True, text=True, check=True)
                times[build].append(float(out.stdout.split()[-1]))
        a, b = statistics.median(times["a"]), statistics.median(times["b"])
        print(f"| {workload} | {a:.3f} | {b:.3f} | {b / a:.3f} |", flush=True)


if __name__ == "__main__":
    main()
