"""Fused optimizers: the optimizer runs in the store, beside each row.

A lookup's backward on a table sends its row gradients straight to the store,
which sums duplicates and applies the optimizer to the touched rows; the
weight never gets a ``.grad``. The classes here attach an optimizer to tables
and behave like ``torch.optim`` objects where a training loop expects it:
``param_groups`` (an LR scheduler may change ``lr``), ``step()``,
``zero_grad()``, ``state_dict()`` / ``load_state_dict()``.

    emb = torch.nn.Embedding(10**9, 64, device="recdev")
    opt = torch_recdev.optim.Adagrad([emb.weight], lr=0.05)

or TorchRec's convention:

    torch_recdev.optim.apply_optimizer_in_backward(torch.optim.Adagrad, [emb.weight], {"lr": 0.05})

The math per touched row matches ``torch.optim.SGD`` (no momentum),
``torch.optim.Adagrad`` with sparse gradients, fbgemm's EXACT_ROWWISE_ADAGRAD,
and ``torch.optim.SparseAdam``. Updates are applied during backward, so
``step()`` has nothing left to apply; it exists so loops written for
``torch.optim`` run unchanged.

In a fleet (torchrun), ``sync=True`` makes the updates synchronous (``torch_recdev/sync.py``):
backward records the row gradients and ``step()`` combines every rank's and applies them once, so
that N ranks with batch B train exactly like one process with batch N * B
(``apply_optimizer_in_backward``'s do it when backward ends). ``sync_timeout`` (seconds) bounds the
wait for the other ranks; a rank that does not arrive is named in the error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterable

import torch

from . import _C
from .sync import SyncTables
from .tables import is_table

__all__ = ["SGD", "Adagrad", "RowWiseAdagrad", "Adam", "FusedOptimizer", "apply_optimizer_in_backward"]


class _TableGroup(dict):
    """A param group that pushes a new ``lr`` to its tables at once, so that a
    scheduler's change applies to the very next backward."""

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        if key == "lr" and "params" in self:
            for p in self["params"]:
                _C._set_table_lr(p, float(value))


class _TableState(Mapping):
    """A fused optimizer's state of one table, ``{"step": n}``, read from the store, where it lives
    (with the per-row state, in the table's records). Never empty: DCP's ``get_state_dict`` /
    ``set_state_dict`` take an optimizer with no state for one never stepped and step it once with
    zero gradients and ``lr`` 0 — which, pushed to a table the whole fleet shares, would stop every
    rank's updates meanwhile."""

    def __init__(self, table: torch.Tensor):
        self._table = table

    def __getitem__(self, key):
        if key != "step":
            raise KeyError(key)
        return _C._table_optimizer_step(self._table)

    def __iter__(self):
        return iter(("step",))

    def __len__(self) -> int:
        return 1

    def __repr__(self) -> str:
        return repr(dict(self))


class FusedOptimizer(torch.optim.Optimizer):
    """Base of the fused optimizers; ``kind`` names the store-side optimizer."""

    kind: str = ""
    #: hyperparameters the store understands, with torch.optim's defaults
    defaults_for_store: dict[str, Any] = {}

    def __init__(self, params: Iterable[torch.Tensor], *, sync: bool = False, sync_timeout: float = 60.0,
                 **hyperparameters):
        stochastic_rounding = bool(hyperparameters.pop("stochastic_rounding", False))
        unknown = set(hyperparameters) - set(self.defaults_for_store)
        if unknown:
            raise TypeError(
                f"{type(self).__name__} got unknown hyperparameters {sorted(unknown)}; "
                f"it takes {sorted(self.defaults_for_store)}"
            )
        defaults = {**self.defaults_for_store, **hyperparameters}
        defaults.update(_rounding_defaults(stochastic_rounding))
        super().__init__(params, defaults)
        # Check every parameter before attaching to any, so a refusal leaves no table changed.
        for group in self.param_groups:
            for p in group["params"]:
                if not is_table(p):
                    raise ValueError(
                        f"{type(self).__name__} fuses its updates into store tables, but got a parameter of shape "
                        f"{tuple(p.shape)} on {p.device} that is not a recdev table. Use the torch.optim optimizer "
                        "for ordinary parameters, or create the weight on recdev table storage "
                        "(large enough, or inside torch_recdev.placement('table'))."
                    )
                _check_rounding(type(self).__name__, p, group)
        for group in self.param_groups:
            for p in group["params"]:
                self._attach(p, group)
        self.param_groups = [_TableGroup(g) for g in self.param_groups]
        self._state_in_the_store()
        self._sync = None
        if sync:
            self._sync = SyncTables([p for g in self.param_groups for p in g["params"]], sync_timeout)

    def _attach(self, p: torch.Tensor, group: dict) -> None:
        config = {k: float(group[k]) for k in self.defaults_for_store if k != "betas"}
        if "betas" in self.defaults_for_store:
            config["beta1"], config["beta2"] = (float(b) for b in group["betas"])
        config.update(_rounding_config(self, p, group))
        _C._set_table_optimizer(p, _C.OptimizerConfig(self.kind, **config))

    @torch.no_grad()
    def step(self, closure=None):
        """Runs the closure if given. Updates were applied in backward; with sync=True, this is where
        every rank's row gradients of the step are combined and applied (but for the optimizers of
        ``apply_optimizer_in_backward``, whose backward does it)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._sync is not None and not self._sync.after_backward:
            self._sync.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Table weights never hold a gradient; nothing to clear."""

    def _state_in_the_store(self) -> None:
        self.state.clear()
        self.state.update({p: _TableState(p) for g in self.param_groups for p in g["params"]})

    def state_dict(self) -> dict:
        state = super().state_dict()
        params = [p for g in self.param_groups for p in g["params"]]
        state["state"] = {i: dict(self.state[p]) for i, p in enumerate(params)}
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self.param_groups = [_TableGroup(g) for g in self.param_groups]
        params = [p for g in self.param_groups for p in g["params"]]
        for group in self.param_groups:
            for p in group["params"]:
                self._attach(p, group)
        for i, p in enumerate(params):
            step = state_dict["state"].get(i, {}).get("step")
            if step is not None:
                _C._set_table_optimizer_step(p, int(step))
        self._state_in_the_store()


def _rounding_defaults(stochastic_rounding: bool) -> dict:
    """``stochastic_rounding=True``: the optimizer draws its rounding seed from the recdev
    generator now, so a run under ``torch.manual_seed`` rounds the same way every time."""
    if not stochastic_rounding:
        return {"stochastic_rounding": False}
    seed = int(_C._draw_seed())
    return {"stochastic_rounding": True, "rounding_seed": seed}


def _rounding_seed(seed) -> int:
    """A given rounding seed, checked: the store takes an integer in [0, 2**53)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**53:
        raise ValueError(f"rounding_seed must be an integer in [0, 2**53); got {seed!r}")
    return seed


def _check_rounding(name: str, p: torch.Tensor, group: dict) -> None:
    if group.get("stochastic_rounding") and p.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(
            f"{name}(stochastic_rounding=True) rounds the float32 update of float16 and bfloat16 rows; "
            f"this table holds {p.dtype} rows, which are updated without rounding. Leave stochastic_rounding "
            "off for it (or put it in a separate param group)."
        )


def _rounding_config(opt: FusedOptimizer, p: torch.Tensor, group: dict) -> dict:
    """The store's rounding settings for one table: its seed mixes the optimizer's seed with the
    table's position among the optimizer's parameters, so each table draws its own bits."""
    if not group.get("stochastic_rounding"):
        return {}
    index = next(i for i, q in enumerate(q for g in opt.param_groups for q in g["params"]) if q is p)
    seed = (int(group["rounding_seed"]) + index * 0x9E3779B97F4A7C15) % 2**53
    return {"stochastic_rounding": True, "rounding_seed": seed}


class SGD(FusedOptimizer):
    """``torch.optim.SGD`` without momentum, per touched row."""

    kind = "sgd"
    defaults_for_store = {"lr": 1e-3, "weight_decay": 0.0}


class Adagrad(FusedOptimizer):
    """``torch.optim.Adagrad`` with sparse gradients, per touched row."""

    kind = "adagrad"
    defaults_for_store = {"lr": 1e-2, "lr_decay": 0.0, "weight_decay": 0.0, "initial_accumulator_value": 0.0, "eps": 1e-10}


class RowWiseAdagrad(FusedOptimizer):
    """fbgemm's EXACT_ROWWISE_ADAGRAD: one accumulator per row."""

    kind = "rowwise_adagrad"
    defaults_for_store = {"lr": 1e-2, "eps": 1e-10, "weight_decay": 0.0}


class Adam(FusedOptimizer):
    """``torch.optim.SparseAdam`` (lazy Adam: only touched rows move)."""

    kind = "adam"
    defaults_for_store = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8}


_FUSED_FOR = {
    torch.optim.SGD: SGD,
    torch.optim.Adagrad: Adagrad,
    torch.optim.SparseAdam: Adam,
    torch.optim.Adam: Adam,
    SGD: SGD,
    Adagrad: Adagrad,
    RowWiseAdagrad: RowWiseAdagrad,
    Adam: Adam,
}


def apply_optimizer_in_backward(optimizer_class, params: Iterable[torch.Tensor], optimizer_kwargs: dict) -> None:
    """TorchRec's convention: fuse ``optimizer_class`` into the backward of these table weights.

    Accepts torch.optim.SGD, Adagrad, SparseAdam (and Adam, run as SparseAdam's lazy
    update) and the torch_recdev.optim classes. Each parameter records its optimizer
    in ``param._in_backward_optimizers``, as TorchRec does. ``sync=True`` in the kwargs
    makes them synchronous: one optimizer then holds every parameter, and every rank's rows
    of a step are combined and applied when that step's backward ends, before ``backward()``
    returns (no ``step()`` call; its failures are raised by ``backward()``)."""
    fused = _FUSED_FOR.get(optimizer_class)
    if fused is None:
        names = ", ".join(sorted({c.__module__ + "." + c.__name__ for c in _FUSED_FOR}))
        raise ValueError(f"no fused store-side version of {optimizer_class!r}; choose one of: {names}")
    kwargs = dict(optimizer_kwargs)
    if fused is SGD and "momentum" in kwargs:
        # torch.optim.SGD's momentum=0 default is accepted; anything else cannot be fused.
        if kwargs.pop("momentum"):
            raise ValueError("the fused SGD has no momentum; use momentum=0 or Adagrad/Adam")
    params = list(params)
    if kwargs.get("sync"):
        # One exchange per step for all of them: one optimizer.
        opt = fused(params, **kwargs)
        opt._sync.step_when_backward_ends()
        for p in params:
            p._in_backward_optimizers = [opt]
        return
    for p in params:
        opt = fused([p], **kwargs)
        p._in_backward_optimizers = [opt]
