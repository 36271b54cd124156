"""Memory of lazy tables: touching k distinct rows of a 10**10-row table materializes exactly k rows,
and a materialized row costs little more than its bytes (DESIGN.md, "Memory model": Lazy rows)."""

import pytest
import torch
import torch.nn.functional as F

import torch_recdev
from torch_recdev import is_table, table_stats

N = 10**10


def _random_ids(count, seed, high=N):
    return torch.randint(0, high, (count,), generator=torch.Generator().manual_seed(seed))


LOOKUPS = {
    "embedding": lambda w, ids: F.embedding(ids, w),
    "embedding_2d": lambda w, ids: F.embedding(ids.view(-1, 1), w),
    "index_select": lambda w, ids: w.index_select(0, ids),
    "getitem": lambda w, ids: w[ids],
    "bag_sum": lambda w, ids: F.embedding_bag(ids, w, torch.arange(0, len(ids), 3), mode="sum"),
    "bag_mean": lambda w, ids: F.embedding_bag(ids, w, torch.arange(0, len(ids), 5), mode="mean"),
    "bag_max": lambda w, ids: F.embedding_bag(ids, w, torch.tensor([0]), mode="max"),
    "bag_psw": lambda w, ids: F.embedding_bag(
        ids, w, torch.tensor([0, len(ids) // 2]), mode="sum", per_sample_weights=torch.ones(len(ids), device="recdev")
    ),
}


@pytest.mark.parametrize("lookup", sorted(LOOKUPS))
def test_k_distinct_rows_materialize_exactly_k(lookup, huge_table):
    w = huge_table(128)
    ids = _random_ids(500, seed=1)
    ids = torch.cat([ids, ids[:100], torch.tensor([0, N - 1, 0])])  # duplicates and the two ends
    k = ids.unique().numel()
    out = LOOKUPS[lookup](w, ids)
    assert not is_table(out)
    stats = table_stats(w)
    assert stats["rows"] == k
    assert stats["writes"] == 0, "a lookup reads; it does not write rows"
    # the same ids again: no growth at all
    LOOKUPS[lookup](w, ids)
    LOOKUPS[lookup](w, ids.flip(0))
    again = table_stats(w)
    assert again["rows"] == k
    assert again["bytes"] == stats["bytes"]
    # k2 new ids add exactly k2 rows
    more = torch.tensor([17, 18, 19, 17])
    fresh = (~torch.isin(more.unique(), ids)).sum().item()
    LOOKUPS[lookup](w, more)
    assert table_stats(w)["rows"] == k + fresh


@pytest.mark.parametrize("k", [1, 7, 1000])
def test_rows_count_for_various_k(k, huge_table):
    w = huge_table(64)
    ids = torch.arange(k, dtype=torch.int64) * 9_999_991 % N
    F.embedding(ids, w)
    assert table_stats(w)["rows"] == k


def test_padding_rows_of_a_bag_are_not_materialized(huge_table):
    w = huge_table(32)
    ids = torch.tensor([5, 9, 5, 9, 123])
    F.embedding_bag(ids, w, torch.tensor([0, 2]), mode="sum", padding_idx=9)
    assert table_stats(w)["rows"] == 2


def test_lookups_on_a_view_materialize_only_the_rows_of_the_table_they_hit(huge_table):
    w = huge_table(64)
    view = w[10**9 : 10**9 + 1000]
    out = F.embedding(torch.tensor([0, 999, 0, 5]), view)
    assert table_stats(w)["rows"] == 3
    assert torch.equal(out.cpu(), F.embedding(torch.tensor([10**9, 10**9 + 999, 10**9, 10**9 + 5]), w).cpu())
    assert table_stats(w)["rows"] == 3


def test_writes_materialize_only_the_written_rows(huge_table):
    w = huge_table(128)
    w[5] = 1.0
    w[10**9 : 10**9 + 3] = 2.0
    w[N - 1].fill_(3.0)
    stats = table_stats(w)
    assert stats["rows"] == 5
    assert stats["writes"] == 5


def test_empty_huge_table_holds_little_memory(huge_table):
    tables = [huge_table(128) for _ in range(4)]
    for t in tables:
        assert table_stats(t)["rows"] == 0
        assert table_stats(t)["bytes"] < 256 * 1024


def test_bytes_per_materialized_row_overhead(huge_table):
    w = huge_table(128)
    ids = _random_ids(101_000, seed=2).unique()[:100_000]  # 100k distinct rows
    assert ids.numel() == 100_000
    F.embedding(ids, w)
    stats = table_stats(w)
    assert stats["rows"] == 100_000
    row_bytes = 128 * 4
    ratio = stats["bytes"] / (stats["rows"] * row_bytes)
    assert 1.0 <= ratio <= 1.3, f"{stats['bytes']} bytes for {stats['rows']} rows of {row_bytes} bytes: {ratio:.3f}x"


def test_reinit_frees_materialized_rows(huge_table):
    w = huge_table(128)
    F.embedding(_random_ids(20_000, seed=4), w)
    full = table_stats(w)
    assert full["rows"] > 19_000
    with torch.no_grad():
        w.normal_()
    empty = table_stats(w)
    assert empty["rows"] == 0
    assert empty["bytes"] < full["bytes"] / 10


def test_memory_cached_counts_freed_host_blocks_until_taken_back(store_backend):
    torch.recdev.empty_cache()
    assert torch.recdev.memory_cached() == 0
    with torch_recdev.placement("host"):
        block = torch.empty(4 << 20, device="recdev")  # 16 MiB of host storage
    del block
    assert torch.recdev.memory_cached() == 16 << 20
    with torch_recdev.placement("host"):
        again = torch.empty(4 << 20, device="recdev")  # takes the block back
    assert torch.recdev.memory_cached() == 0
    del again


def test_memory_cached_counts_a_deleted_tables_emptied_regions_until_empty_cache(store_backend, run_python):
    if store_backend != "embedded":
        pytest.skip("the table's rows live in the servers' processes, and so does their memory")
    # A fresh process: here earlier tests' tables share the pool's regions, and the new table's rows
    # could fill their freed chunks instead of regions of their own.
    done = run_python(
        """
        import torch, torch_recdev
        with torch_recdev.placement("table"):
            table = torch.empty(10**6, 64, device="recdev")
        ids = torch.arange(0, 10**6, 10)
        torch_recdev.ops.emb_write(table, ids, torch.ones(len(ids), 64))  # ~26 MiB of records
        before = torch.recdev.memory_cached()
        del table  # its emptied 2 MiB regions are kept for the next table's rows
        kept = torch.recdev.memory_cached() - before
        assert kept >= 10 << 20, kept
        torch.recdev.empty_cache()
        assert torch.recdev.memory_cached() == 0, torch.recdev.memory_cached()
        print("ok")
        """
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
