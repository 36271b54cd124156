"""ops.save / ops.load on a remote store: one file on the client, in the embedded store's format."""

import os
import subprocess
import sys
import uuid

import torch

import torch_recdev
from torch_recdev import _C, local_shards, ops


def test_save_and_load_round_trip_through_the_shards_and_the_embedded_store(start_shards, tmp_path):
    # Shards of its own: ops.save writes every named table of the store, and the last assert names them all.
    torch_recdev.connect(local_shards.server_list(start_shards(2)))
    name = f"ckpt_{uuid.uuid4().hex}"
    table = ops.init_embedding_table(name, 10**6, 16, init=torch_recdev.Normal(0, 1), optimizer=("adam", {"lr": 0.01}))
    keys = torch.randint(0, 10**6, (300,))
    for _ in range(3):
        ops.emb_update(table, keys, torch.randn(300, 16))
    path = tmp_path / "remote.recdev"
    ops.save(path)
    saved = ops.emb_read(table, keys).cpu()

    ops.emb_update(table, keys, torch.randn(300, 16))  # rows, optimizer state and step move on
    ops.emb_write(table, keys[:5], torch.zeros(5, 16))
    assert name in ops.load(path)
    assert torch.equal(ops.emb_read(table, keys).cpu(), saved)
    assert _C._table_optimizer_step(table) == 3

    # The same file in a fresh process's embedded store: one more identical update gives identical
    # rows (so the optimizer state came back on both), and the file that store saves loads back here.
    torch.save(keys, tmp_path / "keys.pt")
    grads = torch.randn(300, 16)
    torch.save(grads, tmp_path / "grads.pt")
    script = f"""
import torch, torch_recdev
from torch_recdev import ops
assert torch_recdev.store_info()["kind"] == "embedded"
assert {name!r} in ops.load({str(path)!r})
table = ops.init_embedding_table({name!r}, 10**6, 16)
keys = torch.load({str(tmp_path / "keys.pt")!r})
ops.emb_update(table, keys, torch.load({str(tmp_path / "grads.pt")!r}))
torch.save(ops.emb_read(table, keys).cpu(), {str(tmp_path / "after.pt")!r})
ops.save({str(tmp_path / "embedded.recdev")!r})
"""
    env = {k: v for k, v in os.environ.items() if k != "RECDEV_SERVERS"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    ops.emb_update(table, keys, grads)
    after = torch.load(tmp_path / "after.pt")
    assert torch.equal(ops.emb_read(table, keys).cpu(), after)

    ops.emb_write(table, keys, torch.zeros(300, 16))
    assert ops.load(tmp_path / "embedded.recdev") == [name]
    assert torch.equal(ops.emb_read(table, keys).cpu(), after)
