"""A shard restarted without its --checkpoint-dir has lost its part of every table (issue 33). Declaring
the table again re-created that part empty, with no error: half the rows silently read their init
values again, and the handles made before worked again on them. Now the declaration says which shard
lost it and how to recover, and changes nothing."""

import pytest
import torch

import torch_recdev
from torch_recdev import local_shards, ops

IDS = torch.arange(10)


def _declare(**kwargs):
    return ops.init_embedding_table("lost.table", 1000, 4, init=torch_recdev.Zero(), **kwargs)


def test_a_shard_that_lost_its_part_says_so_at_the_next_declaration(start_shards, tmp_path):
    servers = start_shards(2)
    torch_recdev.connect(local_shards.server_list(servers))
    table = _declare()
    ops.emb_write(table, IDS, torch.full((10, 4), 7.0))
    listen = servers[1].address
    servers[1].kill()
    start_shards.restart(1, 2, listen=listen)
    with pytest.raises(KeyError, match="restarted without table 'lost.table'"):
        ops.emb_read(table, IDS)
    with pytest.raises(KeyError, match=r"is on some shards but not on recdev-server .* \(shard 1 of 2\).*ops.load.*reset=True"):
        _declare()
    # Nothing was re-created: the old handle still refuses instead of reading init values.
    with pytest.raises(KeyError, match="restarted without table 'lost.table'"):
        ops.emb_read(table, IDS)
    fresh = _declare(reset=True)
    assert torch.equal(ops.emb_read(fresh, IDS).cpu(), torch.zeros(10, 4))


def test_a_checkpoint_restores_a_table_a_shard_lost(start_shards, tmp_path):
    servers = start_shards(2)
    torch_recdev.connect(local_shards.server_list(servers))
    table = _declare()
    ops.emb_write(table, IDS, torch.full((10, 4), 7.0))
    ops.save(tmp_path / "fleet.recdev")
    listen = servers[1].address
    servers[1].kill()
    start_shards.restart(1, 2, listen=listen)
    ops.load(tmp_path / "fleet.recdev")
    assert torch.equal(ops.emb_read(_declare(), IDS).cpu(), torch.full((10, 4), 7.0))
