"""torch.save / torch.load of tables on a remote store, beyond what the table suites check on both
stores (test/tables/test_state_dict.py): files move between the embedded and the remote store,
restored tables live on the shards, and whole-table copies stay lazy."""

import io

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_recdev
from torch_recdev import local_shards

HUGE_ROWS = 10**10


@pytest.fixture
def servers(start_shards):
    return local_shards.server_list(start_shards(2))


def _trained_table():
    """A 10^10-row table with Adagrad state on 50 touched rows: (weight, probe ids)."""
    with torch.no_grad():
        weight = nn.Embedding(HUGE_ROWS, 8, device="recdev").weight
    opt = torch_recdev.optim.Adagrad([weight], lr=0.1)
    ids = torch.randint(0, HUGE_ROWS, (50,), generator=torch.Generator().manual_seed(3))
    F.embedding(ids, weight).pow(2).sum().backward()
    opt.step()
    return weight, ids


def _saved(tensor):
    """torch.save of `tensor` into memory, rewound for torch.load."""
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    buffer.seek(0)
    return buffer


def _saved_table_on_two_shards(start_shards):
    """Two fresh shards made current, and a trained table on them: (shards, weight, ids, saved file)."""
    shards = start_shards(2)
    torch_recdev.connect(local_shards.server_list(shards))
    weight, ids = _trained_table()
    return shards, weight, ids, _saved(weight)


def _state(weight, ids):
    return torch_recdev.ops.emb_read(weight, ids).cpu(), torch_recdev._C._table_optimizer_step(weight)


@pytest.mark.parametrize("save_on, load_on", [("remote", "embedded"), ("embedded", "remote"), ("remote", "remote")])
def test_a_saved_table_loads_on_either_store(servers, save_on, load_on):
    torch_recdev.connect(servers if save_on == "remote" else None)
    weight, ids = _trained_table()
    buffer = _saved(weight)
    untouched = torch.tensor([7, HUGE_ROWS - 2])  # read after the save: reading materializes them
    expected = _state(weight, ids), torch_recdev.ops.emb_read(weight, untouched).cpu()
    assert len(buffer.getvalue()) < 100_000  # the touched rows with their state, not 10^10 rows
    torch_recdev.connect(servers if load_on == "remote" else None)
    loaded = torch.load(buffer)
    assert torch_recdev.store_info()["kind"] == load_on
    assert torch_recdev.table_stats(loaded)["rows"] == 50
    rows, step = _state(loaded, ids)
    assert torch.equal(rows, expected[0][0]) and step == expected[0][1]
    assert torch.equal(torch_recdev.ops.emb_read(loaded, untouched).cpu(), expected[1])  # the same init rule


def _rows_on(shards):
    return [torch_recdev.server_stats(shard.address)["rows"] for shard in shards]


def test_a_table_restored_on_the_shards_lives_and_trains_there(start_shards):
    shards, weight, ids, saved = _saved_table_on_two_shards(start_shards)
    before = _rows_on(shards)
    loaded = torch.load(saved)
    assert _rows_on(shards) == before  # the rows wait in the loaded tensors until the table's first use
    assert torch_recdev.table_stats(loaded)["rows"] == 50
    after = _rows_on(shards)
    assert sum(after) - sum(before) == 50 and all(a > b for a, b in zip(after, before))  # spread over both
    opt_original = torch_recdev.optim.Adagrad([weight], lr=0.1)
    opt = torch_recdev.optim.Adagrad([loaded], lr=0.1)
    for table, optimizer in ((weight, opt_original), (loaded, opt)):
        F.embedding(ids, table).pow(2).sum().backward()
        optimizer.step()
    assert torch.equal(torch_recdev.ops.emb_read(loaded, ids).cpu(), torch_recdev.ops.emb_read(weight, ids).cpu())


def test_whole_table_copy_between_remote_tables_is_lazy_and_exact(servers):
    torch_recdev.connect(servers)
    weight, ids = _trained_table()
    clone = weight.clone()
    assert torch_recdev.is_table(clone) and torch_recdev.table_stats(clone)["rows"] == 50
    probe = torch.cat([ids, torch.tensor([0, HUGE_ROWS - 1])])
    assert torch.equal(F.embedding(probe, clone).cpu(), F.embedding(probe, weight).cpu())


def test_torch_load_with_a_dead_shard_fails_clearly_and_changes_nothing(start_shards):
    shards, _, _, saved = _saved_table_on_two_shards(start_shards)
    rows_before = _rows_on(shards[:1])
    shards[1].kill()
    with pytest.raises(ConnectionError, match=shards[1].address):
        torch.load(saved)
    assert _rows_on(shards[:1]) == rows_before
