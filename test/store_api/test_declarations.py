"""Tables are declared, not reset: init_embedding_table on an existing table with the same shape,
init strategy and optimizer kind keeps every row and optimizer state; a difference is a ValueError
naming it; reset=True is the only way to drop rows; a checkpoint loaded before the declaration keeps
its rows. On the embedded store and on two real shards (conftest)."""

import uuid

import pytest
import torch

import torch_recdev as R
from torch_recdev import ops

KEYS = torch.tensor([3, 17, 17, 999])


def _name():
    return f"decl_{uuid.uuid4().hex}"


def _declare(name, rows=1000, dim=8, init=R.Constant(0.5), optimizer=("adagrad", {"lr": 0.1}), **kwargs):
    return ops.init_embedding_table(name, rows, dim, init=init, optimizer=optimizer, **kwargs)


def _grads(seed):
    return torch.randn(len(KEYS), 8, generator=torch.Generator().manual_seed(seed))


def _rows(table):
    return ops.emb_read(table, KEYS).cpu()


@pytest.mark.parametrize("optimizer", [("sgd", {"lr": 0.1}), ("adagrad", {"lr": 0.1}),
                                       ("rowwise_adagrad", {"lr": 0.1}), ("adam", {"lr": 0.1})])
def test_the_same_declaration_keeps_rows_and_optimizer_state(optimizer):
    # Two tables get the same updates; one is declared again in between, as another rank would. Had
    # the declaration dropped the rows or the optimizer state, the second update would differ.
    name = _name()
    table, reference = _declare(name, optimizer=optimizer), _declare(_name(), optimizer=optimizer)
    for t in (table, reference):
        ops.emb_update(t, KEYS, _grads(0))
    again = _declare(name, optimizer=optimizer)
    assert torch.equal(_rows(again), _rows(reference))
    for t in (again, reference):
        ops.emb_update(t, KEYS, _grads(1))
    assert torch.equal(_rows(table), _rows(reference))
    assert R.table_stats(again)["rows"] == 3


def test_another_seed_for_the_same_strategy_keeps_the_first_declarations_values():
    # Each rank draws its init seed from its own generator: declaring is about the strategy.
    name = _name()
    torch.manual_seed(1)
    first = ops.emb_read(_declare(name, init=R.Normal(0, 1)), KEYS).cpu()
    torch.manual_seed(2)
    again = _declare(name, init=R.Normal(0, 1))
    assert torch.equal(ops.emb_read(again, KEYS).cpu(), first)


def test_new_hyperparameters_apply_and_the_state_stays():
    name = _name()
    table, reference = _declare(name), _declare(_name())
    for t in (table, reference):
        ops.emb_update(t, KEYS, _grads(0))
    _declare(name, optimizer=("adagrad", {"lr": 0.5}))
    R.optim.Adagrad([reference], lr=0.5)  # the same kind again: the state is kept, the lr changes
    for t in (table, reference):
        ops.emb_update(t, KEYS, _grads(1))
    assert torch.equal(_rows(table), _rows(reference))


@pytest.mark.parametrize("change, what", [
    ({"rows": 1001}, "shape: the table is 1000 x 8, declared 1001 x 8"),
    ({"dim": 4}, "shape: the table is 1000 x 8, declared 1000 x 4"),
    ({"init": R.Normal(0, 0.1)}, "init rule: the table has Constant(value=0.5), declared Normal(mean=0, std=0.1)"),
    ({"optimizer": ("adam", {"lr": 0.1})}, "optimizer kind: the table has Adagrad, declared Adam"),
])
def test_each_kind_of_difference_is_a_value_error_naming_it_and_changes_nothing(change, what):
    name = _name()
    table = _declare(name)
    ops.emb_update(table, KEYS, _grads(0))
    before = _rows(table)
    with pytest.raises(ValueError, match="differs from its declaration in " + what.replace("(", r"\(").replace(")", r"\)")
                       + r".*reset=True"):
        _declare(name, **change)
    assert torch.equal(_rows(_declare(name)), before)


def test_every_difference_is_named_at_once():
    name = _name()
    _declare(name)
    with pytest.raises(ValueError, match="shape: .*; init rule: .*; optimizer kind: "):
        _declare(name, rows=5, init=R.Zero(), optimizer=("sgd", {"lr": 0.1}))


def test_reset_drops_rows_and_state_and_may_change_everything():
    name = _name()
    table = _declare(name)
    ops.emb_update(table, KEYS, _grads(0))
    same_shape = _declare(name, init=R.Constant(2.0), optimizer=("sgd", {"lr": 1.0}), reset=True)
    assert ops.emb_exists(same_shape, KEYS).tolist() == [False] * 4
    assert ops.emb_read(same_shape, KEYS).cpu().eq(2.0).all()
    ops.emb_update(same_shape, torch.tensor([3]), torch.ones(1, 8))
    assert ops.emb_read(same_shape, torch.tensor([3])).cpu().eq(1.0).all()  # plain SGD: 2 - 1
    other_shape = _declare(name, rows=50, dim=4, reset=True)
    assert other_shape.shape == (50, 4) and R.table_stats(other_shape)["rows"] == 0


@pytest.mark.parametrize("rows", [1000, 50], ids=["in_place", "replaced"])
def test_a_reset_that_names_no_optimizer_leaves_the_table_none(rows):
    # As declared, whether the reset keeps the shape (in place) or not (a new table under the name).
    name = _name()
    ops.emb_update(_declare(name, optimizer=("adam", {"lr": 0.1})), KEYS, _grads(0))
    fresh = _declare(name, rows=rows, optimizer=None, reset=True)
    with pytest.raises(ValueError, match="has no optimizer"):
        ops.emb_update(fresh, KEYS % rows, _grads(1))
    assert R.table_stats(fresh)["rows"] == 0


def test_without_init_or_optimizer_a_declaration_opens_whatever_the_table_has():
    name = _name()
    table = _declare(name, init=R.Normal(0, 1), optimizer=("adam", {"lr": 0.1}))
    ops.emb_update(table, KEYS, _grads(0))
    opened = ops.init_embedding_table(name, 1000, 8)
    assert torch.equal(_rows(opened), _rows(table))


def test_a_checkpoint_loaded_before_the_declaration_keeps_its_rows(tmp_path):
    name = _name()
    table = _declare(name, init=R.Normal(0, 0.1))
    ops.emb_update(table, KEYS, _grads(0))
    saved = _rows(table)
    path = tmp_path / "store.recdev"
    ops.save(path)
    _declare(name, init=R.Normal(0, 0.1), reset=True)  # as if in a fresh store
    assert name in ops.load(path)
    resumed = _declare(name, init=R.Normal(0, 0.1))
    assert torch.equal(_rows(resumed), saved)
    assert R.table_stats(resumed)["rows"] == 3
