"""Budgets, eviction and admission on recdev-server shards: every shard keeps its share of the budget
after every batch, evicted rows read as the init rule, counts add up across shards, concurrent
trainers never see a torn row, checkpoints (ops.save, torch.save, the servers' own) keep the policy
and its touch metadata, and `recdev-server --stats` reports what each table's policy did."""

import datetime
import io
import os
import subprocess
import sys
import uuid

import pytest
import torch

import torch_recdev
from torch_recdev import _C, local_shards, ops, server

DIM = 8
INIT = 0.5  # Constant init: an evicted row reads exactly this, an updated one never does


def _name():
    return f"remote_budget_{uuid.uuid4().hex}"


def shard_counters(servers, name):
    """Each shard's STATS entry of the named table: [{rows, evicted, admitted, pending, max_rows}, ...]."""
    entries = []
    for address in servers:
        stats = torch_recdev.server_stats(address.address)
        (entry,) = [t for t in stats["table_counters"] if t["name"] == name]
        entries.append(entry)
    return entries


POLICIES = {
    "lru": dict(max_rows=101, evict="lru"),
    "lfu": dict(max_rows=101, evict="lfu", half_life=5),
    "ttl": dict(max_rows=101, evict="ttl", ttl=4),
}


@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_each_policy_keeps_every_shards_share_after_every_batch(start_shards, kind):
    servers = start_shards(2)
    torch_recdev.connect(local_shards.server_list(servers))
    name = _name()
    table = ops.init_embedding_table(name, 10**6, DIM, init=torch_recdev.Constant(INIT),
                                     optimizer=("sgd", {"lr": 1.0}), **POLICIES[kind])
    policy = torch_recdev.table_policy(table)
    assert policy["max_rows"] == 101 and policy["evict"] == kind
    # 101 over 2 shards: 51 and 50, which add up to the table's budget.
    assert sorted(e["max_rows"] for e in shard_counters(servers, name)) == [50, 51]
    generator = torch.Generator().manual_seed(7)
    updated = set()
    for step in range(30):
        keys = torch.randint(0, 600, (40,), generator=generator)
        ops.emb_read(table, keys)
        ops.emb_update(table, keys, torch.ones(40, DIM))
        updated.update(keys.tolist())
        for entry in shard_counters(servers, name):
            assert entry["rows"] <= entry["max_rows"], (step, entry)
    stats = torch_recdev.table_stats(table)
    per_shard = shard_counters(servers, name)
    assert stats["rows"] == sum(e["rows"] for e in per_shard) <= 101
    assert stats["evicted"] == sum(e["evicted"] for e in per_shard) > 0
    assert stats["admitted"] == sum(e["admitted"] for e in per_shard)
    # Every row came in through the policy: what is held is what was admitted and not evicted.
    assert stats["rows"] == stats["admitted"] - stats["evicted"]
    assert stats["policy"]["max_rows"] == 101
    # Rows updated then evicted read as the init rule again, not as their last value.
    ids = torch.tensor(sorted(updated))
    held = ops.emb_exists(table, ids)
    evicted = ids[~held]
    assert evicted.numel() > 0
    assert torch.equal(ops.emb_read(table, evicted[:50]).cpu(), torch.full((min(50, evicted.numel()), DIM), INIT))


def test_admission_on_two_shards_counts_pending_touches(start_shards):
    servers = start_shards(2)
    torch_recdev.connect(local_shards.server_list(servers))
    name = _name()
    table = ops.init_embedding_table(name, 10**6, DIM, init=torch_recdev.Constant(INIT), max_rows=1000,
                                     evict="lru", admit_after=2)
    keys = torch.arange(100)
    ops.emb_read(table, keys)
    stats = torch_recdev.table_stats(table)
    assert (stats["rows"], stats["admitted"], stats["pending"]) == (0, 0, 100)
    ops.emb_write(table, keys[:10], torch.zeros(10, DIM))  # a write admits at once
    ops.emb_read(table, keys)  # the second lookup admits the other 90
    stats = torch_recdev.table_stats(table)
    assert (stats["rows"], stats["admitted"]) == (100, 100)
    assert sum(e["pending"] for e in shard_counters(servers, name)) == stats["pending"] == 100
    assert torch.equal(ops.emb_read(table, keys[:10]).cpu(), torch.zeros(10, DIM))


def test_set_table_policy_on_a_module_table_and_bad_policies(remote_shards):
    torch_recdev.connect(remote_shards)
    with torch_recdev.placement("table"):
        embedding = torch.nn.Embedding(10**6, DIM, device="recdev")
    weight = embedding.weight
    torch_recdev.set_table_policy(weight, evict="ttl", ttl=datetime.timedelta(hours=1), admit_after=3)
    assert torch_recdev.table_policy(weight) == dict(max_rows=None, max_bytes=None, evict="ttl",
                                                     ttl=datetime.timedelta(hours=1), admit_after=3)
    with pytest.raises(ValueError, match="cannot be split over its 2 shards"):
        torch_recdev.set_table_policy(weight, max_rows=1, evict="lru")
    for bad in (dict(max_rows=0), dict(evict="mru", max_rows=5), dict(ttl=5), dict(evict="lru")):
        with pytest.raises(ValueError):
            torch_recdev.set_table_policy(weight, **bad)
    assert torch_recdev.table_policy(weight)["admit_after"] == 3  # nothing changed
    torch_recdev.set_table_policy(weight)
    assert torch_recdev.table_stats(weight)["policy"]["evict"] is None


def test_a_budget_without_evict_refused_by_one_shard_changes_no_shard(start_shards):
    servers = start_shards(2)
    torch_recdev.connect(local_shards.server_list(servers))
    name = _name()
    table = ops.init_embedding_table(name, 10**6, DIM, max_rows=500, evict="lru")
    ops.emb_read(table, torch.arange(300))
    next_id = 300
    while len({e["rows"] for e in shard_counters(servers, name)}) == 1:  # until one shard holds more
        ops.emb_read(table, torch.tensor([next_id]))
        next_id += 1
    fewer = min(e["rows"] for e in shard_counters(servers, name))
    # Shares of `fewer` rows each, without evict: one shard takes it, the other refuses; the first is
    # set back, so both keep the old policy.
    with pytest.raises(MemoryError, match="no evict policy"):
        torch_recdev.set_table_policy(table, max_rows=2 * fewer)
    assert torch_recdev.table_policy(table)["max_rows"] == 500
    assert [e["max_rows"] for e in shard_counters(servers, name)] == [250, 250]
    assert torch_recdev.table_stats(table)["rows"] == next_id


TRAINER = """
import torch, torch_recdev
from torch_recdev import ops
table = ops.init_embedding_table({name!r}, 500, {dim})
gen = torch.Generator().manual_seed({seed})
for step in range(60):
    keys = torch.randint(0, 500, (16,), generator=gen)
    rows = ops.emb_read(table, keys).cpu()
    # Every element of a row moves together: a torn row (half evicted, half updated) differs inside.
    assert torch.equal(rows, rows[:, :1].expand_as(rows)), rows
    assert torch.equal(rows, rows.round()), rows
    ops.emb_update(table, keys, torch.randint(-3, 4, (16, 1)).float().expand(16, {dim}).contiguous())
"""


def test_concurrent_trainers_under_a_budget_see_no_torn_row(start_shards):
    servers = start_shards(2)
    addresses = local_shards.server_list(servers)
    torch_recdev.connect(addresses)
    name = _name()
    # Zero init and SGD with lr 1 on integer gradients shared by a row's elements: every value a row
    # can hold is an integer, the same in every element.
    table = ops.init_embedding_table(name, 500, DIM, init=torch_recdev.Zero(), optimizer=("sgd", {"lr": 1.0}),
                                     max_rows=64, evict="lru")
    env = dict(os.environ, RECDEV_SERVERS=addresses)
    trainers = [subprocess.Popen([sys.executable, "-c", TRAINER.format(name=name, dim=DIM, seed=seed)], env=env,
                                 stderr=subprocess.PIPE, text=True) for seed in (1, 2)]
    for trainer in trainers:
        _, stderr = trainer.communicate(timeout=300)
        assert trainer.returncode == 0, stderr
    rows = table.cpu()  # a copy peeks: every row, held or not, without touching it
    assert torch.equal(rows, rows[:, :1].expand_as(rows)) and torch.equal(rows, rows.round())
    stats = torch_recdev.table_stats(table)
    per_shard = shard_counters(servers, name)
    assert stats["rows"] <= 64 and all(e["rows"] <= e["max_rows"] for e in per_shard)
    assert stats["rows"] == stats["admitted"] - stats["evicted"]
    assert _C._table_optimizer_step(table) == 2 * 60


def _touches(table):
    ops.emb_read(table, torch.tensor([4, 100, 101, 102]))
    ops.emb_read(table, torch.tensor([100, 101, 102]))  # admits them, evicting the least recent rows


def test_ops_save_and_load_keep_the_policy_and_its_touch_metadata(remote_shards, tmp_path):
    torch_recdev.connect(remote_shards)
    name = _name()
    table = ops.init_embedding_table(name, 10**6, 4, optimizer=("sgd", {"lr": 0.1}), max_rows=40, evict="lru",
                                     admit_after=2)
    for first in range(0, 72, 12):  # 72 rows admitted, each shard full at its 20
        for _ in range(2):
            ops.emb_read(table, torch.arange(first, first + 12))
    path = tmp_path / "remote.recdev"
    ops.save(path)
    saved_stats = torch_recdev.table_stats(table)
    _touches(table)
    held = ops.emb_exists(table, torch.arange(200))

    torch_recdev.set_table_policy(table)  # anything may change meanwhile
    ops.emb_read(table, torch.arange(50, 90))
    assert name in ops.load(path)
    assert torch_recdev.table_policy(table)["max_rows"] == 40
    restored = torch_recdev.table_stats(table)
    for key in ("rows", "evicted", "admitted", "pending"):
        assert restored[key] == saved_stats[key], key
    _touches(table)  # the same touches evict the same rows: the touch metadata came back
    assert torch.equal(ops.emb_exists(table, torch.arange(200)), held)

    # The same file in an embedded store: one table under the whole budget.
    torch_recdev.connect(None)
    assert name in ops.load(path)
    local = ops.init_embedding_table(name, 10**6, 4)
    assert torch_recdev.table_policy(local)["max_rows"] == 40
    assert torch_recdev.table_stats(local)["rows"] == saved_stats["rows"]


def test_torch_save_of_a_remote_table_with_a_policy_round_trips(remote_shards):
    torch_recdev.connect(remote_shards)
    table = ops.init_embedding_table(_name(), 10**4, 4, init=torch_recdev.Normal(0, 1), max_rows=20, evict="lfu",
                                     half_life=3, optimizer=("sgd", {"lr": 0.1}))
    for step in range(6):
        keys = torch.arange(step * 5, step * 5 + 10)
        ops.emb_read(table, keys)
        ops.emb_update(table, keys, torch.ones(10, 4))
    buffer = io.BytesIO()
    torch.save(table, buffer)
    ids = torch.arange(100)
    held, values = ops.emb_exists(table, ids), table.cpu()
    buffer.seek(0)
    loaded = torch.load(buffer)
    assert torch_recdev.table_policy(loaded) == torch_recdev.table_policy(table)
    saved, restored = torch_recdev.table_stats(table), torch_recdev.table_stats(loaded)
    assert (restored["admitted"], restored["pending"]) == (saved["admitted"], saved["pending"])
    # The loaded table is a new anonymous table, whose rows spread over the shards by another routing
    # key: a shard given more rows than its share evicts the lowest counts at once. Those rows read as
    # the init rule; every row it keeps has its saved value.
    kept = ops.emb_exists(loaded, ids)
    assert bool((held | ~kept).all())
    assert restored["evicted"] == saved["evicted"] + int(held.sum() - kept.sum())
    assert torch.equal(loaded.cpu()[:100][kept], values[:100][kept])
    # Each shard holds 10 rows of the budget of 20, and this table's routing key is random: 10 ids per
    # request always fit one shard, where 15 would overflow one about one time in eight.
    for start in (60, 70):
        ops.emb_read(loaded, torch.arange(start, start + 10))
    assert torch_recdev.table_stats(loaded)["rows"] <= 20


def test_server_checkpoints_keep_each_shards_budget(start_shards, tmp_path):
    checkpoints = str(tmp_path / "ckpt")
    servers = start_shards(2, "--checkpoint-dir", checkpoints)
    addresses = local_shards.server_list(servers)
    torch_recdev.connect(addresses)
    name = _name()
    table = ops.init_embedding_table(name, 10**6, DIM, max_rows=40, evict="lru")
    for first in range(0, 200, 10):
        ops.emb_read(table, torch.arange(first, first + 10))
    before = [dict(e, table_id=None) for e in shard_counters(servers, name)]
    for shard, old in enumerate(servers):
        listen = old.address
        old.stop()
        servers[shard] = start_shards.restart(shard, 2, "--checkpoint-dir", checkpoints, listen=listen)
    assert [dict(e, table_id=None) for e in shard_counters(servers, name)] == before
    assert torch_recdev.table_policy(table)["max_rows"] == 40
    for first in range(1000, 1100, 10):
        ops.emb_read(table, torch.arange(first, first + 10))
    assert all(e["rows"] <= e["max_rows"] for e in shard_counters(servers, name))


def test_stats_command_reports_each_tables_evictions_and_admissions(start_shards):
    servers = start_shards(1)
    torch_recdev.connect(local_shards.server_list(servers))
    name = _name()
    table = ops.init_embedding_table(name, 10**6, DIM, max_rows=30, evict="lru", admit_after=2)
    for first in range(0, 100, 10):
        for _ in range(2):  # the second lookup admits
            ops.emb_read(table, torch.arange(first, first + 10))
    stats = torch_recdev.table_stats(table)
    assert (stats["evicted"], stats["admitted"], stats["pending"]) == (70, 100, 100)
    out = subprocess.run([server.executable(), "--stats", servers[0].address], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    (line,) = [line for line in out.stdout.splitlines() if name in line]
    assert "rows 30, evicted 70, admitted 100, pending 100" in line
    assert "max_rows=30" in line and "evict=lru" in line


def test_a_handle_to_a_table_recreated_with_another_dtype_is_refused(start_shards):
    (shard,) = start_shards(1)
    addresses = local_shards.server_list([shard])
    torch_recdev.connect(addresses)
    name = _name()
    old = ops.init_embedding_table(name, 100, 8, init=torch_recdev.Constant(1.0))
    ops.emb_read(old, torch.arange(4))
    listen = shard.address
    shard.stop()  # no checkpoint: the table is gone with the server
    start_shards.restart(0, 1, listen=listen)
    torch_recdev.connect(addresses)
    # 16 float16 elements are the same 8 words per row as the old table's 8 float32: only the dtype
    # tells them apart.
    new = ops.init_embedding_table(name, 100, 16, dtype=torch.float16, init=torch_recdev.Constant(2.0))
    ops.emb_write(new, torch.arange(4), torch.full((4, 16), 3.0, dtype=torch.float16))
    for request in (lambda: ops.emb_read(old, torch.arange(4)),
                    lambda: ops.emb_write(old, torch.arange(2), torch.zeros(2, 8))):
        with pytest.raises(ValueError, match="as float32 refused: this shard holds the table's rows as float16"):
            request()
    assert torch.equal(ops.emb_read(new, torch.arange(4)).cpu(), torch.full((4, 16), 3.0, dtype=torch.float16))
