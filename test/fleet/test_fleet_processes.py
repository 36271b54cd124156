"""2 trainers x 2 shards, as real processes (test/fleet/fleet_processes.py): the servers named on
rank 0 only (and rank 0's overlap_updates taken by the others); every rank declares every table with its init and no update is lost (exact SGD sums);
share_tables on a model; a checkpoint saved by rank 0 and resumed by all; sync=True equal to one
process with the whole batch, on shards and on the embedded store, stepped by hand or by
apply_optimizer_in_backward's backward, and on shards with spilled tables (a memory tier of 2/3 of the rows); fleet
versions (ops.checkpoint(fleet=True)) of a synchronous fleet; a rank killed in sync mode, on shards and on the embedded
store."""

import pytest
import torch

from torch_recdev import local_shards

import fleet_worker
from fleet_processes import run_fleet


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """One fleet run of every scenario (each launch of two interpreters costs seconds)."""
    tmp = tmp_path_factory.mktemp("fleet")
    servers = local_shards.start_shards(2, "--disk-dir", str(tmp / "disk"), log_dir=str(tmp))
    try:
        out = run_fleet("async_sums,shared_model,checkpoint,sync_reference,sync_in_backward,sync_spilled,sync_versions,"
                        "sync_killed",
                        tmp, servers=local_shards.server_list(servers))
        yield out, local_shards.server_list(servers)
    finally:
        for server in servers:
            server.stop()


def test_ranks_without_recdev_servers_get_rank_0s_store(fleet):
    out, servers = fleet
    for rank in out:
        assert rank["store"]["kind"] == "remote" and ",".join(rank["store"]["servers"]) == servers


def test_every_rank_declaring_every_table_loses_no_update(fleet):
    out, _ = fleet
    # Row k: 1 - lr * count(k) * sum over ranks and steps of 2^-(rank+2) * (step+1) = 1 - 2.8125 * count(k).
    counts = torch.tensor([1.0, 2.0, 2.0, 1.0, 1.0]).unsqueeze(1)
    expected = (1.0 - 2.8125 * counts).expand(5, 4)
    for rank in out:
        for rows in rank["rows"]:
            assert torch.equal(rows, expected), rows


def test_ranks_take_rank_0s_overlap_updates_and_lose_no_update(fleet, tmp_path):
    _, servers = fleet
    out = run_fleet("overlap_published", tmp_path, env_all={"FLEET_CONNECT": servers})
    for rank in out:
        assert rank["store"]["overlap_updates"] is True
    test_every_rank_declaring_every_table_loses_no_update((out, servers))


def test_share_tables_names_the_tables_and_both_ranks_train_them(fleet):
    out, _ = fleet
    assert out[0]["names"] == out[1]["names"] == ["fleet.model.items.weight", "fleet.model.users.weight"]
    for part in range(2):
        # The first declaration's init values, whatever seed the other rank drew.
        assert torch.equal(out[0]["before"][part], out[1]["before"][part])
    heads = out[0]["head_weight"][0], out[1]["head_weight"][0]
    # d(sum of outputs)/d(row) is the head's weight slice: each rank's step moves each row by -lr times it.
    users_step = -0.25 * (heads[0][:4] + heads[1][:4])
    items_step = -0.25 * (heads[0][4:] + heads[1][4:])
    for rank in out:
        torch.testing.assert_close(rank["after"][0] - rank["before"][0], users_step.expand(2, 4), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(rank["after"][1] - rank["before"][1], items_step.expand(3, 4), rtol=1e-5, atol=1e-6)


def test_checkpoint_saved_by_rank_0_is_resumed_by_every_rank(fleet):
    out, _ = fleet
    for rank in out:
        assert torch.equal(rank["resumed"], rank["saved"])
    assert torch.equal(out[0]["saved"], out[1]["saved"])
    assert not torch.equal(out[0]["saved"], torch.ones_like(out[0]["saved"]))


@pytest.fixture(scope="module")
def embedded_fleet(tmp_path_factory):
    """Two ranks on their own embedded stores: synchronous replicas, then a rank killed mid-job."""
    return run_fleet("sync_reference,sync_in_backward,sync_replicas_with_policy,sync_versions,sync_killed",
                     tmp_path_factory.mktemp("embedded_fleet"))


@pytest.fixture(scope="module")
def reference():
    """The same 50 steps in this process (embedded), with the whole batch of each step; no sync."""
    return {kind: fleet_worker.sync_train(kind, 0, 1, False) for kind in fleet_worker.SYNC_KINDS}


@pytest.mark.parametrize("kind", fleet_worker.SYNC_KINDS)
def test_sync_on_two_shards_equals_one_process_with_the_whole_batch(fleet, reference, kind):
    out, _ = fleet
    assert out[0]["sync_store"] == "remote"
    for rank in out:
        torch.testing.assert_close(rank["sync"][kind], reference[kind], rtol=1e-6, atol=0)


@pytest.mark.parametrize("kind", fleet_worker.SYNC_KINDS)
def test_sync_in_backward_on_two_shards_equals_one_process_without_a_step_call(fleet, reference, kind):
    out, _ = fleet
    for rank in out:
        torch.testing.assert_close(rank["sync_in_backward"][kind], reference[kind], rtol=1e-6, atol=0)


@pytest.mark.parametrize("kind", fleet_worker.SYNC_KINDS)
def test_sync_on_two_shards_with_spilled_tables_equals_one_process_without_a_budget(fleet, reference, kind):
    """The shards' memory tiers hold 2/3 of the rows the steps touch; the disk tier gives every row
    back as it left, so the fleet trains as the unbounded single process does."""
    out, _ = fleet
    for rank in out:
        torch.testing.assert_close(rank["sync_spilled"][kind], reference[kind], rtol=1e-6, atol=0)


@pytest.mark.parametrize("where", ["embedded_fleet", "fleet"])
def test_fleet_versions_of_a_synchronous_fleet_restore_the_tables_between_the_same_two_steps(where, request):
    """ops.checkpoint(fleet=True) after every second step: rank 0 restores each version and finds the
    tables exactly as every rank left them between those two steps."""
    out = request.getfixturevalue(where)
    out = out[0] if where == "fleet" else out
    assert out[0]["versions_restored"] == {1: True, 2: True, 3: True}


@pytest.mark.parametrize("kind", fleet_worker.SYNC_KINDS)
def test_sync_on_embedded_replicas_equals_one_process_with_the_whole_batch(embedded_fleet, reference, kind):
    assert embedded_fleet[0]["sync_store"] == "embedded"
    for rank in embedded_fleet:
        torch.testing.assert_close(rank["sync"][kind], reference[kind], rtol=1e-6, atol=0)
        torch.testing.assert_close(rank["sync_in_backward"][kind], reference[kind], rtol=1e-6, atol=0)


@pytest.mark.parametrize("where", ["embedded_fleet", "fleet"])
def test_a_killed_rank_in_sync_mode_is_named_and_nothing_is_half_applied(where, request):
    """On the embedded store the group's store names the rank that did not reach the step; on shards
    every shard names the rank whose part never came (STAGE_UPDATE's timeout), and no rank commits."""
    out = request.getfixturevalue(where)
    survivor = out[0] if where == "embedded_fleet" else out[0][0]
    said = "did not reach it within 3 s" if where == "embedded_fleet" else "sent no part within 3 s"
    both_steps = [[-1.0] * 4, [-1.0] * 4, [1.0] * 4]  # rows 1, 2 after both ranks' step 1; row 3 untouched
    for prefix in ("", "in_backward_"):
        error = survivor[prefix + "error"]
        assert "synchronous step 2 (rank 0): " in error and f"rank 1 of 2 {said} (dead or hung)" in error, error
        assert torch.equal(survivor[prefix + "after_failed_step"], survivor[prefix + "after_step_1"])
        assert survivor[prefix + "after_step_1"].tolist() == both_steps


def test_embedded_sync_replicas_refuse_a_budget_policy_either_way(embedded_fleet):
    for rank in embedded_fleet:
        assert "identical replica" in rank["sync_of_policy_error"]
        assert "recdev-server shards" in rank["policy_of_sync_error"]
        assert rank["policy_after_refusal"]["max_rows"] is None
