"""SIGKILL a server with periodic checkpoints (numbered versions: a base, then deltas, compacted in the
background) at random points around them, again and again: every restart holds exactly the last
version the server reported complete, bit for bit, never a part of a later one, and no temporary
file outlives the restart.

Each version of the table's rows is one SGD UPDATE, which a checkpoint sees whole (scan takes the
optimizer lock that an update holds for its whole batch), and the optimizer step tells the versions
apart: the rows of step k are recorded when it is applied, and a restarted server must hold those of
the step its newest version records."""

import re
import time

import numpy as np

from wire import optimizer, u64

ROWS = 50_000
DIM = 32
ROUNDS = 10
WRITTEN = re.compile(r"checkpoint (\d+) written: (\S+) \(version (\d+), (base|delta), (\d+) tables?, (\d+) rows, "
                     r"(\d+) bytes, crc ([0-9a-f]{8})\)")
REMOVED = re.compile(r"removed (\d+) temporary files? \((\d+) bytes\) of interrupted saves")


def completed(server):
    return WRITTEN.findall(server.log())


def wait_for_checkpoints(server, count, timeout=30):
    """Waits until the server reports `count` more completed checkpoints than now."""
    target = len(completed(server)) + count
    deadline = time.monotonic() + timeout
    while len(completed(server)) < target:
        assert server.alive() and time.monotonic() < deadline, f"no checkpoint completed: {server.log()!r}"
        time.sleep(0.02)


def test_sigkill_around_checkpoints_restarts_from_the_last_completed_one(start_server, tmp_path):
    from torch_recdev import _testing

    # A short lease makes the housekeeping thread, which writes the checkpoints, wake every 50 ms.
    args = ("--checkpoint-dir", str(tmp_path), "--checkpoint-every", "0.1", "--lease-seconds", "0.2")
    path = tmp_path / "shard-0-of-1"  # the shard's versions
    rng = np.random.default_rng(16)
    ids = np.arange(ROWS, dtype=np.uint64)

    server = start_server(*args)
    with server.connect() as c:
        table = c.open_named("crash.table", ROWS, DIM)["table_id"]
        c.call("SET_OPTIMIZER", u64(table) + optimizer("sgd", lr=1.0))
        c.write(table, ids, rng.standard_normal((ROWS, DIM)))
    versions = {}  # optimizer step -> the rows it left, as the server returned them
    interrupted = rows_lost = doomed_kept = unlogged = 0
    step = 0
    for _ in range(ROUNDS):
        with server.connect() as c:
            c.update(table, ids, rng.standard_normal((ROWS, DIM)))
            step += 1
            versions[step] = c.gather(table, ids, op="PEEK")
            # The second checkpoint completed from now on began after the update: step is saved.
            wait_for_checkpoints(server, 2)
            saved = step
            # Updates that a checkpoint may or may not catch before the kill.
            for _ in range(int(rng.integers(0, 3))):
                c.update(table, ids, rng.standard_normal((ROWS, DIM)))
                step += 1
                versions[step] = c.gather(table, ids, op="PEEK")
                time.sleep(rng.uniform(0, 0.1))
        if rng.random() < 0.6:
            # During a checkpoint: once its temporary file appears (the next one within a second).
            until = time.monotonic() + 1
            while time.monotonic() < until and not any(".tmp." in p.name for p in path.iterdir()):
                time.sleep(0.001)
            time.sleep(rng.uniform(0, 0.01))
        else:
            time.sleep(rng.uniform(0, 0.25))
        server.kill()

        # On disk: the last version reported complete — or, when the kill fell between its rename and
        # its log line, a later one, complete all the same.
        last = int(completed(server)[-1][2])
        newest = _testing._store.restorable_versions(str(path))[-1]
        assert newest >= last
        unlogged += newest > last
        (info,) = _testing._store.read_version_info(str(path), newest)  # every file of it verified
        assert saved <= info.optimizer_step <= step and info.row_count == ROWS

        server = start_server(*args)
        removed = REMOVED.search(server.log())
        interrupted += removed is not None
        assert [p.name for p in tmp_path.iterdir()] == [path.name]
        assert not [p.name for p in path.iterdir() if ".tmp." in p.name]
        with server.connect() as c:
            (table, name, _), = c.list()
            description = c.info(table)["table"]
            assert description["optimizer_step"] == info.optimizer_step
            rows = c.gather(table, ids, op="PEEK").reshape(ROWS, DIM)
        expected = versions[info.optimizer_step].reshape(ROWS, DIM)
        rows_lost += int((rows.view(np.uint32) != expected.view(np.uint32)).any(axis=1).sum())
        doomed_kept += info.optimizer_step > saved
        step = info.optimizer_step
        versions = {k: v for k, v in versions.items() if k <= step}
    assert rows_lost == 0
    print(f"\n{ROUNDS} kills and restarts; {interrupted} kills interrupted a checkpoint, {unlogged} fell between "
          f"one's rename and its log line; {doomed_kept} restarts held updates made after the last waited-for "
          f"checkpoint; {rows_lost} rows lost")
