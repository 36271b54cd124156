"""`make bench --quick` runs in the suite, so the benchmarks cannot rot. It checks
that every suite runs and writes its table and plot, not the timings (those
are for benchmarks/results, never for assertions)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_quick_benchmark_run_writes_table_and_plot(tmp_path):
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "run.py"), "--quick", "--name", "quick",
         "--out-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    table = (tmp_path / "quick.md").read_text()
    for workload in ("add, 1M float32", "F.embedding, 65,536 ids", "embedding_bag sum", "training step",
                     "torch.save, 10^9-row table", "remote gather, 65,536 ids", "pooled on the shards",
                     "raw loopback TCP stream", "throughput against table size", "against server shards",
                     "fbgemm"):
        assert workload in table
    assert (tmp_path / "quick.png").stat().st_size > 10_000
