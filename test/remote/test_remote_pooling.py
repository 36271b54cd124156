"""embedding_bag on a remote table pools on the shards (partial sums and counts, or maxima with
positions) and equals the embedded store's result."""

import pytest
import torch
import torch.nn.functional as F

import torch_recdev

ROWS, DIM = 500, 16


def make_table(seed):
    torch.manual_seed(seed)
    with torch_recdev.placement("table"):
        w = torch.empty(ROWS, DIM, device="recdev")
    w.normal_()
    # Some rows written, the rest left to the init rule.
    w[7:40] = torch.randn(33, DIM, generator=torch.Generator().manual_seed(seed + 1))
    return w


def batch(seed, include_last_offset):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 12, (40,), generator=gen)
    lengths[5] = 0  # empty bags
    lengths[-1] = 0
    ids = torch.randint(0, 60, (int(lengths.sum()),), generator=gen)
    ids[:8] = 3  # padding_idx among them, and repeats
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    if include_last_offset:
        offsets = torch.cat([offsets, torch.tensor([ids.numel()])])
    weights = torch.rand(ids.numel(), generator=gen)
    return ids, offsets, weights


@pytest.mark.parametrize("include_last_offset", [False, True])
@pytest.mark.parametrize(
    "mode, with_weights, padding_idx",
    [("sum", False, None), ("sum", True, None), ("sum", True, 3), ("mean", False, None), ("mean", False, 3),
     ("max", False, None), ("max", False, 3)],
)
def test_remote_pooling_equals_embedded(remote_shards, mode, with_weights, padding_idx, include_last_offset):
    ids, offsets, weights = batch(11, include_last_offset)
    kwargs = dict(mode=mode, padding_idx=padding_idx, include_last_offset=include_last_offset,
                  per_sample_weights=weights if with_weights else None)
    embedded = make_table(5)
    expected = F.embedding_bag(ids, embedded, offsets, **kwargs).cpu()
    torch_recdev.connect(remote_shards)
    remote = make_table(5)
    assert torch.equal(remote.cpu(), embedded.cpu())  # the same table on both stores
    got = F.embedding_bag(ids, remote, offsets, **kwargs).cpu()
    if mode == "max":
        assert torch.equal(got, expected)
    else:  # the shards' partial sums are added in another order
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    # Against the CPU too, and the table is as it was.
    torch.testing.assert_close(got, F.embedding_bag(ids, embedded.cpu(), offsets, **kwargs), rtol=1e-6, atol=1e-6)
    assert torch.equal(remote.cpu(), embedded.cpu())


def test_max_ties_keep_the_first_position_across_shards(remote_shards):
    torch_recdev.connect(remote_shards)
    with torch_recdev.placement("table"):
        w = torch.zeros(64, 4, device="recdev")
    w.requires_grad_(False)
    ids = torch.arange(64)
    # Every row equal: the maximum of each bag is its first row, wherever the rows live.
    out, _, _, max_indices = torch.ops.aten._embedding_bag(w, ids, torch.tensor([0, 20, 41]), False, 2)
    assert torch.equal(max_indices.cpu(), torch.tensor([0, 20, 41]).unsqueeze(1).expand(3, 4))
    assert torch.equal(out.cpu(), torch.zeros(3, 4))


def test_max_with_nan_rows_equals_cpu(remote_shards):
    # CPU's embedding_bag max keeps a nan only when it is in the bag's first row; a later nan never
    # counts. A shard whose share of a bag starts with a nan, but does not hold the bag's first row,
    # must not let that nan hide its later rows (GATHER_POOLED_PARTIAL's ignore_nan).
    gen = torch.Generator().manual_seed(3)
    values = torch.randn(64, 4, generator=gen)
    values[torch.rand(64, 4, generator=gen) < 0.3] = float("nan")
    lengths = torch.randint(1, 7, (300,), generator=gen)
    ids = torch.randint(0, 64, (int(lengths.sum()),), generator=gen)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    expected, _, _, expected_positions = torch.ops.aten._embedding_bag(values, ids, offsets, False, 2)
    torch_recdev.connect(remote_shards)
    with torch_recdev.placement("table"):
        w = torch.empty(64, 4, device="recdev")
    w.copy_(values)
    got, _, _, positions = torch.ops.aten._embedding_bag(w, ids, offsets, False, 2)
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(positions.cpu(), expected_positions)
