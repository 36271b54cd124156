"""Incremental checkpoints (suite online, issue 36, docs/online.md), against a full ops.save of the same
table in the same run.

- A delta after 1% of a 10^7-row table (dim 32, Adagrad) changed: its bytes and time against ops.save
  of the whole table. Target: at most 3% of both.
- Training steps (update of 16,384 ids) while versions are written one after another on another
  thread, against steps without: target at most 1.2x the median step. Each version holds what the
  steps changed while the one before was written (a quarter of the table and more a second here).
- A serving shard (recdev-server --serve) following the directory: the time from a version's
  completion to the shard serving it (target within 2 s), and its lookups of 65,536 held ids against
  the same lookups on a training shard holding the same rows (restored from the same version):
  target within 10%.

    python benchmarks/bench_online.py [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import torch

import torch_recdev
from harness import Fact, Row, compare
from torch_recdev import local_shards, ops

DIM = 32
STEP_IDS = 16_384


def _fill(table, rows: int) -> None:
    chunk = 1 << 18
    for first in range(0, rows, chunk):
        n = min(chunk, rows - first)
        ops.emb_update(table, torch.arange(first, first + n), torch.ones(n, DIM))


def _step_times(table, rows: int, seconds: float, generator) -> np.ndarray:
    times = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        keys = torch.randint(0, rows, (STEP_IDS,), generator=generator)
        grads = torch.randn(STEP_IDS, DIM, generator=generator)
        start = time.perf_counter()
        ops.emb_update(table, keys, grads)
        times.append(time.perf_counter() - start)
    return np.array(times)


def run(quick: bool = False) -> list:
    """In a process of its own: a version holds every named table of the store, and the suites before
    this one leave theirs in this process's embedded store."""
    command = [sys.executable, os.path.abspath(__file__), "--json"] + (["--quick"] if quick else [])
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"bench_online failed:\n{done.stderr}")
    items = json.loads(done.stdout.splitlines()[-1])
    return [Row(**item["fields"]) if item["kind"] == "row" else Fact(**item["fields"]) for item in items]


def measure(quick: bool) -> list:
    rows = 5 * 10**4 if quick else 10**7
    torch_recdev.connect(None)
    table = ops.init_embedding_table(f"online.bench{os.getpid()}", rows, DIM, optimizer=("adagrad", {"lr": 0.05}),
                                     reset=True)
    _fill(table, rows)
    generator = torch.Generator().manual_seed(0)
    out = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("RECDEV_BENCH_DIR")) as work:
        full_path = os.path.join(work, "full.recdev")
        start = time.perf_counter()
        ops.save(full_path)
        full_s = time.perf_counter() - start
        full_bytes = os.path.getsize(full_path)
        os.remove(full_path)

        versions = os.path.join(work, "versions")
        start = time.perf_counter()
        ops.checkpoint(versions)
        base_s = time.perf_counter() - start
        changed = torch.randperm(rows, generator=generator)[: rows // 100]
        ops.emb_update(table, changed, torch.randn(changed.numel(), DIM, generator=generator))
        start = time.perf_counter()
        ops.checkpoint(versions)
        delta_s = time.perf_counter() - start
        delta_bytes = ops.version_files(versions)[-1]["bytes"]
        label = f"{rows:.0e} rows of dim {DIM} (Adagrad), 1% changed".replace("e+0", "e")
        out.append(Row(f"delta version, {label}", delta_s, "ops.save of the whole table", full_s,
                       ">= 33.3 (<= 3% of the time)", 100 / 3))
        out.append(Fact(f"delta bytes against a full checkpoint ({label})",
                        f"{delta_bytes / 2**20:.1f} MiB / {full_bytes / 2**20:.0f} MiB = {delta_bytes / full_bytes:.2%}",
                        "<= 3%", delta_bytes <= 0.03 * full_bytes))
        out.append(Fact(f"base version against ops.save ({label[:-12]})", f"{base_s:.2f} s / {full_s:.2f} s",
                        "reference", True))

        seconds = 1.0 if quick else 10.0
        alone = _step_times(table, rows, seconds, generator)
        ops.checkpoint(versions)  # what those steps changed: the versions below hold what the timed ones change
        stop = threading.Event()
        written = []

        def write_versions():
            while not stop.is_set():
                written.append(ops.checkpoint(versions))

        writer = threading.Thread(target=write_versions)
        writer.start()
        try:
            during = _step_times(table, rows, seconds, generator)
        finally:
            stop.set()
            writer.join()
            ops.wait_for_compaction(versions)  # before the directory is removed
        out.append(Row(f"training step ({STEP_IDS} ids) while {len(written)} delta versions were written",
                       float(np.median(during)), "the same step without", float(np.median(alone)),
                       ">= 0.83 (<= 1.2x)", 1 / 1.2))
        out.append(Fact("training step p99 / max while versions were written",
                        f"{np.percentile(during, 99) * 1e3:.1f} / {during.max() * 1e3:.1f} ms "
                        f"(without: {np.percentile(alone, 99) * 1e3:.1f} / {alone.max() * 1e3:.1f} ms)",
                        "reference", True))
    ops.init_embedding_table(f"online.bench{os.getpid()}", 1, DIM, reset=True)  # frees the rows
    return out + _serving(quick)


def _serving(quick: bool) -> list:
    rows, lookups = 5 * 10**4 if quick else 10**6, 65_536
    name = f"online.serve{os.getpid()}"
    torch_recdev.connect(None)
    table = ops.init_embedding_table(name, rows, DIM, optimizer=("adagrad", {"lr": 0.05}), reset=True)
    _fill(table, rows)
    out = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("RECDEV_BENCH_DIR")) as versions:
        ops.checkpoint(versions)
        serving = local_shards.Server(0, 1, "--serve", versions)
        training = local_shards.Server(0, 1)
        try:
            pickups = []
            for _ in range(2 if quick else 10):
                ops.emb_update(table, torch.randint(0, rows, (STEP_IDS,)), torch.ones(STEP_IDS, DIM))
                version = ops.checkpoint(versions)
                written = time.perf_counter()
                while torch_recdev.server_stats(serving.address)["serving_version"] < version:
                    time.sleep(0.005)
                pickups.append(time.perf_counter() - written)
            out.append(Fact(f"a serving shard serves a new version after its completion ({rows:.0e} rows, delta of "
                            f"{STEP_IDS} ids): median / max over {len(pickups)}".replace("e+0", "e"),
                            f"{np.median(pickups):.2f} / {max(pickups):.2f} s", "<= 2 s", max(pickups) <= 2.0))
            torch_recdev.connect(local_shards.server_list([training]))
            ops.restore(versions)
            trained = ops.init_embedding_table(name, rows, DIM)
            torch_recdev.connect(local_shards.server_list([serving]), read_only=True)
            served = ops.init_embedding_table(name, rows, DIM)
            keys = torch.randint(0, rows, (lookups,))
            serve_s, train_s = compare(lambda: ops.emb_read(served, keys), lambda: ops.emb_read(trained, keys),
                                       repeat=5 if quick else 20)
            out.append(Row(f"lookup of {lookups} held ids on a serving shard", serve_s,
                           "the same on a training shard", train_s, ">= 0.9 (within 10%)", 0.9))
        finally:
            torch_recdev.connect(None)
            serving.stop()
            training.stop()
    ops.init_embedding_table(name, 1, DIM, reset=True)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON line (for run())")
    args = parser.parse_args()
    if args.json:
        results = measure(args.quick)
        print(json.dumps([{"kind": "row" if isinstance(item, Row) else "fact", "fields": dataclasses.asdict(item)}
                          for item in results]))
    else:
        for item in run(args.quick):
            print(item)
