"""A server's life: SIGTERM / SIGINT write a checkpoint and exit 0, a restart loads it, checkpoints of
another layout are refused, periodic checkpoints, --max-memory, the --stats command and bad options."""

import os
import signal
import subprocess
import time

import numpy as np
import pytest

import wire
from torch_recdev import server
from server_process import checksum
from wire import ServerError, array, init_rule, optimizer, u64, table_ref

DIM = 8


def run_cli(*args, timeout=120):
    return subprocess.run([server.executable(), *args], capture_output=True, text=True, timeout=timeout)


def populate(conn, shard, num_shards, name="life.table"):
    """A named table with optimizer state on the shard's own rows; returns its id and the rows."""
    table = conn.open_named(name, 10**9, DIM, init_rule("normal", 0.0, 0.1, seed=4))["table_id"]
    conn.call("SET_OPTIMIZER", u64(table) + optimizer("rowwise_adagrad", lr=0.1))
    ids = wire.owned_ids(wire.route_key_of_name(name), shard, num_shards, 300, start=10**8)
    grads = np.random.default_rng(shard).standard_normal((len(ids), DIM)).astype(np.float32)
    conn.update(table, ids, grads)
    conn.update(table, ids[:10], grads[:10])
    return table, ids


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_writes_checkpoint_and_restart_loads_it(start_server, tmp_path, sig):
    args = ("--shard", "1", "--num-shards", "2", "--checkpoint-dir", str(tmp_path / "ckpt"))
    server = start_server(*args)
    with server.connect() as c:
        table, ids = populate(c, 1, 2)
        anonymous = c.create_table(100, DIM, route_key=7)
        c.write(anonymous, wire.owned_ids(7, 1, 2, 1), np.ones((1, DIM)))
        digest = checksum(c)
        rows = c.gather(table, ids)
    assert server.stop(sig) == 0
    assert "stopped" in server.log()
    from torch_recdev import _testing

    path = tmp_path / "ckpt" / "shard-1-of-2"
    assert _testing._store.restorable_versions(str(path))

    restarted = start_server(*args)
    with restarted.connect() as c:
        listed = c.list()
        assert [name for _, name, _ in listed] == ["life.table"]  # anonymous tables are not kept
        assert checksum(c) != digest  # the anonymous table is gone...
        table_id = listed[0][0]
        np.testing.assert_array_equal(c.gather(table_id, ids), rows)  # ...the named one is back, bit for bit
        info = c.info(table_id)["table"]
        assert info["optimizer_step"] == 2 and info["optimizer"]["kind"] == wire.OPTIMIZER["rowwise_adagrad"]
        # Training resumes from the checkpoint: the next update uses the restored state.
        c.update(table_id, ids[:1], np.ones((1, DIM)))
    assert restarted.stop() == 0


def test_in_flight_requests_finish_on_sigterm(start_server, tmp_path):
    server = start_server("--checkpoint-dir", str(tmp_path))
    with server.connect() as c:
        table = c.open_named("life.inflight", 10**6, 64)["table_id"]
        ids = np.arange(200000, dtype=np.uint64)
        request = wire.frame("WRITE", table_ref(table) + array(ids, np.uint64) + array(np.ones((ids.size, 64)), np.float32),
                             request_id=77)
        c.send_raw(request)
        server.proc.send_signal(signal.SIGTERM)
        opcode, flags, request_id, payload = c.read_frame()
        assert (opcode, flags, request_id, payload) == (wire.OP["WRITE"], 0, 77, b"")
    assert server.proc.wait(60) == 0
    restarted = start_server("--checkpoint-dir", str(tmp_path))
    with restarted.connect() as c:
        (table_id, name, _), = c.list()
        assert c.info(table_id)["stats"]["rows"] == 200000


def test_checkpoint_of_another_layout_refused(start_server, tmp_path):
    server = start_server("--shard", "0", "--num-shards", "2", "--checkpoint-dir", str(tmp_path))
    with server.connect() as c:
        populate(c, 0, 2)
    assert server.stop() == 0
    # Another number of shards: refused, not started empty.
    result = run_cli("--listen", "127.0.0.1:0", "--shard", "0", "--num-shards", "3", "--checkpoint-dir", str(tmp_path))
    assert result.returncode == 1
    assert "another number of shards" in result.stderr and "shard-0-of-2" in result.stderr
    # Shard 0's versions presented as shard 1's: their rows belong to shard 0.
    os.rename(tmp_path / "shard-0-of-2", tmp_path / "shard-1-of-2")
    result = run_cli("--listen", "127.0.0.1:0", "--shard", "1", "--num-shards", "2", "--checkpoint-dir", str(tmp_path))
    assert result.returncode == 1
    assert "belongs to shard 0" in result.stderr and "written by another shard" in result.stderr
    # A damaged file is refused too.
    (path,) = (tmp_path / "shard-1-of-2").iterdir()
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # the CRC
    path.write_bytes(bytes(data))
    result = run_cli("--listen", "127.0.0.1:0", "--shard", "1", "--num-shards", "2", "--checkpoint-dir", str(tmp_path))
    assert result.returncode == 1 and "checksum" in result.stderr.lower()


def test_periodic_checkpoints(start_server, tmp_path):
    from torch_recdev import _testing

    server = start_server("--checkpoint-dir", str(tmp_path), "--checkpoint-every", "0.3")
    path = tmp_path / "shard-0-of-1"
    with server.connect() as c:
        table = c.open_named("life.periodic", 1000, DIM)["table_id"]
        c.write(table, np.arange(50), np.ones((50, DIM)))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            versions = _testing._store.restorable_versions(str(path)) if path.exists() else []
            if versions:
                infos = _testing._store.read_version_info(str(path), versions[-1])
                if infos and infos[0].row_count == 50:
                    break
            time.sleep(0.1)
        else:
            pytest.fail("no periodic checkpoint with the rows written")
        assert server.alive()
    server.kill()  # even a SIGKILL leaves the last periodic checkpoint
    restarted = start_server("--checkpoint-dir", str(tmp_path))
    with restarted.connect() as c:
        (table_id, name, _), = c.list()
        assert name == "life.periodic" and c.exists(table_id, np.arange(50)).all()


def test_checkpoint_every_below_a_second_is_kept(start_server, tmp_path):
    # The housekeeping loop woke once a second (a quarter of the 60 s lease, capped at 1 s), so
    # --checkpoint-every 0.2 checkpointed about once a second.
    server = start_server("--checkpoint-dir", str(tmp_path), "--checkpoint-every", "0.2")
    time.sleep(3)
    written = server.log().count(" written: ")
    assert written >= 8, f"{written} checkpoints in 3 s at --checkpoint-every 0.2:\n{server.log()}"


def test_max_memory_gives_store_full(start_server):
    limit = 4 << 20
    server = start_server("--max-memory", "4M")
    with server.connect() as c:
        table = c.create_table(10**9, 64)
        written, full = 0, None
        for batch in range(200):
            ids = np.arange(batch * 1000, (batch + 1) * 1000, dtype=np.uint64)
            try:
                c.write(table, ids, np.ones((1000, 64)))
                written += 1000
            except ServerError as e:
                full = e
                break
        assert full is not None and full.name == "Full" and "store full" in full.message and "--max-memory" in full.message
        assert 5000 < written < 20000
        stats = c.stats()
        assert stats["max_memory"] == limit and stats["bytes"] <= limit
        # Reads of rows already there still work when full; gathers of new ones do not.
        assert c.gather(table, np.arange(10)).size == 640
        with pytest.raises(ServerError) as info:
            c.gather(table, np.arange(10**6, 10**6 + 5000))
        assert info.value.name == "Full"
        # A dump snapshot is exempt, so that a full shard can still be saved.
        ids, _, header = c.dump_all(table, max_rows=4000)
        assert header["total_rows"] == written and np.array_equal(np.sort(ids), np.arange(written))
        # Freeing rows makes room again.
        c.call("ERASE", table_ref(table) + array(np.arange(written), np.uint64))
        c.write(table, np.arange(1000), np.ones((1000, 64)))
    assert server.alive()
    assert server.stop() == 0


def test_an_admission_sketch_sized_by_its_budget_counts_against_max_memory(start_server):
    """sketch_width 0 sizes the sketch from the budget: 10^7 rows and admit_after=1000 (16-bit
    counters) ask for 2^22 columns, 32 MiB, which a 4 MiB shard refuses before allocating."""
    server = start_server("--max-memory", "4M")
    with server.connect() as c:
        table = c.create_table(10**9, 8)
        for budget in (dict(max_rows=10**7), dict(max_bytes=10**10)):
            with pytest.raises(ServerError) as info:
                c.call("SET_POLICY", u64(table) + wire.policy(**budget, evict="lru", admit_after=1000, sketch_width=0))
            assert info.value.name == "Full" and "--max-memory" in info.value.message
            assert c.info(table)["policy"]["admit_after"] == 1
        # admit_after=2 packs 2-bit counters: a budget of 2^19 rows takes 2^20 columns, 1 MiB, which fits.
        c.call("SET_POLICY", u64(table) + wire.policy(max_rows=2**19, evict="lru", admit_after=2, sketch_width=0))
        assert c.info(table)["policy"]["sketch_width"] == 2**20
        assert c.stats()["bytes"] <= 4 << 20
    assert server.alive()
    assert server.stop() == 0


def test_stats_command(start_server, tmp_path):
    token = tmp_path / "token"
    token.write_text("abc\n")
    server = start_server("--token-file", str(token), "--shard", "0", "--num-shards", "1")
    with server.connect(token="abc") as c:
        table = c.create_table(100, DIM)
        c.write(table, np.arange(10), np.ones((10, DIM)))
        with pytest.raises(ServerError):
            c.gather(table, [100])
        result = run_cli("--stats", server.address, "--token-file", str(token))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"server       {server.address} (shard 0 of 1)" in out
    assert "tables       1 (0 named)" in out
    assert "rows         10\n" in out
    assert "errors       1\n" in out
    for field in ("bytes", "requests", "connections", "sessions", "uptime"):
        assert f"\n{field}" in out
    wrong = tmp_path / "wrong"
    wrong.write_text("nope\n")
    result = run_cli("--stats", server.address, "--token-file", str(wrong))
    assert result.returncode == 1 and "wrong token" in result.stderr and server.address in result.stderr
    result = run_cli("--stats", server.address)
    assert result.returncode == 1 and "requires a token" in result.stderr
    assert server.stop() == 0


def test_stats_of_a_dead_server_fails_within_the_timeout():
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = run_cli("--stats", f"127.0.0.1:{port}", "--timeout", "2")
    assert result.returncode == 1 and "cannot connect" in result.stderr


@pytest.mark.parametrize("args, message", [
    (("--shard", "2", "--num-shards", "2"), "is not below --num-shards"),
    (("--num-shards", "0"), "--num-shards"),
    (("--checkpoint-every", "5"), "needs --checkpoint-dir"),
    (("--listen", "nowhere"), "expected HOST:PORT"),
    (("--listen", "127.0.0.1:99999"), "port past 65535"),
    (("--lease-seconds", "0"), "--lease-seconds"),
    (("--token-file", "/nonexistent/token"), "cannot read --token-file"),
])
def test_bad_options(args, message):
    result = run_cli(*args)
    assert result.returncode != 0 and message in result.stderr, result.stderr


def test_bad_size_and_busy_port(start_server):
    result = run_cli("--max-memory", "lots")
    assert result.returncode == 2 and "is not a size" in result.stderr
    server = start_server()
    result = run_cli("--listen", server.address)
    assert result.returncode == 1 and "cannot listen" in result.stderr

