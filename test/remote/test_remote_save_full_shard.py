"""ops.save of a remote store whose shards are filled up to their --max-memory: the DUMP snapshots it
reads are not refused, and the file loads back into fresh servers."""

import pytest
import torch

import torch_recdev
from torch_recdev import _C, local_shards, ops

DIM = 32
BATCH = 2000


def test_save_works_on_shards_filled_to_their_max_memory(start_shards, tmp_path):
    servers = start_shards(2, "--max-memory", "8M")
    torch_recdev.connect(local_shards.server_list(servers))
    table = ops.init_embedding_table("full.shard", 10**9, DIM, optimizer=("sgd", {"lr": 0.5}))
    generator = torch.Generator().manual_seed(16)
    ops.emb_update(table, torch.arange(BATCH), torch.ones(BATCH, DIM))  # optimizer step 1
    written = []
    for _ in range(100):
        keys = torch.arange(len(written) * BATCH, (len(written) + 1) * BATCH)
        values = torch.randn(BATCH, DIM, generator=generator)
        try:
            ops.emb_write(table, keys, values)
        except Exception as error:  # a shard reached its cap
            assert "store full" in str(error) and "--max-memory" in str(error)
            break
        written.append(values)
    else:
        pytest.fail("the shards never refused a write")
    assert len(written) > 2
    keys = torch.arange(len(written) * BATCH)
    expected = torch.cat(written)

    path = tmp_path / "full.recdev"
    ops.save(path)

    torch_recdev.connect(None)
    fresh = start_shards(2)
    torch_recdev.connect(local_shards.server_list(fresh))
    assert ops.load(path) == ["full.shard"]
    loaded = ops.init_embedding_table("full.shard", 10**9, DIM)
    assert torch.equal(ops.emb_read(loaded, keys).cpu(), expected)
    assert _C._table_optimizer_step(loaded) == 1
