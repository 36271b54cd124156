"""The Python API of budgets, eviction and admission: ops.init_embedding_table(..., max_rows=, ...),
torch_recdev.set_table_policy / table_policy on module tables, table_stats, and bad input."""

import datetime
import pathlib
import sys
import uuid

import numpy as np
import pytest
import torch

import torch_recdev
from torch_recdev import ops

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "store"))
from policy_model import PolicyModel  # noqa: E402


@pytest.fixture
def store_backend(monkeypatch):
    """Embedded only (overrides test/conftest.py's): these tests count rows against one table-wide
    budget; on shards each shard keeps its own share (test/remote/test_remote_budgets.py)."""
    monkeypatch.delenv("RECDEV_SERVERS", raising=False)
    torch_recdev.connect(None)
    yield "embedded"


def _name():
    return f"budget_{uuid.uuid4().hex}"


def test_init_embedding_table_with_a_budget_keeps_it_after_every_batch():
    table = ops.init_embedding_table(_name(), 10**9, 8, init=torch_recdev.Normal(0, 0.1), max_rows=100, evict="lru",
                                     optimizer=("sgd", {"lr": 0.1}))
    for step in range(20):
        keys = torch.arange(step * 30, step * 30 + 30)
        ops.emb_read(table, keys)
        ops.emb_update(table, keys, torch.ones(30, 8))
        assert torch_recdev.table_stats(table)["rows"] <= 100
    stats = torch_recdev.table_stats(table)
    assert stats["rows"] == 100
    assert stats["evicted"] == 600 - 100
    assert stats["admitted"] == 600
    assert stats["policy"]["max_rows"] == 100 and stats["policy"]["evict"] == "lru"
    assert ops.emb_exists(table, torch.tensor([0, 599])).tolist() == [False, True]
    assert torch_recdev.table_policy(table) == dict(max_rows=100, max_bytes=None, evict="lru", ttl=None,
                                                    admit_after=1)


def test_a_module_table_under_admission_trains_only_admitted_rows():
    with torch_recdev.placement("table"):
        embedding = torch.nn.Embedding(1000, 4, device="recdev")
    weight = embedding.weight
    torch_recdev.set_table_policy(weight, max_rows=50, evict="lfu", half_life=10, admit_after=2)
    assert torch_recdev.table_policy(weight)["half_life"] == 10.0
    optimizer = torch_recdev.optim.SGD([weight], lr=0.5)
    ids = torch.tensor([3, 4, 5])
    initial = weight.detach().cpu()[ids]  # a copy to CPU peeks: not a lookup, nothing admitted
    for expected_rows in (0, 3):
        optimizer.zero_grad()
        embedding(ids).sum().backward()
        optimizer.step()
        assert torch_recdev.table_stats(weight)["rows"] == expected_rows
    # The first step's gradients were dropped (rows pending), the second's applied.
    torch.testing.assert_close(weight.detach().cpu()[ids], initial - 0.5)
    assert torch_recdev.table_stats(weight)["pending"] >= 3


@pytest.mark.parametrize("module", ["EmbeddingBag", "Embedding"])
def test_training_batches_larger_than_a_kernel_task_evict_as_the_model_does(module):
    # 20,000 ids a batch: the kernels split a batch without a policy over threads in tasks of 8,192
    # ids, but send a table with a policy the whole batch, so that its touches are decided in batch
    # order (tasks on two threads would reach the policy in either order, and the victims would
    # depend on which came first) and the backward's update is recognized as a repeat of the lookup.
    with torch_recdev.placement("table"):
        layer = getattr(torch.nn, module)(10**6, 4, device="recdev", **({"mode": "sum"} if module == "EmbeddingBag" else {}))
    torch_recdev.set_table_policy(layer.weight, max_rows=5000, evict="lru")
    optimizer = torch_recdev.optim.SGD([layer.weight], lr=0.1)
    model = PolicyModel(max_rows=5000, evict="lru")
    rng = np.random.default_rng(5)
    for _ in range(6):
        ids = torch.from_numpy(rng.zipf(1.2, size=20_000) % 10_000)
        optimizer.zero_grad()
        out = layer(ids, torch.arange(0, 20_000, 4)) if module == "EmbeddingBag" else layer(ids)
        out.sum().backward()
        optimizer.step()
        model.request(ids.tolist(), "lookup")
        model.request(ids.tolist(), "update")
        held = ops.emb_exists(layer.weight.detach(), torch.arange(10_000))
        assert set(torch.nonzero(held).flatten().tolist()) == set(model.rows)
    assert torch_recdev.table_stats(layer.weight)["evicted"] == len(model.evicted) > 0


def test_ttl_as_a_timedelta_and_removing_the_policy():
    table = ops.init_embedding_table(_name(), 1000, 4, evict="ttl", ttl=datetime.timedelta(minutes=5))
    assert torch_recdev.table_policy(table)["ttl"] == datetime.timedelta(minutes=5)
    torch_recdev.set_table_policy(table)
    assert torch_recdev.table_policy(table) == dict(max_rows=None, max_bytes=None, evict=None, ttl=None,
                                                    admit_after=1)


def test_budget_without_evict_is_an_error_at_the_batch_that_passes_it():
    table = ops.init_embedding_table(_name(), 1000, 4, max_rows=10)
    ops.emb_read(table, torch.arange(10))
    with pytest.raises(MemoryError, match="no evict policy"):
        ops.emb_read(table, torch.arange(5, 15))
    assert torch_recdev.table_stats(table)["rows"] == 10


def test_a_batch_with_more_distinct_rows_than_the_budget_is_refused():
    table = ops.init_embedding_table(_name(), 1000, 4, max_rows=10, evict="lru")
    with pytest.raises(ValueError, match="11 distinct rows cannot fit the budget of 10"):
        ops.emb_read(table, torch.arange(11))
    assert torch_recdev.table_stats(table)["rows"] == 0


@pytest.mark.parametrize(
    "keywords, message",
    [
        (dict(max_rows=0, evict="lru"), "max_rows must be a positive int"),
        (dict(max_rows=-5, evict="lru"), "max_rows must be a positive int"),
        (dict(max_bytes=0), "max_bytes must be a positive int"),
        (dict(max_rows=10, evict="fifo"), "unknown evict policy 'fifo'"),
        (dict(ttl=5), "needs evict='ttl'"),
        (dict(max_rows=10, evict="lru", ttl=5), "needs evict='ttl'"),
        (dict(evict="ttl"), "needs ttl="),
        (dict(evict="ttl", ttl=2.5), "positive int"),
        (dict(evict="lru"), "needs a budget"),
        (dict(max_rows=10, evict="lru", half_life=3), "needs evict='lfu'"),
        (dict(max_rows=10, evict="lfu", half_life=-1), "half_life must be a positive"),
        (dict(admit_after=0), r"admit_after must be an int in \[1, 65535\]"),
        (dict(max_rows=True, evict="lru"), "max_rows must be a positive int"),
    ],
)
def test_bad_policies_are_refused_before_anything_changes(keywords, message):
    name = _name()
    with pytest.raises(ValueError, match=message):
        ops.init_embedding_table(name, 1000, 4, **keywords)
    table = ops.init_embedding_table(name, 1000, 4)
    with pytest.raises(ValueError, match=message):
        torch_recdev.set_table_policy(table, **keywords)
    assert torch_recdev.table_policy(table)["evict"] is None


def test_policy_of_a_tensor_that_is_not_a_table():
    with pytest.raises(ValueError, match="not on recdev table storage"):
        torch_recdev.set_table_policy(torch.zeros(3, 4), max_rows=3)
    with pytest.raises(TypeError, match="expects a recdev table tensor"):
        torch_recdev.table_policy([1, 2])


def _steps(table, seed, count=25, dim=4, write_every=0):
    """Lookups of mostly repeated ids then updates (tables with an optimizer) or, every write_every-th
    step, writes of a few rows; yields after each step."""
    generator = torch.Generator().manual_seed(seed)
    for step in range(count):
        keys = torch.randint(0, 200, (12,), generator=generator)
        ops.emb_read(table, keys)
        ops.emb_read(table, keys[:6])
        values = torch.randn(12, dim, generator=generator)
        if not write_every:
            ops.emb_update(table, keys, values)
        elif step % write_every == 0:
            ops.emb_write(table, keys[:3], values[:3])
        yield


def _held(table):
    keys = torch.arange(200)
    stats = torch_recdev.table_stats(table)
    return keys[ops.emb_exists(table, keys)].tolist(), (stats["rows"], stats["evicted"], stats["admitted"])


@pytest.mark.parametrize("policy", [dict(evict="lru"), dict(evict="lru", admit_after=2)], ids=["lru", "admit_after"])
def test_ops_save_and_load_carry_the_policy_and_touch_metadata(tmp_path, policy):
    name = _name()
    table = ops.init_embedding_table(name, 10**9, 4, init=torch_recdev.Normal(0, 0.1), max_rows=40,
                                     optimizer=("sgd", {"lr": 0.1}), **policy)
    for _ in _steps(table, seed=1):
        pass
    ops.save(tmp_path / "ckpt")
    after_save = [_held(table) for _ in _steps(table, seed=2)]
    # Another policy meanwhile: the load brings back the saved one, which the same steps follow exactly.
    torch_recdev.set_table_policy(table, max_rows=5, evict="lfu")
    assert name in ops.load(tmp_path / "ckpt")
    assert torch_recdev.table_policy(table) == dict(max_rows=40, max_bytes=None, ttl=None,
                                                    **{"admit_after": 1, **policy})
    assert [_held(table) for _ in _steps(table, seed=2)] == after_save
    assert torch_recdev.table_stats(table)["rows"] == 40


@pytest.mark.parametrize("policy", [dict(evict="lru"), dict(evict="lru", admit_after=2)], ids=["lru", "admit_after"])
def test_torch_save_and_load_of_a_table_carry_the_policy(tmp_path, policy):
    with torch_recdev.placement("table"):
        embedding = torch.nn.Embedding(10**6, 4, device="recdev")
    weight = embedding.weight.detach()
    torch_recdev.set_table_policy(weight, max_rows=40, **policy)
    for _ in _steps(weight, seed=3, write_every=4):
        pass
    torch.save(weight, tmp_path / "w.pt")
    loaded = torch.load(tmp_path / "w.pt", weights_only=False)
    assert torch_recdev.table_policy(loaded) == torch_recdev.table_policy(weight)
    assert _held(loaded)[0] == _held(weight)[0]
    for _ in zip(_steps(weight, seed=4, write_every=4), _steps(loaded, seed=4, write_every=4)):
        assert _held(loaded) == _held(weight)
    assert torch_recdev.table_stats(loaded)["rows"] == 40


def test_spill_without_a_disk_directory_is_a_clear_error():
    """The embedded store's disk directory (set_disk_dir, RECDEV_DISK_DIR) unset: spill=True is refused
    and the policy stays as it was. (A shard without --disk-dir: test/remote/test_remote_spill.py.)"""
    before = torch_recdev._C._disk_dir()
    torch_recdev._C._set_disk_dir("")
    try:
        table = ops.init_embedding_table(_name(), 10**9, 8, optimizer=("sgd", {"lr": 0.1}))
        with pytest.raises(ValueError, match=r"spill=True needs a disk directory .*set_disk_dir.*RECDEV_DISK_DIR"):
            torch_recdev.set_table_policy(table, max_rows=10, evict="lru", spill=True)
        assert torch_recdev.table_policy(table)["max_rows"] is None
    finally:
        torch_recdev._C._set_disk_dir(before)
