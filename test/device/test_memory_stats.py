"""PyTorch's device-generic memory APIs on recdev (csrc/device/allocator.h, memory_stats.h,
store/memory_accounting.h; docs/device.md, "Memory"): torch.accelerator.memory_* and
torch.recdev's mirrors count host storage per block and the embedded store's tables per chunk, as
they are allocated and freed. The generic checks run through PyTorch's own
instantiate_device_type_tests, as every accelerator's do."""

import gc
import threading

import pytest
import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_utils import TestCase

import torch_recdev
from torch_recdev import local_shards, ops

POOLS = ("all", "small_pool", "large_pool")
FIGURES = ("current", "peak", "allocated", "freed")
BYTE_STATS = ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes")
ONE_MIB = 1 << 20


class TestRecdevMemoryStats(TestCase):
    def setUp(self):
        super().setUp()
        gc.collect()
        torch.accelerator.empty_cache()

    def test_every_stat_pytorch_names_is_reported(self, device):
        torch.ones(8, device=device)
        self.assertTrue(torch._C._accelerator_isAllocatorInitialized())
        stats = torch.accelerator.memory_stats()
        missing = [f"{stat}.{pool}.{figure}" for stat in BYTE_STATS for pool in POOLS for figure in FIGURES
                   if f"{stat}.{pool}.{figure}" not in stats]
        self.assertEqual(missing, [])

    def test_a_tensor_is_counted_at_its_bytes_while_it_lives(self, device):
        torch.accelerator.reset_accumulated_memory_stats()
        before = torch.accelerator.memory_stats()
        x = torch.ones(256, device=device)
        during = torch.accelerator.memory_stats()
        for stat in BYTE_STATS:
            self.assertEqual(during[f"{stat}.all.current"], before[f"{stat}.all.current"] + 1024, stat)
            self.assertEqual(during[f"{stat}.small_pool.current"], before[f"{stat}.small_pool.current"] + 1024, stat)
        self.assertEqual(during["allocation.all.current"], before["allocation.all.current"] + 1)
        del x
        after = torch.accelerator.memory_stats()
        self.assertEqual(after["allocated_bytes.all.current"], before["allocated_bytes.all.current"])
        self.assertEqual(after["active_bytes.all.freed"], 1024)
        self.assertEqual(after["allocation.all.current"], before["allocation.all.current"])

    def test_large_blocks_count_in_the_large_pool_and_the_peak_stays_until_reset(self, device):
        torch.accelerator.reset_peak_memory_stats()
        base = torch.accelerator.memory_allocated()
        x = torch.empty(4 * ONE_MIB, dtype=torch.uint8, device=device)
        stats = torch.accelerator.memory_stats()
        self.assertGreaterEqual(stats["allocated_bytes.large_pool.current"], x.nbytes)
        del x
        self.assertEqual(torch.accelerator.memory_allocated(), base)
        self.assertEqual(torch.accelerator.max_memory_allocated(), base + 4 * ONE_MIB)
        torch.accelerator.reset_peak_memory_stats()
        self.assertEqual(torch.accelerator.max_memory_allocated(), base)

    def test_empty_cache_gives_back_the_host_block_cache(self, device):
        base = torch.accelerator.memory_reserved()
        x = torch.empty(4 * ONE_MIB, dtype=torch.uint8, device=device)
        del x
        # A freed large block is kept for reuse: still reserved, no longer allocated.
        self.assertEqual(torch.accelerator.memory_reserved(), base + 4 * ONE_MIB)
        self.assertGreaterEqual(torch.recdev.memory_cached(), 4 * ONE_MIB)
        torch.accelerator.empty_cache()
        self.assertEqual(torch.accelerator.memory_reserved(), base)
        self.assertEqual(torch.recdev.memory_cached(), 0)

    def test_memory_info_is_the_hosts(self, device):
        free, total = torch.accelerator.get_memory_info()
        self.assertGreater(total, free)
        self.assertGreater(free, 0)
        self.assertEqual(torch.recdev.mem_get_info()[1], total)

    def test_torch_recdev_mirrors_agree_with_torch_accelerator(self, device):
        x = torch.ones(1000, device=device)
        self.assertEqual(torch.recdev.memory_allocated(), torch.accelerator.memory_allocated())
        self.assertEqual(torch.recdev.max_memory_allocated(), torch.accelerator.max_memory_allocated())
        self.assertEqual(torch.recdev.memory_reserved(), torch.accelerator.memory_reserved())
        self.assertEqual(torch.recdev.max_memory_reserved(), torch.accelerator.max_memory_reserved())
        del x

    def test_a_second_device_index_is_refused(self, device):
        with self.assertRaisesRegex(IndexError, "recdev has one device"):
            torch._C._accelerator_getDeviceStats(1)


instantiate_device_type_tests(TestRecdevMemoryStats, globals(), only_for="privateuse1")


def table_bytes():
    return torch.recdev.memory_stats()["table_allocated_bytes.current"]


@pytest.fixture
def embedded():
    torch_recdev.connect(None)
    yield


def test_table_rows_are_counted_when_made_and_when_erased(embedded):
    before = table_bytes()
    table = ops.init_embedding_table("memory_rows", 10**6, 64, optimizer=("adagrad", {"lr": 0.1}), reset=True)
    rows = torch.arange(100_000)
    ops.emb_update(table, rows, torch.ones(100_000, 64))
    grown = table_bytes() - before
    held = torch_recdev.table_stats(table)["bytes"]
    # table_stats also counts the table's own bookkeeping; the chunks are nearly all of it.
    assert 0.98 * held <= grown <= held, (grown, held)
    assert grown >= 100_000 * 64 * 4 * 2, "values and Adagrad state of every row"
    split = torch.recdev.memory_stats()
    assert split["allocated_bytes.all.current"] == split["host_allocated_bytes.current"] + split[
        "table_allocated_bytes.current"]
    ops.emb_delete(table, rows)
    assert table_bytes() == before
    assert torch.recdev.memory_stats()["table_allocated_bytes.peak"] >= before + grown


def test_the_peak_holds_rows_that_came_and_went(embedded):
    torch.recdev.reset_peak_memory_stats()
    base = torch.recdev.memory_allocated()
    table = ops.init_embedding_table("memory_peak", 10**6, 32, optimizer=("sgd", {"lr": 0.1}), reset=True)
    rows = torch.arange(50_000)
    ops.emb_update(table, rows, torch.ones(50_000, 32))
    high = torch.recdev.memory_allocated()
    ops.emb_delete(table, rows)
    assert torch.recdev.memory_allocated() == base
    assert torch.recdev.max_memory_allocated() >= high > base


def test_empty_cache_unmaps_the_stores_empty_regions(embedded):
    table = ops.init_embedding_table("memory_regions", 10**6, 64, optimizer=("sgd", {"lr": 0.1}), reset=True)
    rows = torch.arange(200_000)
    ops.emb_update(table, rows, torch.ones(200_000, 64))
    ops.emb_delete(table, rows)
    kept = torch.recdev.memory_stats()["table_reserved_bytes.current"]
    torch.recdev.empty_cache()
    assert torch.recdev.memory_stats()["table_reserved_bytes.current"] < kept


def test_threads_allocating_at_once_leave_the_counts_balanced(embedded):
    """Host blocks are made and freed on many threads at once: no count is lost to a race."""
    gc.collect()
    before = torch.recdev.memory_stats()
    torch.recdev.reset_accumulated_memory_stats()
    sizes = [100, 1000, 300_000]  # small and large blocks
    per_thread = 300

    def churn():
        for i in range(per_thread):
            x = torch.empty(sizes[i % len(sizes)], device="recdev")
            del x

    threads = [threading.Thread(target=churn) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    after = torch.recdev.memory_stats()
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    assert after["allocation.all.current"] == before["allocation.all.current"]
    made = 8 * sum(sizes[i % len(sizes)] * 4 for i in range(per_thread))
    assert after["allocated_bytes.all.allocated"] == after["allocated_bytes.all.freed"] == made


@pytest.fixture
def own_shards(tmp_path):
    """Two shards for this test alone: the session's shards hold other tests' tables, which their
    sessions' leases can free in the middle of a measurement of the shards' bytes."""
    servers = local_shards.start_shards(2, log_dir=str(tmp_path))
    yield local_shards.server_list(servers)
    for server in servers:
        server.stop()


def test_on_a_remote_store_tables_are_the_shards_memory(own_shards):
    torch_recdev.connect(own_shards)
    try:
        gc.collect()
        local_before = table_bytes()
        table = ops.init_embedding_table("memory_remote", 10**6, 16, optimizer=("sgd", {"lr": 0.1}), reset=True)
        rows = torch.arange(40_000)
        before = {s["address"]: s["bytes"] for s in torch.recdev.shard_memory_stats()}
        ops.emb_update(table, rows, torch.ones(40_000, 16))
        shards = torch.recdev.shard_memory_stats()
        assert [s["address"] for s in shards] == [u.removeprefix("tcp://") for u in torch_recdev.store_info()["servers"]]
        grown = sum(s["bytes"] - before[s["address"]] for s in shards)
        assert grown >= 40_000 * 16 * 4, "each shard holds its part of the rows"
        assert all(s["bytes"] > before[s["address"]] for s in shards)
        gc.collect()
        # Other tests' tables may be freed meanwhile; none of these rows may be here.
        assert table_bytes() - local_before < 40_000 * 16 * 4 // 10, "no table row is in the trainer's memory"
        ops.emb_delete(table, rows)
    finally:
        torch_recdev.connect(None)
    assert torch.recdev.shard_memory_stats() == []
