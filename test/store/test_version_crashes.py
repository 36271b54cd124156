"""Incremental checkpoints under kill -9 (docs/online.md): a process writing versions (deltas, and
compactions in the background) is killed at random moments; the directory then restores exactly the
state of its last complete version, and the next checkpoint leaves no temporary file behind."""

import hashlib
import os
import random
import subprocess
import sys
import textwrap
import time


import torch_recdev
from torch_recdev import _C, ops

WRITER = textwrap.dedent("""
    import hashlib, sys, torch, torch_recdev
    from torch_recdev import _C, ops

    def digest(table):
        _, ids, records = _C._table_snapshot(table)
        order = ids.argsort()
        return hashlib.sha256(ids[order].numpy().tobytes() + records[order].numpy().tobytes()).hexdigest()

    directory = sys.argv[1]
    table = ops.init_embedding_table("crash.t", 10**6, 32, optimizer=("adagrad", {"lr": 0.1}))
    generator = torch.Generator().manual_seed(int(sys.argv[2]))
    ops.emb_update(table, torch.arange(100_000), torch.ones(100_000, 32))
    while True:
        keys = torch.randint(0, 200_000, (30_000,), generator=generator)
        ops.emb_update(table, keys, torch.randn(30_000, 32, generator=generator))
        version = ops.checkpoint(directory)
        print(version, digest(table), flush=True)
""")


def digest(table):
    _, ids, records = _C._table_snapshot(table)
    order = ids.argsort()
    return hashlib.sha256(ids[order].numpy().tobytes() + records[order].numpy().tobytes()).hexdigest()


def test_sigkill_while_writing_versions_leaves_every_complete_version_restorable(tmp_path):
    torch_recdev.connect(None)
    directory = tmp_path / "versions"
    table = ops.init_embedding_table("crash.t", 10**6, 32, optimizer=("adagrad", {"lr": 0.1}))
    rng = random.Random(0)
    digests = {}
    for run in range(3):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(directory), str(run)], stdout=subprocess.PIPE,
                                  text=True)
        try:
            wanted = len(digests) + rng.randint(2, 6)
            deadline = time.monotonic() + 120
            while len(digests) < wanted:
                line = writer.stdout.readline()
                assert line, f"the writer stopped (exit code {writer.poll()})"
                version, written = line.split()
                digests[int(version)] = written
                assert time.monotonic() < deadline
            time.sleep(rng.uniform(0.0, 0.3))  # somewhere in the next write, or a compaction
        finally:
            writer.kill()
            writer.wait()
            writer.stdout.close()
        reachable = ops.versions(directory)
        assert reachable and reachable[-1] >= max(digests), (reachable, sorted(digests))
        newest_known = max(v for v in reachable if v in digests)
        assert ops.restore(directory, newest_known) == newest_known
        assert digest(table) == digests[newest_known], f"version {newest_known} after kill {run}"
        # The next writer starts from the directory's newest version, whoever wrote it.
        for version in [v for v in digests if v > reachable[-1]]:
            del digests[version]
        digests = {v: d for v, d in digests.items() if v <= reachable[-1]}
        if reachable[-1] not in digests:  # complete but the writer died before reporting it
            ops.restore(directory, reachable[-1])
            digests[reachable[-1]] = digest(table)
    ops.checkpoint(directory)
    leftovers = [name for name in os.listdir(directory) if ".tmp." in name]
    assert not leftovers, leftovers
