"""A batch that one shard's budget refuses changes no shard (issue 33): each shard judges its part
against its own share, so before a batch that reaches several shards of a table with a budget is
sent, every shard is asked whether its policy would refuse its part (CHECK_POLICY). Without that,
the shards that accepted applied their part — materialized, admitted, counted in the sketch — and the
user was told that nothing was applied. Each case below is a state one shard refuses and the other
would accept."""

import subprocess
import sys
import uuid

import pytest
import torch

import torch_recdev
import wire  # test/server's, on the path by conftest.py
from torch_recdev import local_shards, ops

DIM = 4


def _table(servers, **policy):
    torch_recdev.connect(local_shards.server_list(servers))
    name = f"refusals_{uuid.uuid4().hex}"
    table = ops.init_embedding_table(name, 10**6, DIM, init=torch_recdev.Constant(0.5), optimizer=("sgd", {"lr": 0.1}),
                                     **policy)
    route = wire.route_key_of_name(name)
    return name, table, [wire.owned_ids(route, shard, 2, 8) for shard in range(2)]


def _run(op, table, ids):
    keys = torch.tensor(ids)
    if op == "read":
        ops.emb_read(table, keys)
    elif op == "write":
        ops.emb_write(table, keys, torch.ones(len(ids), DIM))
    else:
        ops.emb_update(table, keys, torch.ones(len(ids), DIM))


@pytest.mark.parametrize("op", ["read", "write", "update"])
def test_a_full_shard_without_evict_refuses_the_batch_on_every_shard(start_shards, op):
    # max_rows=8 without evict: 4 rows a shard. Shard 1 is full, shard 0 has room for the batch's row.
    name, table, (on0, on1) = _table(start_shards(2), max_rows=8)
    ops.emb_read(table, torch.tensor(on1[:4]))
    with pytest.raises(MemoryError, match="no evict policy"):
        _run(op, table, [on0[0], on1[4]])
    assert ops.emb_exists(table, torch.tensor([on0[0]])).tolist() == [False]
    assert torch_recdev.table_stats(table)["rows"] == 4


def test_rows_pending_admission_on_one_shard_refuse_the_batch_on_every_shard(start_shards):
    # max_rows=4 with lru and admit_after=2: 2 rows a shard. Each row below was looked up once, so the
    # batch would admit them all: 3 on shard 1, past its 2, and 1 on shard 0, within its 2.
    name, table, (on0, on1) = _table(start_shards(2), max_rows=4, evict="lru", admit_after=2)
    ops.emb_read(table, torch.tensor([on0[0]] + on1[:3]))
    before = torch_recdev.table_stats(table)
    with pytest.raises(ValueError, match="3 distinct rows cannot fit the budget of 2"):
        ops.emb_read(table, torch.tensor([on0[0]] + on1[:3]))
    assert torch_recdev.table_stats(table) == before
    # Nor did the refused batch count in shard 0's sketch: one lookup more admits the row (its second).
    assert ops.emb_exists(table, torch.tensor([on0[0]])).tolist() == [False]
    ops.emb_read(table, torch.tensor([on0[0]]))
    assert ops.emb_exists(table, torch.tensor([on0[0]])).tolist() == [True]


OTHER_PROCESS = """
import torch, torch_recdev
from torch_recdev import ops
torch_recdev.connect({servers!r})
table = ops.init_embedding_table({name!r}, 10**6, {dim})  # keeps the policy, which it never reads
try:
    ops.emb_read(table, torch.tensor({ids!r}))
except MemoryError as error:
    print("refused:", error)
"""


def test_a_handle_that_never_read_the_policy_is_refused_on_every_shard(start_shards):
    servers = start_shards(2)
    name, table, (on0, on1) = _table(servers, max_rows=8)
    ops.emb_read(table, torch.tensor(on1[:4]))
    script = OTHER_PROCESS.format(servers=local_shards.server_list(servers), name=name, dim=DIM,
                                  ids=[on0[0], on1[4]])
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "refused:" in out.stdout and "no evict policy" in out.stdout, out.stdout
    assert ops.emb_exists(table, torch.tensor([on0[0]])).tolist() == [False]
    assert torch_recdev.table_stats(table)["rows"] == 4
