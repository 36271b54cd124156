"""A pure-Python reference model of a named store table, from the documented semantics
(docs/store_api.md, docs/budgets.md, docs/training.md, docs/fleet.md).

The model never talks to the store. `store_machine.py` drives the real store and this model side by
side. A method either raises `Refused(exc_type)` having changed nothing (a refused request changes
nothing), or applies the request and returns what a read must give.

Values are held as float32 numpy arrays holding values of the table's dtype exactly (a float16 row
is kept widened). Init values of Normal/Uniform rules cannot be computed here: the machine learns
them from the store (a copy of the table to the CPU, which is no touch) and checks they never change
while the rule's seed does not.
"""

from __future__ import annotations

import copy
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# torch_recdev.optim's defaults (= torch.optim's), which a declaration's missing hyperparameters take.
OPT_DEFAULTS = {
    "sgd": {"lr": 1e-3, "weight_decay": 0.0},
    "adagrad": {"lr": 1e-2, "lr_decay": 0.0, "weight_decay": 0.0, "initial_accumulator_value": 0.0, "eps": 1e-10},
    "rowwise_adagrad": {"lr": 1e-2, "eps": 1e-10, "weight_decay": 0.0},
    "adam": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8},
}


class Refused(Exception):
    """The store must raise `exc` and change nothing."""

    def __init__(self, exc: type[BaseException], why: str):
        super().__init__(f"{exc.__name__}: {why}")
        self.exc = exc


def to_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values rounded once, to nearest even, into `dtype`, widened back."""
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(DTYPES[dtype]).float().numpy()


def ulp(x: np.ndarray, dtype: str) -> np.ndarray:
    """The spacing of `dtype` at each value of x (the gap to the next value away from zero)."""
    t = torch.from_numpy(np.abs(np.ascontiguousarray(x, dtype=np.float32))).to(DTYPES[dtype])
    return (torch.nextafter(t, torch.tensor(float("inf"), dtype=t.dtype)).float() - t.float()).numpy()


@dataclass
class Row:
    w: np.ndarray  # float32, values of the table's dtype
    state: dict  # optimizer state, float64 (the store's is float32: compared with a tolerance)


@dataclass
class Policy:
    max_rows: Optional[int] = None  # with evict="lru" whenever set
    admit_after: int = 1
    spill: bool = False  # evicted rows go to the disk tier (needs max_rows), and come back as they were

    def keywords(self) -> dict:
        kw = {"admit_after": self.admit_after}
        if self.max_rows is not None:
            kw.update(max_rows=self.max_rows, evict="lru")
        if self.spill:
            kw["spill"] = True
        return kw


@dataclass
class TableModel:
    name: str
    rows: int
    dim: int
    dtype: str
    init: tuple  # (kind, a, b) as init strategies give it
    opt: Optional[tuple] = None  # (kind, full hyperparameters)
    policy: Optional[Policy] = None
    step: int = 0
    held: "OrderedDict[int, Row]" = field(default_factory=OrderedDict)  # least recently touched first
    spilled: "OrderedDict[int, Row]" = field(default_factory=OrderedDict)  # on disk (spill), oldest first
    init_known: dict = field(default_factory=dict)  # id -> init row learned from the store
    sketch: Counter = field(default_factory=Counter)  # admission: lookups of rows not held (exact for few ids)
    evicted: int = 0
    admitted: int = 0
    counters_known: bool = True
    last_lookup: Optional[frozenset] = None  # ids the lookup just before stored (lru's backward rule)

    # --- init values -------------------------------------------------------------------------

    def exact_init(self) -> bool:
        return self.init[0] in ("zero", "constant")

    def init_value(self, i: int) -> Optional[np.ndarray]:
        if self.exact_init():
            return to_dtype(np.full(self.dim, self.init[1], np.float32), self.dtype)
        return self.init_known.get(i)

    def fresh_state(self) -> dict:
        if self.opt is None:
            return {}
        kind, hp = self.opt
        if kind == "adagrad":
            return {"sum": np.full(self.dim, hp["initial_accumulator_value"], np.float64)}
        if kind == "rowwise_adagrad":
            return {"acc": 0.0}
        if kind == "adam":
            return {"m": np.zeros(self.dim), "v": np.zeros(self.dim)}
        return {}

    def row(self, i: int) -> Row:
        """A row the table holds, in memory or on disk."""
        return self.held[i] if i in self.held else self.spilled[i]

    def holds(self, i: int) -> bool:
        return i in self.held or i in self.spilled

    # --- checks common to every row request ---------------------------------------------------

    def _check_keys(self, keys: list[int]) -> list[int]:
        for pos, k in enumerate(keys):
            if not 0 <= k < self.rows:
                raise Refused(IndexError, f"key {k} at position {pos} out of range")
        return list(dict.fromkeys(keys))

    def _check_budget(self, stored) -> None:
        """The rows a request stores must fit the budget together (the machine's model is a copy:
        the sketch counted so far is thrown away with it)."""
        if self.policy and self.policy.max_rows is not None and len(stored) > self.policy.max_rows:
            raise Refused(ValueError, f"{len(stored)} distinct rows cannot fit the budget")

    def _materialize(self, i: int) -> Row:
        if i in self.spilled:  # back from disk, weight and state as they left
            row = self.held[i] = self.spilled.pop(i)
            self.admitted += 1
            return row
        v = self.init_value(i)
        assert v is not None, f"init value of row {i} unknown to the model"
        row = Row(v.copy(), self.fresh_state())
        self.held[i] = row
        if self.policy:
            self.admitted += 1
        return row

    def _touch(self, ids) -> None:
        if self.policy and self.policy.max_rows is not None:
            for i in ids:
                if i in self.held:
                    self.held.move_to_end(i)

    def _evict(self, protected: set) -> None:
        if not (self.policy and self.policy.max_rows is not None):
            return
        while len(self.held) > self.policy.max_rows:
            victim = next(i for i in self.held if i not in protected)
            row = self.held.pop(victim)
            if self.policy.spill:
                self.spilled[victim] = row
            self.evicted += 1

    def _admits(self, i: int) -> bool:
        """A lookup of row i, not held: counted in the sketch; stored from the k-th on."""
        k = self.policy.admit_after if self.policy else 1
        if k <= 1:
            return True
        self.sketch[i] += 1
        return self.sketch[i] >= k

    # --- requests ----------------------------------------------------------------------------

    def read(self, keys: list[int]) -> np.ndarray:
        distinct = self._check_keys(keys)
        # a row on disk was admitted before: it comes back without the sketch
        stored = [i for i in distinct if i in self.held or i in self.spilled or self._admits(i)]
        self._check_budget(stored)
        out = {}
        for i in distinct:
            if i in self.held:
                out[i] = self.held[i].w
            elif i in stored:
                out[i] = self._materialize(i).w
            else:
                out[i] = self.init_value(i)  # pending: read as its init value, not stored
        self._touch(distinct)
        self._evict(set(distinct))
        self.last_lookup = frozenset(i for i in distinct if i in self.held)
        return np.stack([out[k] for k in keys]) if keys else np.zeros((0, self.dim), np.float32)

    def write(self, keys: list[int], values: np.ndarray) -> None:
        distinct = self._check_keys(keys)
        self._check_budget(distinct)
        last = {k: values[p] for p, k in enumerate(keys)}  # duplicate keys: the last one wins
        for i in distinct:
            row = self.held.get(i) or self._materialize(i)  # writes admit at once, state kept
            row.w = to_dtype(last[i], self.dtype)
        self._touch(distinct)
        self._evict(set(distinct))
        self.last_lookup = None

    def delete(self, keys: list[int]) -> None:
        for pos, k in enumerate(keys):
            if not 0 <= k < self.rows:
                raise Refused(IndexError, f"key {k} at position {pos} out of range")
        for k in keys:
            self.held.pop(k, None)
            self.spilled.pop(k, None)
        self.last_lookup = None

    def exists(self, keys: list[int]) -> list[bool]:
        for pos, k in enumerate(keys):
            if not 0 <= k < self.rows:
                raise Refused(IndexError, f"key {k} at position {pos} out of range")
        return [k in self.held or k in self.spilled for k in keys]

    def update(self, keys: list[int], grads: np.ndarray) -> set:
        """One optimizer step; returns the ids whose weights moved (compared with a tolerance
        unless the optimizer is exact)."""
        distinct = self._check_keys(keys)
        if self.opt is None:
            raise Refused(ValueError, "no optimizer")
        if not np.all(np.isfinite(grads)):
            raise Refused(ValueError, "non-finite gradient")
        k = self.policy.admit_after if self.policy else 1
        self._check_budget([i for i in distinct if i in self.held or i in self.spilled or k <= 1])
        summed = {i: np.zeros(self.dim, np.float32) for i in distinct}
        with np.errstate(over="ignore"):
            for p, key in enumerate(keys):  # duplicates summed in float32, in batch order
                summed[key] = summed[key] + grads[p].astype(np.float32)
            if any(not np.all(np.isfinite(g)) for g in summed.values()):
                raise Refused(ValueError, "a summed gradient overflows")
        self.step += 1
        moved = set()
        for i in distinct:
            row = self.held.get(i)
            if row is None:
                if k > 1 and i not in self.spilled:
                    continue  # updates never admit: dropped until the row is admitted
                row = self._materialize(i)
            self._apply(row, summed[i])
            moved.add(i)
        if self.last_lookup is None or frozenset(distinct) != self.last_lookup:
            self._touch(distinct)  # under lru the backward of the lookup just before touches nothing
        self._evict(set(distinct))
        self.last_lookup = None
        return moved

    def _apply(self, row: Row, g32: np.ndarray) -> None:
        kind, hp = self.opt
        w = row.w.astype(np.float32)
        if kind == "sgd":
            # exact: float32 math, rounded once into the dtype
            g = g32 + np.float32(hp["weight_decay"]) * w
            new = w + np.float32(-hp["lr"]) * g
        elif kind == "adagrad":
            g = g32.astype(np.float64) + hp["weight_decay"] * w
            clr = hp["lr"] / (1 + (self.step - 1) * hp["lr_decay"])
            row.state["sum"] = row.state["sum"] + g * g
            new = w - clr * g / (np.sqrt(row.state["sum"]) + hp["eps"])
        elif kind == "rowwise_adagrad":
            g = g32.astype(np.float64) + hp["weight_decay"] * w
            row.state["acc"] = row.state["acc"] + float(np.mean(g * g))
            m = hp["lr"] / (np.sqrt(row.state["acc"]) + hp["eps"])
            new = (1 - m * hp["weight_decay"]) * w - m * g
        elif kind == "adam":
            b1, b2 = hp["betas"]
            g = g32.astype(np.float64)
            row.state["m"] = row.state["m"] + (g - row.state["m"]) * (1 - b1)
            row.state["v"] = row.state["v"] + (g * g - row.state["v"]) * (1 - b2)
            size = hp["lr"] * np.sqrt(1 - b2**self.step) / (1 - b1**self.step)
            new = w - size * row.state["m"] / (np.sqrt(row.state["v"]) + hp["eps"])
        else:
            raise AssertionError(kind)
        row.w = to_dtype(np.asarray(new, np.float32), self.dtype)

    # --- declarations ------------------------------------------------------------------------

    def redeclare(self, rows, dim, dtype, init, opt) -> None:
        """The same name declared again without reset: opens it, or is refused on a difference."""
        if (rows, dim) != (self.rows, self.dim):
            raise Refused(ValueError, "shape differs")
        if dtype != self.dtype:
            raise Refused(ValueError, "dtype differs")
        if init is not None and init != self.init:
            raise Refused(ValueError, "init rule differs")
        if opt is not None and self.opt is not None and opt[0] != self.opt[0]:
            raise Refused(ValueError, "optimizer kind differs")
        if opt is not None:
            if self.opt is None or opt[0] != self.opt[0]:
                self.opt = opt
                for row in [*self.held.values(), *self.spilled.values()]:  # on disk too
                    row.state = self.fresh_state()
                self.step = 0
            else:
                self.opt = opt  # same kind: hyperparameters applied, state and step kept
        self.last_lookup = None

    def snapshot(self) -> "TableModel":
        return copy.deepcopy(self)

    def expected_rows(self) -> dict:
        """Every row of the table as a copy to the CPU must give it, where the model knows it."""
        out = {}
        for i in range(self.rows):
            if i in self.held or i in self.spilled:
                out[i] = self.row(i).w
            else:
                v = self.init_value(i)
                if v is not None:
                    out[i] = v
        return out


def restore(saved: TableModel, current: Optional[TableModel]) -> TableModel:
    """What loading `saved` (a checkpoint's table) into `current` (the destination, if any) gives."""
    t = saved.snapshot()
    t.last_lookup = None
    if current is not None and saved.policy is None and current.policy is not None:
        # a file without a policy keeps the destination's, which adopts the rows in id order
        t.policy = copy.deepcopy(current.policy)
        t.held = OrderedDict(sorted(t.held.items()))
        t.sketch = Counter()
        t.counters_known = False
        if t.policy.max_rows is not None:
            while len(t.held) > t.policy.max_rows:
                victim, row = t.held.popitem(last=False)
                if t.policy.spill:
                    t.spilled[victim] = row
    return t


def full_opt(kind: str, hp: dict) -> tuple:
    return kind, {**OPT_DEFAULTS[kind], **hp}
