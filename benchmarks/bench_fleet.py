"""Fleets (issue: fleet training): aggregate samples/s of the demo model (examples/train_ctr.py) for
(trainers, shards) in {(1, 1), (1, 2), (2, 2)}, each a real `examples/fleet_demo.py` run (recdev-server
shards and torchrun trainers on 127.0.0.1), and the loopback bytes per training step, which
docs/scaling.md turns into what a fleet of machines would do. Held-out evaluations are excluded from
the rate (train_ctr.py times them apart). One trainer on 2 shards is also run in turn with the demo
on the embedded store (issue 38: the remote demo at 0.8x or more of the embedded one's samples/s)."""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys

from bench_remote import loopback_bytes
from harness import Fact, Grid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "examples", "fleet_demo.py")
_RATE = re.compile(r"throughput ([\d,]+) samples/s in all \((\d+) trainers?\) over (\d+) steps")


def fleet_run(trainers: int, shards: int, samples: int) -> tuple[float, int, int]:
    """(samples/s in all, steps per trainer, loopback bytes) of one run."""
    # One intra-op thread per trainer, as torchrun gives each of several ranks: on a machine whose cores
    # the shards share, a lone trainer's thread pool would otherwise contend with them and measure that.
    env = dict(os.environ, OMP_NUM_THREADS="1")
    before = loopback_bytes()
    result = subprocess.run(
        [sys.executable, DEMO, "--trainers", str(trainers), "--shards", str(shards), "--",
         "--quiet", "--train-samples", str(samples), "--test-samples", "2000", "--epochs", "1", "--plot", "",
         "--eval-every", str(10**9)],
        capture_output=True, text=True, timeout=900, env=env)
    wire = loopback_bytes() - before
    match = _RATE.search(result.stdout)
    if result.returncode != 0 or match is None:
        raise RuntimeError(f"fleet run ({trainers} trainers, {shards} shards) failed:\n{result.stdout}\n{result.stderr}")
    return float(match.group(1).replace(",", "")), int(match.group(3)), wire


def demo_run(samples: int, servers: str | None) -> float:
    """samples/s of one demo process (no torchrun) on the servers or the embedded store, one intra-op
    thread as fleet_run's trainers."""
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "train_ctr.py"), "--quiet", "--train-samples", str(samples),
         "--test-samples", "2000", "--epochs", "1", "--plot", "", "--eval-every", str(10**9),
         *(["--servers", servers] if servers else [])],
        capture_output=True, text=True, timeout=900, env=dict(os.environ, OMP_NUM_THREADS="1"))
    match = _RATE.search(result.stdout)
    if result.returncode != 0 or match is None:
        raise RuntimeError(f"demo run ({servers or 'embedded'}) failed:\n{result.stdout}\n{result.stderr}")
    return float(match.group(1).replace(",", ""))


def remote_against_embedded(samples: int, rounds: int) -> Fact:
    """The demo on 2 local shards (train_ctr.py --servers: overlap_updates) against the embedded demo,
    one process each, in turn; the median of the rounds' ratios."""
    from torch_recdev import local_shards

    servers = local_shards.start_shards(2)
    try:
        listed = local_shards.server_list(servers)
        pairs = [(demo_run(samples, listed), demo_run(samples, None)) for _ in range(rounds)]
    finally:
        for server in servers:
            server.stop()
    ratios = sorted(remote / embedded for remote, embedded in pairs)
    ratio = statistics.median(ratios)
    return Fact(f"demo on 2 shards / on the embedded store, 1 trainer, samples/s, {rounds} rounds in turn "
                f"({', '.join(f'{r:.2f}x' for r in ratios)})", f"{ratio:.2f}x", ">= 0.8x (issue 38)", ratio >= 0.8)


def step_costs(ids_per_rank: int, steps: int, rounds: int, shards: int) -> tuple[list[tuple[float, float]], dict]:
    """(async, sync) median step seconds of 2 ranks in each round, and the synchronous step's phases
    (fleet_step_worker.py), on `shards` shards (0: each rank's embedded store, replicas in sync mode)."""
    import socket

    from torch_recdev import local_shards

    servers = local_shards.start_shards(shards) if shards else []
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = []
        for rank in range(2):
            env = {k: v for k, v in os.environ.items() if k != "RECDEV_SERVERS"}
            env.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), OMP_NUM_THREADS="1")
            if rank == 0 and servers:
                env["RECDEV_SERVERS"] = local_shards.server_list(servers)
            procs.append(subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "fleet_step_worker.py"),
                                           str(ids_per_rank), str(steps), str(rounds)], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outputs = [p.communicate(timeout=1800)[0] for p in procs]
        found = re.findall(r"round \d+ async ([\d.]+) sync ([\d.]+)", outputs[0])
        phases = re.search(r"phases (.*)", outputs[0])
        if any(p.returncode for p in procs) or len(found) != rounds or phases is None:
            raise RuntimeError(f"step-cost run failed:\n{outputs[0]}\n{outputs[1]}")
        parts = {k.replace("_", " "): float(v) for k, v in (kv.split("=") for kv in phases.group(1).split())}
        return [(float(a), float(b)) for a, b in found], parts
    finally:
        for server in servers:
            server.stop()


def run(quick: bool = False) -> list:
    samples = 20_000 if quick else 400_000
    rows, facts = [], []
    # --quick (the test suite's smoke run) runs the fleet once: each run starts shards and interpreters.
    for trainers, shards in ((2, 2),) if quick else ((1, 1), (1, 2), (2, 2)):
        rate, steps, wire = fleet_run(trainers, shards, samples)
        per_step = wire / (steps * trainers)
        rows.append([str(trainers), str(shards), f"{rate:,.0f}", f"{per_step / 2**20:.2f} MiB"])
    ids = 8_192 if quick else 65_536
    step_rows = []
    for shards, where in ((2, "2 shards"), (0, "embedded replicas")):
        rounds, parts = step_costs(ids, 2 if quick else 10, 1 if quick else 3, shards)
        ratios = [b / a for a, b in rounds]
        ratio = statistics.median(ratios)
        async_s, sync_s = (statistics.median(x) for x in zip(*rounds))
        step_rows.append([where, f"{async_s * 1e3:.0f} ms", f"{sync_s * 1e3:.0f} ms",
                          ", ".join(f"{r:.2f}x" for r in ratios), f"{ratio:.2f}x",
                          ", ".join(f"{k} {v * 1e3:.0f}" for k, v in parts.items())])
        if shards:
            facts.append(Fact(f"training step, {ids:,} ids per rank, dim 64, RowWiseAdagrad, 2 ranks x 2 shards: "
                              "sync / async (median of the rounds' ratios)", f"{ratio:.2f}x",
                              "sync <= 1.3x async", ratio <= 1.3))
    grid = Grid(f"demo model, {samples:,} samples, batch 1,024 per trainer, one thread each (loopback bytes per "
                "trainer step: the machine's loopback counter over the run, so they include the rendezvous, start-up "
                "and anything else using loopback meanwhile)",
                ["trainers", "shards", "samples/s in all", "loopback bytes per trainer step"], rows)
    steps_grid = Grid(f"one table's training step, {ids:,} ids per rank, dim 64, RowWiseAdagrad, 2 ranks: medians of "
                      "alternating asynchronous and synchronous rounds, and where a synchronous step's time goes (ms)",
                      ["store", "async step", "sync step", "sync/async per round", "median ratio",
                       "sync step: lookup, backward, wait, stage, exchange, apply, rest"], step_rows)
    if not quick:
        facts.append(remote_against_embedded(samples, 5))
    return [grid, steps_grid, *facts]


if __name__ == "__main__":
    # The suite alone (make bench runs it with the others); a full run is kept in results/fleet.md.
    import datetime

    import harness

    quick = "--quick" in sys.argv
    body = harness.markdown("Fleets: torchrun trainers on recdev-server shards (suite fleet, issue 19)", run(quick=quick))
    if not quick:
        with open(os.path.join(harness.RESULTS_DIR, "fleet.md"), "w") as f:
            f.write(f"# bench_fleet, {datetime.date.today()}, {os.cpu_count()} cores shared with other jobs "
                    f"(load average {os.getloadavg()[0]:.0f} at the end)\n\nHost: {harness.host_description()}.\n\n{body}")
    print(body)
