"""The row index: memory proportional to the rows touched, within 1.3x of their raw bytes."""

import numpy as np
import pytest

MEMORY_BOUND = 1.3  # stats().bytes / raw bytes of the materialized rows (weight + state floats)
ALL_64_BIT_IDS = 2**64 - 1  # num_rows for tables keyed by arbitrary 64-bit ids


def fill(table, ids, dim, batch=65536):
    for start in range(0, len(ids), batch):
        chunk = ids[start : start + batch]
        table.write(chunk, np.full((len(chunk), dim), 1.0, np.float32))


def ratio(table, record_words):
    stats = table.stats()
    return stats.bytes / (stats.rows * record_words * 4)


def test_touching_k_rows_of_a_huge_table_costs_k_rows(make_table, rng):
    dim, k = 128, 1000
    table = make_table(10**10, dim)
    empty_bytes = table.stats().bytes
    assert empty_bytes < 64 * 1024  # creating a 10**10-row table is O(1)

    ids = rng.choice(10**10, size=k, replace=False).astype(np.uint64)
    table.gather(ids[: k // 2])
    table.write(ids[k // 2 :], np.zeros((k - k // 2, dim), np.float32))
    stats = table.stats()
    assert stats.rows == k
    assert stats.num_rows == 10**10
    # Small tables pay for their sub-shards' first chunks; this is still a few rows' worth per
    # sub-shard, independent of num_rows.
    assert stats.bytes - empty_bytes < 3 * k * dim * 4


@pytest.mark.parametrize("dim", [128, 64])
@pytest.mark.parametrize("ids_kind", ["dense", "sparse"])
def test_memory_within_bound(make_table, rng, dim, ids_kind):
    n = 100_000
    if ids_kind == "dense":
        table, ids = make_table(n, dim), np.arange(n, dtype=np.uint64)
    else:
        table = make_table(ALL_64_BIT_IDS, dim)
        ids = np.unique(rng.integers(0, ALL_64_BIT_IDS, size=n, dtype=np.uint64))
    fill(table, ids, dim)
    table.gather(ids[:1])  # a read gives a dense table its direct index, counted too
    assert (table.direct_index_bytes() > 0) == (ids_kind == "dense")
    assert table.stats().rows == len(ids)
    assert ratio(table, dim) <= MEMORY_BOUND


def test_optimizer_state_counts_as_raw_bytes(make_table):
    n, dim, state = 100_000, 120, 8
    table = make_table(n, dim, state_words=state)
    fill(table, np.arange(n, dtype=np.uint64), dim)
    assert ratio(table, dim + state) <= MEMORY_BOUND


def test_optimizer_relayout_stays_within_bound(make_table, store_mod):
    """set_optimizer re-lays every record to the new state width; memory follows both ways."""
    n, dim = 50_000, 64
    table = make_table(n, dim)
    fill(table, np.arange(n, dtype=np.uint64), dim)
    table.set_optimizer(store_mod.OptimizerConfig.adam())
    assert table.stats().rows == n
    assert ratio(table, 3 * dim) <= MEMORY_BOUND
    adam_bytes = table.stats().bytes
    table.set_optimizer(store_mod.OptimizerConfig.sgd(lr=0.1))
    assert ratio(table, dim) <= MEMORY_BOUND
    assert table.stats().bytes < 0.5 * adam_bytes


def test_erase_returns_memory(make_table):
    n, dim = 50_000, 128
    table = make_table(n, dim)
    empty_bytes = table.stats().bytes
    ids = np.arange(n, dtype=np.uint64)
    fill(table, ids, dim)
    full_bytes = table.stats().bytes

    table.erase(ids[::2])
    assert table.stats().rows == n // 2
    assert ratio(table, dim) <= MEMORY_BOUND
    assert table.stats().bytes < 0.6 * full_bytes

    table.erase(ids)
    assert table.stats().rows == 0
    assert table.stats().bytes == empty_bytes


def test_erased_slots_are_reused(make_table, rng):
    n, dim = 20_000, 32
    table = make_table(ALL_64_BIT_IDS, dim)
    live = np.arange(n, dtype=np.uint64)
    fill(table, live, dim)
    peak = table.stats().bytes
    next_id = n
    for _ in range(8):  # churn: replace a random quarter of the rows with new ids
        gone = rng.choice(n, size=n // 4, replace=False)
        table.erase(live[gone])
        live[gone] = np.arange(next_id, next_id + n // 4, dtype=np.uint64)
        next_id += n // 4
        fill(table, live[gone], dim)
        assert table.stats().rows == n
        assert table.stats().bytes <= peak * 1.05
    assert table.exists(live).all()


def test_random_inserts_and_erases_match_a_dict(make_table, rng):
    """Backward-shift deletion and the move of the last record must keep every other row findable."""
    dim = 3
    table = make_table(ALL_64_BIT_IDS, dim)
    # Few distinct ids, so inserts and erases hit the same rows and clusters again and again.
    universe = rng.integers(0, ALL_64_BIT_IDS, size=3000, dtype=np.uint64)
    model = {}
    for step in range(300):
        ids = rng.choice(universe, size=int(rng.integers(1, 200)))
        if rng.random() < 0.55:
            rows = np.repeat(np.arange(len(ids), dtype=np.float32)[:, None] + step * 1000, dim, axis=1)
            table.write(ids, rows)
            for row_id, row in zip(ids.tolist(), rows):
                model[row_id] = row
        else:
            table.erase(ids)
            for row_id in ids.tolist():
                model.pop(row_id, None)
        if step % 25 == 0 or step == 299:
            assert table.stats().rows == len(model)
            present = table.exists(universe)
            assert present.tolist() == [int(row_id) in model for row_id in universe]
            if model:
                kept = np.array(list(model), np.uint64)
                np.testing.assert_array_equal(table.gather(kept), np.stack([model[int(i)] for i in kept]))
