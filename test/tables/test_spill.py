"""The disk tier through the public API (docs/disk_tier.md), on the embedded store and on two shards
(test/conftest.py's store_backend; the session shards run with --disk-dir): a spilled table trains
bit for bit like an unbounded twin, for every optimizer and dtype, with a memory budget of a few
percent of the rows it touches; its stats, policy, checkpoints and bad input."""

import io
import uuid

import pytest
import torch

import torch_recdev
from torch_recdev import _C, ops

OPTIMIZERS = (("sgd", {"lr": 0.5}), ("adagrad", {"lr": 0.1}), ("rowwise_adagrad", {"lr": 0.1}), ("adam", {"lr": 0.01}))
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
DIM = 8
ROWS_TOUCHED = 1500


@pytest.fixture(autouse=True)
def disk_dir(tmp_path, store_backend):
    """The embedded store's disk tier in the test's directory (the shards have their own)."""
    torch_recdev.set_disk_dir(tmp_path / "disk")
    return tmp_path / "disk"


def declare(dtype, optimizer, **policy):
    # Zero: a named table draws Normal values from its name, and the twins have two names.
    return ops.init_embedding_table(f"spill_{uuid.uuid4().hex}", 10**9, DIM, init=torch_recdev.Zero(),
                                    optimizer=optimizer, dtype=dtype, **policy)


def rows_and_state(table) -> dict:
    """Every row the table holds (both tiers), weight and optimizer state, by id."""
    _, ids, records = _C._table_snapshot(table)
    order = ids.argsort()
    return {"ids": ids[order], "records": records[order]}


def assert_same(table, twin):
    got, want = rows_and_state(table), rows_and_state(twin)
    assert torch.equal(got["ids"], want["ids"])
    assert torch.equal(got["records"].view(torch.int32), want["records"].view(torch.int32))


def train(tables, steps, seed=0, batch=40):
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        keys = torch.randint(0, ROWS_TOUCHED, (batch,), generator=generator) * 7919
        grads = torch.randn(batch, DIM, generator=generator)
        looked_up = [ops.emb_read(t, keys) for t in tables]
        assert all(torch.equal(looked_up[0], other) for other in looked_up[1:])
        for t in tables:
            ops.emb_update(t, keys, grads.to(t.dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: o[0])
def test_a_spilled_table_trains_bit_for_bit_like_an_unbounded_twin(dtype, optimizer):
    # 100 rows in memory (50 per shard on two): about 8% of the ~1,200 rows the stream touches.
    table = declare(dtype, optimizer, max_rows=100, evict="lru", spill=True)
    twin = declare(dtype, optimizer)
    train([table, twin], steps=60)
    assert_same(table, twin)
    stats = torch_recdev.table_stats(table)
    assert stats["rows_in_memory"] <= 100 and stats["rows_on_disk"] > 500
    assert stats["rows"] == stats["rows_in_memory"] + stats["rows_on_disk"] == torch_recdev.table_stats(twin)["rows"]
    assert stats["disk_reads"] > 0 and stats["disk_writes"] > 0 and stats["disk_bytes"] > 0
    assert stats["evicted"] == stats["disk_writes"]  # every row evicted went to disk; none was dropped
    assert ops.emb_exists(table, torch.arange(0, 7919 * 20, 7919)).tolist() == \
        ops.emb_exists(twin, torch.arange(0, 7919 * 20, 7919)).tolist()


def test_lookups_through_a_module_and_pooled_lookups_come_back_exactly(store_backend):
    bag = torch.nn.EmbeddingBag(10**8, DIM, mode="sum", device="recdev")  # large enough to be a lazy table
    dense = torch.nn.EmbeddingBag(10**8, DIM, mode="sum", device="recdev")
    with torch.no_grad():
        dense.weight.copy_(bag.weight)  # lazily: the same init rule, no row held
    torch_recdev.set_table_policy(bag.weight, max_rows=64, evict="lfu", spill=True)
    generator = torch.Generator().manual_seed(3)
    for _ in range(30):
        ids = torch.randint(0, 5000, (32,), generator=generator).to("recdev")
        offsets = torch.arange(0, 32, 4).to("recdev")
        pooled, want = bag(ids, offsets).cpu(), dense(ids, offsets).cpu()
        if store_backend == "embedded":
            assert torch.equal(pooled, want)
        else:  # shards pool their parts of a bag, split by each table's own routing: sums differ in order
            torch.testing.assert_close(pooled, want, rtol=1e-6, atol=1e-6)
        assert torch.equal(bag.weight.detach()[ids].cpu(), dense.weight.detach()[ids].cpu())
    assert torch_recdev.table_stats(bag.weight)["rows_on_disk"] > 0


def test_the_policy_reports_spill_and_bad_spill_arguments_are_refused():
    table = declare(torch.float32, ("sgd", {"lr": 0.1}), max_rows=100, evict="lru", spill=True,
                    max_disk_bytes=1 << 30)
    assert torch_recdev.table_policy(table) == dict(max_rows=100, max_bytes=None, evict="lru", ttl=None,
                                                    admit_after=1, spill=True, max_disk_bytes=1 << 30)
    with pytest.raises(ValueError, match="spill=True .* evict="):
        torch_recdev.set_table_policy(table, max_rows=10, spill=True)
    with pytest.raises(ValueError, match="max_disk_bytes bounds the disk tier: it needs spill=True"):
        torch_recdev.set_table_policy(table, max_rows=10, evict="lru", max_disk_bytes=5)
    with pytest.raises(ValueError, match="spill must be True or False"):
        torch_recdev.set_table_policy(table, max_rows=10, evict="lru", spill="yes")
    with pytest.raises(ValueError, match="set_disk_dir expects a directory path"):
        torch_recdev.set_disk_dir("")
    assert torch_recdev.table_policy(table)["spill"] is True  # refused: nothing changed


@pytest.mark.parametrize("via", ["ops.save", "torch.save"])
def test_checkpoints_hold_the_rows_on_disk(tmp_path, via):
    table = declare(torch.float16, ("adagrad", {"lr": 0.1}), max_rows=100, evict="lru", spill=True)
    twin = declare(torch.float16, ("adagrad", {"lr": 0.1}))
    train([table, twin], steps=30)
    expected = rows_and_state(twin)
    if via == "ops.save":
        ops.save(tmp_path / "store.ckpt")
        train([table], steps=10, seed=1)  # moves rows between the tiers, and changes them
        ops.load(tmp_path / "store.ckpt")
        restored = table
    else:
        buffer = io.BytesIO()
        torch.save(table, buffer)
        buffer.seek(0)
        restored = torch.load(buffer)
    got = rows_and_state(restored)
    assert torch.equal(got["ids"], expected["ids"]) and torch.equal(got["records"], expected["records"])
    stats = torch_recdev.table_stats(restored)
    assert stats["rows_in_memory"] <= 100 and stats["rows_on_disk"] == stats["rows"] - stats["rows_in_memory"] > 0
    assert torch_recdev.table_policy(restored)["spill"] is True
    # And training goes on from there exactly as the twin's.
    train([restored, twin], steps=10, seed=2)
    assert_same(restored, twin)
