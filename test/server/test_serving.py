"""Serving shards (recdev-server --serve DIR; docs/online.md): read-only shards that serve the newest
version of a directory of incremental checkpoints and follow new ones. A trainer process (the
embedded store, or a training shard) writes versions whose rows are all k in version k; lookups
running all the while each see one version, none fails during a swap, a damaged version is refused
with its file named while the one before keeps serving, and every write is refused."""

import shutil
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

import torch_recdev
from torch_recdev import local_shards, ops
import wire
from wire import ServerError, u64

NAME, ROWS, DIM, HELD = "serve.t", 10**7, 8, 4096

TRAINER = textwrap.dedent("""
    import sys, time, torch, torch_recdev
    from torch_recdev import ops

    directory, versions, pause, name = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    table = ops.init_embedding_table(name, 10**7, 8, init=torch_recdev.Zero(), optimizer=("adagrad", {"lr": 0.1}))
    ids = torch.arange(4096) * 97
    if "pad" in sys.argv[5:]:  # rows the versions never change: a base that outweighs two deltas
        ops.emb_write(table, torch.arange(20_000) * 97 + 1, torch.zeros(20_000, 8))
    for k in range(1, versions + 1):
        ops.emb_write(table, ids, torch.full((4096, 8), float(k) + 1 / 3))
        print(ops.checkpoint(directory), flush=True)
        time.sleep(pause)
    if "export" in sys.argv[5:]:
        print(torch_recdev.export_tables(directory + "/export", dtype=torch.float16), flush=True)
""")
IDS = torch.arange(HELD) * 97


def train(directory, versions, pause=0.0, name=NAME, *extra):
    """Runs the trainer to the end; returns the versions it wrote."""
    done = subprocess.run([sys.executable, "-c", TRAINER, str(directory), str(versions), str(pause), name, *extra],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return [int(v) for v in done.stdout.split()]


def wait_for_version(server, version, timeout=60):
    deadline = time.monotonic() + timeout
    while torch_recdev.server_stats(server.address)["serving_version"] < version:
        assert server.alive() and time.monotonic() < deadline, server.log()
        time.sleep(0.05)


@pytest.fixture
def connected():
    yield
    torch_recdev.connect(None)


def test_lookups_see_one_whole_version_while_versions_arrive(tmp_path, connected):
    train(tmp_path, 1)
    server = local_shards.Server(0, 1, "--serve", str(tmp_path))
    try:
        torch_recdev.connect(local_shards.server_list([server]), read_only=True)
        served = ops.init_embedding_table(NAME, ROWS, DIM)  # opens the served table
        seen, failures, stop = [], [], threading.Event()

        def look_up():
            while not stop.is_set():
                try:
                    values = ops.emb_read(served, IDS).cpu().unique()
                except Exception as error:  # noqa: BLE001 - any failure is the finding
                    failures.append(error)
                    return
                seen.append([round(v - 1 / 3) for v in values.tolist()])

        readers = [threading.Thread(target=look_up) for _ in range(2)]
        for reader in readers:
            reader.start()
        trainer = subprocess.Popen([sys.executable, "-c", TRAINER, str(tmp_path), "8", "0.15", NAME],
                                   stdout=subprocess.PIPE, text=True)
        written = [int(line) for line in trainer.stdout]
        assert trainer.wait(120) == 0 and written[-1] == 9, written
        wait_for_version(server, 9)
        time.sleep(0.2)
        stop.set()
        for reader in readers:
            reader.join()
        assert not failures, failures
        assert all(len(values) == 1 for values in seen), [v for v in seen if len(v) != 1][:3]
        versions_seen = sorted({values[0] for values in seen})
        assert versions_seen[-1] == 8 and len(versions_seen) >= 3, versions_seen  # (v9 holds rows = 8)
        stats = torch_recdev.server_stats(server.address)
        assert stats["serving_dir"] == str(tmp_path) and stats["serving_age_seconds"] >= 0
        assert "serving version 9 of" in server.log()
        printed = subprocess.run([local_shards.server.executable(), "--stats", server.address], capture_output=True,
                                 text=True, timeout=30).stdout
        assert f"serving      version 9 of {tmp_path}, written " in printed, printed
    finally:
        server.stop()


def test_a_damaged_version_is_refused_and_the_one_before_keeps_serving(tmp_path, connected):
    staging = tmp_path / "staging"
    train(staging, 3, 0.0, NAME, "pad")  # a base and two deltas
    served_dir = tmp_path / "served"
    served_dir.mkdir()
    for name in ("v00000001-base.recdev", "v00000002-delta.recdev"):
        shutil.copy(staging / name, served_dir / name)
    server = local_shards.Server(0, 1, "--serve", str(served_dir))
    try:
        wait_for_version(server, 2)
        # The third, its delta damaged, appears at once (a rename, as writers do).
        data = bytearray((staging / "v00000003-delta.recdev").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (staging / "damaged").write_bytes(bytes(data))
        (staging / "damaged").rename(served_dir / "v00000003-delta.recdev")
        deadline = time.monotonic() + 30
        while "refused" not in server.log():
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.05)
        assert "version 3 of" in server.log() and "v00000003-delta.recdev" in server.log()
        assert "still serving version 2" in server.log()
        torch_recdev.connect(local_shards.server_list([server]), read_only=True)
        served = ops.init_embedding_table(NAME, ROWS, DIM)
        assert ops.emb_read(served, IDS).cpu().unique().tolist() == [torch.tensor(2 + 1 / 3).item()]
        assert torch_recdev.server_stats(server.address)["serving_version"] == 2
    finally:
        server.stop()


def test_writes_are_refused_naming_the_read_only_server(tmp_path, connected):
    train(tmp_path, 1)
    server = local_shards.Server(0, 1, "--serve", str(tmp_path))
    try:
        # A plain connection: the shard refuses, naming itself.
        torch_recdev.connect(local_shards.server_list([server]))
        served = ops.init_embedding_table(NAME, ROWS, DIM)
        for attempt in (lambda: ops.emb_write(served, IDS[:2], torch.zeros(2, DIM)),
                        lambda: ops.emb_update(served, IDS[:2], torch.ones(2, DIM)),
                        lambda: ops.emb_delete(served, IDS[:2]),
                        lambda: ops.init_embedding_table(NAME, ROWS, DIM, reset=True),
                        lambda: ops.init_embedding_table("serve.new", ROWS, DIM)):
            with pytest.raises((PermissionError, KeyError), match="read-only serving shard|not in version 1"):
                attempt()
        with wire.Connection(server.port) as raw:  # the wire itself: no table is freed either
            (table_id, _, _), = raw.list()
            with pytest.raises(ServerError, match="read-only serving shard"):
                raw.call("FREE_TABLE", u64(table_id))
        assert ops.emb_read(served, IDS).cpu().unique().tolist() == [torch.tensor(1 + 1 / 3).item()]
        # A read-only connection refuses before sending; declarations only open.
        torch_recdev.connect(local_shards.server_list([server]), read_only=True)
        served = ops.init_embedding_table(NAME, ROWS, DIM, init=torch_recdev.Normal(0, 1))
        errors = torch_recdev.server_stats(server.address)["errors"]
        with pytest.raises(PermissionError, match="connection is read-only"):
            ops.emb_write(served, IDS[:2], torch.zeros(2, DIM))
        assert torch_recdev.server_stats(server.address)["errors"] == errors
        with pytest.raises(KeyError, match="not on the servers"):
            ops.init_embedding_table("serve.missing", ROWS, DIM)
        with pytest.raises(ValueError, match="dim 8.*dim 16"):
            ops.init_embedding_table(NAME, ROWS, 16)
        with pytest.raises(ValueError, match="read_only=True needs servers"):
            torch_recdev.connect(None, read_only=True)
    finally:
        server.stop()
    bad = subprocess.run([local_shards.server.executable(), "--serve", str(tmp_path), "--checkpoint-dir",
                          str(tmp_path / "c")], capture_output=True, text=True, timeout=30)
    assert bad.returncode != 0 and "--serve and --checkpoint-dir" in bad.stderr


def test_two_serving_shards_split_the_rows_and_a_model_looks_up_through_them(tmp_path, connected):
    train(tmp_path, 3, name="ctr.bag.weight")
    servers = local_shards.start_shards(2, "--serve", str(tmp_path))
    try:
        for server in servers:
            wait_for_version(server, 3)
        counts = [torch_recdev.server_stats(s.address)["rows"] for s in servers]
        assert sum(counts) == HELD and min(counts) > 0, counts

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.bag = torch.nn.EmbeddingBag(ROWS, DIM, mode="sum", device="recdev")

        model = Model()  # on the embedded store, as the training code builds it
        torch_recdev.connect(local_shards.server_list(servers), read_only=True)
        torch_recdev.share_tables(model, prefix="ctr.")  # opens the served "ctr.bag.weight"
        model.eval()
        with torch.no_grad():
            pooled = model.bag(IDS[:64].view(16, 4))
        bag_of_four = torch.full((4, DIM), 3 + 1 / 3).sum(0)
        assert torch.allclose(pooled.cpu(), bag_of_four.expand(16, DIM), rtol=0, atol=1e-6)
    finally:
        for server in servers:
            server.stop()


def test_an_export_serves_float16_rows_without_optimizer_state(tmp_path, connected):
    written = train(tmp_path, 2, 0.0, NAME, "export")
    assert written == [1, 2, 1]  # the export is version 1 of its own directory
    export = tmp_path / "export"
    (exported,) = ops.version_files(export)
    (trained,) = [f for f in ops.version_files(tmp_path) if f["kind"] == "base"]
    # A row: its id and 8 float16 values (24 bytes) instead of its id, 8 float32 weights and 8 Adagrad
    # states (72 bytes).
    assert abs(exported["bytes"] / trained["bytes"] - 1 / 3) < 0.01
    server = local_shards.Server(0, 1, "--serve", str(export))
    try:
        wait_for_version(server, 1)
        torch_recdev.connect(local_shards.server_list([server]), read_only=True)
        with pytest.raises(ValueError, match="dtype"):
            ops.init_embedding_table(NAME, ROWS, DIM)  # float32: the export holds float16 rows
        served = ops.init_embedding_table(NAME, ROWS, DIM, dtype=torch.float16)
        rows = ops.emb_read(served, IDS).cpu()
        assert rows.dtype == torch.float16
        assert rows.unique().tolist() == [torch.tensor(2 + 1 / 3, dtype=torch.float16).item()]  # rounded to nearest
    finally:
        server.stop()
