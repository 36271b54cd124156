"""The disk tier on the engine (csrc/store/disk_tier.h, docs/disk_tier.md): a spilling table against
an unbounded twin, bit for bit; races between readers and the rows moving between the tiers; the
tier's files — corrupt blocks, a full file system, an unwritable directory, what dead processes
left behind."""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from threads import run_threads

NUM_IDS = 5000
DIM = 8


@pytest.fixture
def disk_dir(store_mod, tmp_path):
    path = tmp_path / "disk"
    store_mod.set_disk_dir(str(path))
    yield path
    store_mod.set_disk_dir("")


def twins(store_mod, optimizer, num_ids=NUM_IDS, dim=DIM, **policy):
    """(table, twin): the same init values and optimizer; `policy` on the table only."""
    store = store_mod.Store()
    config = store_mod.TableConfig(num_rows=num_ids, row_words=dim, init=store_mod.InitRule.normal(0, 1, seed=5))
    table = store.table(store.create_table(config, init_stream=77))
    twin = store.table(store.create_table(config, init_stream=77))
    for t in (table, twin):
        t.set_optimizer(optimizer)
    table.set_policy(**policy)
    return store, table, twin


def assert_same(table, twin, num_ids=NUM_IDS):
    ids = np.arange(num_ids, dtype=np.uint64)
    np.testing.assert_array_equal(table.peek(ids).view(np.uint32), twin.peek(ids).view(np.uint32))
    np.testing.assert_array_equal(table.gather_state(ids).view(np.uint32), twin.gather_state(ids).view(np.uint32))
    np.testing.assert_array_equal(table.exists(ids), twin.exists(ids))


OPTIMIZERS = {
    "sgd": lambda s: s.OptimizerConfig.sgd(lr=0.5, weight_decay=0.01),
    "adagrad": lambda s: s.OptimizerConfig(kind=s.OptimizerKind.Adagrad, lr=0.1),
    "rowwise_adagrad": lambda s: s.OptimizerConfig(kind=s.OptimizerKind.RowWiseAdagrad, lr=0.1),
    "adam": lambda s: s.OptimizerConfig(kind=s.OptimizerKind.Adam, lr=0.01),
}


@pytest.mark.parametrize("evict", ["lru", "lfu"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_a_spilled_table_trains_like_an_unbounded_twin(store_mod, disk_dir, rng, optimizer, evict):
    """A budget of 2% of the rows touched: nearly every batch brings rows back from disk and sends
    others there, and rows, optimizer state and existence stay those of the twin."""
    _, table, twin = twins(store_mod, OPTIMIZERS[optimizer](store_mod), max_rows=60, evict=evict, spill=True)
    for step in range(150):
        ids = (rng.zipf(1.2, size=48) % 3000).astype(np.uint64)
        grads = rng.standard_normal((48, DIM)).astype(np.float32)
        np.testing.assert_array_equal(table.gather(ids), twin.gather(ids))
        table.update(ids, grads)
        twin.update(ids, grads)
        if step % 50 == 49:
            assert_same(table, twin)
    stats = table.stats()
    assert stats.rows_in_memory <= 60 and stats.rows_on_disk > 1000
    assert stats.rows == stats.rows_in_memory + stats.rows_on_disk == twin.stats().rows
    assert stats.disk_reads > 0 and stats.disk_writes >= stats.rows_on_disk
    assert stats.disk_bytes >= stats.disk_live_bytes > 0
    assert_same(table, twin)


def test_pooled_lookups_writes_erase_and_snapshots_see_both_tiers(store_mod, disk_dir, rng):
    store, table, twin = twins(store_mod, OPTIMIZERS["adagrad"](store_mod), max_rows=20, evict="lru", spill=True)
    ids = np.arange(400, dtype=np.uint64)
    rows = rng.standard_normal((400, DIM)).astype(np.float32)
    for batch in range(0, 400, 20):  # a request stores at most the budget's rows
        table.write(ids[batch:batch + 20], rows[batch:batch + 20])
        twin.write(ids[batch:batch + 20], rows[batch:batch + 20])
    assert table.stats().rows_on_disk == 380
    offsets = np.arange(0, 20, 4, dtype=np.int64)
    order = rng.permutation(400).astype(np.uint64)
    for batch in range(0, 400, 20):
        bags = order[batch:batch + 20]
        np.testing.assert_array_equal(table.gather_pooled(bags, offsets)[0], twin.gather_pooled(bags, offsets)[0])
        table.update_pooled(bags, offsets, np.ones((5, DIM), np.float32))
        twin.update_pooled(bags, offsets, np.ones((5, DIM), np.float32))
    table.write_bytes(3 * DIM * 4 + 4, np.array([7.0, 8.0], np.float32))
    twin.write_bytes(3 * DIM * 4 + 4, np.array([7.0, 8.0], np.float32))
    np.testing.assert_array_equal(table.read_bytes(0, 400 * DIM * 4), twin.read_bytes(0, 400 * DIM * 4))  # no touch
    table.erase(ids[::3])
    twin.erase(ids[::3])
    assert_same(table, twin)
    # A checkpoint holds the rows of both tiers; loading it into a fresh spilling table gives them back.
    path = disk_dir.parent / "table.ckpt"
    store_mod.save_table(str(path), table, "t")
    config = store_mod.TableConfig(num_rows=NUM_IDS, row_words=DIM, init=store_mod.InitRule.normal(0, 1, seed=5))
    loaded = store.table(store.create_table(config, init_stream=77))
    loaded.set_policy(max_rows=20, evict="lru", spill=True)
    store_mod.load_table(str(path), loaded)
    assert_same(loaded, twin)
    assert loaded.stats().rows_in_memory <= 20


def test_spill_off_brings_every_row_back_and_a_new_optimizer_relays_them(store_mod, disk_dir, rng):
    _, table, twin = twins(store_mod, OPTIMIZERS["adam"](store_mod), max_rows=50, evict="lru", spill=True)
    ids = np.arange(200, dtype=np.uint64)
    grads = rng.standard_normal((200, DIM)).astype(np.float32)
    for t in (table, twin):
        for batch in range(0, 200, 50):
            t.update(ids[batch:batch + 50], grads[batch:batch + 50])
    # Another kind of optimizer: every row's state restarts, on disk as in memory.
    for t in (table, twin):
        t.set_optimizer(OPTIMIZERS["rowwise_adagrad"](store_mod))
        t.update(ids[:50], grads[:50])
    assert_same(table, twin, 200)
    table.set_policy(max_rows=500, evict="lru")  # no spill: the rows on disk come back
    assert (table.stats().rows_on_disk, table.stats().rows_in_memory) == (0, 200)
    assert_same(table, twin, 200)
    assert os.listdir(disk_dir) == []  # the table's directory went with its tier


def test_max_disk_bytes_drops_the_oldest_spilled_rows_and_counts_them(store_mod, disk_dir, rng):
    _, table, _ = twins(store_mod, OPTIMIZERS["sgd"](store_mod), num_ids=10**6, dim=256, max_rows=1000, evict="lru",
                        spill=True, max_disk_bytes=2 << 20)
    for start in range(0, 20000, 1000):
        table.write(np.arange(start, start + 1000, dtype=np.uint64), np.ones((1000, 256), np.float32))
    stats = table.stats()
    assert stats.disk_bytes <= (2 << 20) + (16 << 20)  # past it by at most the segment being filled
    # evicted counts both tiers' evictions: the 19,000 rows spilled, and those dropped from disk.
    assert stats.evicted > 19000 and stats.rows == 20000 - (stats.evicted - 19000)


def test_readers_never_see_a_row_torn_or_lost_while_it_moves_between_tiers(store_mod, disk_dir):
    """Writers keep every row's words equal (all k) while a tiny budget spills and brings rows back
    at every request; readers that do not touch (peek, read_bytes, exists) and readers that do
    (gather) must see whole rows, of a value the row had, and every row present."""
    _, table, _ = twins(store_mod, OPTIMIZERS["sgd"](store_mod), num_ids=2000, max_rows=16, evict="lru", spill=True)
    ids = np.arange(64, dtype=np.uint64)
    for batch in range(0, 64, 16):
        table.write(ids[batch:batch + 16], np.zeros((16, DIM), np.float32))
    stop = threading.Event()

    def writer():
        for k in range(1, 300):
            chosen = np.random.default_rng(k).choice(64, size=8, replace=False).astype(np.uint64)
            table.write(chosen, np.full((8, DIM), float(k), np.float32))
        stop.set()

    def check(rows):
        assert np.all(rows == rows[:, :1]), f"torn rows: {rows[~np.all(rows == rows[:, :1], axis=1)]}"

    def peeker():
        while not stop.is_set():
            check(table.peek(ids))
            check(np.frombuffer(table.read_bytes(0, 64 * DIM * 4), np.float32).reshape(64, DIM))
            assert table.exists(ids).all()

    def gatherer():
        while not stop.is_set():
            check(table.gather(ids[np.random.default_rng().choice(64, size=8, replace=False)]))

    run_threads([writer, peeker, peeker, gatherer])
    stats = table.stats()
    assert stats.rows == 64 and stats.rows_in_memory <= 16 and stats.disk_reads > 0


def test_a_snapshot_while_spilling_holds_each_request_wholly(store_mod, disk_dir):
    """Writes set 32 rows to one new value, alternating between two sets of ids with room for one in
    memory, so that each write spills the other set; a snapshot taken meanwhile must hold every write
    wholly or not at all: within each set, one value."""
    _, table, _ = twins(store_mod, OPTIMIZERS["sgd"](store_mod), num_ids=2000, max_rows=32, evict="lru", spill=True)
    sets = (np.arange(32, dtype=np.uint64), np.arange(32, 64, dtype=np.uint64))
    for ids in sets:
        table.write(ids, np.zeros((32, DIM), np.float32))
    stop = threading.Event()
    seen = []

    def writer():
        for k in range(1, 200):
            table.write(sets[k % 2], np.full((32, DIM), float(k), np.float32))
        stop.set()

    def snapshotter(tmp=disk_dir.parent):
        copy = store_mod.Store()
        config = store_mod.TableConfig(num_rows=2000, row_words=DIM, init=store_mod.InitRule.zero())
        target = copy.table(copy.create_table(config))
        while not stop.is_set():
            path = str(tmp / "snapshot.ckpt")
            store_mod.save_table(path, table, "t")
            store_mod.load_table(path, target)
            seen.append([set(target.peek(ids)[:, 0].tolist()) for ids in sets])

    run_threads([writer, snapshotter])
    assert seen and all(len(values) == 1 for snapshot in seen for values in snapshot), seen[:3]
    assert table.stats().disk_writes > 100


def segment_files(disk_dir):
    return sorted(p for p in disk_dir.rglob("segment-*.blocks"))


def test_a_corrupt_block_is_refused_naming_the_file_and_the_rest_keeps_serving(store_mod, disk_dir):
    _, table, twin = twins(store_mod, OPTIMIZERS["sgd"](store_mod), max_rows=100, evict="lru", spill=True)
    ids = np.arange(2000, dtype=np.uint64)
    rows = np.arange(2000 * DIM, dtype=np.float32).reshape(2000, DIM)
    for batch in range(0, 2000, 100):
        table.write(ids[batch:batch + 100], rows[batch:batch + 100])
    table.gather(ids[:10])  # a request flushes the previous one's spilled rows to their files
    (segment,) = segment_files(disk_dir)
    with open(segment, "r+b") as f:  # one flipped bit in the first block's records
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 1]))
    before = table.stats()
    with pytest.raises(ValueError, match=r"block 0 of the disk tier's file .*segment-0\.blocks fails its checksum"):
        table.gather(ids[10:12])
    after = table.stats()
    assert (after.rows, after.rows_on_disk, after.evicted) == (before.rows, before.rows_on_disk, before.evicted)
    with pytest.raises(ValueError, match="fails its checksum"):
        table.peek(ids[10:11])
    # Rows in other blocks still come back exactly; the damaged ones can be erased.
    np.testing.assert_array_equal(table.gather(ids[1500:1505]), rows[1500:1505])
    table.erase(ids[10:12])
    np.testing.assert_array_equal(table.gather(ids[10:12]), twin.gather(ids[10:12]))


def test_spill_needs_a_disk_directory_and_evict(store_mod, tmp_path):
    store_mod.set_disk_dir("")
    _, table, _ = twins(store_mod, OPTIMIZERS["sgd"](store_mod))
    with pytest.raises(ValueError, match=r"spill=True needs a disk directory.*set_disk_dir"):
        table.set_policy(max_rows=10, evict="lru", spill=True)
    assert table.policy["spill"] is False
    with pytest.raises(ValueError, match="spill=True .* evict="):
        table.set_policy(max_rows=10, spill=True)
    with pytest.raises(ValueError, match="max_disk_bytes .* needs spill=True"):
        table.set_policy(max_rows=10, evict="lru", max_disk_bytes=1 << 20)
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    with pytest.raises(OSError, match="not a directory"):
        store_mod.set_disk_dir(str(blocked))
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(OSError, match="cannot create files in the disk directory"):
            store_mod.set_disk_dir(str(locked))


def test_what_a_dead_process_left_is_removed_and_a_live_ones_kept(store_mod, disk_dir):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = disk_dir / f"recdev-{int(dead.stdout)}-0"
    left.mkdir(parents=True)
    (left / "segment-0.blocks").write_bytes(b"x" * 4096)
    alive = disk_dir / f"recdev-{os.getppid()}-3"
    alive.mkdir()
    assert store_mod.set_disk_dir(str(disk_dir)) == 1
    assert not left.exists() and alive.exists()


@pytest.fixture
def small_file_system(tmp_path):
    """A 2 MiB tmpfs: a disk that fills up. Mounting one needs root, which CI has; as root a mount that
    fails is this test's failure, and only a run without root skips it."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a 2 MiB tmpfs to fill up needs root (CI runs as root)")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)], check=True,
                   capture_output=True)
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_a_full_disk_refuses_the_next_request_and_loses_nothing(store_mod, small_file_system, rng):
    store_mod.set_disk_dir(str(small_file_system))
    try:
        _, table, twin = twins(store_mod, OPTIMIZERS["adagrad"](store_mod), num_ids=10**6, dim=64, max_rows=1000,
                               evict="lru", spill=True)
        refused = None
        for start in range(0, 40000, 1000):
            ids = np.arange(start, start + 1000, dtype=np.uint64)
            rows = rng.standard_normal((1000, 64)).astype(np.float32)
            try:
                table.write(ids, rows)
            except OSError as error:
                refused = (start, str(error))
                break
            twin.write(ids, rows)
        assert refused is not None, "a 2 MiB file system held 40,000 rows of 256 bytes"
        assert "No space left on device" in refused[1] and str(small_file_system) in refused[1]
        # The refused write changed nothing, and every row written before reads back exactly.
        written = np.arange(refused[0], dtype=np.uint64)
        assert table.stats().rows == refused[0]
        np.testing.assert_array_equal(table.peek(written), twin.peek(written))
        assert not table.exists(np.arange(refused[0], refused[0] + 1000, dtype=np.uint64)).any()
    finally:
        store_mod.set_disk_dir("")


def test_compaction_keeps_the_files_within_twice_the_live_rows(store_mod, disk_dir, rng, monkeypatch):
    """Small segments (RECDEV_DISK_SEGMENT_BYTES) and a stream that keeps bringing rows back and
    spilling them again, so that most records on disk die: compaction rewrites the emptiest segments,
    the files stay within 2x the live records plus a segment, and every row stays exact."""
    monkeypatch.setenv("RECDEV_DISK_SEGMENT_BYTES", str(64 << 10))
    _, table, twin = twins(store_mod, OPTIMIZERS["adagrad"](store_mod), dim=32, max_rows=50, evict="lru", spill=True)
    for step in range(400):
        ids = rng.integers(0, 600, size=40).astype(np.uint64)
        grads = rng.standard_normal((40, 32)).astype(np.float32)
        table.update(ids, grads)
        twin.update(ids, grads)
        stats = table.stats()
        record_bytes = 8 + 32 * 4 * 2
        live = stats.rows_on_disk * record_bytes
        assert stats.disk_bytes <= 2 * live + 2 * (64 << 10) + 40 * 4096, (step, stats.disk_bytes, live)
    assert stats.disk_writes > 5 * stats.rows_on_disk  # the same rows went to disk again and again
    assert_same(table, twin, 600)
