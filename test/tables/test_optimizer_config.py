"""_C.OptimizerConfig, the typed configuration of a fused optimizer that torch_recdev.optim attaches,
init_embedding_table declares and share_tables reads back: typed fields, refusals that say what to
do, and the round trip through a table without a float in between. And the production module holds
no test binding (those are torch_recdev._testing's)."""

import pytest
import torch

import torch_recdev
from torch_recdev import _C, ops
from torch_recdev import optim as rd_optim


def test_fields_are_typed():
    config = _C.OptimizerConfig("adam", lr=0.1, beta1=0.8, eps=1e-6)
    assert (config.kind, config.lr, config.beta1, config.beta2, config.eps) == ("adam", 0.1, 0.8, 0.999, 1e-6)
    assert config.stochastic_rounding is False and config.rounding_seed == 0
    assert config.hyperparameters() == {"lr": 0.1, "eps": 1e-6, "betas": (0.8, 0.999)}
    rounding = _C.OptimizerConfig("sgd", lr=0.5, stochastic_rounding=True, rounding_seed=2**53 - 1)
    assert rounding.hyperparameters() == {"lr": 0.5, "weight_decay": 0.0, "stochastic_rounding": True,
                                          "rounding_seed": 2**53 - 1}
    assert type(rounding.hyperparameters()["rounding_seed"]) is int


def test_bad_configs_say_what_to_do():
    with pytest.raises(ValueError, match="unknown optimizer 'adamw'; choose sgd, adagrad, rowwise_adagrad or adam"):
        _C.OptimizerConfig("adamw", lr=0.1)
    with pytest.raises(ValueError, match="rounding_seed is used with stochastic_rounding=True only"):
        _C.OptimizerConfig("sgd", lr=0.1, rounding_seed=3)
    with pytest.raises(TypeError):  # keywords only, typed
        _C.OptimizerConfig("sgd", 0.1)


def test_an_attached_optimizer_reads_back_exactly(tmp_path):
    weight = ops.init_embedding_table("optimizer_config.table", 100, 8, dtype=torch.bfloat16, reset=True)
    rd_optim.Adagrad([weight], lr=0.25, lr_decay=0.01, stochastic_rounding=True)
    _, config = _C._table_declaration(weight)
    assert config.kind == "adagrad" and config.lr == 0.25 and config.lr_decay == 0.01
    assert config.stochastic_rounding is True and 0 <= config.rounding_seed < 2**53
    # share_tables' path: the read-back hyperparameters declare the same optimizer.
    again = ops.init_embedding_table("optimizer_config.table", 100, 8, dtype=torch.bfloat16,
                                     optimizer=(config.kind, config.hyperparameters()))
    assert _C._table_declaration(again)[1] == config


def test_the_production_module_holds_no_test_binding():
    assert not hasattr(_C, "_store") and not hasattr(_C, "_server")
    assert torch_recdev.StoreFullError is _C.StoreFullError
    assert issubclass(torch_recdev.StoreFullError, MemoryError)
