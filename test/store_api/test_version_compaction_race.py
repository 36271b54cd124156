"""Versions written back to back while compactions run in the background: a checkpoint that lists
the directory while a compaction is still folding its chain must not hand the next compaction that
stale listing (files the first one has since removed), and every version left restores."""

import uuid

import torch

from torch_recdev import ops


def test_back_to_back_checkpoints_while_compactions_run(tmp_path):
    table = ops.init_embedding_table(f"race_{uuid.uuid4().hex[:8]}", 10**6, 8, optimizer=("sgd", {"lr": 0.5}))
    ops.emb_update(table, torch.arange(20_000), torch.ones(20_000, 8))
    ops.checkpoint(tmp_path)
    # Each delta rewrites about a third of the base's bytes (the store's other tables are in it too):
    # a compaction is due every few versions, and the next checkpoints run while it does.
    rows = min(10**6 - 200, max(20_000, ops.version_files(tmp_path)[0]["bytes"] // 120))
    for step in range(120):
        ops.emb_update(table, torch.arange(rows) + step, torch.ones(rows, 8))
        ops.checkpoint(tmp_path)
    ops.wait_for_compaction(tmp_path)  # raised what a compaction of vanished files failed with
    files = ops.version_files(tmp_path)
    assert files[0]["kind"] == "base" and files[0]["version"] > 1, files
    want = ops.emb_read(table, torch.arange(rows + 200)).cpu()
    ops.emb_update(table, torch.arange(1000), torch.ones(1000, 8))
    assert ops.restore(tmp_path) == 121
    assert torch.equal(ops.emb_read(table, torch.arange(rows + 200)).cpu(), want)
