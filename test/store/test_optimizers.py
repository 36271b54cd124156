"""Fused optimizers (csrc/store/optimizer.h): per-row math against PyTorch's own optimizers to 1e-6
relative, gradient validation, state layout, concurrency and checkpoints."""

import math
import struct
import threading

import numpy as np
import pytest
import torch
from checksums import file_checksum
from threads import run_threads

NUM_ROWS, DIM, STEPS = 300, 8, 50


def new_table(store_mod, optimizer=None, num_rows=NUM_ROWS, dim=DIM, init=None, state_words=0):
    store = store_mod.Store()
    config = store_mod.TableConfig(
        num_rows=num_rows, row_words=dim, state_words=state_words, init=init or store_mod.InitRule.normal(0, 1, seed=5)
    )
    table = store.table(store.create_table(config))
    if optimizer is not None:
        table.set_optimizer(optimizer)
    return table


def dense_view(table):
    """Every row of the table as a [num_rows, dim] array, without materializing any."""
    num_rows, dim = table.config.num_rows, table.config.row_words
    return table.read_bytes(0, num_rows * dim * 4).view(np.float32).reshape(num_rows, dim).copy()


def all_ids(table):
    return np.arange(table.config.num_rows, dtype=np.uint64)


def full_snapshot(table):
    """Weights, state, materialization, optimizer and step: everything an update may change."""
    ids = all_ids(table)
    return (
        dense_view(table).tobytes(),
        table.gather_state(ids).tobytes(),
        table.exists(ids).tobytes(),
        repr(table.config),
        table.optimizer,
        table.optimizer_step,
    )


def batch(rng, num_rows=NUM_ROWS, size=40, dim=DIM):
    """Random ids with duplicates in every batch (some ids three times), and float32 gradients."""
    ids = rng.integers(0, num_rows, size=size)
    ids = np.concatenate([ids, ids[:6], ids[:2]])
    rng.shuffle(ids)
    grads = rng.standard_normal((len(ids), dim)).astype(np.float32)
    return ids.astype(np.int64), grads


def sparse_grad(ids, grads, shape):
    return torch.sparse_coo_tensor(torch.from_numpy(ids)[None], torch.from_numpy(grads), shape)


class RowWiseAdagradReference:
    """fbgemm_gpu's EXACT_ROWWISE_ADAGRAD, weight_decay_mode=1 (L2), as its CPU kernel computes it
    (rowwise_adagrad() in fbgemm_gpu/codegen/genscript/optimizers.py): accumulator += mean over the
    row of (g + wd*w)^2; multiplier = lr / (sqrt(accumulator) + eps); w = (1 - multiplier*wd) * w -
    multiplier * g. Math in float64, weights and accumulator stored as float32."""

    def __init__(self, weights, lr, eps, weight_decay):
        self.weights = weights.astype(np.float32).copy()
        self.state = np.zeros((len(weights), 1), np.float32)
        self.lr, self.eps, self.weight_decay = lr, eps, weight_decay

    def step(self, ids, grads):
        sums = {}
        for row_id, grad in zip(ids.tolist(), grads):  # float32 sums in batch order, as a coalesce
            sums[row_id] = sums[row_id] + grad if row_id in sums else grad.copy()
        for row_id, grad in sums.items():
            g = grad.astype(np.float64)
            w = self.weights[row_id].astype(np.float64)
            decayed = g + self.weight_decay * w
            accumulator = float(self.state[row_id, 0]) + float(np.sum(decayed * decayed)) / len(g)
            self.state[row_id, 0] = accumulator
            multiplier = self.lr / (math.sqrt(accumulator) + self.eps)
            correction = 1.0 - multiplier * self.weight_decay
            self.weights[row_id] = (correction * w - g * multiplier).astype(np.float32)


class TorchReference:
    """A dense float32 parameter driven by a torch optimizer with sparse gradients. weight_decay > 0
    adds the L2 term to the touched rows' gradients before the optimizer (the store's lazy L2, which
    torch's sparse optimizers do not offer)."""

    def __init__(self, weights, make_optimizer, weight_decay=0.0):
        self.param = torch.nn.Parameter(torch.from_numpy(weights.copy()))
        self.optimizer = make_optimizer([self.param])
        self.weight_decay = weight_decay

    @property
    def weights(self):
        return self.param.detach().numpy()

    def set_lr(self, lr):
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def step(self, ids, grads):
        # Coalesced: SGD would otherwise apply duplicates one by one (w - lr*g1 - lr*g2), where the
        # store, like Adagrad and SparseAdam, sums them first (w - lr*(g1 + g2)).
        grad = sparse_grad(ids, grads, self.param.shape).coalesce()
        if self.weight_decay:
            rows = grad.indices()[0]
            values = grad.values().add(self.param.detach()[rows], alpha=self.weight_decay)
            grad = torch.sparse_coo_tensor(rows[None], values, self.param.shape)
        self.param.grad = grad
        self.optimizer.step()

    def state(self, kind):
        state = self.optimizer.state[self.param]
        if kind == "Adagrad":
            return state["sum"].numpy()
        if kind == "Adam":
            return np.concatenate([state["exp_avg"].numpy(), state["exp_avg_sq"].numpy()], axis=1)
        return np.zeros((NUM_ROWS, 0), np.float32)


CASES = {
    "sgd": dict(
        config=lambda s: s.OptimizerConfig.sgd(lr=0.05),
        reference=lambda w: TorchReference(w, lambda p: torch.optim.SGD(p, lr=0.05)),
        new_lr=0.2,
    ),
    "sgd_weight_decay": dict(
        config=lambda s: s.OptimizerConfig.sgd(lr=0.05, weight_decay=0.1),
        reference=lambda w: TorchReference(w, lambda p: torch.optim.SGD(p, lr=0.05), weight_decay=0.1),
        new_lr=0.01,
    ),
    "adagrad": dict(
        config=lambda s: s.OptimizerConfig.adagrad(lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1, eps=1e-10),
        reference=lambda w: TorchReference(
            w, lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1, eps=1e-10)
        ),
        new_lr=0.3,
    ),
    "adagrad_weight_decay": dict(
        config=lambda s: s.OptimizerConfig.adagrad(lr=0.1, weight_decay=0.05, eps=1e-6),
        reference=lambda w: TorchReference(w, lambda p: torch.optim.Adagrad(p, lr=0.1, eps=1e-6), weight_decay=0.05),
        new_lr=0.02,
    ),
    "rowwise_adagrad": dict(
        config=lambda s: s.OptimizerConfig.rowwise_adagrad(lr=0.1, eps=1e-8, weight_decay=0.01),
        reference=lambda w: RowWiseAdagradReference(w, lr=0.1, eps=1e-8, weight_decay=0.01),
        new_lr=0.05,
    ),
    "adam": dict(
        config=lambda s: s.OptimizerConfig.adam(lr=0.01, beta1=0.8, beta2=0.99, eps=1e-8),
        reference=lambda w: TorchReference(w, lambda p: torch.optim.SparseAdam(p, lr=0.01, betas=(0.8, 0.99), eps=1e-8)),
        new_lr=0.05,
    ),
}


def reference_state(reference, kind):
    if isinstance(reference, RowWiseAdagradReference):
        return reference.state
    return reference.state(kind)


# dim 13: the vector kernels' full blocks and their scalar tails (8 + 5, 4 * 3 + 1).
@pytest.mark.parametrize("dim", [DIM, 13])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_pytorch_over_50_steps(store_mod, case, dim):
    spec = CASES[case]
    config = spec["config"](store_mod)
    kind = config.kind.name
    table = new_table(store_mod, config, dim=dim)
    # The reference starts from the same init values; the table's rows are not materialized yet, so
    # its updates also exercise materialization from the init rule.
    reference = spec["reference"](dense_view(table))
    assert table.stats().rows == 0
    rng = np.random.default_rng(11)
    touched = set()
    for step in range(1, STEPS + 1):
        if step == STEPS // 2:  # an LR scheduler's change midway, mirrored on the reference
            table.set_learning_rate(spec["new_lr"])
            if isinstance(reference, RowWiseAdagradReference):
                reference.lr = spec["new_lr"]
            else:
                reference.set_lr(spec["new_lr"])
        ids, grads = batch(rng, dim=dim)
        table.update(ids.astype(np.uint64), grads)
        reference.step(ids, grads)
        touched.update(ids.tolist())
        if step % 10 == 0:
            torch.testing.assert_close(dense_view(table), reference.weights, rtol=1e-6, atol=1e-7)
    assert table.optimizer_step == STEPS
    assert table.optimizer.lr == spec["new_lr"]
    assert table.stats().rows == len(touched)
    # Untouched rows kept their init value (lazy), in both.
    torch.testing.assert_close(dense_view(table), reference.weights, rtol=1e-6, atol=1e-7)
    state = table.gather_state(all_ids(table))
    assert state.shape == (NUM_ROWS, store_mod.optimizer_state_elements(config.kind, dim))
    torch.testing.assert_close(state, reference_state(reference, kind), rtol=1e-6, atol=1e-7)


def test_duplicate_ids_are_summed_before_the_optimizer(store_mod):
    """One update with row 4 twice equals one update with the summed gradient — not two steps."""
    config = store_mod.OptimizerConfig.adagrad(lr=0.5)
    twice, once = new_table(store_mod, config), new_table(store_mod, config)
    g = np.arange(2 * DIM, dtype=np.float32).reshape(2, DIM) / 7
    twice.update(np.array([4, 4], np.uint64), g)
    once.update(np.array([4], np.uint64), g.sum(axis=0, keepdims=True))
    assert full_snapshot(twice) == full_snapshot(once)
    assert twice.stats().updates == 1


def test_empty_update_counts_a_step(store_mod):
    table = new_table(store_mod, store_mod.OptimizerConfig.adam())
    table.update(np.array([], np.uint64), np.zeros((0, DIM), np.float32))
    assert table.optimizer_step == 1  # as optimizer.step() with an empty sparse gradient
    assert table.stats().rows == 0


# ---- Validation ----


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=str)
def test_non_finite_gradients_are_refused_with_nothing_changed(store_mod, bad):
    table = new_table(store_mod, store_mod.OptimizerConfig.adam(lr=0.1))
    table.update(np.array([3, 7, 11, 3], np.uint64), np.ones((4, DIM), np.float32))
    before = full_snapshot(table)
    updates_before = table.stats().updates
    grads = np.ones((4, DIM), np.float32)
    grads[2, 5] = bad
    grads[3, 0] = bad  # the first bad row in batch order is named
    with pytest.raises(ValueError, match=r"row id 200 \(ids\[2\]\) holds (nan|inf) at column 5; nothing was applied"):
        table.update(np.array([7, 5, 200, 9], np.uint64), grads)
    assert full_snapshot(table) == before
    assert table.stats().updates == updates_before


def test_gradients_summing_to_inf_are_refused(store_mod):
    table = new_table(store_mod, store_mod.OptimizerConfig.sgd(lr=1.0))
    before = full_snapshot(table)
    grads = np.full((3, DIM), 3e38, np.float32)
    with pytest.raises(ValueError, match="summed gradient of row id 4 overflows to inf"):
        table.update(np.array([1, 4, 4], np.uint64), grads)
    assert full_snapshot(table) == before


def test_out_of_range_ids_change_nothing(store_mod):
    table = new_table(store_mod, store_mod.OptimizerConfig.sgd(lr=1.0))
    before = full_snapshot(table)
    with pytest.raises(IndexError, match=f"row id {NUM_ROWS} .*out of range"):
        table.update(np.array([1, NUM_ROWS], np.uint64), np.ones((2, DIM), np.float32))
    assert full_snapshot(table) == before


@pytest.mark.parametrize(
    "shape", [(3, DIM + 1), (2, DIM), (4, DIM), (3 * DIM,), (3, DIM, 1)], ids=str
)
def test_gradient_shape_is_checked_by_the_binding(store_mod, shape):
    table = new_table(store_mod, store_mod.OptimizerConfig.sgd(lr=1.0))
    with pytest.raises(ValueError, match=rf"grads must have shape \(3, {DIM}\).*but has shape"):
        table.update(np.array([1, 2, 3], np.uint64), np.ones(shape, np.float32))
    assert table.optimizer_step == 0


def test_update_without_optimizer_names_the_optimizers(store_mod):
    table = new_table(store_mod)
    message = r"has no optimizer: attach one with set_optimizer \(SGD, Adagrad, RowWiseAdagrad, Adam\)"
    with pytest.raises(ValueError, match=message):
        table.update(np.array([1], np.uint64), np.ones((1, DIM), np.float32))
    table.set_optimizer(store_mod.OptimizerConfig.sgd(lr=1.0))
    table.set_optimizer(store_mod.OptimizerConfig())  # detaches it
    with pytest.raises(ValueError, match=message):
        table.update(np.array([1], np.uint64), np.ones((1, DIM), np.float32))
    with pytest.raises(ValueError, match="has no optimizer to set the learning rate of"):
        table.set_learning_rate(0.1)
    assert table.stats().rows == 0


INVALID_CONFIGS = {
    "negative lr": (lambda s: s.OptimizerConfig.sgd(lr=-1.0), r"lr must be finite and >= 0 \(got -1\)"),
    "nan lr": (lambda s: s.OptimizerConfig.adam(lr=float("nan")), r"lr must be finite and >= 0 \(got nan\)"),
    "inf lr": (lambda s: s.OptimizerConfig.adagrad(lr=float("inf")), r"lr must be finite and >= 0 \(got inf\)"),
    "negative weight_decay": (
        lambda s: s.OptimizerConfig.sgd(lr=0.1, weight_decay=-0.5),
        r"weight_decay must be finite and >= 0",
    ),
    "negative eps": (lambda s: s.OptimizerConfig.rowwise_adagrad(eps=-1e-8), r"eps must be finite and >= 0"),
    "negative lr_decay": (lambda s: s.OptimizerConfig.adagrad(lr_decay=-0.1), r"lr_decay must be finite and >= 0"),
    "negative accumulator": (
        lambda s: s.OptimizerConfig.adagrad(initial_accumulator_value=-1.0),
        r"initial_accumulator_value must be finite and >= 0",
    ),
    "beta1 of 1": (lambda s: s.OptimizerConfig.adam(beta1=1.0), r"beta1 must be in \[0, 1\) \(got 1\)"),
    "negative beta2": (lambda s: s.OptimizerConfig.adam(beta2=-0.1), r"beta2 must be in \[0, 1\)"),
    "adam weight_decay": (
        lambda s: s.OptimizerConfig(kind=s.OptimizerKind.Adam, weight_decay=0.01),
        r"Adam does not use weight_decay \(got 0.01\); leave it at its default 0",
    ),
    "sgd lr_decay": (
        lambda s: s.OptimizerConfig(kind=s.OptimizerKind.SGD, lr_decay=0.1),
        r"SGD does not use lr_decay",
    ),
    "rowwise beta1": (
        lambda s: s.OptimizerConfig(kind=s.OptimizerKind.RowWiseAdagrad, beta1=0.5),
        r"RowWiseAdagrad does not use beta1",
    ),
    "none with lr": (lambda s: s.OptimizerConfig(lr=0.5), r"None does not use lr"),
}


@pytest.mark.parametrize("case", list(INVALID_CONFIGS))
def test_invalid_optimizer_configs_are_refused(store_mod, case):
    make, message = INVALID_CONFIGS[case]
    table = new_table(store_mod, store_mod.OptimizerConfig.sgd(lr=0.1))
    table.update(np.array([1], np.uint64), np.ones((1, DIM), np.float32))
    before = full_snapshot(table)
    with pytest.raises(ValueError, match="invalid optimizer .*" + message):
        table.set_optimizer(make(store_mod))
    with pytest.raises(ValueError, match=message):
        store_mod.validate_optimizer(make(store_mod))
    assert full_snapshot(table) == before


def test_invalid_learning_rate_is_refused(store_mod):
    table = new_table(store_mod, store_mod.OptimizerConfig.adam(lr=0.1))
    for lr in (-0.1, float("nan")):
        with pytest.raises(ValueError, match="lr must be finite and >= 0"):
            table.set_learning_rate(lr)
    assert table.optimizer.lr == 0.1
    table.set_learning_rate(0.0)  # a scheduler may reach 0
    assert table.optimizer == store_mod.OptimizerConfig.adam(lr=0.0)


def test_describe(store_mod):
    assert repr(store_mod.OptimizerConfig.adagrad(lr=0.1, lr_decay=0.5)) == (
        "Adagrad(lr=0.1, lr_decay=0.5, weight_decay=0, eps=1e-10, initial_accumulator_value=0)"
    )
    assert repr(store_mod.OptimizerConfig.adam()) == "Adam(lr=0.001, beta1=0.9, beta2=0.999, eps=1e-08)"
    assert repr(store_mod.OptimizerConfig.sgd(lr=1)) == "SGD(lr=1, weight_decay=0)"
    assert repr(store_mod.OptimizerConfig()) == "None"


# ---- State layout ----


def test_set_optimizer_keeps_weights_and_initializes_state(store_mod):
    table = new_table(store_mod)
    table.write(np.array([1, 2], np.uint64), np.full((2, DIM), 3.0, np.float32))
    table.gather(np.array([5], np.uint64))
    weights = dense_view(table)
    materialized = table.exists(all_ids(table))
    probe = np.array([1, 2, 5, 6], np.uint64)  # 6 is not materialized

    table.set_optimizer(store_mod.OptimizerConfig.adagrad(lr=0.1, initial_accumulator_value=0.25))
    assert table.config.state_words == DIM
    np.testing.assert_array_equal(dense_view(table), weights)
    np.testing.assert_array_equal(table.exists(all_ids(table)), materialized)
    np.testing.assert_array_equal(table.gather_state(probe), np.full((4, DIM), 0.25, np.float32))
    assert table.optimizer_step == 0

    table.update(np.array([1], np.uint64), np.ones((1, DIM), np.float32))
    table.update(np.array([9], np.uint64), np.ones((1, DIM), np.float32))  # materialized by the update
    np.testing.assert_array_equal(table.gather_state(np.array([1, 9], np.uint64)), np.full((2, DIM), 1.25, np.float32))
    weights = dense_view(table)

    # The same kind with other parameters keeps the state and the step.
    table.set_optimizer(store_mod.OptimizerConfig.adagrad(lr=0.5, initial_accumulator_value=0.25))
    assert table.optimizer_step == 2
    assert table.gather_state(np.array([1], np.uint64))[0, 0] == 1.25

    # Another kind: re-laid records, fresh state, step 0, same weights.
    table.set_optimizer(store_mod.OptimizerConfig.adam())
    assert table.config.state_words == 2 * DIM
    assert table.optimizer_step == 0
    np.testing.assert_array_equal(dense_view(table), weights)
    np.testing.assert_array_equal(table.gather_state(all_ids(table)), np.zeros((NUM_ROWS, 2 * DIM), np.float32))
    assert table.stats().rows == 4

    table.set_optimizer(store_mod.OptimizerConfig.rowwise_adagrad())
    assert table.config.state_words == 1
    table.update(np.array([2], np.uint64), np.ones((1, DIM), np.float32))
    assert table.gather_state(np.array([2], np.uint64))[0, 0] == 1.0  # mean of 1^2

    table.set_optimizer(store_mod.OptimizerConfig.sgd(lr=0.1))
    assert table.config.state_words == 0
    assert table.gather_state(probe).shape == (4, 0)
    weights = dense_view(table)
    table.set_optimizer(store_mod.OptimizerConfig())
    assert table.optimizer == store_mod.OptimizerConfig()
    np.testing.assert_array_equal(dense_view(table), weights)
    assert table.stats().rows == 4


def test_same_width_other_kind_resets_state(store_mod):
    """Adagrad and RowWiseAdagrad both keep one float per row when dim == 1: no re-layout, but the
    state still restarts."""
    table = new_table(store_mod, store_mod.OptimizerConfig.adagrad(initial_accumulator_value=2.0), dim=1)
    table.update(np.array([3], np.uint64), np.ones((1, 1), np.float32))
    assert table.gather_state(np.array([3], np.uint64))[0, 0] == 3.0
    table.set_optimizer(store_mod.OptimizerConfig.rowwise_adagrad())
    assert table.gather_state(np.array([3], np.uint64))[0, 0] == 0.0


def test_raw_state_table_takes_an_optimizer(store_mod):
    table = new_table(store_mod, state_words=3)
    table.write(np.array([7], np.uint64), np.full((1, DIM), 2.0, np.float32))
    table.set_optimizer(store_mod.OptimizerConfig.adam(lr=0.1))
    assert table.config.state_words == 2 * DIM
    np.testing.assert_array_equal(table.gather(np.array([7], np.uint64)), np.full((1, DIM), 2.0, np.float32))


def test_record_size_limit_applies_to_optimizer_state(store_mod):
    table = new_table(store_mod, num_rows=4, dim=2**27)
    with pytest.raises(ValueError, match="cannot hold 268435456 optimizer-state words per row"):
        table.set_optimizer(store_mod.OptimizerConfig.adam())
    assert table.config.state_words == 0


def test_erase_drops_state_and_write_keeps_it(store_mod):
    table = new_table(store_mod, store_mod.OptimizerConfig.adagrad(lr=0.1, initial_accumulator_value=0.5))
    ids = np.array([4, 8], np.uint64)
    init = dense_view(table)[[4, 8]]
    table.update(ids, np.ones((2, DIM), np.float32))
    state = table.gather_state(ids)
    assert (state == 1.5).all()

    table.write(ids[:1], np.full((1, DIM), 9.0, np.float32))  # weights only
    np.testing.assert_array_equal(table.gather_state(ids), state)
    np.testing.assert_array_equal(table.gather(ids[:1]), np.full((1, DIM), 9.0, np.float32))

    table.erase(ids)
    assert not table.exists(ids).any()
    np.testing.assert_array_equal(table.gather_state(ids), np.full((2, DIM), 0.5, np.float32))
    np.testing.assert_array_equal(table.gather(ids), init)  # and gather re-materializes the init value
    np.testing.assert_array_equal(table.gather_state(ids), np.full((2, DIM), 0.5, np.float32))


def test_reads_and_stats_with_state(store_mod):
    table = new_table(store_mod, store_mod.OptimizerConfig.adam(lr=0.1))
    ids = np.array([10, 20, 10], np.uint64)
    table.update(ids, np.ones((3, DIM), np.float32))
    stats = table.stats()
    assert (stats.rows, stats.updates, stats.writes) == (2, 2, 0)
    rows = table.gather(np.array([10, 20], np.uint64))
    assert rows.shape == (2, DIM)
    np.testing.assert_array_equal(dense_view(table)[[10, 20]], rows)
    pooled, _ = table.gather_pooled(np.array([10, 20], np.uint64), np.array([0], np.int64))
    np.testing.assert_allclose(pooled[0], rows.sum(axis=0), rtol=1e-6)


# ---- Concurrency ----


def test_concurrent_sgd_updates_lose_nothing(store_mod):
    """lr = 1 and small integer gradients: every float sum is exact, so the final rows must be the
    init value minus the sum of every gradient of every thread, exactly."""
    num_threads, iterations, size, num_rows, dim = 4, 150, 512, 2000, 16
    table = new_table(
        store_mod, store_mod.OptimizerConfig.sgd(lr=1.0), num_rows=num_rows, dim=dim,
        init=store_mod.InitRule.constant(3.0),
    )
    expected = np.full((num_rows, dim), 3.0)
    batches = []
    for t in range(num_threads):
        rng = np.random.default_rng(t)
        mine = []
        for _ in range(iterations):
            ids = rng.integers(0, num_rows, size=size)  # overlapping between threads, duplicates within
            grads = rng.integers(-8, 9, size=(size, dim)).astype(np.float32)
            mine.append((ids.astype(np.uint64), grads))
            np.subtract.at(expected, ids, grads)
        batches.append(mine)

    def worker(t):
        for ids, grads in batches[t]:
            table.update(ids, grads)

    run_threads([lambda t=t: worker(t) for t in range(num_threads)])
    np.testing.assert_array_equal(dense_view(table), expected.astype(np.float32))
    assert table.optimizer_step == num_threads * iterations


def test_checkpoints_during_updates_see_whole_updates(store_mod, tmp_path):
    """Every update moves all rows 0..N-1 by exactly -1 (SGD, lr 1): a checkpoint taken while updates
    run must hold rows all equal to init - step, with the step of the updates it holds."""
    num_rows, dim, iterations = 4000, 4, 300
    table = new_table(
        store_mod, store_mod.OptimizerConfig.sgd(lr=1.0), num_rows=num_rows, dim=dim,
        init=store_mod.InitRule.constant(0.0),
    )
    ids = np.arange(num_rows, dtype=np.uint64)
    grads = np.ones((num_rows, dim), np.float32)
    done = threading.Event()
    checked = []

    def updater():
        try:
            for _ in range(iterations):
                table.update(ids, grads)
        finally:
            done.set()

    def checkpointer():
        path = tmp_path / "during.ckpt"
        copy = new_table(store_mod, num_rows=num_rows, dim=dim)
        while not done.is_set():
            store_mod.save_table(path, table)
            store_mod.load_table(path, copy)
            step = copy.optimizer_step
            rows = dense_view(copy)
            assert (rows == -float(step)).all(), f"a checkpoint at step {step} holds rows {np.unique(rows)}"
            checked.append(step)

    run_threads([updater, checkpointer])
    assert len(checked) > 0
    assert (dense_view(table) == -float(iterations)).all()


def test_optimizer_changes_during_updates_and_reads(store_mod):
    """set_optimizer re-lays records and set_learning_rate changes lr while other threads update and
    read: no crash, no error, and afterwards every row's state has the width of the final optimizer."""
    num_rows, dim = 5000, 8
    table = new_table(store_mod, store_mod.OptimizerConfig.adagrad(lr=0.01), num_rows=num_rows, dim=dim)
    done = threading.Event()

    def updater(seed):
        rng = np.random.default_rng(seed)
        while not done.is_set():
            ids = rng.integers(0, num_rows, size=256).astype(np.uint64)
            table.update(ids, rng.standard_normal((256, dim)).astype(np.float32))

    def reader():
        rng = np.random.default_rng(99)
        while not done.is_set():
            ids = rng.integers(0, num_rows, size=256).astype(np.uint64)
            state = table.gather_state(ids)
            assert state.shape[1] in (0, 1, dim, 2 * dim)
            assert np.isfinite(table.gather(ids)).all()

    def changer():
        try:
            configs = [
                store_mod.OptimizerConfig.adam(lr=0.01),
                store_mod.OptimizerConfig.rowwise_adagrad(lr=0.01),
                store_mod.OptimizerConfig.sgd(lr=0.01),
                store_mod.OptimizerConfig.adagrad(lr=0.01, initial_accumulator_value=0.1),
            ]
            for i in range(40):
                table.set_optimizer(configs[i % len(configs)])
                table.set_learning_rate(0.001 * (i + 1))
        finally:
            done.set()

    run_threads([lambda: updater(1), lambda: updater(2), reader, changer])
    assert table.optimizer == store_mod.OptimizerConfig.adagrad(lr=0.04, initial_accumulator_value=0.1)
    assert table.config.state_words == dim
    assert table.gather_state(all_ids(table)).shape == (num_rows, dim)
    assert table.stats().rows > 0


# ---- Checkpoints ----


def train(table, rng, steps):
    for _ in range(steps):
        ids, grads = batch(rng, num_rows=table.config.num_rows, dim=table.config.row_words)
        table.update(ids.astype(np.uint64), grads)


@pytest.mark.parametrize("case", ["sgd_weight_decay", "adagrad", "rowwise_adagrad", "adam"])
def test_checkpoint_round_trip_continues_identically(store_mod, tmp_path, case):
    config = CASES[case]["config"](store_mod)
    source = new_table(store_mod, config)
    train(source, np.random.default_rng(3), 10)
    source.set_learning_rate(0.03)
    path = tmp_path / "table.ckpt"
    store_mod.save_table(path, source, "emb")

    [info] = store_mod.read_checkpoint_info(path)
    assert (info.optimizer, info.optimizer_step, info.config) == (source.optimizer, 10, source.config)

    # Another init rule and another optimizer (of another state width) in the destination: the load
    # restores all of it.
    destination = new_table(store_mod, store_mod.OptimizerConfig.rowwise_adagrad(lr=9.0),
                            init=store_mod.InitRule.constant(1.0))
    destination.update(np.array([0, 1], np.uint64), np.ones((2, DIM), np.float32))
    store_mod.load_table(path, destination)
    assert full_snapshot(destination) == full_snapshot(source)
    assert destination.config == source.config

    # Both continue with the same gradients: bit-identical results.
    train(source, np.random.default_rng(4), 10)
    train(destination, np.random.default_rng(4), 10)
    assert full_snapshot(destination) == full_snapshot(source)
    assert destination.optimizer_step == 20


def test_store_checkpoint_carries_optimizers(store_mod, tmp_path):
    store = store_mod.Store()
    config = store_mod.TableConfig(num_rows=NUM_ROWS, row_words=DIM, init=store_mod.InitRule.normal(0, 1, seed=2))
    user = store.table(store.create_named_table("user", config))
    user.set_optimizer(store_mod.OptimizerConfig.adam(lr=0.02))
    train(user, np.random.default_rng(5), 3)
    item = store.table(store.create_named_table("item", config))  # no optimizer
    item.gather(np.array([1], np.uint64))
    path = tmp_path / "store.ckpt"
    store_mod.save_store(path, store)

    restored = store_mod.Store()
    assert store_mod.load_store(path, restored) == ["item", "user"]
    for name, table in (("user", user), ("item", item)):
        assert full_snapshot(restored.table(restored.find(name))) == full_snapshot(table)
    assert restored.table(restored.find("user")).optimizer_step == 3


def patched(data, offset, fmt, *values):
    """The file with fields overwritten at offset and its checksum fixed, so that only the field
    checks can refuse it."""
    body = bytearray(data[:-4])
    struct.pack_into(fmt, body, offset, *values)
    return bytes(body) + file_checksum(body)


# Offsets in a table file whose table name is empty: the section starts at 16.
STATE_FLOATS_OFFSET = 16 + 4 + 12
OPTIMIZER_OFFSET = 16 + 4 + 56
ROUNDING_SEED_OFFSET = OPTIMIZER_OFFSET + 8 + 7 * 8
STEP_OFFSET = ROUNDING_SEED_OFFSET + 8


@pytest.mark.parametrize(
    "patch, match",
    [
        ((OPTIMIZER_OFFSET, "<I", 9), "invalid optimizer.*unknown optimizer kind 9"),
        ((OPTIMIZER_OFFSET + 4, "<I", 2), "unknown optimizer flags 2"),
        ((OPTIMIZER_OFFSET + 4, "<I", 1), "stochastic rounding on the float32 rows"),
        ((ROUNDING_SEED_OFFSET, "<Q", 7), "rounding_seed is used with stochastic_rounding only"),
        ((OPTIMIZER_OFFSET + 8, "<d", -1.0), r"invalid optimizer.*lr must be finite and >= 0"),
        ((OPTIMIZER_OFFSET + 8 + 5 * 8, "<d", 1.5), r"invalid optimizer.*beta1 must be in \[0, 1\)"),
        ((OPTIMIZER_OFFSET + 8 + 1 * 8, "<d", 0.5), r"Adam does not use weight_decay"),
        ((STATE_FLOATS_OFFSET, "<I", DIM), f"has {DIM} state words per row.*keeps {2 * DIM}"),
        ((OPTIMIZER_OFFSET, "<I", 2), f"has {2 * DIM} state words per row.*Adagrad.*keeps {DIM}"),
    ],
    ids=["unknown kind", "unknown flags", "rounding of float32", "rounding seed alone", "lr", "beta1",
         "unused weight_decay", "state width", "kind vs width"],
)
def test_damaged_optimizer_fields_are_refused(store_mod, tmp_path, patch, match):
    source = new_table(store_mod, store_mod.OptimizerConfig.adam(lr=0.1))
    train(source, np.random.default_rng(6), 2)
    path = tmp_path / "table.ckpt"
    store_mod.save_table(path, source)
    good = path.read_bytes()
    assert struct.unpack_from("<I", good, OPTIMIZER_OFFSET) == (4,)  # the offsets are right
    assert struct.unpack_from("<Q", good, STEP_OFFSET) == (2,)

    destination = new_table(store_mod, store_mod.OptimizerConfig.adagrad(lr=0.3))
    train(destination, np.random.default_rng(7), 1)
    before = full_snapshot(destination)
    path.write_bytes(patched(good, *patch))
    with pytest.raises(ValueError, match=match):
        store_mod.load_table(path, destination)
    assert full_snapshot(destination) == before


def test_checkpoint_of_optimizer_table_refuses_every_flipped_byte(store_mod, tmp_path):
    source = new_table(store_mod, store_mod.OptimizerConfig.rowwise_adagrad(lr=0.1), num_rows=20, dim=2)
    source.update(np.array([3, 4], np.uint64), np.ones((2, 2), np.float32))
    path = tmp_path / "table.ckpt"
    store_mod.save_table(path, source)
    good = path.read_bytes()
    destination = new_table(store_mod, store_mod.OptimizerConfig.adam(), num_rows=20, dim=2)
    destination.update(np.array([5], np.uint64), np.ones((1, 2), np.float32))
    before = full_snapshot(destination)
    damaged = tmp_path / "damaged.ckpt"
    for position in range(len(good)):
        flipped = bytearray(good)
        flipped[position] ^= 0x04
        damaged.write_bytes(bytes(flipped))
        with pytest.raises(ValueError, match="checkpoint"):
            store_mod.load_table(damaged, destination)
        assert full_snapshot(destination) == before
