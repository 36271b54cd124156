"""Incremental checkpoints (ops.checkpoint / restore / versions; docs/online.md), on the embedded
store and on two shards: every version restores bit for bit, deltas hold only what changed, a
version holds each request wholly or not at all, and bad input is refused with nothing changed."""

import os
import tempfile
import threading
import uuid

import pytest
import torch

import torch_recdev
from shard_groups import shard_groups
from torch_recdev import _C, ops


def state_of(table):
    """Every held row with its optimizer state, by id, and the table's counters."""
    _, ids, records = _C._table_snapshot(table)
    order = ids.argsort()
    stats = torch_recdev.table_stats(table)
    counters = {k: stats[k] for k in ("rows", "rows_on_disk", "evicted", "admitted")}
    return ids[order].clone(), records[order].view(torch.int32).clone(), _C._table_optimizer_step(table), counters


def assert_same(got, want, what):
    assert torch.equal(got[0], want[0]), f"{what}: row ids differ"
    assert torch.equal(got[1], want[1]), f"{what}: records differ (compared bit for bit)"
    assert got[2:] == want[2:], f"{what}: step or counters {got[2:]} != {want[2:]}"


def declare(prefix, dtype, **policy):
    return ops.init_embedding_table(f"{prefix}_{str(dtype)[6:]}", 10**9, 8, dtype=dtype,
                                    init=torch_recdev.Normal(0.0, 0.1), optimizer=("adagrad", {"lr": 0.05}), **policy)


@pytest.mark.parametrize("policy", [{}, dict(max_rows=300, evict="lru"), dict(max_rows=300, evict="lfu", admit_after=2),
                                    dict(max_rows=100, evict="lru", spill=True)],
                         ids=["unbounded", "lru", "lfu-admission", "spilled"])
def test_every_version_restores_bit_for_bit(tmp_path, policy, on_every_store):
    if policy.get("spill") and on_every_store == "embedded":
        # The shards have theirs (--disk-dir); one that outlives the test, as the tables do.
        torch_recdev.set_disk_dir(tempfile.mkdtemp(prefix="recdev-versions-disk-"))
    prefix = f"v_{uuid.uuid4().hex[:8]}"
    dtypes = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
    tables = [declare(prefix, dtype, **policy) for dtype in dtypes]
    generator = torch.Generator().manual_seed(0)
    for table in tables:
        for first in range(10_000, 10_000 + (300 if policy else 5000), 50):  # within a shard's share of the budget
            ops.emb_read(table, torch.arange(first, first + 50))
    # Ballast: a base large enough that the deltas below stay under it, so that no compaction folds
    # the versions this test restores one by one.
    ballast = ops.init_embedding_table(prefix + "_ballast", 10**6, 64, init=torch_recdev.Zero())
    ops.emb_write(ballast, torch.arange(20_000), torch.ones(20_000, 64))
    expected = {}
    for step in range(6):
        for table in tables:
            keys = torch.randint(0, 2000 if step < 3 else 5000, (40,), generator=generator)
            ops.emb_read(table, keys)
            ops.emb_update(table, keys, torch.randn(40, 8, generator=generator).to(table.dtype))
            if step == 4:
                ops.emb_delete(table, keys[:20])
        version = ops.checkpoint(tmp_path)
        assert version == step + 1
        expected[version] = [state_of(t) for t in tables]
    assert ops.versions(tmp_path) == list(range(1, 7))
    kinds = [f["kind"] for f in ops.version_files(tmp_path)]
    assert kinds[0] == "base" and set(kinds[1:]) <= {"delta", "base"}
    for version in (3, 1, 6, 5):
        assert ops.restore(tmp_path, version) == version
        for table, want in zip(tables, expected[version]):
            assert_same(state_of(table), want, f"version {version} of {table.dtype}")
    assert ops.restore(tmp_path) == 6  # the newest


def test_a_delta_holds_only_the_rows_changed_since_the_version_before(tmp_path):
    table = ops.init_embedding_table(f"d_{uuid.uuid4().hex[:8]}", 10**6, 32, optimizer=("adagrad", {"lr": 0.1}))
    ops.emb_update(table, torch.arange(20_000), torch.ones(20_000, 32))
    ops.checkpoint(tmp_path)
    ops.emb_update(table, torch.arange(200), torch.ones(200, 32))  # 1% of the rows
    ops.emb_read(table, torch.arange(10_000))  # reads change nothing
    ops.checkpoint(tmp_path)
    ops.checkpoint(tmp_path)  # nothing changed: the headers of the store's tables (earlier tests' too)
    base, delta, empty = ops.version_files(tmp_path)
    assert (base["kind"], delta["kind"], empty["kind"]) == ("base", "delta", "delta")
    row_bytes = 8 + 4 * (32 + 32)
    assert base["bytes"] > 20_000 * row_bytes
    assert 200 * row_bytes <= delta["bytes"] - empty["bytes"] < 210 * row_bytes, (delta, empty)


def test_erased_and_evicted_rows_are_gone_in_the_versions_after_and_back_in_those_before(tmp_path):
    table = ops.init_embedding_table(f"e_{uuid.uuid4().hex[:8]}", 1000, 4, init=torch_recdev.Zero(),
                                     max_rows=100, evict="lru")
    everything = torch.arange(300)
    for first in range(0, 60, 20):  # batches within a shard's share of the budget
        ops.emb_write(table, torch.arange(first, first + 20), torch.ones(20, 4))
    ops.checkpoint(tmp_path)
    at_1 = ops.emb_exists(table, everything)
    ops.emb_delete(table, torch.arange(10))
    for first in range(100, 300, 20):  # evicts the rest of the first rows
        ops.emb_write(table, torch.arange(first, first + 20), torch.full((20, 4), 2.0))
    ops.checkpoint(tmp_path)
    at_2 = ops.emb_exists(table, everything)
    assert at_1[:60].all() and not at_2[:60].any() and at_2.sum() > 50
    ops.restore(tmp_path, 1)
    assert torch.equal(ops.emb_exists(table, everything), at_1)
    ops.restore(tmp_path, 2)
    assert torch.equal(ops.emb_exists(table, everything), at_2)
    held = everything[at_2.bool()]
    assert torch.equal(ops.emb_read(table, held).cpu(), torch.full((held.numel(), 4), 2.0))


def test_tables_created_reset_or_deleted_between_versions(tmp_path):
    prefix = f"c_{uuid.uuid4().hex[:8]}"
    a = ops.init_embedding_table(prefix + "_a", 100, 4, init=torch_recdev.Zero())
    ops.emb_write(a, torch.arange(5), torch.ones(5, 4))
    ops.checkpoint(tmp_path)
    b = ops.init_embedding_table(prefix + "_b", 100, 4, init=torch_recdev.Zero())
    ops.emb_write(b, torch.arange(3), torch.full((3, 4), 3.0))
    a = ops.init_embedding_table(prefix + "_a", 100, 4, init=torch_recdev.Zero(), reset=True)
    ops.emb_write(a, torch.tensor([7]), torch.full((1, 4), 7.0))
    ops.checkpoint(tmp_path)
    ops.restore(tmp_path, 1)
    assert ops.emb_exists(a, torch.arange(10)).tolist() == [True] * 5 + [False] * 5
    ops.restore(tmp_path, 2)
    assert ops.emb_exists(a, torch.arange(10)).tolist() == [False] * 7 + [True] + [False] * 2
    assert torch.equal(ops.emb_read(b, torch.arange(3)).cpu(), torch.full((3, 4), 3.0))


def compaction_workload(directory, steps):
    """A table with a base version in `directory`, and the number of rows a delta should rewrite so
    that compactions come every few versions: the base holds the store's other tables too (earlier
    tests' in this process), so each delta rewrites about a third of the base's bytes (a row is about
    40 of them) and a few pass it. `steps` more rows than that exist."""
    table = ops.init_embedding_table(f"k_{uuid.uuid4().hex[:8]}", 10**6, 8, optimizer=("sgd", {"lr": 0.5}))
    ops.emb_update(table, torch.arange(50_000), torch.ones(50_000, 8))
    ops.checkpoint(directory)
    return table, min(10**6 - steps, max(40_000, ops.version_files(directory)[0]["bytes"] // 120))


def test_compaction_folds_the_deltas_into_a_new_base_that_restores_the_same(tmp_path):
    table, rows = compaction_workload(tmp_path, 40)
    for step in range(40):
        ops.emb_update(table, torch.arange(rows) + step, torch.ones(rows, 8))
        ops.checkpoint(tmp_path)
        ops.wait_for_compaction(tmp_path)
        if ops.version_files(tmp_path)[0]["version"] > 1:
            break
    newest = step + 2
    want = state_of(table)
    files = ops.version_files(tmp_path)
    assert files[0]["kind"] == "base" and 1 < files[0]["version"] <= newest, files
    assert ops.versions(tmp_path)[-1] == newest
    ops.emb_update(table, torch.arange(1000), torch.ones(1000, 8))
    assert ops.restore(tmp_path) == newest
    assert_same(state_of(table), want, "the newest version after compaction")
    assert not [p for p in os.listdir(tmp_path) if ".tmp." in p]


def test_back_to_back_checkpoints_while_compactions_run(tmp_path):
    """A checkpoint that lists the directory while a compaction still folds it must not hand the next
    compaction that listing: files the first has removed since (an OSError from wait_for_compaction,
    in about half the runs before)."""
    table, rows = compaction_workload(tmp_path, 120)
    for step in range(120):
        ops.emb_update(table, torch.arange(rows) + step, torch.ones(rows, 8))
        ops.checkpoint(tmp_path)  # never waits for a compaction: several run while these are written
    ops.wait_for_compaction(tmp_path)
    files = ops.version_files(tmp_path)
    assert files[0]["kind"] == "base" and files[0]["version"] > 1, files
    want = state_of(table)
    ops.emb_update(table, torch.arange(1000), torch.ones(1000, 8))
    assert ops.restore(tmp_path) == 121
    assert_same(state_of(table), want, "the newest version after back-to-back compactions")


def test_a_version_holds_each_request_wholly_or_not_at_all(tmp_path):
    """Writers rewrite the same 256 rows with value k, request after request, while versions are cut:
    every version shows one k in all of them (in all of a shard's, on shards)."""
    name = f"a_{uuid.uuid4().hex[:8]}"
    table = ops.init_embedding_table(name, 10**6, 16, init=torch_recdev.Zero())
    keys = torch.randperm(10**6)[:256]
    # Ballast, as above: the twelve deltas stay under the base, so no compaction folds them.
    ballast = ops.init_embedding_table(name + "_ballast", 10**6, 64, init=torch_recdev.Zero())
    ops.emb_write(ballast, torch.arange(20_000), torch.ones(20_000, 64))
    stop = threading.Event()

    def write():
        k = 0
        while not stop.is_set():
            k += 1
            ops.emb_write(table, keys, torch.full((256, 16), float(k)))

    writer = threading.Thread(target=write)
    writer.start()
    try:
        written = [ops.checkpoint(tmp_path) for _ in range(12)]
    finally:
        stop.set()
        writer.join()
    for version in written:
        ops.restore(tmp_path, version)
        for group in shard_groups(name, keys.numpy()):  # a version is a point in time per shard
            values = ops.emb_read(table, torch.from_numpy(group)).cpu().unique()
            assert values.numel() == 1, f"version {version} holds parts of requests {values.tolist()}"


def test_bad_input_is_refused_with_nothing_changed(tmp_path):
    name = f"b_{uuid.uuid4().hex[:8]}"
    table = ops.init_embedding_table(name, 100, 4, init=torch_recdev.Zero())
    with pytest.raises(KeyError, match="no complete version"):
        ops.restore(tmp_path)
    with pytest.raises(KeyError, match="cannot list"):
        ops.restore(tmp_path / "missing")
    ops.emb_write(table, torch.arange(3), torch.ones(3, 4))
    ops.checkpoint(tmp_path)
    ops.emb_write(table, torch.arange(3), torch.full((3, 4), 2.0))
    ops.checkpoint(tmp_path)
    with pytest.raises(KeyError, match=r"no version 7 .* it has versions 1-2"):
        ops.restore(tmp_path, 7)
    with pytest.raises(ValueError, match="positive int"):
        ops.restore(tmp_path, 0)
    # A corrupt delta: refused, naming the file; the table keeps what it had.
    delta = next(f["path"] for f in ops.version_files(tmp_path) if f["version"] == 2)
    with open(delta, "r+b") as f:
        f.seek(-10, os.SEEK_END)
        byte = f.read(1)
        f.seek(-10, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    ops.emb_write(table, torch.arange(3), torch.full((3, 4), 5.0))
    with pytest.raises(ValueError, match=os.path.basename(delta)):
        ops.restore(tmp_path, 2)
    assert torch.equal(ops.emb_read(table, torch.arange(3)).cpu(), torch.full((3, 4), 5.0))
    assert ops.restore(tmp_path, 1) == 1  # the base still restores
    # A directory of another layout: the same name with another dim is refused before anything changes.
    other = tmp_path / "other"
    ops.init_embedding_table(name, 100, 4, init=torch_recdev.Zero(), reset=True)
    ops.checkpoint(other)
    torch_recdev.ops.init_embedding_table(name, 100, 8, init=torch_recdev.Zero(), reset=True)
    with pytest.raises(ValueError, match="dim=?4|dim=?8"):
        ops.restore(other)
    # Not a directory.
    plain = tmp_path / "plain"
    plain.write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        ops.checkpoint(plain)
