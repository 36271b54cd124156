"""The chunk pool under the tables' records and row indexes (csrc/store/chunk_pool.h): full-size
chunks and large bucket arrays come from 2 MiB regions on transparent huge pages, freed chunks are
reused, and regions go back to the system once empty, so the memory outside the tables' own count
stays a few regions."""

import re

import numpy as np
import pytest

REGION = 2 << 20
DIM = 128  # 520-byte records: 8320-byte full-size chunks, which the pool serves


def filled_table(store_mod, rows, dim=DIM):
    store = store_mod.Store()
    table = store.table(store.create_table(store_mod.TableConfig(num_rows=10**9, dim=dim)))
    ids = np.arange(rows, dtype=np.uint64) * 7919  # spread over every sub-shard
    for start in range(0, rows, 8192):
        chunk = ids[start:start + 8192]
        table.write(chunk, np.full((len(chunk), dim), 1.5, np.float32))
    return store, table, ids


def test_slack_stays_within_a_few_regions_and_returns_when_rows_go(store_mod):
    baseline = store_mod.pooled_chunk_slack_bytes()
    store, table, ids = filled_table(store_mod, 100_000)
    held = table.stats().bytes
    assert held < 1.3 * 100_000 * DIM * 4
    # One partly used region per chunk size (64 sub-shards share them), not one per sub-shard.
    assert store_mod.pooled_chunk_slack_bytes() - baseline <= 3 * REGION
    table.erase(ids)
    assert table.stats().rows == 0
    assert store_mod.pooled_chunk_slack_bytes() <= baseline + 3 * REGION


def test_freed_chunks_are_reused_and_rows_keep_their_values(store_mod):
    store, table, ids = filled_table(store_mod, 20_000)
    table.erase(ids[::2])  # frees chunks in the middle of regions (records move to fill holes)
    again = np.arange(10_000, dtype=np.uint64) * 7919 + 3
    table.write(again, np.full((len(again), DIM), -2.0, np.float32))
    assert (table.gather(ids[1::2]) == 1.5).all()
    assert (table.gather(again) == -2.0).all()
    assert table.stats().rows == 20_000


def _thp_mode():
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
        return re.search(r"\[(\w+)\]", f.read()).group(1)


def _huge_bytes():
    with open("/proc/self/smaps_rollup") as f:
        return int(re.search(r"AnonHugePages:\s+(\d+) kB", f.read()).group(1)) * 1024


def test_records_sit_on_huge_pages_when_the_kernel_allows(store_mod):
    # With THP "never" the kernel ignores MADV_HUGEPAGE, so there is no huge page to count; what the
    # pool does regardless (reuse, slack, giving memory back) is checked by the other tests here.
    if _thp_mode() == "never":
        pytest.skip("transparent huge pages are off on this machine")
    before = _huge_bytes()
    store, table, _ = filled_table(store_mod, 60_000)  # ~31 MiB of records
    # Huge pages are a request the kernel may refuse when memory is fragmented; most should be granted.
    assert _huge_bytes() - before >= 8 * REGION


def test_large_row_indexes_sit_on_huge_pages_and_give_them_back(store_mod):
    # 7M rows over 64 sub-shards: each sub-shard's bucket array grows through the pooled sizes
    # (128 KiB - 2 MiB) to 4 MiB, a mapping of its own; 256 MiB of buckets in all, one random line of
    # them read per lookup.
    mode = _thp_mode()  # with "never", only the huge-page counts are left out (see above)
    rows, dim = 7_000_000, 1
    before_huge = _huge_bytes()
    baseline_slack = store_mod.pooled_chunk_slack_bytes()
    store = store_mod.Store()
    table = store.table(store.create_table(store_mod.TableConfig(num_rows=rows, dim=dim)))
    ids = np.arange(rows, dtype=np.uint64)
    for start in range(0, rows, 1 << 20):
        chunk = ids[start:start + (1 << 20)]
        table.write(chunk, chunk.astype(np.float32).reshape(-1, 1))
    held = table.stats().bytes
    records_and_ids = rows * (dim * 4 + 8)
    bucket_bytes = held - records_and_ids
    assert bucket_bytes >= 64 * (4 << 20)
    if mode != "never":
        assert _huge_bytes() - before_huge >= bucket_bytes // 2
    # Whole-region arrays leave no slack; the pooled sizes the arrays grew through were freed.
    assert store_mod.pooled_chunk_slack_bytes() - baseline_slack <= 3 * REGION
    sample = np.random.default_rng(0).choice(ids, 10_000, replace=False)
    np.testing.assert_array_equal(table.gather(sample).ravel(), sample.astype(np.float32))
    table.erase(ids)
    assert table.stats().rows == 0
    assert store_mod.pooled_chunk_slack_bytes() <= baseline_slack + 3 * REGION
    if mode != "never":
        assert _huge_bytes() - before_huge < bucket_bytes // 4
