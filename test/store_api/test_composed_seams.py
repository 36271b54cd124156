"""Where two features of the store meet (issue 33): a reset that changes the dtype, a reset's policy
and counters, the rounding mode through declarations and checkpoints, a refused update under a
budget. Each test failed on the build before the fix. On the embedded store and on two real shards
(conftest)."""

import uuid

import pytest
import torch

import torch_recdev as R
from torch_recdev import ops


def _name():
    return f"seam_{uuid.uuid4().hex}"


def test_a_reset_to_another_dtype_of_the_same_row_width_never_reads_the_old_bytes():
    # 32 float32 words and 64 float16 halves are the same 128 bytes a row: the in-place reset took
    # them for the same table and read float32 1.0 as the halves [0.0, 1.875].
    name = _name()
    old = ops.init_embedding_table(name, 1000, 32, init=R.Constant(1.0))
    ops.emb_read(old, torch.tensor([0, 1]))
    new = ops.init_embedding_table(name, 1000, 64, dtype=torch.float16, init=R.Constant(0.25), reset=True)
    assert new.dtype == torch.float16
    rows = ops.emb_read(new, torch.tensor([0, 1, 2])).cpu()
    assert rows.dtype == torch.float16
    assert torch.equal(rows, torch.full((3, 64), 0.25, dtype=torch.float16))
    assert R.table_stats(new)["dtype"] == "float16"


def test_a_reset_in_place_drops_the_policy_and_counters_as_a_replacing_reset_does():
    name = _name()
    table = ops.init_embedding_table(name, 100, 4, init=R.Zero(), max_rows=2, evict="lru")
    for key in (1, 2, 3):
        ops.emb_read(table, torch.tensor([key]))
    assert R.table_stats(table)["evicted"] >= 1
    same_shape = ops.init_embedding_table(name, 100, 4, init=R.Zero(), reset=True)
    other_shape = ops.init_embedding_table(_name(), 100, 4, init=R.Zero())
    for t in (same_shape, other_shape):
        assert R.table_policy(t) == R.table_policy(ops.init_embedding_table(_name(), 100, 4))
        stats = R.table_stats(t)
        assert (stats["rows"], stats["evicted"], stats["admitted"], stats["reads"]) == (0, 0, 0, 0)
    # No budget any more: five rows stay.
    ops.emb_read(same_shape, torch.arange(5))
    assert R.table_stats(same_shape)["rows"] == 5


def _trained_mean(table, steps=40):
    # Updates far below a float16 ulp of 1.0 (about 1e-3): round-to-nearest never moves the rows,
    # stochastic rounding moves their mean by about steps * 1e-4 * lr.
    keys = torch.arange(64)
    for _ in range(steps):
        ops.emb_update(table, keys, torch.full((64, 8), 1e-4, dtype=torch.float16))
    return ops.emb_read(table, keys).cpu().float().mean().item()


def test_the_store_api_declares_stochastic_rounding():
    table = ops.init_embedding_table(_name(), 1000, 8, dtype=torch.float16, init=R.Constant(1.0),
                                     optimizer=("sgd", {"lr": 1.0, "stochastic_rounding": True}))
    assert _trained_mean(table) < 0.999
    plain = ops.init_embedding_table(_name(), 1000, 8, dtype=torch.float16, init=R.Constant(1.0),
                                     optimizer=("sgd", {"lr": 1.0}))
    assert _trained_mean(plain) == 1.0
    with pytest.raises(ValueError, match="float16 and bfloat16"):
        ops.init_embedding_table(_name(), 1000, 8, optimizer=("sgd", {"lr": 1.0, "stochastic_rounding": True}))
    with pytest.raises(ValueError, match="rounding_seed is used with stochastic_rounding"):
        ops.init_embedding_table(_name(), 1000, 8, dtype=torch.float16, optimizer=("sgd", {"rounding_seed": 3}))


def test_a_declaration_that_does_not_name_rounding_keeps_it_and_false_turns_it_off():
    name = _name()
    table = ops.init_embedding_table(name, 1000, 8, dtype=torch.float16, init=R.Constant(1.0),
                                     optimizer=("sgd", {"lr": 1.0, "stochastic_rounding": True}))
    again = ops.init_embedding_table(name, 1000, 8, dtype=torch.float16, init=R.Constant(1.0),
                                     optimizer=("sgd", {"lr": 1.0}))
    assert _trained_mean(again) < 0.999
    off = ops.init_embedding_table(name, 1000, 8, dtype=torch.float16, optimizer=("sgd", {"stochastic_rounding": False}))
    before = ops.emb_read(table, torch.arange(64)).cpu()
    _trained_mean(off)
    assert torch.equal(ops.emb_read(table, torch.arange(64)).cpu(), before)


def test_torch_save_and_load_keep_the_rounding_mode(tmp_path):
    # What load_state_dict does: torch.load the saved table, copy_ it into the live one.
    table = ops.init_embedding_table(_name(), 1000, 8, dtype=torch.float16, init=R.Constant(1.0))
    R.optim.SGD([table], lr=1.0, stochastic_rounding=True)
    path = tmp_path / "table.pt"
    torch.save(table, path)
    with torch.no_grad():
        table.copy_(torch.load(path))
    assert _trained_mean(table) < 0.999


def test_ops_save_and_load_keep_the_rounding_mode_and_seed(tmp_path):
    name = _name()
    table = ops.init_embedding_table(name, 1000, 8, dtype=torch.float16, init=R.Constant(1.0),
                                     optimizer=("sgd", {"lr": 1.0, "stochastic_rounding": True, "rounding_seed": 7}))
    path = tmp_path / "store.recdev"
    ops.save(path)
    expected = _trained_mean(table, steps=10)
    ops.load(path)
    # The same seed, step and rows: bit for bit the same rounding again.
    assert _trained_mean(table, steps=10) == expected


def test_share_tables_keeps_the_modules_dtype():
    with R.placement("table"):
        emb = torch.nn.Embedding(10**6, 8, dtype=torch.float16, device="recdev")
    assert R.is_table(emb.weight)
    R.share_tables(emb, prefix=_name() + ".")
    assert emb.weight.dtype == torch.float16
    assert R.table_stats(emb.weight)["dtype"] == "float16"


def test_a_refused_update_evicts_and_admits_nothing():
    # Two gradients of id 5 sum past float32's largest finite value: the update is refused, and must
    # leave the budgeted table's trained rows 0 and 1 where they were (2 rows a shard).
    dtype, grad = torch.float32, 3e38
    table = ops.init_embedding_table(_name(), 100, 4, dtype=dtype, init=R.Zero(), optimizer=("sgd", {"lr": 1.0}),
                                     max_rows=2 * max(1, ops.store_info()["shards"]), evict="lru")
    ops.emb_update(table, torch.tensor([0, 1]), torch.ones(2, 4, dtype=dtype))
    before = R.table_stats(table)
    with pytest.raises(ValueError, match="overflows"):
        ops.emb_update(table, torch.tensor([5, 5]), torch.full((2, 4), grad, dtype=dtype))
    after = R.table_stats(table)
    assert (after["rows"], after["evicted"], after["admitted"], after["updates"]) == \
        (before["rows"], before["evicted"], before["admitted"], before["updates"])
    assert ops.emb_exists(table, torch.tensor([0, 1, 5])).tolist() == [True, True, False]
    assert torch.equal(ops.emb_read(table, torch.tensor([0, 1])).cpu(), torch.full((2, 4), -1.0, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_large_gradients_whose_sums_stay_finite_are_applied(dtype):
    # Near the type's largest value (a sum of duplicates is checked for overflow then, not skipped as
    # for ordinary gradients): three gradients of id 5 summing to 3/4 of it, and a row named once.
    largest = torch.finfo(dtype).max
    table = ops.init_embedding_table(_name(), 100, 4, dtype=dtype, init=R.Zero(), optimizer=("sgd", {"lr": 1.0}))
    grads = torch.full((4, 4), largest / 4, dtype=dtype)
    ops.emb_update(table, torch.tensor([5, 7, 5, 5]), grads)
    assert torch.equal(ops.emb_read(table, torch.tensor([5, 7])).cpu(),
                       torch.stack([torch.full((4,), -3 * (largest / 4), dtype=dtype),
                                    torch.full((4,), -largest / 4, dtype=dtype)]))


def test_save_and_load_do_not_count_an_ids_lookups_again(tmp_path):
    # On shards the file's admission sketch is merged from every shard's and each shard gets it whole
    # back; merged by a sum, every save after a load counted each lookup once per shard.
    table = ops.init_embedding_table(_name(), 10**6, 4, init=R.Zero(), max_rows=100, evict="lru", admit_after=8)
    key = torch.tensor([12345])
    for _ in range(3):
        ops.emb_read(table, key)
    for _ in range(2):
        ops.save(tmp_path / "store.recdev")
        ops.load(tmp_path / "store.recdev")
    for lookup in range(4, 9):
        assert not ops.emb_exists(table, key).item(), f"admitted after {lookup - 1} lookups, not 8"
        ops.emb_read(table, key)
    assert ops.emb_exists(table, key).item()
