"""The disk tier on recdev-server shards (--disk-dir; docs/disk_tier.md): a shard killed while it
spills and compacts restarts from its checkpoint with every row of it, bit for bit, and leaves no
files of the dead process behind; a shard without --disk-dir refuses spill=True, naming the flag;
--stats shows each table's disk tier."""

import re
import subprocess
import time
import uuid

import pytest
import torch

import torch_recdev
from torch_recdev import _C, ops, server

WRITTEN = re.compile(r"checkpoint (\d+) written")
DIM = 16


def rows_and_state(table):
    _, ids, records = _C._table_snapshot(table)
    order = ids.argsort()
    return ids[order].clone(), records[order].clone()


def wait_for_checkpoints(shard, count, timeout=30):
    target = len(WRITTEN.findall(shard.log())) + count
    deadline = time.monotonic() + timeout
    while len(WRITTEN.findall(shard.log())) < target:
        assert shard.alive() and time.monotonic() < deadline, shard.log()
        time.sleep(0.02)


def declare(name):
    return ops.init_embedding_table(name, 10**9, DIM, init=torch_recdev.Zero(), optimizer=("adagrad", {"lr": 0.1}),
                                    max_rows=64, evict="lru", spill=True)


def test_sigkill_while_spilling_and_compacting_restarts_with_every_row_of_the_checkpoint(start_shards, tmp_path,
                                                                                        monkeypatch):
    monkeypatch.setenv("RECDEV_DISK_SEGMENT_BYTES", str(64 << 10))  # many segments, compacted often
    disk, checkpoints = tmp_path / "disk", tmp_path / "checkpoints"
    args = ("--disk-dir", str(disk), "--checkpoint-dir", str(checkpoints), "--checkpoint-every", "0.2",
            "--lease-seconds", "0.2")
    (shard,) = start_shards(1, *args)
    torch_recdev.connect(f"tcp://{shard.address}")
    name = f"spill_{uuid.uuid4().hex}"
    table = declare(name)
    generator = torch.Generator().manual_seed(0)
    # Every row and its state after each request, by optimizer step: after update k, and after the
    # lookup that follows it (which adds rows and leaves the step at k). A checkpoint holds one of them.
    versions = {}

    def step():
        keys = torch.randint(0, 2000, (48,), generator=generator)
        ops.emb_read(table, keys)
        versions.setdefault(_C._table_optimizer_step(table), []).append(rows_and_state(table))
        ops.emb_update(table, keys, torch.randn(48, DIM, generator=generator))
        versions.setdefault(_C._table_optimizer_step(table), []).append(rows_and_state(table))

    for _ in range(40):
        step()
    wait_for_checkpoints(shard, 2)
    for _ in range(20):  # more spilling and compaction; killed right after, its writes in flight
        step()
    old_pid = shard.proc.pid
    assert any(p.name.startswith(f"recdev-{old_pid}-") for p in disk.iterdir())
    shard.kill()

    restarted = start_shards.restart(0, 1, *args, listen=shard.address)
    torch_recdev.connect(f"tcp://{restarted.address}")
    table = declare(name)  # opens the restored table
    saved = _C._table_optimizer_step(table)
    assert saved >= 40 and saved in versions
    ids, records = rows_and_state(table)
    assert any(torch.equal(ids, want_ids) and torch.equal(records.view(torch.int32), want_records.view(torch.int32))
               for want_ids, want_records in versions[saved]), f"step {saved}: not a state the shard was in"
    stats = torch_recdev.table_stats(table)
    assert stats["rows_on_disk"] > 0 and stats["rows_in_memory"] <= 64
    # The dead process's files are gone; only the new one's directory is there.
    assert "removed 1 disk-tier directories of dead processes" in restarted.log()
    assert {p.name.split("-")[1] for p in disk.iterdir()} == {str(restarted.proc.pid)}


def test_a_shard_without_disk_dir_refuses_spill_naming_the_flag(start_shards):
    shards = start_shards(2)
    torch_recdev.connect(",".join(f"tcp://{s.address}" for s in shards))
    table = ops.init_embedding_table(f"spill_{uuid.uuid4().hex}", 10**6, DIM, optimizer=("sgd", {"lr": 0.1}))
    with pytest.raises(ValueError, match=r"spill=True needs a disk directory.*recdev-server --disk-dir"):
        torch_recdev.set_table_policy(table, max_rows=100, evict="lru", spill=True)
    assert torch_recdev.table_policy(table)["max_rows"] is None  # refused on every shard: nothing set


def test_stats_show_each_tables_disk_tier(start_shards, tmp_path):
    (shard,) = start_shards(1, "--disk-dir", str(tmp_path / "disk"))
    torch_recdev.connect(f"tcp://{shard.address}")
    name = f"spill_{uuid.uuid4().hex}"
    table = declare(name)
    for start in range(0, 640, 64):
        ops.emb_write(table, torch.arange(start, start + 64), torch.ones(64, DIM))
    stats = torch_recdev.table_stats(table)
    assert (stats["rows"], stats["rows_in_memory"], stats["rows_on_disk"]) == (640, 64, 576)
    shown = subprocess.run([server.executable(), "--stats", shard.address], capture_output=True, text=True, check=True)
    assert re.search(rf"{name}: rows 640, .*spill=True.*, on disk 576 rows in \d+ bytes, disk reads 0, "
                     rf"disk writes 576", shown.stdout), shown.stdout
