"""The direct index (csrc/store/direct_index.h): batch reads of a dense table find records through an
array indexed by row id. Every change of where a record lives must reach that array, or a read
returns another row's record (or freed memory): these tests read through it after each such change
and compare with a model that knows nothing of it."""

import threading

import numpy as np
import pytest
from dense_model import DenseModel
from threads import run_threads

# 256-byte rows: 8 bytes per possible id, so the index is built from 16 * 8 * 512 / 256 = 256 rows
# materialized and dropped under 128.
NUM_ROWS, DIM = 512, 64
BUILT_FROM, KEPT_FROM = 256, 128
INDEX_BYTES = NUM_ROWS * 8


@pytest.fixture
def table(make_table, store_mod):
    return make_table(NUM_ROWS, DIM, init=store_mod.InitRule.normal(0, 1, seed=5))


def all_ids():
    return np.arange(NUM_ROWS, dtype=np.uint64)


def assert_reads_match(table, model):
    """peek reads every row through the index in use without materializing any."""
    np.testing.assert_array_equal(table.peek(all_ids()), model.values)
    np.testing.assert_array_equal(table.exists(all_ids()), model.materialized)  # the hash index


def write_rows(table, model, ids, rng):
    rows = rng.standard_normal((len(ids), DIM)).astype(np.float32)
    table.write(ids, rows)
    model.write(ids, rows)


def test_built_by_the_first_read_once_the_table_is_dense_enough(table, rng):
    table.write(all_ids()[: BUILT_FROM - 1], np.ones((BUILT_FROM - 1, DIM), np.float32))
    table.gather(all_ids()[:1])
    assert table.direct_index_bytes() == 0
    without_index = table.stats().bytes

    table.write(all_ids()[BUILT_FROM - 1 : BUILT_FROM], np.ones((1, DIM), np.float32))
    assert table.direct_index_bytes() == 0  # writes never build it: reads do
    table.gather(all_ids()[:1])
    assert table.direct_index_bytes() == INDEX_BYTES
    assert table.stats().bytes >= without_index + INDEX_BYTES  # counted in the table's memory


def test_a_lazy_table_of_sparse_ids_never_gets_one(make_table, rng):
    table = make_table(10**10, DIM)
    ids = rng.choice(10**10, size=5000, replace=False).astype(np.uint64)
    table.gather(ids)
    assert table.stats().rows == 5000
    assert table.direct_index_bytes() == 0


def materialize_all_and_index(table):
    table.gather(all_ids())  # decides before it materializes: not yet dense
    table.gather(all_ids()[:1])


def test_erasing_rows_drops_it_and_set_init_too(table, store_mod):
    materialize_all_and_index(table)
    assert table.direct_index_bytes() == INDEX_BYTES
    table.erase(all_ids()[: NUM_ROWS - KEPT_FROM])
    assert table.direct_index_bytes() == INDEX_BYTES  # still worth keeping at exactly KEPT_FROM rows
    table.erase(all_ids()[NUM_ROWS - KEPT_FROM : NUM_ROWS - KEPT_FROM + 1])
    assert table.direct_index_bytes() == 0

    materialize_all_and_index(table)
    assert table.direct_index_bytes() == INDEX_BYTES
    table.set_init(store_mod.InitRule.zero())
    assert table.direct_index_bytes() == 0
    np.testing.assert_array_equal(table.gather(all_ids()), np.zeros((NUM_ROWS, DIM), np.float32))


def test_random_writes_erasures_and_reads_through_it_match_the_model(table, store_mod, rng):
    """Rows come and go across both thresholds; an erase moves its sub-shard's last record into the
    freed slot, which the index must follow."""
    model = DenseModel(store_mod, table)
    index_states = set()
    growing = True
    for step in range(160):
        rows = int(model.materialized.sum())
        growing = rows < BUILT_FROM + 60 if growing else rows <= KEPT_FROM - 40
        ids = rng.integers(0, NUM_ROWS, size=int(rng.integers(1, 48))).astype(np.uint64)
        if growing:
            write_rows(table, model, ids, rng)
        else:
            table.erase(ids)
            model.erase(ids)
        reads = rng.integers(0, NUM_ROWS, size=64).astype(np.uint64)
        np.testing.assert_array_equal(table.gather(reads), model.gather(reads))
        offsets = np.arange(0, 64, 4, dtype=np.int64)
        pooled, _ = table.gather_pooled(reads, offsets)
        np.testing.assert_allclose(pooled, model.values[reads].reshape(16, 4, DIM).sum(axis=1), rtol=1e-6, atol=1e-6)
        index_states.add(table.direct_index_bytes() > 0)
        if step % 8 == 0:
            assert_reads_match(table, model)
    assert index_states == {True, False}  # the loop really read through both indexes
    assert_reads_match(table, model)


def test_it_follows_records_relaid_for_an_optimizer_and_back(table, store_mod, rng):
    model = DenseModel(store_mod, table)
    write_rows(table, model, all_ids()[::2], rng)  # 256 rows: built at the next read
    table.gather(all_ids()[:1])
    model.gather(all_ids()[:1])
    assert table.direct_index_bytes() == INDEX_BYTES
    table.set_optimizer(store_mod.OptimizerConfig.adagrad(lr=0.1))  # every record re-laid, wider
    assert table.direct_index_bytes() == INDEX_BYTES
    assert_reads_match(table, model)
    write_rows(table, model, all_ids()[1:40:2], rng)  # new records, then some erased
    table.erase(all_ids()[:100:3])
    model.erase(all_ids()[:100:3])
    assert_reads_match(table, model)
    table.set_optimizer(store_mod.OptimizerConfig())  # and narrower again
    assert_reads_match(table, model)


def test_updates_materialize_rows_into_it(table, store_mod):
    table.set_optimizer(store_mod.OptimizerConfig.sgd(lr=1.0))
    table.gather(all_ids()[:BUILT_FROM])
    table.gather(all_ids()[:1])
    assert table.direct_index_bytes() == INDEX_BYTES
    before = table.peek(all_ids())
    grads = np.full((NUM_ROWS, DIM), 0.5, np.float32)
    table.update(all_ids(), grads)  # half the rows are materialized by the update itself
    np.testing.assert_array_equal(table.gather(all_ids()), before - grads)


def test_a_loaded_table_gets_one_for_its_new_records(table, make_table, store_mod, rng, tmp_path):
    model = DenseModel(store_mod, table)
    write_rows(table, model, all_ids()[: NUM_ROWS - 12], rng)
    path = tmp_path / "t.ckpt"
    store_mod.save_table(path, table, "t")

    destination = make_table(NUM_ROWS, DIM)
    materialize_all_and_index(destination)  # its own records, indexed, then replaced by the load
    assert destination.direct_index_bytes() == INDEX_BYTES
    store_mod.load_table(path, destination)
    assert destination.direct_index_bytes() == INDEX_BYTES
    assert_reads_match(destination, model)


def test_concurrent_erasures_and_writes_never_show_a_reader_another_rows_record(make_table, store_mod):
    """Row r holds the value r + 1 whenever it is materialized and its init value 0 otherwise: a
    reader that followed a stale entry of the index would see another row's value."""
    num_rows = 4096
    table = make_table(num_rows, DIM, init=store_mod.InitRule.zero())
    ids = np.arange(num_rows, dtype=np.uint64)
    values = np.repeat((ids + 1).astype(np.float32)[:, None], DIM, axis=1)
    table.write(ids, values)
    table.gather(ids[:1])
    assert table.direct_index_bytes() > 0
    done = threading.Event()
    reads = [0]

    def churn():
        rng = np.random.default_rng(7)
        for _ in range(300):
            batch = rng.choice(num_rows, size=200, replace=False).astype(np.uint64)
            table.erase(batch)
            table.write(batch, values[batch.astype(np.int64)])
        done.set()

    def reader(seed):
        rng = np.random.default_rng(seed)
        while not done.is_set():
            batch = rng.integers(0, num_rows, size=1024).astype(np.uint64)
            rows = table.peek(batch)
            expected = (batch + 1).astype(np.float32)[:, None]
            assert np.all((rows == expected) | (rows == 0))
            reads[0] += 1

    run_threads([churn, lambda: reader(1), lambda: reader(2)])
    assert reads[0] >= 10
    assert table.direct_index_bytes() > 0  # every row is back: the readers went through the index
    np.testing.assert_array_equal(table.gather(ids), values)
