"""The fused optimizers behave like torch.optim objects where a training loop expects it: both ways
in (the torch_recdev.optim classes and apply_optimizer_in_backward), param_groups, LR schedulers
taking effect in the very next backward, step()/zero_grad() as no-ops, and state_dict() /
load_state_dict() carrying hyperparameters and step counts."""

import copy

import pytest
import torch
import torch.nn as nn

from torch_recdev import optim as rd_optim

from _training_utils import (
    DIM,
    RowWiseAdagradReference,
    assert_close,
    lookup_backward,
    random_lookup,
    read,
    sparse_grad,
    table_bag,
    table_embedding,
)

# name -> (fused class, kwargs, reference factory)
KINDS = {
    "sgd": (rd_optim.SGD, dict(lr=0.2, weight_decay=0.0), lambda p, kw: torch.optim.SGD(p, **kw)),
    "adagrad": (
        rd_optim.Adagrad,
        dict(lr=0.1, lr_decay=0.05, initial_accumulator_value=0.2, eps=1e-10),
        lambda p, kw: torch.optim.Adagrad(p, **kw),
    ),
    "rowwise_adagrad": (
        rd_optim.RowWiseAdagrad,
        dict(lr=0.1, eps=1e-8, weight_decay=0.0),
        lambda p, kw: RowWiseAdagradReference(p, **kw),
    ),
    "adam": (rd_optim.Adam, dict(lr=0.02, betas=(0.7, 0.95), eps=1e-8), lambda p, kw: torch.optim.SparseAdam(p, **kw)),
}


def pair(kind):
    """(table embedding, fused optimizer, reference parameter, reference optimizer)."""
    cls, kwargs, make_reference = KINDS[kind]
    emb = table_embedding()
    ref_w = nn.Parameter(read(emb.weight))
    opt = cls([emb.weight], **kwargs)
    return emb, opt, ref_w, make_reference([ref_w], dict(kwargs))


def both_steps(emb, opt, ref_w, ref_opt, gen):
    ids, grad_out = random_lookup(gen)
    lookup_backward(emb, ids, grad_out)
    assert emb.weight.grad is None
    opt.step()
    opt.zero_grad()
    ref_w.grad = sparse_grad(ids, grad_out, ref_w.shape)
    ref_opt.step()
    ref_opt.zero_grad()


# ---- both ways in ---------------------------------------------------------------------------------


def test_fused_optimizers_are_torch_optimizers_with_param_groups():
    emb = table_embedding()
    opt = rd_optim.Adagrad([emb.weight], lr=0.05)
    assert isinstance(opt, torch.optim.Optimizer)
    assert len(opt.param_groups) == 1
    group = opt.param_groups[0]
    assert len(group["params"]) == 1 and group["params"][0] is emb.weight
    # torch.optim.Adagrad's defaults for what was not given.
    assert group["lr"] == 0.05
    assert group["lr_decay"] == 0.0
    assert group["weight_decay"] == 0.0
    assert group["initial_accumulator_value"] == 0.0
    assert group["eps"] == 1e-10
    adam = rd_optim.Adam([table_embedding().weight])
    assert adam.param_groups[0]["lr"] == 1e-3
    assert tuple(adam.param_groups[0]["betas"]) == (0.9, 0.999)
    assert adam.param_groups[0]["eps"] == 1e-8


IN_BACKWARD = [
    (torch.optim.SGD, {"lr": 0.2}, rd_optim.SGD),
    (torch.optim.SGD, {"lr": 0.2, "momentum": 0.0}, rd_optim.SGD),
    (torch.optim.Adagrad, {"lr": 0.05}, rd_optim.Adagrad),
    (torch.optim.SparseAdam, {"lr": 0.01, "betas": (0.8, 0.99)}, rd_optim.Adam),
    (torch.optim.Adam, {"lr": 0.01}, rd_optim.Adam),
    (rd_optim.RowWiseAdagrad, {"lr": 0.1}, rd_optim.RowWiseAdagrad),
    (rd_optim.Adagrad, {"lr": 0.1}, rd_optim.Adagrad),
]


@pytest.mark.parametrize("cls,kwargs,fused", IN_BACKWARD, ids=lambda x: getattr(x, "__name__", None))
def test_apply_optimizer_in_backward_attaches_and_trains(cls, kwargs, fused):
    emb = table_embedding()
    bag = table_bag(mode="mean")
    before = read(emb.weight), read(bag.weight)
    given = dict(kwargs)
    assert rd_optim.apply_optimizer_in_backward(cls, [emb.weight, bag.weight], kwargs) is None
    assert kwargs == given, "apply_optimizer_in_backward must not change the caller's kwargs"
    for w in (emb.weight, bag.weight):
        opts = w._in_backward_optimizers
        assert isinstance(opts, list) and len(opts) == 1
        (opt,) = opts
        assert type(opt) is fused
        assert opt.param_groups[0]["params"][0] is w
        assert opt.param_groups[0]["lr"] == kwargs["lr"]
    # One optimizer per parameter, as TorchRec does.
    assert emb.weight._in_backward_optimizers[0] is not bag.weight._in_backward_optimizers[0]

    ids = torch.tensor([1, 2, 2, 5])
    lookup_backward(emb, ids, torch.ones(4, DIM))
    out = bag(ids.to("recdev"), torch.tensor([0, 2]).to("recdev"))
    out.cpu().sum().backward()
    assert emb.weight.grad is None and bag.weight.grad is None
    for w, b in zip((emb.weight, bag.weight), before):
        after = read(w)
        assert not torch.equal(after[[1, 2, 5]], b[[1, 2, 5]]), "the named rows must move in backward"
        assert torch.equal(after[[0, 3, 4]], b[[0, 3, 4]]), "rows no lookup names must not move"


def test_class_and_in_backward_ways_give_the_same_training():
    tables = []
    for way in ("class", "in_backward"):
        torch.manual_seed(7)
        emb = table_embedding()
        if way == "class":
            rd_optim.Adagrad([emb.weight], lr=0.05)
        else:
            rd_optim.apply_optimizer_in_backward(torch.optim.Adagrad, [emb.weight], {"lr": 0.05})
        gen = torch.Generator().manual_seed(3)
        for _ in range(5):
            lookup_backward(emb, *random_lookup(gen))
        tables.append(read(emb.weight))
    assert torch.equal(tables[0], tables[1])


# ---- LR schedulers ----------------------------------------------------------------------------------

SCHEDULERS = {
    "step_lr": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.3),
    "lambda_lr": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda epoch: 1.0 / (1 + epoch) if epoch % 4 else 2.0),
}


@pytest.mark.parametrize("scheduler", list(SCHEDULERS))
@pytest.mark.parametrize("kind", list(KINDS))
def test_lr_scheduler_matches_reference_under_same_scheduler(kind, scheduler):
    emb, opt, ref_w, ref_opt = pair(kind)
    sched = SCHEDULERS[scheduler](opt)
    ref_sched = SCHEDULERS[scheduler](ref_opt)
    gen = torch.Generator().manual_seed(5)
    lrs = set()
    for step in range(1, 16):
        both_steps(emb, opt, ref_w, ref_opt, gen)
        assert_close(read(emb.weight), ref_w.detach(), f"after step {step}")
        sched.step()
        ref_sched.step()
        assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"]
        lrs.add(opt.param_groups[0]["lr"])
    assert len(lrs) >= 3, "the scheduler must have changed lr several times"


@pytest.mark.parametrize("how", ["assignment", "step_lr", "lambda_lr"])
def test_new_lr_applies_to_the_very_next_backward(how):
    emb = table_embedding()
    opt = rd_optim.SGD([emb.weight], lr=0.1)
    if how == "step_lr":
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=4.0)
    elif how == "lambda_lr":
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: [1.0, 4.0][min(epoch, 1)])
    grad = torch.full((1, DIM), 0.5)
    before = read(emb.weight)[3].clone()
    lookup_backward(emb, torch.tensor([3]), grad)
    opt.step()
    middle = read(emb.weight)[3].clone()
    assert_close(middle, before - 0.1 * grad[0])
    if how == "assignment":
        opt.param_groups[0]["lr"] = 0.4
    else:
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.4)
    lookup_backward(emb, torch.tensor([3]), grad)
    assert_close(read(emb.weight)[3], middle - 0.4 * grad[0])


# ---- step() and zero_grad() ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(KINDS))
def test_step_and_zero_grad_are_noops_for_tables(kind):
    emb, opt, _, _ = pair(kind)
    gen = torch.Generator().manual_seed(2)
    lookup_backward(emb, *random_lookup(gen))
    after_backward = read(emb.weight)
    step_count = opt.state_dict()["state"][0]["step"]
    assert emb.weight.grad is None
    assert opt.step() is None
    opt.zero_grad()
    opt.zero_grad(set_to_none=False)
    assert emb.weight.grad is None
    assert torch.equal(read(emb.weight), after_backward)
    assert opt.state_dict()["state"][0]["step"] == step_count

    # step(closure) runs the closure (whose backward is what updates the table) and returns its loss.
    ids, grad_out = random_lookup(gen)

    def closure():
        out = emb(ids.to("recdev"))
        loss = (out.cpu() * grad_out).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert isinstance(loss, torch.Tensor) and loss.ndim == 0
    assert not torch.equal(read(emb.weight), after_backward)
    assert opt.state_dict()["state"][0]["step"] == step_count + 1
    assert emb.weight.grad is None


# ---- state_dict / load_state_dict --------------------------------------------------------------------


def test_state_dict_holds_hyperparameters_and_steps():
    emb = table_embedding()
    opt = rd_optim.Adagrad([emb.weight], lr=0.07, lr_decay=0.02, initial_accumulator_value=0.3, eps=1e-7, weight_decay=0.01)
    gen = torch.Generator().manual_seed(4)
    for _ in range(3):
        lookup_backward(emb, *random_lookup(gen))
    sd = opt.state_dict()
    assert sd["state"][0]["step"] == 3
    group = sd["param_groups"][0]
    assert group["params"] == [0]
    assert (group["lr"], group["lr_decay"], group["initial_accumulator_value"], group["eps"], group["weight_decay"]) == (
        0.07,
        0.02,
        0.3,
        1e-7,
        0.01,
    )


@pytest.mark.parametrize("kind", list(KINDS))
def test_load_state_dict_round_trips_into_a_fresh_optimizer(kind):
    cls, kwargs, _ = KINDS[kind]
    emb = table_embedding()
    opt = cls([emb.weight], **kwargs)
    gen = torch.Generator().manual_seed(4)
    for _ in range(4):
        lookup_backward(emb, *random_lookup(gen))
    sd = copy.deepcopy(opt.state_dict())
    other = {k: (tuple(0.5 for _ in v) if isinstance(v, tuple) else v * 3 + 0.25) for k, v in kwargs.items()}
    fresh = cls([emb.weight], **other)
    fresh.load_state_dict(copy.deepcopy(sd))
    loaded = fresh.state_dict()
    assert loaded["state"] == sd["state"]
    for key, value in sd["param_groups"][0].items():
        got = loaded["param_groups"][0][key]
        assert (tuple(got) if isinstance(got, (list, tuple)) else got) == (
            tuple(value) if isinstance(value, (list, tuple)) else value
        ), key
    # A scheduler's later change still reaches the table after a load.
    fresh.param_groups[0]["lr"] = 0.0
    before = read(emb.weight)
    lookup_backward(emb, *random_lookup(gen))
    assert torch.equal(read(emb.weight), before), "lr=0 set after load_state_dict must apply to the table"


@pytest.mark.parametrize("kind", ["adam", "adagrad"])
def test_resume_from_state_dict_continues_like_uninterrupted_training(kind):
    """Adam's bias correction and Adagrad's lr_decay depend on the step count: train k steps, save,
    load into a fresh optimizer (built with wrong hyperparameters) on the same table, continue, and
    compare with an uninterrupted reference."""
    cls, kwargs, _ = KINDS[kind]
    emb, opt, ref_w, ref_opt = pair(kind)
    gen = torch.Generator().manual_seed(9)
    for _ in range(7):
        both_steps(emb, opt, ref_w, ref_opt, gen)
    sd = copy.deepcopy(opt.state_dict())
    assert sd["state"][0]["step"] == 7
    wrong = dict(kwargs, lr=kwargs["lr"] * 50)
    if "betas" in wrong:
        wrong["betas"] = (0.1, 0.2)
    fresh = cls([emb.weight], **wrong)
    fresh.load_state_dict(sd)
    for step in range(8, 16):
        both_steps(emb, fresh, ref_w, ref_opt, gen)
        assert_close(read(emb.weight), ref_w.detach(), f"after resumed step {step}")
    assert fresh.state_dict()["state"][0]["step"] == 15


@pytest.mark.parametrize("kind", ["adam", "adagrad"])
def test_loaded_step_count_drives_the_next_update(kind):
    """A state_dict's step is what the table continues from: set it to 100 on both sides (through
    load_state_dict) and the next updates use step 101, 102, ... in their bias correction / lr decay."""
    emb, opt, ref_w, ref_opt = pair(kind)
    gen = torch.Generator().manual_seed(10)
    for _ in range(3):
        both_steps(emb, opt, ref_w, ref_opt, gen)
    sd = copy.deepcopy(opt.state_dict())
    sd["state"][0]["step"] = 100
    opt.load_state_dict(sd)
    assert opt.state_dict()["state"][0]["step"] == 100
    ref_sd = copy.deepcopy(ref_opt.state_dict())
    old = ref_sd["state"][0]["step"]
    ref_sd["state"][0]["step"] = torch.tensor(100.0) if torch.is_tensor(old) else 100
    ref_opt.load_state_dict(ref_sd)
    for step in range(2):
        both_steps(emb, opt, ref_w, ref_opt, gen)
        assert_close(read(emb.weight), ref_w.detach(), f"after step {101 + step}")
    assert opt.state_dict()["state"][0]["step"] == 102


def test_one_optimizer_over_two_tables():
    a, b = table_embedding(), table_bag(mode="sum")
    opt = rd_optim.Adam([a.weight, b.weight], lr=0.01)
    ref_a, ref_b = nn.Parameter(read(a.weight)), nn.Parameter(read(b.weight))
    ref_opt = torch.optim.SparseAdam([ref_a, ref_b], lr=0.01)
    gen = torch.Generator().manual_seed(12)
    for _ in range(4):
        ids, grad_out = random_lookup(gen)
        lookup_backward(a, ids, grad_out)
        ref_a.grad = sparse_grad(ids, grad_out, ref_a.shape)
        ref_opt.step()
        ref_opt.zero_grad()
    ids = torch.tensor([3, 3, 9])
    out = b(ids.to("recdev"), torch.tensor([0]).to("recdev"))
    go = torch.randn(1, DIM, generator=gen)
    (out.cpu() * go).sum().backward()
    ref_b.grad = sparse_grad(ids, go.expand(3, DIM), ref_b.shape)
    ref_opt.step()
    assert_close(read(a.weight), ref_a.detach())
    assert_close(read(b.weight), ref_b.detach())
    steps = opt.state_dict()["state"]
    assert steps[0]["step"] == 4 and steps[1]["step"] == 1
