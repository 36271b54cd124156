"""Budgets, eviction and admission (issue 20, docs/budgets.md).

- Training step (embedding_bag sum, fused Adagrad, 65,536 ids in bags of 4 from 200,000 ids, drawn
  from a Zipf law as click logs are, and uniformly as the worst case; and a drifting stream, where
  new ids arrive and old ones fade) on a table with an LRU budget at 50% of the rows the run (10
  steps) touches, against the same steps on a table with no policy, same run: target ≤ 1.15× the
  time.
- Admission sketch cost: lookups of 100,000 never-admitted ids (admit_after=65535: each counted in
  the sketch, answered with its init value) against peeking the same ids' init values.
- A stream of 10^7 distinct ids (dim 16, batches of 50,000) through a 10^6-row LRU budget: rows held
  against the budget, RSS along the stream, evictions per second.
- Admission in the CTR demo (examples/train_ctr.py), one pass over 100,000 samples (a stream: with more
  epochs every id recurs and is admitted): table memory and rows with admit_after=2 against 1, and
  the held-out AUC of both: target ≥ 30% less memory at an AUC within 0.005."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

import torch_recdev
from harness import Fact, Row, compare
from torch_recdev import _testing

TOUCHED, NUM_IDS, BAG, DIM, STEPS = 200_000, 65_536, 4, 64, 10
ZIPF = 1.05
DRIFT_NEW, DRIFT_DECAY, DRIFT_AGES = 4096, 0.75, 40


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _zipf_ids(rng: np.random.Generator, n: int, exponent: float) -> torch.Tensor:
    """n ids from TOUCHED ids whose frequencies follow Zipf's law (rank r drawn with weight r^-exponent),
    the ranks scattered over the ids."""
    weights = 1.0 / np.arange(1, TOUCHED + 1) ** exponent
    ranks = rng.choice(TOUCHED, size=n, p=weights / weights.sum())
    return torch.from_numpy(rng.permutation(TOUCHED)[ranks])


def _training_case(name: str, batches: list, steps: int, quick: bool) -> list:
    """Each timed run trains `steps` batches: the same ones every run, or with more batches than that
    (a stream), the next ones, so that both tables see the same stream in the same order. The budget
    is half the rows STEPS batches touch (on a stream, the mean over its windows of STEPS)."""
    offsets = torch.arange(0, NUM_IDS, BAG)
    window = min(STEPS, len(batches))
    touched = round(statistics.mean(len(torch.unique(torch.cat(batches[first:first + window])))
                                    for first in range(0, len(batches) - window + 1, window)))
    with torch_recdev.placement("table"):
        plain = torch.nn.EmbeddingBag(10**9, DIM, mode="sum", device="recdev")
        budgeted = torch.nn.EmbeddingBag(10**9, DIM, mode="sum", device="recdev")
    torch_recdev.optim.Adagrad([plain.weight], lr=0.05)
    torch_recdev.optim.Adagrad([budgeted.weight], lr=0.05)
    torch_recdev.set_table_policy(budgeted.weight, max_rows=touched // 2, evict="lru")

    def run_steps(module):
        position = [0]

        def steps_fn():
            first = position[0] % len(batches)
            for ids in batches[first:first + steps]:
                module(ids, offsets).sum().backward()
            position[0] += steps

        return steps_fn

    budget_s, plain_s = compare(run_steps(budgeted), run_steps(plain), repeat=1 if quick else 2)
    stats = torch_recdev.table_stats(budgeted.weight)
    lookups = stats["reads"]
    return [
        Row(f"training step, LRU budget at 50% of {touched:,} touched rows, {name} ({steps} steps)", budget_s,
            "the same steps, no policy", plain_s, "≤ 1.15× the time", 1 / 1.15),
        Fact(f"{name}: rows held under the budget / rows held without (evictions per lookup)",
             f"{stats['rows']:,} / {torch_recdev.table_stats(plain.weight)['rows']:,} "
             f"({stats['evicted']:,} evicted, {stats['evicted'] / max(lookups, 1):.3f} per id looked up)",
             f"≤ {touched // 2:,}", stats["rows"] <= touched // 2),
    ]


def _drifting_stream(rng: np.random.Generator, batches: int) -> list:
    """The stream a budget is for: every step brings DRIFT_NEW new ids (Zipf within them), and an id's
    popularity fades by DRIFT_DECAY per step of its age, so old ids stop being looked up."""
    ages = DRIFT_DECAY ** np.arange(DRIFT_AGES)
    ranks = 1.0 / np.arange(1, DRIFT_NEW + 1) ** ZIPF
    order = rng.permutation(DRIFT_NEW)
    stream = []
    for step in range(batches):
        age = rng.choice(DRIFT_AGES, size=NUM_IDS, p=ages / ages.sum())
        rank = rng.choice(DRIFT_NEW, size=NUM_IDS, p=ranks / ranks.sum())
        stream.append(torch.from_numpy((step + DRIFT_AGES - age) * DRIFT_NEW + order[rank]))
    return stream


def _training(quick: bool) -> list:
    """Ids drawn uniformly (the worst case: half the lookups miss the budget, each miss an eviction
    and a first touch), from a Zipf law, as click logs are (most lookups hit the rows kept), and a
    drifting stream (new ids arrive, old ones fade: what evictions are for)."""
    steps = 3 if quick else STEPS
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    uniform = [torch.randint(0, TOUCHED, (NUM_IDS,)) for _ in range(steps)]
    skewed = [_zipf_ids(rng, NUM_IDS, ZIPF) for _ in range(steps)]
    # compare() runs each side 3 x (2 warm-up + repeat) times: a fresh part of the stream every run.
    runs = 3 * (2 + (1 if quick else 2))
    drifting = _drifting_stream(rng, runs * steps)
    return (_training_case(f"Zipf({ZIPF}) ids", skewed, steps, quick)
            + _training_case("uniform ids", uniform, steps, quick)
            + _training_case(f"a drifting stream ({DRIFT_NEW:,} new ids a step, popularity x{DRIFT_DECAY} a step "
                             "of age)", drifting, steps, quick))


def _sketch_cost(quick: bool) -> list:
    n = 20_000 if quick else 100_000
    store = _testing._store
    table = store.Store()
    config = store.TableConfig(num_rows=1 << 40, row_words=DIM, init=store.InitRule.normal(0, 0.01, seed=1))
    pending = table.table(table.create_table(config))
    plain = table.table(table.create_table(config))
    pending.set_policy(admit_after=65535)
    batches = [(torch.arange(n, dtype=torch.int64) + k * n).numpy().astype("uint64") * 7919 for k in range(8)]
    state = {"k": 0}

    def lookups():
        pending.gather(batches[state["k"] % len(batches)])
        state["k"] += 1

    def peeks():
        plain.peek(batches[state["k"] % len(batches)])
        state["k"] += 1

    lookup_s, peek_s = compare(lookups, peeks, repeat=3 if quick else 5)
    per_id_ns = (lookup_s - peek_s) / n * 1e9
    return [
        Row(f"lookups of {n:,} ids pending admission (sketch + init value)", lookup_s,
            "peek of the same ids (init value)", peek_s, "-", 0),
        Fact("admission sketch cost per id (lookup - peek)", f"{per_id_ns:.0f} ns", "-", True),
    ]


def _stream(quick: bool) -> list:
    distinct, budget, batch = (10**6, 10**5, 50_000) if quick else (10**7, 10**6, 50_000)
    store = _testing._store
    s = store.Store()
    table = s.table(s.create_table(store.TableConfig(num_rows=1 << 40, row_words=16)))
    table.set_policy(max_rows=budget, evict="lru")
    rss, held = [], []
    start = time.perf_counter()
    for first in range(0, distinct, batch):
        ids = (torch.arange(first, first + batch, dtype=torch.int64) * 7919).numpy().astype("uint64")
        table.gather(ids)
        held.append(table.stats().rows)
        if (first + batch) % (distinct // 4) == 0:
            rss.append(_rss_bytes())
    seconds = time.perf_counter() - start
    stats = table.stats()
    worst = max(held[len(held) // 10:])
    rss_text = " → ".join(f"{r / 2**20:.0f}" for r in rss)
    return [
        Fact(f"{distinct:,} distinct ids through a {budget:,}-row LRU budget: rows held (max after the first 10%)",
             f"{worst:,} ({(worst - budget) / budget:+.2%})", "within 1% of the budget",
             abs(worst - budget) <= budget // 100),
        Fact("RSS at 25/50/75/100% of the stream (MiB)", rss_text, "flat (last ≤ 1.1× the 25% point)",
             rss[-1] <= 1.1 * rss[0]),
        Fact("evictions per second (whole stream)", f"{stats.evicted / seconds / 1e6:.2f} M/s "
             f"({stats.evicted:,} in {seconds:.1f} s)", "-", True),
        Fact("table bytes held at the end (records, index, touch metadata)", f"{stats.bytes / 2**20:.0f} MiB", "-",
             True),
    ]


DEMO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "train_ctr.py")


def _demo_run(samples: int, admit_after: int) -> dict:
    """The demo's summary (rows, bytes, auc) in a process of its own: its tables are named, and a second
    run in this process would find the first run's rows."""
    script = (f"import runpy, json; main = runpy.run_path({DEMO!r})['main']; r = main(['--quiet', '--plot', '', "
              f"'--train-samples', '{samples}', '--test-samples', '20000', '--epochs', '1', '--eval-every', "
              f"'{10**9}', '--admit-after', '{admit_after}']); print(json.dumps({{k: r[k] for k in "
              f"('rows', 'bytes', 'auc')}}))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise RuntimeError(f"demo with admit_after={admit_after} failed:\n{result.stdout}\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _demo_admission(quick: bool) -> list:
    samples = 20_000 if quick else 100_000
    every, admitted = _demo_run(samples, 1), _demo_run(samples, 2)
    saved = 1 - admitted["bytes"] / every["bytes"]
    auc_change = admitted["auc"] - every["auc"]
    return [
        Fact(f"demo, one pass over {samples:,} samples: table memory, admit_after=2 against 1",
             f"{admitted['bytes'] / 2**20:.2f} / {every['bytes'] / 2**20:.2f} MiB ({-saved:+.1%}); rows "
             f"{admitted['rows']:,} / {every['rows']:,} ({admitted['rows'] / every['rows'] - 1:+.1%})",
             "≥ 30% less memory", saved >= 0.30),
        Fact("demo: held-out AUC, admit_after=2 against 1", f"{admitted['auc']:.4f} / {every['auc']:.4f} "
             f"({auc_change:+.4f})", "within 0.005", abs(auc_change) <= 0.005),
    ]


def run(quick: bool = False) -> list:
    return _training(quick) + _sketch_cost(quick) + _stream(quick) + _demo_admission(quick)


if __name__ == "__main__":
    import platform
    import sys
    import tempfile

    import bench_first_touch
    import harness

    quick = "--quick" in sys.argv
    sections = {
        "First touch of new ids": bench_first_touch.run(quick=quick),
        "Budgets, eviction and admission": run(quick=quick),
    }
    preamble = (
        f"# bench_budget (issue 20){' (quick)' if quick else ''}\n\n"
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores, "
        f"{platform.machine()}, load average {os.getloadavg()[0]:.1f} at the start. "
        "Ratio = peer time / recdev time (above 1: recdev faster).\n\n"
    )
    # A quick run is a smoke test: its figures do not replace the results.
    out_dir = tempfile.mkdtemp() if quick else harness.RESULTS_DIR
    print(harness.write("budget", sections, preamble, out_dir=out_dir))
