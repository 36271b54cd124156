"""The disk tier (suite disk, issue 35, docs/disk_tier.md), with the disk's own limit measured in the
same run.

- fio: 4 KiB random reads (O_DIRECT) at queue depth 1 and 32 on the disk directory's file system.
- Cold lookups: every id spilled, 65,536 ids a batch: rows/s, reads issued per second against fio's
  queue-depth-32 IOPS (target ≥ 50%), and reads per row (rows spilled together share 4 KiB blocks).
- Hot lookups and training steps on a spilled table whose working set fits its memory tier, against
  the same table and budget without spill: target within 5%.
- A Zipf(1.05) training stream over 10^8 ids of dim 32 through a memory tier of 5·10^6 rows (scaled
  down by --quick): RSS along the stream against the memory tier's bytes plus the disk index, target
  ≤ 1.3×; steps/s against an unbounded table fed the same stream.
- The CTR demo with --max-rows at about 10% of the rows it touches, with and without --spill, against
  the unbounded run: AUC within 0.002 with spill (without, the budget loses rows).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

import torch_recdev
from harness import Fact, Row, compare
from torch_recdev import ops

DIM = 32
BATCH = 65_536
DEMO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "train_ctr.py")


def _bytes_written() -> int:
    """What this process has written to storage so far (O_DIRECT writes included)."""
    with open("/proc/self/io") as io:
        return int(next(line for line in io if line.startswith("write_bytes:")).split()[1])


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _fio_iops(directory: str, depth: int, quick: bool) -> float | None:
    if shutil.which("fio") is None:
        return None
    engine = "psync" if depth == 1 else "libaio"
    done = subprocess.run(
        ["fio", "--name=randread", f"--directory={directory}", "--rw=randread", "--bs=4k", "--direct=1",
         f"--ioengine={engine}", f"--iodepth={depth}", "--size=256M" if quick else "--size=1G", "--time_based",
         f"--runtime={1 if quick else 5}", "--output-format=json"],
        capture_output=True, text=True, timeout=300)
    for name in os.listdir(directory):
        if name.startswith("randread"):
            os.remove(os.path.join(directory, name))
    if done.returncode != 0:
        raise RuntimeError(f"fio failed: {done.stderr}")
    return json.loads(done.stdout)["jobs"][0]["read"]["iops"]


def _table(name: str, max_rows: int | None, spill: bool, optimizer=None) -> torch.Tensor:
    policy = dict(max_rows=max_rows, evict="lru", spill=spill) if max_rows else {}
    return ops.init_embedding_table(f"disk_{name}_{time.monotonic_ns()}", 10**9, DIM, init=torch_recdev.Zero(),
                                    optimizer=optimizer, **policy)


def _disk_limit(directory: str, quick: bool) -> tuple[list, float | None]:
    qd1, qd32 = _fio_iops(directory, 1, quick), _fio_iops(directory, 32, quick)
    if qd32 is None:
        return [Fact("fio 4 KiB random reads", "fio is not installed (apt-get install fio)", "", True)], None
    return [Fact("fio: 4 KiB random reads, O_DIRECT, on the disk directory's file system",
                 f"{qd1:,.0f} IOPS at queue depth 1, {qd32:,.0f} at 32", "the disk's limit", True)], qd32


def _cold(quick: bool, qd32: float | None) -> list:
    """Rows written in batches through a budget of one batch, so that all but the last are on disk;
    then batches of ids drawn from the ones on disk."""
    rows = 4 * BATCH if quick else 32 * BATCH
    table = _table("cold", BATCH, True)
    for start in range(0, rows, BATCH):
        ops.emb_write(table, torch.arange(start, start + BATCH), torch.ones(BATCH, DIM))
    generator = torch.Generator().manual_seed(0)
    before = torch_recdev.table_stats(table)
    seconds, looked_up = 0.0, 0
    for _ in range(2 if quick else 6):
        keys = torch.randint(0, rows - BATCH, (BATCH,), generator=generator)  # never the batch in memory
        on_disk = int((~torch.isin(keys, torch.arange(rows - BATCH, rows))).sum())
        started = time.perf_counter()
        ops.emb_read(table, keys)
        seconds += time.perf_counter() - started
        looked_up += on_disk
        # The batch just read is in memory now: write a fresh batch of rows the next lookup will not
        # ask for, so that every id of the next one is on disk again.
        ops.emb_write(table, torch.arange(rows - BATCH, rows), torch.ones(BATCH, DIM))
    after = torch_recdev.table_stats(table)
    reads = after["disk_read_ops"] - before["disk_read_ops"]
    rows_read = after["disk_reads"] - before["disk_reads"]
    issued = reads / seconds
    facts = [Fact(f"cold lookups: {BATCH:,} ids a batch, every id on disk (dim {DIM}, float32)",
                  f"{rows_read / seconds:,.0f} rows/s, {issued:,.0f} reads/s issued, "
                  f"{reads / max(rows_read, 1):.2f} reads per row", "", True)]
    if qd32:
        facts.append(Fact("cold lookups: reads issued against fio's queue-depth-32 IOPS",
                          f"{issued / qd32:.0%} ({issued:,.0f} / {qd32:,.0f})", "≥ 50%", issued >= 0.5 * qd32))
    return facts


def _hot(quick: bool) -> list:
    """A working set of 100,000 rows in a memory tier of 200,000, after 1,000,000 colder rows went to
    disk: the working set never leaves memory, and spill costs only its bookkeeping (the disk index
    asked about every id a request brings in)."""
    working, cold, steps = 100_000, 200_000 if quick else 1_000_000, 3 if quick else 10
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, working, (BATCH,), generator=generator) for _ in range(steps)]
    grads = torch.randn(BATCH, DIM, generator=generator)
    rows = []
    for what in ("lookups", "training steps"):
        optimizer = ("adagrad", {"lr": 0.05}) if what == "training steps" else None
        spilled = _table("hot", 2 * working, True, optimizer)
        plain = _table("hot_plain", 2 * working, False, optimizer)
        for table in (spilled, plain):  # the cold rows first: on disk, or evicted
            for start in range(working, working + cold, BATCH):
                ops.emb_write(table, torch.arange(start, start + BATCH), torch.ones(BATCH, DIM))

        def run(table):
            def steps_fn():
                for keys in batches:
                    ops.emb_read(table, keys)
                    if optimizer:
                        ops.emb_update(table, keys, grads)
            return steps_fn

        spilled_s, plain_s = compare(run(spilled), run(plain), repeat=1 if quick else 5)
        rows.append(Row(f"hot {what}: {steps} batches of {BATCH:,} ids, working set in memory, "
                        f"{torch_recdev.table_stats(spilled)['rows_on_disk']:,} colder rows on disk, spill=True",
                        spilled_s, "the same budget without spill", plain_s, "within 5%", 1 / 1.05))
    return rows


def _stream_steps(table: torch.Tensor, ids: int, steps: int, on_step=None) -> float:
    """Zipf(1.05) batches over `ids` ids (the same ones for every table: seeded), a lookup and an Adagrad
    update each; returns the seconds they took."""
    rng = np.random.default_rng(2)
    grads = torch.ones(BATCH, DIM)
    started = time.perf_counter()
    for step in range(steps):
        keys = torch.from_numpy((rng.zipf(1.05, BATCH) - 1) % ids)
        ops.emb_read(table, keys)
        ops.emb_update(table, keys, grads)
        if on_step:
            on_step(step)
    return time.perf_counter() - started


def _stream(quick: bool) -> list:
    """Zipf(1.05) ids over 10^8 (scaled down by --quick), dim 32, Adagrad, through a memory tier of
    5·10^6 rows, long enough that the tier fills and stays full; RSS sampled along the stream. Then
    the same stream on an unbounded table."""
    ids, tier, steps = (10**6, 50_000, 20) if quick else (10**8, 5 * 10**6, 400)
    baseline = _rss_bytes()
    spilled = _table("stream", tier, True, ("adagrad", {"lr": 0.05}))
    samples = []  # (step, rss, the table's bytes, tier full)

    def sample(step):
        if step % max(1, steps // 20) == 0 or step == steps - 1:
            stats = torch_recdev.table_stats(spilled)
            samples.append((step, _rss_bytes(), stats["bytes"], stats["rows_in_memory"] >= tier))

    written = _bytes_written()
    seconds = _stream_steps(spilled, ids, steps, sample)
    written = _bytes_written() - written
    stats = torch_recdev.table_stats(spilled)
    spilled_bytes = stats["disk_writes"] * (8 + 2 * DIM * 4)  # each row spilled: its id and record
    unbounded = _table("stream_unbounded", None, False, ("adagrad", {"lr": 0.05}))
    unbounded_seconds = _stream_steps(unbounded, ids, steps)
    held = torch_recdev.table_stats(unbounded)["rows"]
    # Growth since before the table (the tier, the index, the write buffer, and what the batches take)
    # against the bytes the table counts. Once the tier is full only the index grows (20-40 bytes a
    # row on disk), so flat means: what RSS holds beyond the table's bytes stays where it was.
    grown = max(rss for _, rss, _, _ in samples) - baseline
    full_at = next((sample for sample in samples if sample[3]), samples[-1])
    last = samples[-1]
    beyond_at_full, beyond_at_end = full_at[1] - full_at[2], last[1] - last[2]
    return [
        Row(f"Zipf(1.05) stream over {ids:,} ids, dim {DIM}, Adagrad: {steps} steps through a memory tier of "
            f"{tier:,} rows ({stats['rows_on_disk']:,} rows on disk at the end)", seconds,
            f"the same steps on an unbounded table ({held:,} rows in memory)", unbounded_seconds, "reported", 0),
        Fact("RSS growth since before the table, against the table's bytes (memory tier, index, buffer)",
             f"{grown / 2**20:,.0f} / {stats['bytes'] / 2**20:,.0f} MiB ({grown / stats['bytes']:.2f}×)",
             "≤ 1.3×", grown <= 1.3 * stats["bytes"]),
        Fact("disk: write amplification (bytes written / records spilled) and space amplification (file bytes / "
             "live records)", f"{written / max(spilled_bytes, 1):.2f}× ({written / 2**20:,.0f} MiB for "
             f"{stats['disk_writes']:,} rows spilled); {stats['disk_bytes'] / max(stats['disk_live_bytes'], 1):.2f}×",
             "space ≤ 2× (plus a segment)", True),
        Fact(f"RSS once the tier is full (step {full_at[0]}) and at the end (step {steps - 1}); beyond the "
             "table's bytes", f"{full_at[1] / 2**20:,.0f} / {last[1] / 2**20:,.0f} MiB; "
             f"{beyond_at_full / 2**20:,.0f} / {beyond_at_end / 2**20:,.0f} MiB",
             "flat: what is beyond the table's bytes grows ≤ 5% of them",
             beyond_at_end - beyond_at_full <= 0.05 * last[2]),
    ]


def _demo_run(*flags: str) -> dict:
    script = (f"import runpy, json; main = runpy.run_path({DEMO!r})['main']; r = main(['--quiet', '--plot', '', "
              f"'--train-samples', '200000', '--test-samples', '20000', '--epochs', '1', "
              + "".join(f"'{f}', " for f in flags) + "]); print(json.dumps({k: r[k] for k in "
              "('rows', 'rows_on_disk', 'auc', 'evicted')}))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"demo {flags} failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _demo() -> list:
    unbounded = _demo_run()
    # The largest table holds about 15,000 rows: 1,500 is 10% of it (the small tables fit).
    lossy, spilled = _demo_run("--max-rows", "1500"), _demo_run("--max-rows", "1500", "--spill")
    return [Fact("demo, --max-rows 1500 (10% of the largest table's rows): held-out AUC with --spill / without / "
                 "unbounded", f"{spilled['auc']:.4f} / {lossy['auc']:.4f} / {unbounded['auc']:.4f} "
                 f"({spilled['rows_on_disk']:,} rows on disk)", "with spill within 0.002 of unbounded",
                 abs(spilled["auc"] - unbounded["auc"]) <= 0.002)]


def run(quick: bool = False) -> list:
    directory = tempfile.mkdtemp(prefix="recdev-bench-disk-", dir=os.environ.get("RECDEV_BENCH_DISK_DIR"))
    torch_recdev.connect(None)
    torch_recdev.set_disk_dir(directory)
    try:
        limit, qd32 = _disk_limit(directory, quick)
        return limit + _cold(quick, qd32) + _hot(quick) + _stream(quick) + ([] if quick else _demo())
    finally:
        shutil.rmtree(directory, ignore_errors=True)
