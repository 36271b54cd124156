"""Synchronous steps on two real shards where they meet budgets and restarts (issue 33): a step that
one shard's budget could not hold fails at staging on every shard, and a shard restarted between
staging and commit is named, with the shards that applied the step. The steps are staged and
committed here directly (one rank of one: what torch_recdev.sync does per step), so that a restart
can fall between the two."""

import signal

import pytest
import torch

import torch_recdev
import wire  # test/server's, on the path by conftest.py
from torch_recdev import _C, local_shards, ops

DIM = 4
FLEET = 0x5EED


def _ids_by_shard(name, per_shard):
    route = wire.route_key_of_name(name)
    return [wire.owned_ids(route, shard, 2, count) for shard, count in enumerate(per_shard)]


def _stage(table, ids, step=1):
    _C._stage_step([table], [torch.tensor(ids)], [torch.ones(len(ids), DIM)], FLEET, step, 0, 1, 10.0)


def _commit(table, step=1):
    _C._commit_step([table], FLEET, step, 0, 1, 10.0)


def test_a_step_one_shards_budget_cannot_hold_fails_at_staging_on_every_shard(start_shards):
    # max_rows=4 is 2 rows a shard: shard 0 gets 1 row of the step, shard 1 gets 3. Staging checked
    # memory and ownership but not the budget, so shard 0 applied the step and shard 1 refused it.
    torch_recdev.connect(local_shards.server_list(start_shards(2)))
    name = "sync.budget.seam"
    table = ops.init_embedding_table(name, 1000, DIM, init=torch_recdev.Zero(), optimizer=("sgd", {"lr": 1.0}),
                                     max_rows=4, evict="lru")
    (on_0,), on_1 = _ids_by_shard(name, [1, 3])
    synced = _C._sync_table(table)
    with pytest.raises(ValueError, match="cannot fit the budget of 2 rows"):
        _stage(synced, [on_0, *on_1])
    # A rank commits only a step staged everywhere (torch_recdev/sync.py): nothing is applied.
    assert not ops.emb_exists(table, torch.tensor([on_0, *on_1])).any()
    assert _C._table_optimizer_step(table) == 0
    # A step that fits is applied on both shards.
    _stage(synced, [on_0, on_1[0]], step=2)
    _commit(synced, step=2)
    assert torch.equal(ops.emb_read(table, torch.tensor([on_0, on_1[0]])).cpu(), torch.full((2, DIM), -1.0))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_shard_restarted_between_staging_and_commit_is_named_with_the_shards_that_applied(
        start_shards, tmp_path, sig):
    checkpoints = str(tmp_path / "checkpoints")
    servers = start_shards(2, "--checkpoint-dir", checkpoints)
    torch_recdev.connect(local_shards.server_list(servers))
    name = "sync.restart.seam"
    table = ops.init_embedding_table(name, 1000, DIM, init=torch_recdev.Zero(), optimizer=("sgd", {"lr": 1.0}))
    on_0, on_1 = _ids_by_shard(name, [2, 2])
    synced = _C._sync_table(table)
    _stage(synced, on_0 + on_1)
    listen = servers[1].address
    servers[1].stop(sig)  # SIGTERM checkpoints the table (not the staged parts); SIGKILL leaves nothing
    start_shards.restart(1, 2, "--checkpoint-dir", checkpoints, listen=listen)
    with pytest.raises(ConnectionError) as refused:
        _commit(synced)
    message = str(refused.value)
    assert "was applied to table 'sync.restart.seam' on" in message and "(shard 0 of 2)" in message
    assert "but not to table 'sync.restart.seam' on" in message and "(shard 1 of 2)" in message
    assert "is not staged here" not in message.split("(")[0]
    assert torch.equal(ops.emb_read(table, torch.tensor(on_0)).cpu(), torch.full((2, DIM), -1.0))
