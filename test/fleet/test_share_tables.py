"""share_tables in one process: which parameters become named tables, with what rule and optimizer,
and that a second model sharing the same names trains the same rows."""

import uuid

import pytest
import torch
from torch import nn

import torch_recdev as R
from torch_recdev import ops


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        with R.placement("table"):
            self.emb = nn.Embedding(1000, 4, device="recdev")
            self.bag = nn.EmbeddingBag(200, 4, device="recdev")
        self.head = nn.Linear(8, 1)


def test_table_parameters_become_named_tables_with_their_rule_and_optimizer():
    prefix = f"share_{uuid.uuid4().hex}."
    model = Model()
    R.optim.Adagrad([model.emb.weight], lr=0.3)
    param = model.emb.weight
    shared = R.share_tables(model, prefix=prefix)
    assert sorted(shared) == [prefix + "bag.weight", prefix + "emb.weight"]
    assert model.emb.weight is param and R.is_table(param)  # the same Parameter, now the named table
    assert not R.is_table(model.head.weight)
    # Declared with nn.Embedding's Normal(0, 1) and the Adagrad attached before: the same declaration
    # opens it, another is refused.
    again = ops.init_embedding_table(prefix + "emb.weight", 1000, 4, init=R.Normal(0, 1),
                                     optimizer=("adagrad", {"lr": 0.3}))
    ops.emb_update(param, torch.tensor([5]), torch.ones(1, 4))
    assert torch.equal(ops.emb_read(again, torch.tensor([5])).cpu(), ops.emb_read(param, torch.tensor([5])).cpu())
    with pytest.raises(ValueError, match="optimizer kind: the table has Adagrad, declared SGD"):
        ops.init_embedding_table(prefix + "emb.weight", 1000, 4, optimizer=("sgd", {}))


def test_a_second_model_sharing_the_names_sees_the_first_ones_training():
    prefix = f"share_{uuid.uuid4().hex}."
    first, second = Model(), Model()
    R.optim.SGD([first.emb.weight, first.bag.weight], lr=1.0)
    R.optim.SGD([second.emb.weight, second.bag.weight], lr=1.0)
    R.share_tables(first, prefix)
    R.share_tables(second, prefix)
    ids = torch.tensor([[1, 2]])
    first.bag(ids).sum().backward()
    assert torch.equal(ops.emb_read(second.bag.weight, ids[0]).cpu(), ops.emb_read(first.bag.weight, ids[0]).cpu())
    assert torch.equal(second.emb.weight[3].cpu(), first.emb.weight[3].cpu())


def test_share_tables_refuses_what_is_not_a_module():
    with pytest.raises(TypeError, match="takes an nn.Module"):
        R.share_tables(torch.zeros(3))


def test_fleet_store_without_a_process_group_is_the_current_store():
    assert R.fleet_store() == R.store_info()
