"""The state machine: random sequences of public store operations, run against the real store and
the reference model (reference.py) side by side.

After every rule the touched tables are compared whole with the model: a copy of the table to the
CPU (no touch, docs/budgets.md), `emb_exists` of every id, `table_stats` and the optimizer's step.
So a refused request is checked to have changed nothing by the same comparison that checks every
other request.

Where the docs leave room, the model takes: `reset=True` makes a fresh table (the declared policy,
none if none is declared; an empty admission sketch; zero counters and step), however the shape
changes; tables on shards get admission alone (budgets there are per-shard shares over routed ids),
and `shard_budget` checks that a budget refusal on shards is all or nothing. On shards the machine
connects with `overlap_updates=True`, and `update_in_backward` trains through autograd: its update
is answered only when the next rule's first request reads it.
"""

from __future__ import annotations

import atexit
import io
import itertools
import os
import shutil
import tempfile

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

import torch_recdev
from torch_recdev import local_shards, ops

from reference import DTYPES, Policy, Refused, TableModel, full_opt, restore, ulp

NAMES = ("t0", "t1")
SHAPES = ((8, 2), (8, 4), (8, 8), (16, 4), (16, 8))  # float32 x4 and float16 x8 share a row width
INITS = (("constant", 0.5, 0.0), ("zero", 0.0, 0.0), ("constant", -1.25, 0.0), ("normal", 0.0, 1.0),
         ("uniform", -1.0, 1.0))
OPTS = (("sgd", {"lr": 0.5}), ("sgd", {"lr": 0.125, "weight_decay": 0.5}), ("adagrad", {"lr": 0.1}),
        ("rowwise_adagrad", {"lr": 0.1}), ("adam", {"lr": 0.01}), None)
POLICIES = (None, Policy(2, 1), Policy(2, 1), Policy(3, 1), Policy(None, 2), Policy(2, 2), Policy(4, 3), Policy(None, 4),
            Policy(2, 1, spill=True), Policy(3, 2, spill=True))
# Budgets of shard_budget: with lru, without evict (refuses when full), with lru and admission.
SHARD_BUDGETS = {"lru": dict(evict="lru"), "strict": {}, "admission": dict(evict="lru", admit_after=2)}

# On shards each shard evicts against its share of the budget, over the ids it owns (docs/budgets.md),
# which depends on the routing of ids; the model knows no routing, so remote tables get admission alone.
REMOTE_POLICIES = (None, Policy(None, 2), Policy(None, 3), Policy(None, 4))
GRAD_VALUES = (0.0, 0.5, -1.0, 2.0, -0.25, 1.5, 3.0)
OPT_CLASSES = {"sgd": torch_recdev.optim.SGD, "adagrad": torch_recdev.optim.Adagrad,
               "rowwise_adagrad": torch_recdev.optim.RowWiseAdagrad, "adam": torch_recdev.optim.Adam}

_examples = itertools.count()
DISK_DIR = tempfile.mkdtemp(prefix="recdev-model-disk-")
atexit.register(shutil.rmtree, DISK_DIR, ignore_errors=True)


def strategy(rule_):
    kind, a, b = rule_
    return {"normal": torch_recdev.Normal(a, b), "uniform": torch_recdev.Uniform(a, b),
            "constant": torch_recdev.Constant(a), "zero": torch_recdev.Zero()}[kind]


def keys_tensor(keys) -> torch.Tensor:
    return torch.tensor(list(keys), dtype=torch.int64)


def rows_tensor(values: np.ndarray, dtype: str, dim: int) -> torch.Tensor:
    return torch.from_numpy(np.asarray(values, np.float32).reshape(-1, dim)).to(DTYPES[dtype])


def call(refused: Refused | None, fn):
    """Runs fn: it must raise what the model refused with, or succeed."""
    if refused is None:
        return fn()
    with pytest.raises(refused.exc):
        fn()
    return None


class StoreMachine(RuleBasedStateMachine):
    remote = False

    def __init__(self):
        super().__init__()
        # Each remote example has its own servers, and its ids' routing follows the table names: the
        # same names every time keep a replayed example the same. The embedded store lives on.
        self.prefix = "model_" if self.remote else f"model{os.getpid()}_{next(_examples)}_"
        self.counter = itertools.count()
        self.aux = {}  # other named tables (stochastic rounding, share_tables): name -> (rows, dim, dtype)
        self.aux_handles: dict[str, torch.Tensor] = {}
        self.models: dict[str, TableModel] = {}
        self.handles: dict[str, torch.Tensor] = {}
        self.tmp = tempfile.mkdtemp(prefix="recdev-model-")
        self.ckpt = None  # (path, {name: TableModel}) of the last ops.save
        self.tsaved = {}  # name -> (torch.save bytes, TableModel)
        # Incremental checkpoints (ops.checkpoint): the directory, and each version's tables as written.
        self.vdir = os.path.join(self.tmp, "versions")
        self.versions: dict[int, dict[str, TableModel]] = {}
        self.servers = None
        if self.remote:
            self.ckpt_dirs = [os.path.join(self.tmp, f"shard{s}") for s in range(2)]
            # each shard keeps its own checkpoint directory across restarts
            self.servers = [local_shards.Server(s, 2, "--checkpoint-dir", d, log_dir=self.tmp)
                            for s, d in enumerate(self.ckpt_dirs)]
            # Backward's updates overlap what follows (update_in_backward); every other rule's
            # requests are synchronous, and each reads the answers owed first.
            torch_recdev.connect(local_shards.server_list(self.servers), overlap_updates=True)
        else:
            torch_recdev.connect(None)
            torch_recdev.set_disk_dir(DISK_DIR)  # the embedded store lives on, and its spilling tables

    def teardown(self):
        if self.remote:
            torch_recdev.connect(None)
            for server in self.servers:
                server.stop()
        else:
            self.erase_every_row()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def erase_every_row(self) -> None:
        """Erases every row of the example's tables (after its compactions): test_store_model then
        checks that the store's table memory is back where the run started."""
        if os.path.isdir(self.vdir):
            ops.wait_for_compaction(self.vdir)
        for t in [*self.handles.values(), *self.aux_handles.values()]:
            ops.emb_delete(t, torch.arange(t.shape[0]))

    def _restart(self, shard: int, checkpoint_dir: str) -> None:
        old = self.servers[shard]
        old.stop()
        old.proc.stdout.close()
        self.servers[shard] = local_shards.Server(shard, 2, "--checkpoint-dir", checkpoint_dir,
                                                  listen=f"127.0.0.1:{old.port}", log_dir=self.tmp)

    # --- comparing the store with the model ----------------------------------------------------

    def check(self, name: str) -> None:
        m, t = self.models[name], self.handles[name]
        assert tuple(t.shape) == (m.rows, m.dim) and t.dtype == DTYPES[m.dtype]
        peek = t.cpu().float().numpy()  # no touch
        exact = m.opt is None or m.opt[0] == "sgd"
        for i in range(m.rows):
            if m.holds(i):
                want, got = m.row(i).w, peek[i]
                if exact:
                    assert np.array_equal(got, want), f"{name} row {i}: store {got}, model {want}"
                else:
                    tol = 1e-5 * np.abs(want) + 1e-6
                    if m.dtype != "float32":
                        tol = np.maximum(tol, 1.01 * ulp(want, m.dtype))
                    assert np.all(np.abs(got - want) <= tol), f"{name} row {i}: store {got}, model {want}"
                    m.row(i).w = got.copy()  # within tolerance: go on from the store's value
            else:
                want = m.init_value(i)
                if want is None:
                    m.init_known[i] = peek[i].copy()  # a Normal/Uniform row: learned once, then fixed
                else:
                    assert np.array_equal(peek[i], want), f"{name} row {i} (not held): store {peek[i]}, init {want}"
        exists = ops.emb_exists(t, torch.arange(m.rows)).tolist()
        assert exists == [m.holds(i) for i in range(m.rows)], \
            f"{name}: emb_exists {exists}, model holds {sorted(m.held)} and {sorted(m.spilled)} on disk"
        stats = torch_recdev.table_stats(t)
        got = (stats["rows"], stats["rows_on_disk"])
        assert got == (len(m.held) + len(m.spilled), len(m.spilled)), f"{name}: table_stats (rows, on disk) {got}, " \
            f"model {sorted(m.held)} and {sorted(m.spilled)} on disk"
        if m.policy is not None:
            if m.counters_known:
                got = (stats["evicted"], stats["admitted"])
                assert got == (m.evicted, m.admitted), f"{name}: (evicted, admitted) {got}, model {(m.evicted, m.admitted)}"
            else:
                m.evicted, m.admitted, m.counters_known = stats["evicted"], stats["admitted"], True
        if m.opt is not None:
            kind, hp = m.opt
            step = OPT_CLASSES[kind]([t], **hp).state_dict()["state"][0]["step"]  # same kind: state kept
            assert step == m.step, f"{name}: optimizer step {step}, model {m.step}"

    def check_all(self) -> None:
        for name in self.models:
            self.check(name)

    def full(self, name: str) -> str:
        return self.prefix + name

    # --- declarations ---------------------------------------------------------------------------

    def _declare(self, name, shape, dtype, init, opt, policy, reset):
        kw = dict(dtype=DTYPES[dtype], init=strategy(init), optimizer=opt and (opt[0], dict(opt[1])), reset=reset)
        if policy is not None:
            kw.update(policy.keywords())
        return ops.init_embedding_table(self.full(name), shape[0], shape[1], **kw)

    @rule(name=st.sampled_from(NAMES), shape=st.sampled_from(SHAPES), dtype=st.sampled_from(list(DTYPES)),
          init=st.sampled_from(INITS), opt=st.sampled_from(OPTS), policy=st.sampled_from(POLICIES),
          reset=st.booleans())
    def declare(self, name, shape, dtype, init, opt, policy, reset):
        """A new table, or a reset: a fresh table of whatever was declared."""
        if self.remote and policy not in REMOTE_POLICIES:  # a budget becomes admission (k=3 if none)
            policy = Policy(None, policy.admit_after if policy.admit_after > 1 else 3)
        if name in self.models and not reset:
            return  # re-declarations: redeclare
        opt = opt and full_opt(*opt)
        self.handles[name] = self._declare(name, shape, dtype, init, opt, policy, reset)
        self.models[name] = TableModel(self.full(name), shape[0], shape[1], dtype, init, opt, policy)
        self.check(name)

    @precondition(lambda self: self.models)
    @rule(data=st.data(), change=st.sampled_from(["none", "lr", "shape", "dtype", "init", "opt_kind", "open"]))
    def redeclare(self, data, change):
        """The same name declared again: the same declaration opens the table, rows and state kept; a
        difference in shape, dtype, rule or optimizer kind is refused and changes nothing."""
        name = data.draw(st.sampled_from(sorted(self.models)))
        m = self.models[name]
        shape, dtype, init, opt = (m.rows, m.dim), m.dtype, m.init, m.opt
        if change == "lr" and opt is not None:
            opt = (opt[0], {**opt[1], "lr": opt[1]["lr"] * 2})
        elif change == "shape":
            shape = data.draw(st.sampled_from([s for s in SHAPES if s != shape]))
        elif change == "dtype":
            dtype = data.draw(st.sampled_from([d for d in DTYPES if d != dtype and (d == "float32" or m.dim % 2 == 0)]))
        elif change == "init":
            init = data.draw(st.sampled_from([r for r in INITS if r != init]))
        elif change == "opt_kind":
            opt = data.draw(st.sampled_from([o for o in OPTS if o is not None and (opt is None or o[0] != opt[0])]))
            opt = full_opt(*opt)
        new = m.snapshot()
        try:
            new.redeclare(*shape, dtype, None if change == "open" else init, None if change == "open" else opt)
            refused = None
        except Refused as r:
            refused = r

        def run():
            if change == "open":  # another client opens it with name and shape alone
                return ops.init_embedding_table(self.full(name), shape[0], shape[1], dtype=DTYPES[dtype])
            kw = dict(dtype=DTYPES[dtype], init=strategy(init), optimizer=opt and (opt[0], dict(opt[1])))
            return ops.init_embedding_table(self.full(name), shape[0], shape[1], **kw)

        handle = call(refused, run)
        if refused is None:
            self.models[name], self.handles[name] = new, handle
        self.check(name)

    # --- rows -----------------------------------------------------------------------------------

    def _keys(self, data, m: TableModel, max_size=4) -> list[int]:
        # mostly a few hot ids, so that budgets, admission and duplicates meet often
        ids = st.one_of(st.integers(0, 4), st.integers(0, m.rows - 1))
        return data.draw(st.lists(ids, max_size=max_size), label="keys")

    def _apply(self, name, op, *args):
        """Runs op on a copy of the model; returns (copy, refusal)."""
        new = self.models[name].snapshot()
        try:
            out = getattr(new, op)(*args)
            return new, None, out
        except Refused as r:
            return self.models[name], r, None

    @precondition(lambda self: self.models)
    @rule(data=st.data(), bad=st.sampled_from([None, None, None, "range"]))
    def read(self, data, bad):
        name = data.draw(st.sampled_from(sorted(self.models)))
        m, t = self.models[name], self.handles[name]
        keys = self._keys(data, m) + ([m.rows] if bad else [])
        new, refused, want = self._apply(name, "read", keys)
        got = call(refused, lambda: ops.emb_read(t, keys_tensor(keys)))
        if refused is None:
            assert got.dtype == DTYPES[m.dtype] and tuple(got.shape) == (len(keys), m.dim)
            got = got.cpu().float().numpy()
            for p, k in enumerate(keys):
                w = want[p]
                if w is not None and new.opt is None or new.opt[0] == "sgd" or k not in new.held:
                    assert np.array_equal(got[p], w), f"emb_read row {k}: store {got[p]}, model {w}"
            self.models[name] = new
        self.check(name)

    @precondition(lambda self: self.models)
    @rule(data=st.data(), how=st.sampled_from(["write", "write", "init", "bad_dtype", "range"]))
    def write(self, data, how):
        name = data.draw(st.sampled_from(sorted(self.models)))
        m, t = self.models[name], self.handles[name]
        keys = self._keys(data, m)
        values = np.asarray(data.draw(st.lists(st.sampled_from(GRAD_VALUES), min_size=len(keys) * m.dim,
                                               max_size=len(keys) * m.dim)), np.float32)
        tensor = rows_tensor(values, m.dtype, m.dim)
        if how == "range":
            keys, tensor = keys + [m.rows], torch.cat([tensor, tensor.new_zeros(1, m.dim)])
        new, refused, _ = self._apply(name, "write", keys, values.reshape(-1, m.dim))
        if how == "bad_dtype":
            tensor = tensor.to(torch.float64)
            new, refused = self.models[name], Refused(ValueError, "values of another dtype")
        fn = ops.emb_init if how == "init" else ops.emb_write
        call(refused, lambda: fn(t, keys_tensor(keys), tensor))
        self.models[name] = new
        self.check(name)

    @precondition(lambda self: self.models)
    @rule(data=st.data(), bad=st.sampled_from([None, None, "range"]))
    def delete(self, data, bad):
        name = data.draw(st.sampled_from(sorted(self.models)))
        m, t = self.models[name], self.handles[name]
        keys = self._keys(data, m) + ([m.rows] if bad else [])
        new, refused, _ = self._apply(name, "delete", keys)
        call(refused, lambda: ops.emb_delete(t, keys_tensor(keys)))
        self.models[name] = new
        self.check(name)

    @precondition(lambda self: self.models)
    @rule(data=st.data(), bad=st.sampled_from([None, None, None, None, "nan", "inf", "overflow", "overflow", "dtype", "range", "shape"]))
    def update(self, data, bad):
        name = data.draw(st.sampled_from(sorted(self.models)))
        m, t = self.models[name], self.handles[name]
        keys = self._keys(data, m)
        grads = np.asarray(data.draw(st.lists(st.sampled_from(GRAD_VALUES), min_size=len(keys) * m.dim,
                                              max_size=len(keys) * m.dim)), np.float32).reshape(-1, m.dim)
        dtype = m.dtype
        if bad in ("nan", "inf", "overflow", "range") and not keys:
            keys, grads = [0], np.zeros((1, m.dim), np.float32)
        if bad in ("nan", "inf"):
            grads[-1, 0] = float(bad)
        elif bad == "overflow":  # each gradient finite, their sum over a duplicate id not
            # summed in float32 (docs/training.md): float16's 65504 cannot overflow it, so a float16 table
            # gets an inf instead
            big = float("inf") if dtype == "float16" else 3e38
            keys, grads = [keys[-1]] * 2, np.concatenate([grads[-1:]] * 2)
            grads[:, 0] = big
        elif bad == "range":
            keys = keys[:-1] + [m.rows]
        tensor = torch.from_numpy(grads).to(DTYPES[dtype])
        new, refused, _ = self._apply(name, "update", keys, tensor.float().numpy())
        if bad == "dtype":
            tensor = tensor.to(torch.float64)
            new, refused = self.models[name], Refused(ValueError, "gradients of another dtype")
        elif bad == "shape":
            tensor = torch.cat([tensor, tensor.new_zeros(1, m.dim)])
            new, refused = self.models[name], Refused(ValueError, "gradients of another shape")
        call(refused, lambda: ops.emb_update(t, keys_tensor(keys), tensor))
        self.models[name] = new
        self.check(name)

    def _trainable(self) -> list[str]:
        # Policies are left out: a lookup and its backward's update are one touch of the policy
        # (table_policy.h), which the model's read and update would count twice.
        return sorted(n for n, m in self.models.items() if m.opt is not None and m.policy is None)

    @precondition(lambda self: self.remote and self._trainable())
    @rule(data=st.data())
    def update_in_backward(self, data):
        """A training step through autograd: F.embedding's lookup, then its backward's update, which
        with overlap_updates returns once sent; the check after it is the next request, which reads
        its answer first. The model: a read, then an update."""
        name = data.draw(st.sampled_from(self._trainable()))
        m, t = self.models[name], self.handles[name]
        keys = self._keys(data, m) or [0]
        grads = np.asarray(data.draw(st.lists(st.sampled_from(GRAD_VALUES), min_size=len(keys) * m.dim,
                                              max_size=len(keys) * m.dim)), np.float32).reshape(-1, m.dim)
        grads = torch.from_numpy(grads).to(DTYPES[m.dtype])
        new, refused, want = self._apply(name, "read", keys)
        assert refused is None, refused
        new.update(keys, grads.float().numpy())
        out = F.embedding(keys_tensor(keys), t.requires_grad_(True)).cpu()
        for p, k in enumerate(keys):
            if want[p] is not None and (new.opt[0] == "sgd" or k not in self.models[name].held):
                assert np.array_equal(out[p].detach().float().numpy(), want[p]), f"lookup of row {k}"
        (out * grads).sum().backward()
        t.requires_grad_(False)  # the handle as the other rules use it
        self.models[name] = new
        self.check(name)

    # --- checkpoints ----------------------------------------------------------------------------

    @rule()
    def save(self):
        path = os.path.join(self.tmp, "store.recdev")
        ops.save(path)
        self.ckpt = (path, {n: m.snapshot() for n, m in self.models.items()})
        self.check_all()

    @rule(times=st.integers(1, 2))
    def save_and_load(self, times):
        """A checkpoint round trip restores exactly what it saved, budgets' sketches included, however
        often it is repeated."""
        for _ in range(times):
            self.save()
            self.load()

    @precondition(lambda self: self.ckpt is not None)
    @rule()
    def load(self):
        path, saved = self.ckpt
        mismatch = [n for n, s in saved.items() if n in self.models and
                    (self.models[n].rows, self.models[n].dim, self.models[n].dtype) != (s.rows, s.dim, s.dtype)]
        if mismatch:  # the whole file is refused, nothing loaded
            with pytest.raises(ValueError):
                ops.load(path)
        else:
            names = ops.load(path)
            assert {self.full(n) for n in saved} <= set(names)
            for n, s in saved.items():
                self.models[n] = restore(s, self.models.get(n))
                if n not in self.handles:
                    self.handles[n] = ops.init_embedding_table(self.full(n), s.rows, s.dim, dtype=DTYPES[s.dtype])
        self.check_all()

    @rule()
    def checkpoint_version(self):
        """ops.checkpoint writes the next version, a base or a delta of what changed since the last."""
        version = ops.checkpoint(self.vdir)
        ops.wait_for_compaction(self.vdir)  # the versions a restore can reach then stay put
        assert version == max(self.versions, default=0) + 1
        self.versions[version] = {n: m.snapshot() for n, m in self.models.items()}
        self.check_all()

    @precondition(lambda self: self.versions)
    @rule(data=st.data())
    def restore_version(self, data):
        """Restoring any version the directory still has gives exactly the tables as they were when it
        was written, whatever ran in between (resets, deletes, evictions, spills, other versions)."""
        reachable = sorted(set(ops.versions(self.vdir)) & set(self.versions))
        assert reachable and reachable[-1] == max(self.versions), (ops.versions(self.vdir), sorted(self.versions))
        version = data.draw(st.sampled_from(reachable))
        saved = self.versions[version]
        mismatch = [n for n, s in saved.items() if n in self.models and
                    (self.models[n].rows, self.models[n].dim, self.models[n].dtype) != (s.rows, s.dim, s.dtype)]
        if mismatch:
            with pytest.raises(ValueError):
                ops.restore(self.vdir, version)
        else:
            assert ops.restore(self.vdir, version) == version
            for n, s in saved.items():
                self.models[n] = restore(s, self.models.get(n))
                if n not in self.handles:
                    self.handles[n] = ops.init_embedding_table(self.full(n), s.rows, s.dim, dtype=DTYPES[s.dtype])
        self.check_all()

    @precondition(lambda self: self.models)
    @rule(data=st.data())
    def torch_save(self, data):
        name = data.draw(st.sampled_from(sorted(self.models)))
        buf = io.BytesIO()
        torch.save(self.handles[name], buf)
        self.tsaved[name] = (buf.getvalue(), self.models[name].snapshot())
        self.check(name)

    @precondition(lambda self: self.tsaved)
    @rule(data=st.data())
    def torch_load_copy(self, data):
        """torch.load of a saved table, copied whole into the named table: a copy of the saved one."""
        name = data.draw(st.sampled_from(sorted(self.tsaved)))
        blob, saved = self.tsaved[name]
        m = self.models[name]
        if (m.rows, m.dim, m.dtype) != (saved.rows, saved.dim, saved.dtype):
            return
        loaded = torch.load(io.BytesIO(blob))
        with torch.no_grad():
            self.handles[name].copy_(loaded)
        self.models[name] = restore(saved, m)
        self.check(name)

    # --- stochastic rounding ----------------------------------------------------------------------

    @rule(dtype=st.sampled_from(["float16", "bfloat16"]), via=st.sampled_from(["optim", "declare"]),
          then=st.sampled_from(["nothing", "torch_save_load_copy", "redeclare"]))
    def stochastic_rounding(self, dtype, via, then):
        """Tiny SGD steps on a half table: nearest rounding would never move a weight of 1.0; stochastic
        rounding moves the mean as float32 math does, also after a round trip or a re-declaration."""
        name = self.full(f"sr{next(self.counter)}")
        self.aux[name] = (16, 8, dtype)
        hp = {"lr": 1.0}
        if via == "declare":
            hp["stochastic_rounding"] = True
        t = ops.init_embedding_table(name, 16, 8, dtype=DTYPES[dtype], init=torch_recdev.Constant(1.0),
                                     optimizer=("sgd", hp))
        self.aux_handles[name] = t
        if via == "optim":
            torch_recdev.optim.SGD([t], lr=1.0, stochastic_rounding=True)
        ids = torch.arange(16)
        grad = torch.full((16, 8), 1e-4, dtype=DTYPES[dtype])

        def mean_after(n: int) -> float:
            for _ in range(n):
                ops.emb_update(t, ids, grad)
            return ops.emb_read(t, ids).float().mean().item()

        first = mean_after(40)  # float32 math: 1 - 40e-4
        assert 1 - first > 2e-3, f"stochastic rounding did not move the mean of a {dtype} table: {first}"
        if then == "torch_save_load_copy":
            buf = io.BytesIO()
            torch.save(t, buf)
            with torch.no_grad():
                t.copy_(torch.load(io.BytesIO(buf.getvalue())))
        elif then == "redeclare":
            t = ops.init_embedding_table(name, 16, 8, dtype=DTYPES[dtype], init=torch_recdev.Constant(1.0),
                                         optimizer=("sgd", {"lr": 1.0}))
        second = mean_after(40)
        assert first - second > 2e-3, f"stochastic rounding lost after {then}: mean {first} -> {second}"

    @rule(dtype=st.sampled_from(list(DTYPES)))
    def share_tables(self, dtype):
        """A module's anonymous table made a named one keeps its dtype (a dtype is a table's identity)."""
        with torch_recdev.placement("table"):
            emb = torch.nn.Embedding(16, 8, dtype=DTYPES[dtype], device="recdev")
        prefix = self.full(f"share{next(self.counter)}.")
        torch_recdev.share_tables(emb, prefix=prefix)
        self.aux[prefix + "weight"] = (16, 8, dtype)
        self.aux_handles[prefix + "weight"] = emb.weight
        assert emb.weight.dtype == DTYPES[dtype], f"share_tables turned a {dtype} table into {emb.weight.dtype}"
        assert torch_recdev.table_stats(emb.weight)["dtype"] == dtype

    # --- shards ---------------------------------------------------------------------------------

    @precondition(lambda self: self.remote)
    @rule(shard=st.integers(0, 1))
    def restart_shard(self, shard):
        """SIGTERM writes the shard's checkpoint; the restarted server finds every named table with
        its rows as they were."""
        self._restart(shard, self.ckpt_dirs[shard])
        for m in self.models.values():
            m.last_lookup = None
            m.counters_known = False
        self.check_all()

    @precondition(lambda self: self.remote)
    @rule(shard=st.integers(0, 1))
    def restart_shard_empty(self, shard):
        """A shard restarted without its checkpoint has lost its part of every named table: opening
        a table must say so; a reset declaration makes a fresh table on both shards."""
        self.ckpt_dirs[shard] = tempfile.mkdtemp(dir=self.tmp)
        self._restart(shard, self.ckpt_dirs[shard])
        for name, m in list(self.models.items()):
            with pytest.raises((KeyError, ValueError, RuntimeError)):
                ops.init_embedding_table(self.full(name), m.rows, m.dim, dtype=DTYPES[m.dtype])
            self.handles[name] = self._declare(name, (m.rows, m.dim), m.dtype, m.init, m.opt, m.policy, True)
            self.models[name] = TableModel(m.name, m.rows, m.dim, m.dtype, m.init, m.opt, m.policy)
        for full, (rows, dim, dtype) in self.aux.items():  # lost too: ops.save would refuse them
            ops.init_embedding_table(full, rows, dim, dtype=DTYPES[dtype], reset=True)
        self.check_all()


    @precondition(lambda self: self.remote)
    @rule(batches=st.lists(st.lists(st.integers(0, 7), min_size=1, max_size=6), min_size=1, max_size=3),
          max_rows=st.integers(2, 4), kind=st.sampled_from(sorted(SHARD_BUDGETS)))
    def shard_budget(self, batches, max_rows, kind):
        """On shards each shard holds its share of a budget, so whether a request fits depends on the
        routing, which the model does not know; either way a refused request changes no shard (no
        row, admission or pending count), and an accepted one without admission stores all its rows."""
        name = self.full(f"budget{next(self.counter)}")
        t = ops.init_embedding_table(name, 8, 2, init=torch_recdev.Constant(0.5), max_rows=max_rows,
                                     **SHARD_BUDGETS[kind])
        self.aux[name] = (8, 2, "float32")
        self.aux_handles[name] = t
        for keys in batches:
            held = ops.emb_exists(t, torch.arange(8)).tolist()
            stats = torch_recdev.table_stats(t)
            try:
                ops.emb_read(t, keys_tensor(keys))
            except (ValueError, MemoryError):
                assert len(set(keys)) > 1 or kind == "strict"
                after = ops.emb_exists(t, torch.arange(8)).tolist()
                assert after == held, f"a refused read of {keys} ({kind}, max_rows={max_rows}) changed {held} to {after}"
                assert torch_recdev.table_stats(t) == stats, f"a refused read of {keys} changed the counters"
                continue
            if kind != "admission":
                after = ops.emb_exists(t, torch.arange(8)).tolist()
                assert all(after[k] for k in keys), f"a read of {keys} ({kind}) left {after}"


class RemoteStoreMachine(StoreMachine):
    remote = True
