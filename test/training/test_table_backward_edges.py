"""Edge cases of backward on tables: empty batches, scale_grad_by_freq on bags,
per-sample-weight gradients on huge tables, and lookups that cannot train."""

import pytest
import torch
import torch.nn.functional as F

import torch_recdev
from torch_recdev import ops, optim


def _table(rows=40, dim=4):
    with torch_recdev.placement("table"):
        w = torch.empty(rows, dim, device="recdev")
    torch.manual_seed(3)
    w.normal_()
    return w.requires_grad_()


def test_embedding_backward_with_no_ids_still_counts_a_step():
    w = _table()
    optim.Adam([w], lr=0.1)
    before = w.detach().cpu().clone()
    F.embedding(torch.empty(0, dtype=torch.long), w).sum().backward()
    assert torch.equal(w.detach().cpu(), before)
    assert torch_recdev._C._table_optimizer_step(w) == 1


def test_embedding_bag_scale_grad_by_freq_on_a_table_divides_by_id_frequency():
    # The documented semantics ("inverse of frequency of the words in the mini-batch"), as
    # F.embedding computes it. (torch 2.13's CPU embedding_bag divides rows 5 and 7 below by 3
    # as well, which matches neither its documentation nor F.embedding.)
    w = _table()
    before = w.detach().cpu().clone()
    optim.SGD([w], lr=1.0)
    ids, offsets = torch.tensor([1, 1, 1, 5, 7, 7]), torch.tensor([0, 2, 4])
    grad = torch.randn(3, 4)
    (F.embedding_bag(ids, w, offsets, mode="sum", scale_grad_by_freq=True).cpu() * grad).sum().backward()
    expected = before.clone()
    expected[1] -= (grad[0] * 2 + grad[1]) / 3
    expected[5] -= grad[1]
    expected[7] -= grad[2] * 2 / 2
    torch.testing.assert_close(w.detach().cpu(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode, with_weights", [("sum", False), ("sum", True), ("mean", False)])
def test_bag_padding_idx_and_include_last_offset_train_like_cpu(mode, with_weights):
    """Sum and mean bags reach the store as bag gradients (Table::update_pooled): padding ids, an
    empty bag and include_last_offset must still give torch's sparse Adagrad step."""
    w = _table()
    ref = torch.nn.EmbeddingBag(40, 4, mode=mode, padding_idx=2, include_last_offset=True, sparse=True)
    with torch.no_grad():
        ref.weight.copy_(w.detach().cpu())
    optim.Adagrad([w], lr=0.1)
    ref_opt = torch.optim.Adagrad(ref.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(5)
    offsets = torch.tensor([0, 0, 3, 10, 17, 30])  # an empty bag; the last offset ends the last bag
    for _ in range(4):
        ids = torch.randint(0, 8, (30,), generator=gen)  # few distinct ids: duplicates across bags
        ids[::4] = 2
        psw = torch.rand(30, generator=gen) if with_weights else None
        grad = torch.randn(5, 4, generator=gen)
        out = F.embedding_bag(ids, w, offsets, mode=mode, per_sample_weights=psw, include_last_offset=True,
                              padding_idx=2)
        (out.cpu() * grad).sum().backward()
        ref_opt.zero_grad()
        (ref(ids, offsets, per_sample_weights=psw) * grad).sum().backward()
        ref_opt.step()
    torch.testing.assert_close(w.detach().cpu(), ref.weight.detach(), rtol=1e-6, atol=1e-7)
    assert torch.equal(w.detach().cpu()[2], ref.weight.detach()[2])  # the padding row never moved


def test_per_sample_weights_gradient_on_a_huge_table_reads_only_its_rows():
    emb = torch.nn.EmbeddingBag(10**10, 8, mode="sum", device="recdev")
    optim.SGD([emb.weight], lr=0.1)
    ids, offsets = torch.tensor([5, 10**10 - 1, 5]), torch.tensor([0, 2])
    psw = torch.tensor([0.5, 2.0, 1.0], requires_grad=True)
    emb(ids, offsets, per_sample_weights=psw.to("recdev")).cpu().sum().backward()
    assert psw.grad is not None and psw.grad.shape == (3,) and torch.isfinite(psw.grad).all()
    assert torch_recdev.table_stats(emb.weight)["rows"] == 2  # the two rows looked up, nothing else


def test_per_sample_weights_gradient_matches_cpu():
    w = _table()
    w.requires_grad_(False)  # only the weights train
    ids, offsets = torch.tensor([1, 2, 2, 9]), torch.tensor([0, 3])
    psw = torch.rand(4, requires_grad=True)
    psw_cpu = psw.detach().clone().requires_grad_()
    grad = torch.randn(2, 4)
    (F.embedding_bag(ids, w, offsets, mode="sum", per_sample_weights=psw.to("recdev"), padding_idx=9).cpu() * grad).sum().backward()
    (F.embedding_bag(ids, w.detach().cpu(), offsets, mode="sum", per_sample_weights=psw_cpu, padding_idx=9) * grad).sum().backward()
    torch.testing.assert_close(psw.grad, psw_cpu.grad)


@pytest.mark.parametrize("lookup", [lambda w, ids: w[ids], lambda w, ids: w.index_select(0, ids)])
def test_indexing_a_table_that_a_fused_optimizer_trains_is_refused(lookup):
    w = _table()
    optim.SGD([w], lr=1.0)
    before = w.detach().cpu().clone()
    with pytest.raises(RuntimeError, match="F.embedding"):
        lookup(w, torch.tensor([1, 2]))
    with torch.no_grad():
        assert torch.equal(lookup(w, torch.tensor([1, 2])).cpu(), before[[1, 2]])


def test_store_api_optimizers_default_to_torch_optim_defaults():
    t = ops.init_embedding_table("defaults_adam", 10, 2, optimizer=("adam", {"lr": 0.5}))
    g = 1e-9
    ops.emb_update(t, torch.tensor([1]), torch.full((1, 2), g))
    # SparseAdam's first step from a zero row: lr * sqrt(1 - b2) / (1 - b1) * m / (sqrt(v) + eps), with
    # m = (1 - b1) g and v = (1 - b2) g^2. Only torch's eps=1e-8 (not the store's 1e-10) gives this.
    b1, b2, eps = 0.9, 0.999, 1e-8
    expected = 0.5 * (1 - b2) ** 0.5 / (1 - b1) * ((1 - b1) * g) / (((1 - b2) * g * g) ** 0.5 + eps)
    moved = ops.emb_read(t, torch.tensor([1])).abs().max().item()
    assert moved == pytest.approx(expected, rel=1e-3)
    with pytest.raises(ValueError, match="unknown"):
        ops.init_embedding_table("defaults_bad", 10, 2, optimizer=("adam", {"momentum": 0.5}))
