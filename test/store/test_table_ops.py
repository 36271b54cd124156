"""Table operations against a numpy model of the dense table, and the Store's table registry."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from dense_model import DenseModel


@pytest.fixture
def normal_table(make_table, store_mod):
    return make_table(40, 5, init=store_mod.InitRule.normal(0, 1, seed=11))


def assert_matches(table, model):
    all_ids = np.arange(len(model.values), dtype=np.uint64)
    np.testing.assert_array_equal(table.exists(all_ids), model.materialized)
    np.testing.assert_array_equal(table.read_bytes(0, model.values.nbytes), model.flat_bytes())
    assert table.stats().rows == model.materialized.sum()


def test_random_operations_match_the_model(store_mod, normal_table, rng):
    table = normal_table
    model = DenseModel(store_mod, table)
    table_bytes = model.values.nbytes
    for step in range(400):
        op = rng.integers(5)
        ids = rng.integers(0, 40, size=int(rng.integers(0, 12))).astype(np.uint64)
        if op == 0:
            np.testing.assert_array_equal(table.gather(ids), model.gather(ids))
        elif op == 1:
            rows = rng.standard_normal((len(ids), 5)).astype(np.float32)
            table.write(ids, rows)
            model.write(ids, rows)
        elif op == 2:
            start = int(rng.integers(0, table_bytes))
            length = int(rng.integers(0, table_bytes - start + 1))
            np.testing.assert_array_equal(table.read_bytes(start, length), model.flat_bytes()[start : start + length])
        elif op == 3:
            start = int(rng.integers(0, table_bytes))
            data = rng.integers(0, 256, size=int(rng.integers(0, min(70, table_bytes - start) + 1)), dtype=np.uint8)
            table.write_bytes(start, data.tobytes())
            model.write_bytes(start, data.tobytes())
        else:
            table.erase(ids)
            model.erase(ids)
        if step % 20 == 0:
            assert_matches(table, model)
    assert_matches(table, model)


def test_gather_materializes_and_read_bytes_does_not(store_mod, normal_table):
    ids = np.array([3, 9], np.uint64)
    expected = DenseModel(store_mod, normal_table).init[[3, 9]]
    np.testing.assert_array_equal(normal_table.read_bytes(3 * 20, 20).view(np.float32), expected[0])
    assert not normal_table.exists(ids).any()
    np.testing.assert_array_equal(normal_table.gather(ids), expected)
    assert normal_table.exists(ids).all()


def test_peek_reads_init_values_without_materializing(store_mod, normal_table):
    ids = np.array([5, 2, 5], np.uint64)
    expected = DenseModel(store_mod, normal_table).init[[5, 2, 5]]
    normal_table.write(np.array([2], np.uint64), np.full((1, 5), 7.0, np.float32))
    expected[1] = 7.0
    np.testing.assert_array_equal(normal_table.peek(ids), expected)
    assert normal_table.exists(ids).tolist() == [False, True, False]
    with pytest.raises(IndexError):
        normal_table.peek(np.array([40], np.uint64))


def test_partial_row_write_keeps_the_rest_of_the_row(store_mod, normal_table):
    init = DenseModel(store_mod, normal_table).init
    # Bytes 6..13 of row 2: the upper half of element 1, all of element 2, the lower half of element 3.
    normal_table.write_bytes(2 * 20 + 6, b"\x00" * 8)
    assert normal_table.exists(np.array([1, 2, 3], np.uint64)).tolist() == [False, True, False]
    expected = init[2].copy()
    expected.view(np.uint8)[6:14] = 0
    np.testing.assert_array_equal(normal_table.gather(np.array([2], np.uint64))[0], expected)


def test_duplicate_ids_in_a_write_last_one_wins(normal_table):
    ids = np.array([4, 4, 4], np.uint64)
    normal_table.write(ids, np.array([[1.0] * 5, [2.0] * 5, [3.0] * 5], np.float32))
    assert np.all(normal_table.gather(ids[:1]) == 3.0)


def test_erase_reinitializes(store_mod, normal_table):
    init = DenseModel(store_mod, normal_table).init
    ids = np.array([0, 39], np.uint64)
    normal_table.write(ids, np.zeros((2, 5), np.float32))
    normal_table.erase(np.array([0, 39, 17], np.uint64))  # 17 was never materialized: a no-op
    assert not normal_table.exists(ids).any()
    np.testing.assert_array_equal(normal_table.gather(ids), init[[0, 39]])


def test_state_floats_are_not_part_of_the_weight(make_table):
    table = make_table(100, 6, state_words=3)
    table.write(np.array([5], np.uint64), np.full((1, 6), 2.0, np.float32))
    assert table.gather(np.array([5, 6], np.uint64)).shape == (2, 6)
    assert table.read_bytes(0, 100 * 6 * 4).size == 2400


def test_stats_count_rows_read_and_written(make_table):
    table = make_table(1000, 4)
    table.gather(np.arange(10, dtype=np.uint64))
    table.write(np.arange(5, dtype=np.uint64), np.zeros((5, 4), np.float32))
    table.read_bytes(16, 32)  # rows 1 and 2
    table.write_bytes(8, b"\x00" * 16)  # halves of rows 0 and 1
    stats = table.stats()
    assert (stats.num_rows, stats.row_words, stats.rows) == (1000, 4, 10)
    assert (stats.reads, stats.writes) == (12, 7)


def test_empty_batches_are_fine(make_table):
    table = make_table(10, 4)
    empty = np.array([], np.uint64)
    assert table.gather(empty).shape == (0, 4)
    table.write(empty, np.zeros((0, 4), np.float32))
    assert table.exists(empty).shape == (0,)
    table.erase(empty)
    assert table.read_bytes(160, 0).size == 0
    table.write_bytes(160, b"")
    assert table.stats().rows == 0


# --- bad input: refused with a clear error, and nothing changes ---


def snapshot(table):
    return table.read_bytes(0, table.config.num_rows * table.config.row_words * 4), table.exists(
        np.arange(table.config.num_rows, dtype=np.uint64)
    )


def assert_unchanged(table, before):
    after = snapshot(table)
    np.testing.assert_array_equal(after[0], before[0])
    np.testing.assert_array_equal(after[1], before[1])


def test_out_of_range_id_in_a_batch_changes_nothing(normal_table):
    normal_table.write(np.array([1, 2], np.uint64), np.ones((2, 5), np.float32))
    before = snapshot(normal_table)
    bad = np.array([5, 6, 40, 7], np.uint64)
    with pytest.raises(IndexError, match=r"row id 40 \(ids\[2\]\) is out of range \[0, 40\)"):
        normal_table.write(bad, np.zeros((4, 5), np.float32))
    with pytest.raises(IndexError):
        normal_table.gather(bad)
    with pytest.raises(IndexError):
        normal_table.erase(np.array([1, 2, 40], np.uint64))
    with pytest.raises(IndexError):
        normal_table.exists(bad)
    with pytest.raises(IndexError):
        normal_table.gather(np.array([-1], np.int64))  # a negative id wraps to 2**64 - 1
    assert_unchanged(normal_table, before)


def test_byte_range_outside_the_table_changes_nothing(normal_table):
    before = snapshot(normal_table)
    table_bytes = 40 * 5 * 4
    with pytest.raises(IndexError, match="outside table"):
        normal_table.read_bytes(table_bytes - 4, 8)
    with pytest.raises(IndexError):
        normal_table.write_bytes(table_bytes - 4, b"\x00" * 8)
    with pytest.raises(IndexError):
        normal_table.write_bytes(2**64 - 4, b"\x00" * 8)  # offset + size overflows 64 bits
    assert_unchanged(normal_table, before)


def test_rows_of_the_wrong_shape_are_refused(normal_table):
    with pytest.raises(ValueError, match=r"shape \(2, 5\)"):
        normal_table.write(np.array([1, 2], np.uint64), np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match="1-D"):
        normal_table.gather(np.zeros((2, 2), np.uint64))


def test_out_of_memory_raises_store_full_error_and_keeps_the_table_usable():
    # In a child process: the address-space limit must not constrain the test process.
    script = textwrap.dedent(
        """
        import importlib, os, resource
        import numpy as np
        s = importlib.import_module(os.environ.get("RECDEV_STORE_MODULE", "torch_recdev._testing"))._store
        store = s.Store()
        table = store.table(store.create_table(s.TableConfig(num_rows=2**63, row_words=128)))
        rows, ids = np.ones((4096, 128), np.float32), np.arange(4096, dtype=np.uint64)
        with open("/proc/self/statm") as statm:
            mapped = int(statm.read().split()[0]) * resource.getpagesize()
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (mapped + (256 << 20), hard))
        written = 0
        try:
            while True:
                table.write(ids, rows)
                ids += np.uint64(4096)
                written += 4096
        except s.StoreFullError as error:
            assert isinstance(error, MemoryError) and isinstance(error, RuntimeError)
            assert "out of memory" in str(error)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        assert table.stats().rows >= written > 0
        assert (table.gather(np.array([0, written - 1], np.uint64)) == 1).all()
        """
    )
    result = subprocess.run([sys.executable, "-c", script], env=os.environ, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


# --- the store's registry ---


def config(store_mod, **overrides):
    fields = dict(num_rows=1000, row_words=8, init=store_mod.InitRule.normal(0, 0.1, seed=1))
    fields.update(overrides)
    return store_mod.TableConfig(**fields)


def test_named_tables(store_mod):
    store = store_mod.Store()
    anonymous = store.create_table(config(store_mod))
    user = store.create_named_table("user", config(store_mod))
    assert store.create_named_table("user", config(store_mod)) == user
    assert store.find("user") == user
    assert store.find("item") is None
    assert store.list() == [(anonymous, ""), (user, "user")]
    assert store.table(user).config == config(store_mod)


@pytest.mark.parametrize(
    "overrides", [dict(num_rows=1001), dict(row_words=16), dict(init=None)], ids=str
)
def test_named_table_with_another_config_is_refused(store_mod, overrides):
    if overrides.get("init", 0) is None:
        overrides = dict(init=store_mod.InitRule.normal(0, 0.1, seed=2))
    store = store_mod.Store()
    store.create_named_table("user", config(store_mod))
    with pytest.raises(ValueError, match="table 'user' already exists with TableConfig.*differs from the requested"):
        store.create_named_table("user", config(store_mod, **overrides))


def test_named_table_state_width_follows_its_optimizer(store_mod):
    """A second client asking for a named table by its plain config finds it even though the first
    attached an optimizer (which changed state_words)."""
    store = store_mod.Store()
    user = store.create_named_table("user", config(store_mod))
    store.table(user).set_optimizer(store_mod.OptimizerConfig.adam(lr=0.1))
    assert store.table(user).config.state_words == 16
    assert store.create_named_table("user", config(store_mod)) == user
    assert store.create_named_table("user", config(store_mod, state_words=3)) == user
    assert store.table(user).config.state_words == 16


def test_unknown_and_freed_tables(store_mod):
    store = store_mod.Store()
    with pytest.raises(KeyError, match="no table with id 42"):
        store.table(42)
    table_id = store.create_named_table("user", config(store_mod))
    table = store.table(table_id)
    store.free_table(table_id)
    with pytest.raises(KeyError):
        store.table(table_id)
    with pytest.raises(KeyError):
        store.free_table(table_id)
    assert store.find("user") is None
    assert store.list() == []
    assert table.gather(np.array([1], np.uint64)).shape == (1, 8)  # a held reference stays usable
    assert store.create_table(config(store_mod)) != table_id  # ids are not reused


@pytest.mark.parametrize("overrides", [dict(row_words=0), dict(row_words=2**28, state_words=1)], ids=str)
def test_invalid_table_configs_are_refused(store_mod, overrides):
    with pytest.raises(ValueError, match="invalid TableConfig"):
        store_mod.Store().create_table(config(store_mod, **overrides))


def test_named_table_needs_a_name(store_mod):
    with pytest.raises(ValueError, match="non-empty name"):
        store_mod.Store().create_named_table("", config(store_mod))
