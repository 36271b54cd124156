"""50 training steps of a table embedding (with a fused optimizer) under a small CPU MLP, against
the same model on CPU with a dense table and PyTorch's optimizer, to 1e-6 relative on every loss,
on the table and on the MLP. Every batch repeats ids (inside samples/bags and across them).

References: fused SGD vs torch.optim.SGD (no momentum); fused Adagrad vs torch.optim.Adagrad with
sparse gradients (sparse=True on the CPU module); RowWiseAdagrad vs a hand-written
EXACT_ROWWISE_ADAGRAD (_training_utils.RowWiseAdagradReference); Adam vs torch.optim.SparseAdam.
The store applies weight decay lazily, to the rows an update names only; the weight-decay cases add
the L2 term to exactly those rows of the reference's (coalesced, sparse) gradient. torch refuses
sparse=True with mode="max" and with scale_grad_by_freq, so there the reference's dense gradient is
cut to the rows the batch names (which is what a sparse gradient would hold)."""

import copy

import pytest
import torch
import torch.nn as nn

from torch_recdev import optim as rd_optim

from _training_utils import (
    DIM,
    FIELDS,
    NUM_ROWS,
    Model,
    RowWiseAdagradReference,
    add_l2_on_rows,
    assert_close,
    bag_batch,
    embedding_batch,
    make_mlp,
    lookup_backward,
    named_rows_grad,
    random_lookup,
    read,
    sparse_grad,
    table_bag,
    table_embedding,
)

STEPS = 50

# Conditioning. Two float32 implementations that differ in the last bit somewhere (the order of a
# sum, a fused multiply-add) drift apart in a closed training loop wherever a normalizing optimizer
# divides a nearly cancelled gradient by a nearly zero denominator: Adagrad on a row's first touch
# with a zero accumulator, Adam on a row whose past gradients were tiny. There a 1-ulp difference in
# the gradient becomes a 1e-5 difference in the weight, and 1e-6 would measure chaos, not the
# implementation. So the closed-loop (MLP) cases keep those denominators away from zero (Adagrad
# with an initial accumulator, Adam with eps=1e-3; every formula error, e.g. eps inside the sqrt or
# a wrong bias correction, still shows at once), and test_open_loop_* runs the same optimizers with
# zero accumulators and tiny eps on gradients that do not depend on the weights.

# fused: the torch_recdev.optim way in; in_backward: apply_optimizer_in_backward's (class, kwargs);
# reference: PyTorch's optimizer on the CPU weight; sparse: whether the reference needs a sparse
# gradient; l2: lazy weight decay added to the reference's named rows.
OPTIMIZERS = {
    "sgd": dict(
        fused=lambda p: rd_optim.SGD(p, lr=0.3),
        in_backward=(torch.optim.SGD, {"lr": 0.3}),
        reference=lambda p: torch.optim.SGD(p, lr=0.3),
        sparse=False,
        l2=0.0,
    ),
    "sgd_weight_decay": dict(
        fused=lambda p: rd_optim.SGD(p, lr=0.3, weight_decay=0.1),
        in_backward=(torch.optim.SGD, {"lr": 0.3, "weight_decay": 0.1, "momentum": 0}),
        reference=lambda p: torch.optim.SGD(p, lr=0.3),
        sparse=True,
        l2=0.1,
    ),
    "adagrad": dict(
        fused=lambda p: rd_optim.Adagrad(p, lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1, eps=1e-10),
        in_backward=(torch.optim.Adagrad, {"lr": 0.1, "lr_decay": 0.01, "initial_accumulator_value": 0.1, "eps": 1e-10}),
        reference=lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1, eps=1e-10),
        sparse=True,
        l2=0.0,
    ),
    "adagrad_weight_decay": dict(
        fused=lambda p: rd_optim.Adagrad(p, lr=0.1, weight_decay=0.05, eps=1e-6, initial_accumulator_value=0.05),
        in_backward=(
            torch.optim.Adagrad,
            {"lr": 0.1, "weight_decay": 0.05, "eps": 1e-6, "initial_accumulator_value": 0.05},
        ),
        reference=lambda p: torch.optim.Adagrad(p, lr=0.1, eps=1e-6, initial_accumulator_value=0.05),
        sparse=True,
        l2=0.05,
    ),
    "rowwise_adagrad": dict(
        fused=lambda p: rd_optim.RowWiseAdagrad(p, lr=0.1, eps=1e-8, weight_decay=0.01),
        in_backward=(rd_optim.RowWiseAdagrad, {"lr": 0.1, "eps": 1e-8, "weight_decay": 0.01}),
        reference=lambda p: RowWiseAdagradReference(p, lr=0.1, eps=1e-8, weight_decay=0.01),
        sparse=True,
        l2=0.0,
    ),
    "adam": dict(
        fused=lambda p: rd_optim.Adam(p, lr=0.01, betas=(0.8, 0.99), eps=1e-3),
        in_backward=(torch.optim.SparseAdam, {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-3}),
        reference=lambda p: torch.optim.SparseAdam(p, lr=0.01, betas=(0.8, 0.99), eps=1e-3),
        sparse=True,
        l2=0.0,
    ),
}

# name -> (kind, module kwargs, batch kwargs)
FORWARDS = {
    "embedding": ("embedding", {}, {}),
    "embedding_padding_idx": ("embedding", {"padding_idx": 4}, {"padding_idx": 4}),
    "embedding_scale_grad_by_freq": ("embedding", {"scale_grad_by_freq": True}, {}),
    "bag_sum": ("bag", {"mode": "sum"}, {}),
    "bag_mean": ("bag", {"mode": "mean"}, {}),
    "bag_max": ("bag", {"mode": "max"}, {}),
    "bag_sum_per_sample_weights": ("bag", {"mode": "sum"}, {"with_weights": True}),
}


def build(forward, opt_name, entry):
    """(recdev model, fused optimizer or None, CPU reference model, reference optimizer)."""
    kind, module_kwargs, _ = FORWARDS[forward]
    spec = OPTIMIZERS[opt_name]
    if kind == "embedding":
        emb = table_embedding(**module_kwargs)
        in_features = FIELDS * DIM
    else:
        emb = table_bag(**module_kwargs)
        in_features = DIM
    initial = read(emb.weight)
    # The reference: the same weights in a dense CPU table. torch refuses sparse=True for max and
    # for scale_grad_by_freq; there reference_step cuts the dense gradient to the named rows.
    sparse = spec["sparse"] and module_kwargs.get("mode") != "max" and not module_kwargs.get("scale_grad_by_freq")
    if kind == "embedding":
        ref_emb = nn.Embedding(NUM_ROWS, DIM, sparse=sparse, **module_kwargs)
    else:
        ref_emb = nn.EmbeddingBag(NUM_ROWS, DIM, sparse=sparse, **module_kwargs)
    with torch.no_grad():
        ref_emb.weight.copy_(initial)
    mlp = make_mlp(in_features)
    model = Model(emb, mlp)
    ref = Model(ref_emb, copy.deepcopy(mlp))

    if entry == "class":
        fused = spec["fused"]([emb.weight])
    else:
        cls, kwargs = spec["in_backward"]
        assert rd_optim.apply_optimizer_in_backward(cls, [emb.weight], kwargs) is None
        fused = None
        (in_backward,) = emb.weight._in_backward_optimizers
        assert isinstance(in_backward, rd_optim.FusedOptimizer)
    ref_opt = spec["reference"]([ref_emb.weight])
    return model, fused, ref, ref_opt, initial


def reference_step(ref, ref_opt, batch, spec, forward):
    loss = ref.loss(batch)
    ref.mlp_opt.zero_grad()
    loss.backward()
    ref.mlp_opt.step()
    w = ref.emb.weight
    if spec["sparse"] and not w.grad.is_sparse:  # max mode, scale_grad_by_freq
        w.grad = named_rows_grad(w, ref.named_rows(batch))
    if spec["l2"]:
        add_l2_on_rows(w, spec["l2"])
    ref_opt.step()
    ref_opt.zero_grad(set_to_none=True)
    return loss.detach()


def recdev_step(model, fused, batch):
    loss = model.loss(batch)
    model.mlp_opt.zero_grad()
    loss.backward()
    assert model.emb.weight.grad is None, "a table weight with a fused optimizer must not get a .grad"
    model.mlp_opt.step()
    if fused is not None:  # what a torch.optim loop does; both are no-ops for table weights
        fused.step()
        fused.zero_grad()
    return loss.detach()


def make_batch(gen, forward):
    kind, _, batch_kwargs = FORWARDS[forward]
    if kind == "embedding":
        return embedding_batch(gen, **batch_kwargs)
    return bag_batch(gen, **batch_kwargs)


def run_and_compare(forward, opt_name, entry):
    spec = OPTIMIZERS[opt_name]
    model, fused, ref, ref_opt, initial = build(forward, opt_name, entry)
    gen = torch.Generator().manual_seed(1234)
    named = set()
    for step in range(1, STEPS + 1):
        batch = make_batch(gen, forward)
        named.update(ref.named_rows(batch).tolist())
        loss = recdev_step(model, fused, batch)
        ref_loss = reference_step(ref, ref_opt, batch, spec, forward)
        assert_close(loss, ref_loss, f"loss at step {step}")
        if step % 10 == 0:
            assert_close(read(model.emb.weight), ref.emb.weight.detach(), f"table after step {step}")

    table = read(model.emb.weight)
    expected = ref.emb.weight.detach()
    touched = torch.tensor(sorted(named))
    assert_close(table[touched], expected[touched], "touched rows after training")
    # Lazy: the rows no batch named kept their initial values exactly (padding_idx included).
    untouched = torch.tensor([r for r in range(NUM_ROWS) if r not in named], dtype=torch.long)
    assert len(untouched) > 0
    assert torch.equal(table[untouched], initial[untouched])
    # The reference really trained: the comparison is not between two unchanged tables.
    assert (expected[touched] - initial[touched]).abs().max() > 1e-2
    for p, q in zip(model.mlp.parameters(), ref.mlp.parameters()):
        assert_close(p.detach(), q.detach(), "MLP parameters after training")


@pytest.mark.parametrize("forward", list(FORWARDS))
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_fused_optimizer_matches_pytorch(forward, opt_name):
    run_and_compare(forward, opt_name, "class")


@pytest.mark.parametrize("forward", ["embedding", "bag_mean"])
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_apply_optimizer_in_backward_matches_pytorch(forward, opt_name):
    run_and_compare(forward, opt_name, "in_backward")


def test_sgd_weight_decay_decays_only_touched_rows():
    """A single step, checked by hand: a named row moves by -lr * (g + wd * w); a row no lookup
    names keeps its value (torch's dense SGD would decay it too; the store is lazy)."""
    emb = table_embedding(num_rows=10, dim=4)
    before = read(emb.weight)
    rd_optim.SGD([emb.weight], lr=0.5, weight_decay=0.2)
    ids = torch.tensor([2, 7, 2])
    out = emb(ids.to("recdev"))
    grad_out = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 10
    (out.cpu() * grad_out).sum().backward()
    after = read(emb.weight)
    g = torch.zeros(10, 4)
    g.index_add_(0, ids, grad_out)
    for row in (2, 7):
        expected = before[row] - 0.5 * (g[row] + 0.2 * before[row])
        assert_close(after[row], expected, f"row {row}")
    others = [r for r in range(10) if r not in (2, 7)]
    assert torch.equal(after[others], before[others])


# Open loop: the output gradients are given (they do not depend on the weights), so rounding cannot
# feed back; here the touchy hyperparameters (zero accumulators, tiny eps) run for 50 steps.
OPEN_LOOP = {
    "sgd": (lambda p: rd_optim.SGD(p, lr=0.3), lambda p: torch.optim.SGD(p, lr=0.3), 0.0),
    "sgd_weight_decay": (
        lambda p: rd_optim.SGD(p, lr=0.3, weight_decay=0.2),
        lambda p: torch.optim.SGD(p, lr=0.3),
        0.2,
    ),
    "adagrad": (
        lambda p: rd_optim.Adagrad(p, lr=0.1, lr_decay=0.02, eps=1e-10),
        lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.02, eps=1e-10),
        0.0,
    ),
    "adagrad_weight_decay": (
        lambda p: rd_optim.Adagrad(p, lr=0.1, weight_decay=0.05),
        lambda p: torch.optim.Adagrad(p, lr=0.1),
        0.05,
    ),
    "rowwise_adagrad": (
        lambda p: rd_optim.RowWiseAdagrad(p, lr=0.1, eps=1e-10, weight_decay=0.02),
        lambda p: RowWiseAdagradReference(p, lr=0.1, eps=1e-10, weight_decay=0.02),
        0.0,
    ),
    "adam": (
        lambda p: rd_optim.Adam(p, lr=0.01, betas=(0.8, 0.99), eps=1e-8),
        lambda p: torch.optim.SparseAdam(p, lr=0.01, betas=(0.8, 0.99), eps=1e-8),
        0.0,
    ),
}


@pytest.mark.parametrize("lookup", ["embedding", "bag_sum_per_sample_weights"])
@pytest.mark.parametrize("opt_name", list(OPEN_LOOP))
def test_open_loop_50_steps(opt_name, lookup):
    make_fused, make_reference, l2 = OPEN_LOOP[opt_name]
    emb = table_embedding() if lookup == "embedding" else table_bag(mode="sum")
    initial = read(emb.weight)
    ref_w = nn.Parameter(initial.clone())
    make_fused([emb.weight])
    ref_opt = make_reference([ref_w])
    gen = torch.Generator().manual_seed(77)
    named = set()
    for step in range(1, STEPS + 1):
        if lookup == "embedding":
            ids, grad_out = random_lookup(gen)
            lookup_backward(emb, ids, grad_out)
            row_grads = grad_out
        else:
            batch = bag_batch(gen, with_weights=True)
            ids = batch["ids"]
            out = emb(ids.to("recdev"), batch["offsets"].to("recdev"), per_sample_weights=batch["psw"].to("recdev"))
            grad_out = torch.randn(out.shape, generator=gen)
            (out.cpu() * grad_out).sum().backward()
            bags = torch.repeat_interleave(torch.arange(len(batch["offsets"])), torch.diff(batch["offsets"], append=torch.tensor([len(ids)])))
            row_grads = grad_out[bags] * batch["psw"].unsqueeze(1)
        assert emb.weight.grad is None
        named.update(ids.tolist())
        ref_w.grad = sparse_grad(ids, row_grads, ref_w.shape)
        if l2:
            add_l2_on_rows(ref_w, l2)
        ref_opt.step()
        ref_opt.zero_grad()
        if step % 10 == 0:
            assert_close(read(emb.weight), ref_w.detach(), f"table after step {step}")
    untouched = [r for r in range(NUM_ROWS) if r not in named]
    assert untouched and torch.equal(read(emb.weight)[untouched], initial[untouched])
