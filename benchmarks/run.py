"""`make bench`: every benchmark in one run; writes benchmarks/results/latest.md
(a table: workload, recdev, peer, ratio, target) and latest.png.

    python benchmarks/run.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import bench_budget  # noqa: E402
import bench_checkpoint_stall  # noqa: E402
import bench_disk  # noqa: E402
import bench_embedding  # noqa: E402
import bench_fallback  # noqa: E402
import bench_fbgemm  # noqa: E402
import bench_first_touch  # noqa: E402
import bench_online  # noqa: E402
import bench_pooling  # noqa: E402
import bench_fleet  # noqa: E402
import bench_remote  # noqa: E402
import bench_scaling  # noqa: E402
import bench_serialization  # noqa: E402
import bench_training  # noqa: E402
import harness  # noqa: E402

SUITES = [
    ("Fallback on host storage vs CPU (issue: device foundation)", bench_fallback.run),
    ("Embedding lookups on a table (issue: store engine and table storage)", bench_embedding.run),
    ("Pooled lookups against a dense nn.EmbeddingBag (suite pooling, issue 38)", bench_pooling.run),
    ("Training step on a table (issue: training on tables)", bench_training.run),
    ("Saving and loading a lazy table (issue: torch.compile and state_dict)", bench_serialization.run),
    ("recdev vs fbgemm's CPU table-batched embedding (optional peer of the two issues above)", bench_fbgemm.run),
    ("Remote store on loopback (issue: remote store)", bench_remote.run),
    ("Scaling (issue: the main job and the benchmark suite)", bench_scaling.run),
    ("First touch of new ids (issue: bounded memory for unbounded ids)", bench_first_touch.run),
    ("Budgets, eviction and admission (suite budget, issue 20)", bench_budget.run),
    ("Fleets: torchrun trainers on recdev-server shards (issue: fleet training)", bench_fleet.run),
    ("A shard's requests while it checkpoints another table (issue 33)", bench_checkpoint_stall.run),
    ("The disk tier: tables larger than memory (suite disk, issue 35)", bench_disk.run),
    ("Online learning: incremental checkpoints (suite online, issue 36)", bench_online.run),
]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run, ~seconds)")
    parser.add_argument("--name", default="latest", help="results file stem")
    parser.add_argument("--out-dir", default=harness.RESULTS_DIR, help="where the .md and .png go")
    names = [suite.__module__.removeprefix("bench_") for _, suite in SUITES]
    parser.add_argument("--suites", nargs="+", choices=names, metavar="SUITE",
                        help=f"run only these ({', '.join(names)}); with --name, so that latest stays whole")
    args = parser.parse_args(argv)
    torch.set_num_threads(torch.get_num_threads())
    chosen = [(title, suite) for title, suite in SUITES
              if args.suites is None or suite.__module__.removeprefix("bench_") in args.suites]
    sections = {title: suite(quick=args.quick) for title, suite in chosen}
    preamble = (
        f"# torch_recdev benchmarks{' (quick)' if args.quick else ''}\n\n"
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}. "
        "Ratio = peer time / recdev time (above 1: recdev faster).\n\n"
    )
    print(harness.write(args.name, sections, preamble, out_dir=args.out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
