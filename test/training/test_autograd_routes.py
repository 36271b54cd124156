"""Where an embedding lookup's gradient goes (csrc/kernels/embedding_autograd.cpp):

* a table weight with a fused optimizer: the store, during backward; weight.grad stays None;
* a table weight without one: a RuntimeError at backward naming the fused optimizers, table unchanged;
* a host-storage weight on recdev: PyTorch's own dense gradient, equal to CPU's;
and the fused optimizers refuse host parameters."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_recdev import optim as rd_optim

from _training_utils import (
    DIM,
    FIELDS,
    Model,
    assert_close,
    bag_batch,
    embedding_batch,
    host_copy,
    make_mlp,
    read,
    table_bag,
    table_embedding,
)

FUSED_NAMES = ("SGD", "Adagrad", "RowWiseAdagrad", "Adam")


# ---- host-storage weights: PyTorch's gradients ---------------------------------------------------


@pytest.mark.parametrize("scale_grad_by_freq", [False, True])
@pytest.mark.parametrize("padding_idx", [None, 2, -3])
def test_host_embedding_grad_matches_cpu(padding_idx, scale_grad_by_freq):
    cpu = nn.Embedding(12, 5, padding_idx=padding_idx, scale_grad_by_freq=scale_grad_by_freq)
    dev = host_copy(cpu)
    ids = torch.tensor([[1, 2, 2, 9], [9, 9, 0, 2], [4, 1, 9, 11]])
    grad_out = torch.randn(3, 4, 5)
    (cpu(ids) * grad_out).sum().backward()
    (dev(ids.to("recdev")).cpu() * grad_out).sum().backward()
    grad = dev.weight.grad
    assert grad is not None and grad.device.type == "recdev"
    assert not grad.is_sparse
    torch.testing.assert_close(grad.cpu(), cpu.weight.grad, rtol=1e-6, atol=1e-6)
    if padding_idx is not None:
        assert torch.equal(grad.cpu()[padding_idx], torch.zeros(5))


def bag_inputs(include_last_offset):
    ids = torch.tensor([3, 3, 7, 1, 0, 7, 7, 5, 2, 3])
    offsets = torch.tensor([0, 3, 3, 6, 9])  # bag 1 is empty
    if include_last_offset:
        offsets = torch.cat([offsets, torch.tensor([len(ids)])])
    return ids, offsets


@pytest.mark.parametrize("include_last_offset", [False, True])
@pytest.mark.parametrize("padding_idx", [None, 7])
@pytest.mark.parametrize("mode", ["sum", "mean", "max", "sum_per_sample_weights"])
def test_host_embedding_bag_grads_match_cpu(mode, padding_idx, include_last_offset):
    with_weights = mode == "sum_per_sample_weights"
    bag_mode = "sum" if with_weights else mode
    cpu = nn.EmbeddingBag(10, 4, mode=bag_mode, padding_idx=padding_idx, include_last_offset=include_last_offset)
    dev = host_copy(cpu)
    ids, offsets = bag_inputs(include_last_offset)
    psw = (torch.rand(len(ids)) + 0.5).requires_grad_() if with_weights else None
    psw_dev = psw.detach().to("recdev").requires_grad_() if with_weights else None
    out_cpu = cpu(ids, offsets, per_sample_weights=psw)
    out_dev = dev(ids.to("recdev"), offsets.to("recdev"), per_sample_weights=psw_dev)
    assert_close(out_dev.cpu(), out_cpu.detach(), "forward")
    grad_out = torch.randn(out_cpu.shape)
    (out_cpu * grad_out).sum().backward()
    (out_dev.cpu() * grad_out).sum().backward()
    assert dev.weight.grad is not None and dev.weight.grad.device.type == "recdev"
    assert_close(dev.weight.grad.cpu(), cpu.weight.grad, "weight grad")
    if with_weights:
        assert psw_dev.grad is not None
        assert_close(psw_dev.grad.cpu(), psw.grad, "per_sample_weights grad")


def test_host_weights_train_with_torch_optim_like_cpu():
    cpu_emb = nn.Embedding(15, DIM, padding_idx=0)
    cpu_bag = nn.EmbeddingBag(15, DIM, mode="mean")
    dev_emb, dev_bag = host_copy(cpu_emb), host_copy(cpu_bag)
    cpu_opt = torch.optim.Adagrad(list(cpu_emb.parameters()) + list(cpu_bag.parameters()), lr=0.1)
    dev_opt = torch.optim.Adagrad(list(dev_emb.parameters()) + list(dev_bag.parameters()), lr=0.1)
    gen = torch.Generator().manual_seed(3)
    for _ in range(5):
        ids = torch.randint(0, 15, (6, 2), generator=gen)
        bags = bag_batch(gen, num_rows=15, bags=4)
        go1 = torch.randn(6, 2, DIM, generator=gen)
        go2 = torch.randn(4, DIM, generator=gen)
        for emb, bag, opt, dev in ((cpu_emb, cpu_bag, cpu_opt, "cpu"), (dev_emb, dev_bag, dev_opt, "recdev")):
            opt.zero_grad()
            loss = (emb(ids.to(dev)).cpu() * go1).sum() + (bag(bags["ids"].to(dev), bags["offsets"].to(dev)).cpu() * go2).sum()
            loss.backward()
            opt.step()
    assert_close(read(dev_emb.weight), cpu_emb.weight.detach(), "embedding")
    assert_close(read(dev_bag.weight), cpu_bag.weight.detach(), "embedding_bag")


FUSED_CLASSES = [rd_optim.SGD, rd_optim.Adagrad, rd_optim.RowWiseAdagrad, rd_optim.Adam]


@pytest.mark.parametrize("cls", FUSED_CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("where", ["recdev_host", "cpu"])
def test_fused_optimizers_refuse_non_table_params(cls, where):
    emb = nn.Embedding(10, 4)
    if where == "recdev_host":
        emb = host_copy(emb)
    with pytest.raises(ValueError, match="table"):
        cls([emb.weight], lr=0.1)
    with pytest.raises(ValueError, match="table"):
        in_backward = {rd_optim.SGD: torch.optim.SGD, rd_optim.Adagrad: torch.optim.Adagrad, rd_optim.Adam: torch.optim.SparseAdam}
        rd_optim.apply_optimizer_in_backward(in_backward.get(cls, cls), [emb.weight], {"lr": 0.1})
    assert not hasattr(emb.weight, "_in_backward_optimizers")
    # The refused weight still trains the ordinary way.
    out = emb(torch.tensor([1, 1, 3]).to(emb.weight.device))
    out.cpu().sum().backward()
    expected = torch.zeros(10, 4)
    expected[1] = 2
    expected[3] = 1
    assert torch.equal(emb.weight.grad.cpu(), expected)


def test_refusing_a_host_param_among_tables_attaches_nothing():
    """A constructor that raises leaves no optimizer behind: the table listed before the refused
    host weight must still be a table without an optimizer (backward refuses it, table unchanged),
    not one that silently trains with an Adagrad the caller never got back."""
    table = table_embedding()
    host = host_copy(nn.Embedding(10, 4))
    with pytest.raises(ValueError, match="table"):
        rd_optim.Adagrad([table.weight, host.weight], lr=0.1)
    before = read(table.weight)
    out = table(torch.tensor([1, 2]).to("recdev"))
    with pytest.raises(RuntimeError, match="no fused optimizer"):
        out.cpu().sum().backward()
    unchanged = torch.equal(read(table.weight), before)
    assert unchanged


# ---- table weights ---------------------------------------------------------------------------------


@pytest.mark.parametrize("lookup", ["embedding", "bag_sum", "bag_mean", "bag_max", "bag_per_sample_weights"])
def test_table_without_optimizer_raises_at_backward_and_is_unchanged(lookup):
    if lookup == "embedding":
        module = table_embedding()
    else:
        module = table_bag(mode="max" if lookup == "bag_max" else "mean" if lookup == "bag_mean" else "sum")
    before = read(module.weight)
    ids = torch.tensor([1, 4, 4, 7])
    if lookup == "embedding":
        out = module(ids.to("recdev"))  # the forward works: only backward needs somewhere to put the gradient
    else:
        psw = torch.rand(4).to("recdev") if lookup == "bag_per_sample_weights" else None
        out = module(ids.to("recdev"), torch.tensor([0, 2]).to("recdev"), per_sample_weights=psw)
    loss = out.cpu().pow(2).sum()
    with pytest.raises(RuntimeError) as info:
        loss.backward()
    message = str(info.value)
    for name in FUSED_NAMES:
        assert name in message, (name, message)
    assert "optimizer" in message.lower()
    assert module.weight.grad is None
    assert torch.equal(read(module.weight), before)


@pytest.mark.parametrize("cls", FUSED_CLASSES, ids=lambda c: c.__name__)
def test_table_with_fused_optimizer_gets_no_grad(cls):
    emb = table_embedding()
    bag = table_bag(mode="sum")
    cls([emb.weight, bag.weight], lr=0.05)
    before = read(emb.weight), read(bag.weight)
    ids = torch.tensor([2, 2, 3])
    loss = emb(ids.to("recdev")).cpu().sum() + bag(ids.to("recdev"), torch.tensor([0]).to("recdev")).cpu().sum()
    loss.backward()
    assert emb.weight.grad is None and bag.weight.grad is None
    assert not torch.equal(read(emb.weight), before[0])
    assert not torch.equal(read(bag.weight), before[1])


def test_per_sample_weights_grad_with_a_table_weight():
    """The per-sample-weights gradient flows back as PyTorch's, from the weights before the update."""
    table = table_bag(mode="sum")
    cpu = nn.EmbeddingBag(table.num_embeddings, DIM, mode="sum")
    with torch.no_grad():
        cpu.weight.copy_(read(table.weight))
    rd_optim.SGD([table.weight], lr=0.5)
    ids, offsets = torch.tensor([1, 1, 4, 9, 4]), torch.tensor([0, 2])
    psw = (torch.rand(5) + 0.5).requires_grad_()
    psw_dev = psw.detach().to("recdev").requires_grad_()
    grad_out = torch.randn(2, DIM)
    (cpu(ids, offsets, per_sample_weights=psw) * grad_out).sum().backward()
    (table(ids.to("recdev"), offsets.to("recdev"), per_sample_weights=psw_dev).cpu() * grad_out).sum().backward()
    assert_close(psw_dev.grad.cpu(), psw.grad)
    # ... and the table moved as SGD over the summed weight gradient.
    expected = cpu.weight.detach() - 0.5 * cpu.weight.grad
    assert_close(read(table.weight), expected)


def test_frozen_table_without_optimizer_passes_gradient_to_per_sample_weights():
    """A frozen table (requires_grad=False) needs no optimizer: backward must still give the
    per-sample weights their gradient, and leave the table alone."""
    table = table_bag(mode="sum")
    table.weight.requires_grad_(False)
    cpu = nn.EmbeddingBag(table.num_embeddings, DIM, mode="sum")
    with torch.no_grad():
        cpu.weight.copy_(read(table.weight))
    cpu.weight.requires_grad_(False)
    before = read(table.weight)
    ids, offsets = torch.tensor([1, 1, 4, 9, 4]), torch.tensor([0, 2])
    psw = (torch.rand(5) + 0.5).requires_grad_()
    psw_dev = psw.detach().to("recdev").requires_grad_()
    (cpu(ids, offsets, per_sample_weights=psw)).sum().backward()
    (table(ids.to("recdev"), offsets.to("recdev"), per_sample_weights=psw_dev)).cpu().sum().backward()
    assert_close(psw_dev.grad.cpu(), psw.grad)
    unchanged = torch.equal(read(table.weight), before)
    assert unchanged, "a frozen table moved in backward"


def test_frozen_table_with_optimizer_is_not_updated_by_per_sample_weights_backward():
    """requires_grad=False freezes a weight: a backward that only needs the per-sample weights'
    gradient must not run the table's fused optimizer."""
    table = table_bag(mode="sum")
    rd_optim.SGD([table.weight], lr=0.5)
    table.weight.requires_grad_(False)
    before = read(table.weight)
    psw = (torch.rand(5) + 0.5).to("recdev").requires_grad_()
    out = table(torch.tensor([1, 1, 4, 9, 4]).to("recdev"), torch.tensor([0, 2]).to("recdev"), per_sample_weights=psw)
    out.cpu().sum().backward()
    assert psw.grad is not None
    unchanged = torch.equal(read(table.weight), before)
    assert unchanged, "a frozen table moved in backward"


def test_frozen_table_without_optimizer_under_a_trained_mlp():
    table = table_embedding()
    table.weight.requires_grad_(False)
    before = read(table.weight)
    mlp = make_mlp(FIELDS * DIM)
    model = Model(table, mlp)
    batch = embedding_batch(torch.Generator().manual_seed(1))
    model.loss(batch).backward()
    assert all(p.grad is not None for p in mlp.parameters())
    assert torch.equal(read(table.weight), before)


def test_one_model_table_and_host_and_cpu_routes():
    """A fused table embedding, a host embedding trained by torch.optim.SGD on recdev, and a CPU MLP,
    in one backward, against the same model on CPU."""
    gen = torch.Generator().manual_seed(21)
    table = table_embedding()
    host = host_copy(nn.Embedding(10, DIM))
    mlp = make_mlp(2 * DIM)
    ref_table = nn.Embedding(table.num_embeddings, DIM, sparse=True)
    with torch.no_grad():
        ref_table.weight.copy_(read(table.weight))
    ref_host = nn.Embedding(10, DIM)
    with torch.no_grad():
        ref_host.weight.copy_(read(host.weight))
    ref_mlp = copy.deepcopy(mlp)

    rd_optim.Adagrad([table.weight], lr=0.1, initial_accumulator_value=0.1)
    dense_opt = torch.optim.SGD([host.weight] + list(mlp.parameters()), lr=0.1)
    ref_sparse_opt = torch.optim.Adagrad([ref_table.weight], lr=0.1, initial_accumulator_value=0.1)
    ref_dense_opt = torch.optim.SGD([ref_host.weight] + list(ref_mlp.parameters()), lr=0.1)

    for step in range(10):
        a = torch.randint(0, 40, (8,), generator=gen)
        a[-2:] = a[:2]
        b = torch.randint(0, 10, (8,), generator=gen)
        target = torch.randn(8, 1, generator=gen)
        losses = []
        for emb_t, emb_h, m, opts, dev in (
            (table, host, mlp, [dense_opt], "recdev"),
            (ref_table, ref_host, ref_mlp, [ref_sparse_opt, ref_dense_opt], "cpu"),
        ):
            for o in opts:
                o.zero_grad()
            x = torch.cat([emb_t(a.to(dev)).cpu(), emb_h(b.to(dev)).cpu()], dim=1)
            loss = F.mse_loss(m(x), target)
            loss.backward()
            for o in opts:
                o.step()
            losses.append(loss.detach())
        assert_close(losses[0], losses[1], f"loss at step {step}")
        assert table.weight.grad is None
        assert host.weight.grad is not None
    assert_close(read(table.weight), ref_table.weight.detach(), "table")
    assert_close(read(host.weight), ref_host.weight.detach(), "host embedding")
    for p, q in zip(mlp.parameters(), ref_mlp.parameters()):
        assert_close(p.detach(), q.detach(), "mlp")


@pytest.mark.parametrize("optimizer_class", [torch.optim.SGD, torch.optim.Adagrad, torch.optim.SparseAdam])
@pytest.mark.parametrize("bag", [False, True])
def test_sparse_gradients_of_host_weights_train_like_cpu(optimizer_class, bag):
    # sparse=True on host storage: the gradient is a sparse COO tensor on recdev, and
    # torch.optim's sparse paths run on it.
    torch.manual_seed(0)
    if bag:
        cpu = torch.nn.EmbeddingBag(20, 4, mode="sum", sparse=True)
        dev = torch.nn.EmbeddingBag(20, 4, mode="sum", sparse=True).to("recdev")
    else:
        cpu = torch.nn.Embedding(20, 4, sparse=True)
        dev = torch.nn.Embedding(20, 4, sparse=True).to("recdev")
    with torch.no_grad():
        dev.weight.copy_(cpu.weight)
    cpu_opt, dev_opt = optimizer_class(cpu.parameters(), lr=0.1), optimizer_class(dev.parameters(), lr=0.1)
    for _ in range(10):
        ids = torch.randint(0, 20, (8,))
        args = (ids, torch.tensor([0, 3])) if bag else (ids,)
        for model, opt in ((cpu, cpu_opt), (dev, dev_opt)):
            opt.zero_grad()
            model(*(a.to(next(model.parameters()).device) for a in args)).pow(2).sum().backward()
            opt.step()
        assert dev.weight.grad.layout == torch.sparse_coo and dev.weight.grad.device.type == "recdev"
    torch.testing.assert_close(dev.weight.detach().cpu(), cpu.weight.detach(), rtol=1e-6, atol=1e-6)
