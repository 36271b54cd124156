"""A process killed while it writes a checkpoint leaves its temporary file behind. The next start of a
server removes those in its own shard's versions directory (and only those) and says so; the next save of the embedded store to
the same path removes those of savers on this host that are gone."""

import os
import random
import socket
import subprocess
import sys
import time

import numpy as np

import wire

DIM = 8


def test_start_removes_only_its_own_shards_interrupted_checkpoints(start_server, tmp_path):
    args = ("--shard", "1", "--num-shards", "2", "--checkpoint-dir", str(tmp_path))
    server = start_server(*args)
    with server.connect() as c:
        table = c.open_named("temp.files", 10**6, DIM)["table_id"]
        ids = wire.owned_ids(wire.route_key_of_name("temp.files"), 1, 2, 100)
        c.write(table, ids, np.full((len(ids), DIM), 3.0))
    assert server.stop() == 0
    own_dir = tmp_path / "shard-1-of-2"
    (completed,) = own_dir.iterdir()  # the shard's first version, a base

    # Named as AtomicFileWriter names them: the destination, ".tmp.", the writer's host, pid and a
    # counter. The shard's own directory has only its own server's, removed whoever wrote them (its
    # previous server, maybe elsewhere).
    host = socket.gethostname()
    own = {f"v00000002-delta.recdev.tmp.{host}.4242.0": 1000, "v00000003-base.recdev.tmp.other.host.1.17": 5000}
    (tmp_path / "shard-0-of-2").mkdir()
    kept = {
        f"shard-0-of-2/v00000004-delta.recdev.tmp.{host}.4242.0": 700,  # another shard's, maybe being written now
        "shard-0-of-2/v00000003-delta.recdev": 300,                     # another shard's version
        f"shard-11-of-20.recdev.tmp.{host}.1.0": 200,                   # another layout's
    }
    for name, size in own.items():
        (own_dir / name).write_bytes(b"\0" * size)
    for name, size in kept.items():
        (tmp_path / name).write_bytes(b"\0" * size)
    checkpoint_bytes = completed.read_bytes()

    restarted = start_server(*args)
    assert [p.name for p in own_dir.iterdir()] == [completed.name]
    assert all((tmp_path / name).exists() for name in kept)
    assert completed.read_bytes() == checkpoint_bytes
    assert f"removed 2 temporary files (6000 bytes) of interrupted saves of {own_dir}" in restarted.log()
    with restarted.connect() as c:
        (table_id, name, _), = c.list()
        np.testing.assert_array_equal(c.gather(table_id, ids), np.full(len(ids) * DIM, 3.0, dtype=np.float32))

    # Nothing to remove: nothing said.
    assert restarted.stop() == 0
    again = start_server(*args)
    assert "temporary file" not in again.log()


SAVER = """
import sys, torch, torch_recdev
from torch_recdev import ops
table = ops.init_embedding_table("crash.embedded", 10**6, 64)
ops.emb_write(table, torch.arange(200_000), torch.full((200_000, 64), float(sys.argv[2])))
for _ in range(int(sys.argv[3])):
    ops.save(sys.argv[1])
    print("saved", flush=True)
"""


def saver(path, value, saves):
    env = {k: v for k, v in os.environ.items() if k != "RECDEV_SERVERS"}
    return subprocess.Popen([sys.executable, "-c", SAVER, str(path), str(value), str(saves)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_embedded_saves_killed_midway_keep_the_last_file_and_leave_no_leftovers(tmp_path):
    """ops.save of the embedded store killed while it writes: the file holds the last completed save,
    and the next save on this host removes what the killed ones left, and nothing else."""
    from torch_recdev import _testing

    path = tmp_path / "model.recdev"
    first = saver(path, 1.0, 1)
    assert first.wait(120) == 0, first.stderr.read()
    host = socket.gethostname()
    live = tmp_path / f"model.recdev.tmp.{host}.{os.getpid()}.99"  # this live process's save in progress
    elsewhere = tmp_path / "model.recdev.tmp.other.host.1.0"         # a save on another host sharing the directory
    live.write_bytes(b"\0" * 10)
    elsewhere.write_bytes(b"\0" * 10)

    rng = random.Random(16)
    left = []
    for _ in range(4):
        proc = saver(path, 2.0, 1000)
        assert proc.stdout.readline() == "saved\n", proc.stderr.read()
        time.sleep(rng.uniform(0, 0.2))
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
        left += [p for p in tmp_path.iterdir() if p.name.startswith(f"model.recdev.tmp.{host}.{proc.pid}.")]
        (info,) = _testing._store.read_checkpoint_info(str(path))  # a whole checkpoint, never a part of one
        assert info.name == "crash.embedded" and info.row_count == 200_000
        if len(left) >= 2:
            break
    assert left, "no kill landed during a save"

    last = saver(path, 3.0, 1)
    assert last.wait(120) == 0, last.stderr.read()
    assert {p.name for p in tmp_path.iterdir()} == {path.name, live.name, elsewhere.name}
    store = _testing._store.Store()
    assert _testing._store.load_store(str(path), store) == ["crash.embedded"]
    rows = np.asarray(store.table(store.find("crash.embedded")).gather(np.arange(200_000, dtype=np.uint64)))
    assert (rows == 3.0).all()
