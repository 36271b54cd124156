"""`make bench --quick` runs in the suite, so the benchmarks cannot rot. It checks
that every suite runs and writes its table and plot, not the timings (those
are for benchmarks/results, never for assertions)."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """The directory a quick run wrote its table and plot to."""
    out = tmp_path_factory.mktemp("bench")
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "run.py"), "--quick", "--name", "quick",
         "--out-dir", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    return out


def test_quick_benchmark_run_writes_table_and_plot(quick_run):
    tmp_path = quick_run
    table = (tmp_path / "quick.md").read_text()
    for workload in ("add, 1M float32", "F.embedding, 65,536 ids", "embedding_bag sum", "training step",
                     "torch.save, 10^9-row table", "remote gather, 65,536 ids", "pooled on the shards",
                     "raw loopback TCP stream", "throughput against table size", "against server shards",
                     "fbgemm", "first touch, 100,000 new ids",
                     "embedding_bag sum float16, bags of 32, per_sample_weights", "a drifting stream",
                     "demo, one pass over"):
        assert workload in table
    # The host, so that ratios from hosts with other caches or instructions are never read as one.
    (host,) = [line for line in table.splitlines() if line.startswith("Host: ")]
    assert " caches L1d " in host and " L2 " in host
    assert (tmp_path / "quick.png").stat().st_size > 10_000


def test_the_redis_peer_ran(quick_run):
    # Where redis-server could not be installed (no root), make test still passes, and says so here.
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make test installs it where apt-get may run): "
                    "the Redis peer of the remote benchmark was not run")
    assert "Redis pipelined MGET" in (quick_run / "quick.md").read_text()
