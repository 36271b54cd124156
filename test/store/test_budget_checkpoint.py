"""Checkpoints carry a table's budget policy and touch metadata (csrc/store/checkpoint.h, format 4):
a budgeted table saved and loaded into a fresh table or store evicts and admits exactly the rows the
original does under the same further requests, and keeps its budget; files of format 3 still load."""


import numpy as np
import pytest
from checksums import file_checksum
from policy_model import PolicyModel
from test_budget import DIM, NUM_IDS, held, run_against_model

POLICIES = [
    dict(max_rows=20, evict="lru"),
    dict(max_rows=20, evict="lru", admit_after=2, sketch_width=16),
    dict(max_rows=20, evict="lfu", half_life=5.0, admit_after=3, sketch_width=16),
]


def make_table(store_mod, store=None, name=None, **policy):
    store = store or store_mod.Store()
    config = store_mod.TableConfig(num_rows=NUM_IDS, row_words=DIM, init=store_mod.InitRule.normal(0, 1, seed=5))
    table_id = store.create_named_table(name, config) if name else store.create_table(config, init_stream=77)
    table = store.table(table_id)
    table.set_optimizer(store_mod.OptimizerConfig.sgd(lr=0.5, weight_decay=0.0))
    if policy:
        table.set_policy(**policy)
    return store, table


def same_requests(original, restored, rng, requests=150):
    """The same random lookups and updates on both tables; they hold the same rows after each."""
    for _ in range(requests):
        n = int(rng.integers(1, 9))
        ids = (rng.zipf(1.3, size=n) % NUM_IDS).astype(np.uint64)
        if rng.random() < 0.5:
            np.testing.assert_array_equal(original.gather(ids), restored.gather(ids))
        else:
            grads = rng.standard_normal((n, DIM)).astype(np.float32)
            original.update(ids, grads)
            restored.update(ids, grads)
        assert held(restored) == held(original)
        a, b = original.stats(), restored.stats()
        assert (b.rows, b.evicted, b.admitted, b.pending) == (a.rows, a.evicted, a.admitted, a.pending)
        assert b.rows <= 20


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: "-".join(f"{k}={v}" for k, v in p.items()))
def test_load_table_restores_policy_and_metadata(store_mod, tmp_path, rng, policy):
    _, table = make_table(store_mod, **policy)
    model = PolicyModel(**policy)
    run_against_model(table, model, rng, requests=120)
    store_mod.save_table(tmp_path / "t.ckpt", table)
    info = store_mod.read_checkpoint_info(tmp_path / "t.ckpt")[0]
    assert info.policy == table.policy
    assert info.policy_rows == table.stats().rows

    _, restored = make_table(store_mod)  # a fresh table without a policy
    store_mod.load_table(tmp_path / "t.ckpt", restored)
    assert restored.policy == table.policy
    assert held(restored) == held(table)
    # The model, the original and the restored table go on exactly alike.
    state = rng.bit_generator.state
    run_against_model(restored, model, rng, requests=100)
    rng.bit_generator.state = state
    _, again = make_table(store_mod)
    store_mod.load_table(tmp_path / "t.ckpt", again)
    same_requests(table, again, rng)


@pytest.mark.parametrize("policy", POLICIES[:2], ids=["lru", "lru-admit_after"])
def test_load_store_restores_policy_over_the_targets_own(store_mod, tmp_path, rng, policy):
    store, table = make_table(store_mod, name="users", **policy)
    run_against_model(table, PolicyModel(**policy), rng, requests=120)
    store_mod.save_store(tmp_path / "s.ckpt", store)

    # Into a fresh store (the table is created) and into a store whose table has another, smaller
    # budget: the file's policy replaces it before any row is evicted.
    fresh = store_mod.Store()
    assert store_mod.load_store(tmp_path / "s.ckpt", fresh) == ["users"]
    other, _ = make_table(store_mod, name="users", max_rows=3, evict="lfu")
    store_mod.load_store(tmp_path / "s.ckpt", other)
    for target in (fresh, other):
        restored = target.table(target.find("users"))
        assert restored.policy == table.policy
        assert held(restored) == held(table)
    same_requests(table, fresh.table(fresh.find("users")), rng)


def test_a_file_without_policy_leaves_the_tables_policy(store_mod, tmp_path, rng):
    _, plain = make_table(store_mod)
    plain.update(np.arange(50, dtype=np.uint64), np.ones((50, DIM), np.float32))
    store_mod.save_table(tmp_path / "plain.ckpt", plain)
    assert store_mod.read_checkpoint_info(tmp_path / "plain.ckpt")[0].policy is None
    _, budgeted = make_table(store_mod, max_rows=10, evict="lru")
    store_mod.load_table(tmp_path / "plain.ckpt", budgeted)
    assert budgeted.policy["max_rows"] == 10
    assert budgeted.stats().rows == 10


def as_format_4(data):
    """A format-6 file of one table without stochastic rounding as format 4 wrote it: no rounding_seed
    after beta2 (the optimizer flags, reserved then, are 0 already), and a CRC-32."""
    body = bytearray(data[:-4])
    assert body[8:12] == (6).to_bytes(4, "little")
    body[8:12] = (4).to_bytes(4, "little")
    name_length = int.from_bytes(body[16:20], "little")
    # magic, version, table_count; then name_length, name, and 120 bytes of config, init and optimizer.
    seed_at = 16 + 4 + name_length + 120
    assert body[seed_at - 60 : seed_at - 56] == bytes(4) and body[seed_at : seed_at + 8] == bytes(8)
    del body[seed_at : seed_at + 8]
    return bytes(body) + file_checksum(body)


def as_format_3(data):
    """A format-6 file of tables without a policy as format 3 wrote it: no policy blocks."""
    body = bytearray(as_format_4(data)[:-4])
    assert body[8:12] == (4).to_bytes(4, "little")
    body[8:12] = (3).to_bytes(4, "little")
    # One table: its policy block (u64 0) is the last 8 bytes before the checksum.
    assert body[-8:] == bytes(8)
    del body[-8:]
    return bytes(body) + file_checksum(body)


def test_format_3_files_still_load(store_mod, tmp_path):
    _, plain = make_table(store_mod)
    ids = np.arange(0, 40, 3, dtype=np.uint64)
    plain.update(ids, np.ones((len(ids), DIM), np.float32))
    store_mod.save_table(tmp_path / "v5.ckpt", plain)
    (tmp_path / "v3.ckpt").write_bytes(as_format_3((tmp_path / "v5.ckpt").read_bytes()))
    _, loaded = make_table(store_mod, max_rows=100, evict="lru")
    store_mod.load_table(tmp_path / "v3.ckpt", loaded)
    np.testing.assert_array_equal(loaded.gather(ids), plain.gather(ids))
    assert loaded.policy["max_rows"] == 100


def test_format_4_files_still_load(store_mod, tmp_path):
    _, plain = make_table(store_mod, max_rows=100, evict="lru")
    ids = np.arange(0, 40, 3, dtype=np.uint64)
    plain.update(ids, np.ones((len(ids), DIM), np.float32))
    store_mod.save_table(tmp_path / "v5.ckpt", plain)
    (tmp_path / "v4.ckpt").write_bytes(as_format_4((tmp_path / "v5.ckpt").read_bytes()))
    _, loaded = make_table(store_mod)
    store_mod.load_table(tmp_path / "v4.ckpt", loaded)
    np.testing.assert_array_equal(loaded.gather(ids), plain.gather(ids))
    assert loaded.policy["max_rows"] == 100


def refused_with_nothing_loaded(store_mod, tmp_path, data, match):
    """Loads `data` with its checksum fixed (so that only the field checks can refuse it): refused with
    `match`, and the destination keeps no row of it. Returns the destination."""
    data[-4:] = file_checksum(data[:-4])
    (tmp_path / "bad.ckpt").write_bytes(bytes(data))
    _, target = make_table(store_mod)
    with pytest.raises(Exception, match=match):
        store_mod.load_table(tmp_path / "bad.ckpt", target)
    assert target.stats().rows == 0
    return target


def test_unknown_optimizer_flags_are_refused(store_mod, tmp_path):
    _, plain = make_table(store_mod)
    store_mod.save_table(tmp_path / "t.ckpt", plain)
    data = bytearray((tmp_path / "t.ckpt").read_bytes())
    name_length = int.from_bytes(data[16:20], "little")
    flags_at = 16 + 4 + name_length + 60  # after the config, init rule, init stream and optimizer kind
    data[flags_at : flags_at + 4] = (2).to_bytes(4, "little")
    refused_with_nothing_loaded(store_mod, tmp_path, data, "unknown optimizer flags 2")


def test_a_damaged_policy_block_is_refused_with_nothing_loaded(store_mod, tmp_path, rng):
    _, table = make_table(store_mod, max_rows=20, evict="lru")
    run_against_model(table, PolicyModel(max_rows=20, evict="lru"), rng, requests=50)
    store_mod.save_table(tmp_path / "t.ckpt", table)
    data = bytearray((tmp_path / "t.ckpt").read_bytes())
    # The policy block's first field (max_rows) set to 0 and the checksum fixed: an inactive policy.
    # The block: 112 fixed bytes, no sketch, u64 touch count, 40 bytes per row's touch metadata.
    rows = store_mod.read_checkpoint_info(tmp_path / "t.ckpt")[0].policy_rows
    block_start = len(data) - 4 - (112 + 8 + 40 * rows)
    assert data[block_start - 8 : block_start + 8] == (120 + 40 * rows).to_bytes(8, "little") + (20).to_bytes(8, "little")
    data[block_start : block_start + 8] = bytes(8)
    target = refused_with_nothing_loaded(store_mod, tmp_path, data,
                                         "bad policy block in table #0: .*evict=.lru. needs a budget")
    assert target.policy["max_rows"] is None
