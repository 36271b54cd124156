"""Concurrent readers and writers: no torn rows, no lost writes. The binding releases the GIL around
table operations, so these Python threads really do run the store concurrently."""

import threading

import numpy as np
from threads import run_threads

DIM = 64
INIT_VALUE = -1.0


def assert_uniform(rows):
    """Every row was written whole with one value (or is the constant init): a torn row is not."""
    torn = np.flatnonzero(np.any(rows != rows[:, :1], axis=1))
    assert len(torn) == 0, f"torn rows: {rows[torn[:3]]}"


def test_concurrent_writes_and_reads_never_tear_or_lose_rows(make_table, store_mod):
    num_writers, rows_per_writer, iterations, batch = 4, 1500, 150, 300
    table = make_table(10**8, DIM, init=store_mod.InitRule.constant(INIT_VALUE))
    # Writer w owns ids w, w + num_writers, ... spread over every sub-shard.
    owned = [np.arange(w, num_writers * rows_per_writer, num_writers, dtype=np.uint64) * 7919 for w in range(num_writers)]
    all_ids = np.concatenate(owned)
    last_written = [dict() for _ in range(num_writers)]
    done = threading.Event()
    reads_during_writes = [0]

    def writer(w):
        rng = np.random.default_rng(w)
        for iteration in range(iterations):
            ids = rng.choice(owned[w], size=batch, replace=False)
            values = (w * 1_000_000 + iteration * 1000 + np.arange(batch)).astype(np.float32)
            table.write(ids, np.repeat(values[:, None], DIM, axis=1))
            for row_id, value in zip(ids.tolist(), values.tolist()):
                last_written[w][row_id] = value

    def reader(r):
        rng = np.random.default_rng(100 + r)
        while not done.is_set():
            ids = rng.choice(all_ids, size=500)
            rows = table.gather(ids)
            assert_uniform(rows)
            # A value is the init value or one its owner wrote.
            owners = (rows[:, 0] // 1_000_000).astype(np.int64)
            expected_owner = (ids // np.uint64(7919)) % np.uint64(num_writers)
            written = rows[:, 0] != INIT_VALUE
            assert np.array_equal(owners[written], expected_owner[written].astype(np.int64))
            first = int(rng.integers(0, 10**8 - 3))
            assert_uniform(table.read_bytes(first * DIM * 4, 3 * DIM * 4).view(np.float32).reshape(3, DIM))
            reads_during_writes[0] += 1

    def writers_then_done():
        run_threads([lambda w=w: writer(w) for w in range(num_writers)])
        done.set()

    run_threads([writers_then_done] + [lambda r=r: reader(r) for r in range(3)])
    assert reads_during_writes[0] >= 10  # the readers really overlapped the writers

    for w in range(num_writers):
        ids = np.array(list(last_written[w]), np.uint64)
        expected = np.array(list(last_written[w].values()), np.float32)
        np.testing.assert_array_equal(table.gather(ids), np.repeat(expected[:, None], DIM, axis=1))
    stats = table.stats()
    assert stats.writes == num_writers * iterations * batch


def test_concurrent_first_touches_materialize_each_row_once(make_table, store_mod):
    table = make_table(10**9, DIM, init=store_mod.InitRule.normal(0, 1, seed=8))
    ids = np.random.default_rng(0).choice(10**9, size=4000, replace=False).astype(np.uint64)
    expected = np.stack(
        [store_mod.init_row(table.config.init, table.init_stream, int(row), DIM, 10**9) for row in ids[:50]]
    )
    results = [None] * 6

    def toucher(t):
        order = np.random.default_rng(t).permutation(len(ids))
        rows = np.empty((len(ids), DIM), np.float32)
        for start in range(0, len(ids), 250):
            batch = order[start : start + 250]
            rows[batch] = table.gather(ids[batch])
        results[t] = rows

    run_threads([lambda t=t: toucher(t) for t in range(len(results))])
    for rows in results:
        np.testing.assert_array_equal(rows, results[0])
    np.testing.assert_array_equal(results[0][:50], expected)
    assert table.stats().rows == len(ids)


def test_set_init_is_atomic_for_readers(make_table, store_mod):
    table = make_table(10**6, DIM, init=store_mod.InitRule.constant(0.0))
    ids = np.arange(0, 10**6, 997, dtype=np.uint64)
    done = threading.Event()

    def switcher():
        for value in range(1, 60):
            table.set_init(store_mod.InitRule.constant(float(value)))
        done.set()

    def reader():
        while not done.is_set():
            rows = table.gather(ids)
            assert_uniform(rows)
            # Each row is some init value; rows materialized before a switch were dropped by it.

    run_threads([switcher, reader, reader])
    assert np.all(table.gather(ids) == 59.0)


def test_concurrent_named_table_creation_agrees(store_mod):
    store = store_mod.Store()
    config = store_mod.TableConfig(num_rows=100, row_words=4)
    ids = [None] * 8

    def create(i):
        ids[i] = store.create_named_table("shared", config)

    run_threads([lambda i=i: create(i) for i in range(len(ids))])
    assert len(set(ids)) == 1
    assert store.list() == [(ids[0], "shared")]
