"""Stochastic rounding of half-precision rows (optimizer(stochastic_rounding=True), issue 17), on the
embedded store and on two shards (test/tables/conftest.py runs every test on both).

The store rounds each float32 update result to one of the two float16/bfloat16 values around it,
the upper with probability proportional to the distance from the lower, with random bits that are a
pure function of (the optimizer's seed from the recdev generator, table, row id, step): so a run is
reproducible under torch.manual_seed, and updates too small for round-to-nearest move a row on
average as float32 math does."""

import pytest
import torch
import torch.nn.functional as F

import torch_recdev
from torch_recdev import _C
from torch_recdev import optim as rd_optim

HALF = (torch.float16, torch.bfloat16)
ROWS = 64
DIM = 8


def table(dtype, value=None, seed=1):
    with torch_recdev.placement("table"):
        weight = torch.empty(ROWS, DIM, dtype=dtype, device="recdev")
    init = (torch.full((ROWS, DIM), value) if value is not None else
            torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(seed))).to(dtype)
    with torch.no_grad():
        weight.copy_(init)
    return weight.requires_grad_(), init


def read(weight):
    return weight.detach()[torch.arange(weight.shape[0])].cpu()


def train(dtype, make_optimizer, steps=20, seed=0):
    """Random batches (fixed by `seed`) of tiny SGD/Adagrad updates; returns the table's rows."""
    weight, _ = table(dtype)
    optimizer = make_optimizer([weight])
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        ids = torch.randint(0, ROWS, (32,), generator=gen)
        coefficients = (torch.randn(32, DIM, generator=gen) * 1e-3).to(dtype)
        (F.embedding(ids.to("recdev"), weight) * coefficients.to("recdev")).sum().backward()
        optimizer.step()
    return read(weight)


def bits(rows):
    return rows.view(torch.int16)


@pytest.mark.parametrize("kind", ["sgd", "rowwise_adagrad"])
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_a_run_is_reproducible_under_the_same_seed(dtype, kind):
    make = {
        "sgd": lambda p: rd_optim.SGD(p, lr=0.1, stochastic_rounding=True),
        "rowwise_adagrad": lambda p: rd_optim.RowWiseAdagrad(p, lr=0.01, stochastic_rounding=True),
    }[kind]
    torch.manual_seed(1234)
    first = train(dtype, make)
    torch.manual_seed(1234)
    second = train(dtype, make)
    assert torch.equal(bits(first), bits(second))
    torch.manual_seed(4321)
    other_seed = train(dtype, make)
    assert not torch.equal(bits(first), bits(other_seed)), "the rounding ignored the generator's seed"
    nearest = train(dtype, {"sgd": lambda p: rd_optim.SGD(p, lr=0.1),
                            "rowwise_adagrad": lambda p: rd_optim.RowWiseAdagrad(p, lr=0.01)}[kind])
    assert not torch.equal(bits(first), bits(nearest)), "stochastic rounding rounded as round-to-nearest does"


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_tiny_updates_move_the_mean_as_float32_math_does(dtype):
    # Every element starts at 1.0 and gets `steps` SGD updates of -lr * g, each well under half a unit
    # in the last place below 1.0 (float16: 2**-12, bfloat16: 2**-9): round-to-nearest loses them all.
    g, steps = (1e-4, 200) if dtype == torch.float16 else (5e-4, 200)
    ids = torch.arange(ROWS)

    def run(stochastic_rounding):
        weight, _ = table(dtype, value=1.0)
        optimizer = rd_optim.SGD([weight], lr=1.0, stochastic_rounding=stochastic_rounding)
        coefficients = torch.full((ROWS, DIM), g).to(dtype)
        for _ in range(steps):
            (F.embedding(ids.to("recdev"), weight) * coefficients.to("recdev")).sum().backward()
            optimizer.step()
        return read(weight).double()

    torch.manual_seed(0)
    nearest = run(False)
    assert torch.equal(nearest, torch.ones(ROWS, DIM, dtype=torch.float64)), "round-to-nearest kept the updates"
    stochastic = run(True)
    expected = 1.0 - steps * float(torch.tensor(g).to(dtype))  # the float32 math (exact enough here)
    # Each rounding adds a zero-mean error of at most one ulp (u); over `steps` steps an element's
    # error has a standard deviation under sqrt(steps) * u / 2, the mean of ROWS * DIM elements
    # sqrt(ROWS * DIM) times less: allow 6 of those.
    ulp = 2.0**-11 if dtype == torch.float16 else 2.0**-8
    sd = (steps**0.5) * ulp / 2 / (ROWS * DIM) ** 0.5
    assert abs(stochastic.mean().item() - expected) < 6 * sd, (stochastic.mean().item(), expected, sd)
    # And the elements are spread over several half values, each one of the grid's.
    assert len(torch.unique(stochastic)) > 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_refused_on_float32_and_float64_tables(dtype):
    weight, init = table(dtype)
    with pytest.raises(ValueError, match=r"stochastic_rounding=True\) rounds the float32 update of float16 and bfloat16"):
        rd_optim.SGD([weight], lr=0.1, stochastic_rounding=True)
    # The store refuses it too (for clients that bypass torch_recdev.optim), and nothing changed.
    with pytest.raises(Exception, match="stochastic_rounding applies to float16 and bfloat16 tables only"):
        _C._set_table_optimizer(weight, _C.OptimizerConfig("sgd", lr=0.1, stochastic_rounding=True, rounding_seed=5))
    assert torch.equal(read(weight), init)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_the_seed_travels_with_the_optimizer_state_dict(dtype):
    torch.manual_seed(5)
    weight, _ = table(dtype)
    optimizer = rd_optim.Adagrad([weight], lr=0.05, stochastic_rounding=True)
    state = optimizer.state_dict()
    assert state["param_groups"][0]["stochastic_rounding"] is True
    seed = state["param_groups"][0]["rounding_seed"]
    assert 0 <= seed < 2**53
    torch.manual_seed(6)
    again = rd_optim.Adagrad([weight], lr=0.05, stochastic_rounding=True)
    assert again.state_dict()["param_groups"][0]["rounding_seed"] != seed
    again.load_state_dict(state)
    assert again.param_groups[0]["rounding_seed"] == seed
