"""Table.update_pooled (csrc/store/pooled_gradients.h): an optimizer step from the gradient of
gather_pooled's output. It must be, bit for bit, update() with the per-id gradient rows expanded the
way PyTorch's embedding_bag backward expands them (index_select of the bag gradients, then * weight
or / bag size in float32), and validate like update() and gather_pooled()."""

import numpy as np
import pytest

from test_optimizers import full_snapshot, new_table

NUM_ROWS, DIM = 300, 8


def optimizers(store_mod):
    return [
        store_mod.OptimizerConfig.sgd(lr=0.05, weight_decay=0.1),
        store_mod.OptimizerConfig.adagrad(lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1),
        store_mod.OptimizerConfig.rowwise_adagrad(lr=0.1, weight_decay=0.01),
        store_mod.OptimizerConfig.adam(lr=0.01),
    ]


def expanded(ids, offsets, bag_grads, mode, weights, include_last_offset, padding_idx):
    """The per-id (ids, gradient rows) update() gets for the same step, built independently."""
    num_bags = len(bag_grads)
    ends = list(offsets[1:num_bags + 1]) if include_last_offset else list(offsets[1:]) + [len(ids)]
    kept_ids, rows = [], []
    for b in range(num_bags):
        members = [p for p in range(offsets[b], ends[b]) if ids[p] != padding_idx]
        for p in members:
            row = bag_grads[b].copy()
            if weights is not None:
                row = row * weights[p]
            elif mode == "mean":
                row = row / np.float32(len(members))
            kept_ids.append(ids[p])
            rows.append(row.astype(np.float32))
    return np.array(kept_ids, np.uint64), np.array(rows, np.float32).reshape(len(rows), DIM)


def random_bags(rng, num_bags, with_empty=True):
    sizes = rng.integers(0 if with_empty else 1, 7, size=num_bags)
    ids = rng.integers(0, 40, size=int(sizes.sum())).astype(np.uint64)  # few distinct: many duplicates
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    return ids, offsets


CASES = {
    "sum": dict(mode="sum", weights=False, include_last_offset=False, padding_idx=-1),
    "mean": dict(mode="mean", weights=False, include_last_offset=False, padding_idx=-1),
    "sum_weights": dict(mode="sum", weights=True, include_last_offset=False, padding_idx=-1),
    "mean_padding": dict(mode="mean", weights=False, include_last_offset=False, padding_idx=7),
    "sum_weights_padding_last_offset": dict(mode="sum", weights=True, include_last_offset=True, padding_idx=3),
}


@pytest.mark.parametrize("case", list(CASES))
def test_equals_update_with_expanded_rows_bit_for_bit(store_mod, rng, case):
    spec = CASES[case]
    mode = {"sum": store_mod.PoolingMode.Sum, "mean": store_mod.PoolingMode.Mean}[spec["mode"]]
    for config in optimizers(store_mod):
        pooled, reference = new_table(store_mod, config), new_table(store_mod, config)
        for step in range(5):
            ids, offsets = random_bags(rng, 30)
            num_bags = len(offsets)
            if spec["include_last_offset"]:
                offsets = np.append(offsets, len(ids)).astype(np.int64)
            bag_grads = rng.standard_normal((num_bags, DIM)).astype(np.float32)
            weights = rng.standard_normal(len(ids)).astype(np.float32) if spec["weights"] else None
            pooled.update_pooled(ids, offsets, bag_grads, mode, weights, spec["include_last_offset"],
                                 spec["padding_idx"])
            reference.update(*expanded(ids, offsets, bag_grads, spec["mode"], weights,
                                       spec["include_last_offset"], spec["padding_idx"]))
            assert full_snapshot(pooled) == full_snapshot(reference), (config, step)
        assert pooled.stats().updates == reference.stats().updates


def test_large_batch_on_several_threads_equals_update(store_mod, rng):
    """A batch large enough to be coalesced and applied on several threads."""
    config = store_mod.OptimizerConfig.adagrad(lr=0.1)
    pooled = new_table(store_mod, config, num_rows=5000)
    reference = new_table(store_mod, config, num_rows=5000)
    ids = rng.integers(0, 5000, size=40000).astype(np.uint64)
    offsets = np.arange(0, 40000, 4, dtype=np.int64)
    bag_grads = rng.standard_normal((len(offsets), DIM)).astype(np.float32)
    pooled.update_pooled(ids, offsets, bag_grads)
    reference.update(ids, np.repeat(bag_grads, 4, axis=0))
    assert full_snapshot(pooled) == full_snapshot(reference)


def test_all_ids_padding_still_counts_a_step(store_mod):
    table = new_table(store_mod, store_mod.OptimizerConfig.adam())
    table.update_pooled(np.array([5, 5], np.uint64), np.array([0], np.int64), np.ones((1, DIM), np.float32),
                        padding_idx=5)
    assert table.optimizer_step == 1
    assert table.stats().rows == 0


def test_max_is_refused(store_mod):
    table = new_table(store_mod, store_mod.OptimizerConfig.sgd(lr=1.0))
    before = full_snapshot(table)
    with pytest.raises(ValueError, match="mode Max has no per-bag gradient"):
        table.update_pooled(np.array([1, 2], np.uint64), np.array([0], np.int64), np.ones((1, DIM), np.float32),
                            store_mod.PoolingMode.Max)
    assert full_snapshot(table) == before


@pytest.mark.parametrize("bad", [np.nan, np.inf], ids=str)
def test_non_finite_gradient_names_the_first_id_that_gets_it(store_mod, bad):
    table = new_table(store_mod, store_mod.OptimizerConfig.adagrad(lr=0.1))
    before = full_snapshot(table)
    bag_grads = np.ones((3, DIM), np.float32)
    bag_grads[0, 1] = bad  # an empty bag: no id gets it
    bag_grads[2, 4] = bad
    ids = np.array([7, 8, 9, 10], np.uint64)
    with pytest.raises(ValueError, match=r"row id 9 \(ids\[2\]\) holds (nan|inf) at column 4; nothing was applied"):
        table.update_pooled(ids, np.array([0, 0, 2], np.int64), bag_grads)
    assert full_snapshot(table) == before


def test_gradient_only_in_an_empty_bag_is_harmless(store_mod):
    table = new_table(store_mod, store_mod.OptimizerConfig.sgd(lr=1.0))
    bag_grads = np.ones((2, DIM), np.float32)
    bag_grads[1] = np.nan
    table.update_pooled(np.array([3], np.uint64), np.array([0, 1], np.int64), bag_grads)
    assert table.optimizer_step == 1


def test_weighted_gradient_overflowing_is_refused(store_mod):
    table = new_table(store_mod, store_mod.OptimizerConfig.sgd(lr=1.0))
    before = full_snapshot(table)
    with pytest.raises(ValueError, match=r"row id 4 \(ids\[1\]\) holds inf"):
        table.update_pooled(np.array([3, 4], np.uint64), np.array([0], np.int64), np.full((1, DIM), 3e38, np.float32),
                            per_sample_weights=np.array([1, 10], np.float32))
    assert full_snapshot(table) == before


@pytest.mark.parametrize(
    "offsets, weights, mode, match",
    [
        ([1], None, "Sum", "offsets\\[0\\] has to be 0"),
        ([0, 3, 2], None, "Sum", "non-decreasing"),
        ([0, 9], None, "Sum", "can not be greater than input's length"),
        ([0], [1.0, 1.0, 1.0], "Mean", "per_sample_weights is only supported for mode='sum'"),
    ],
)
def test_bags_are_validated_with_nothing_changed(store_mod, offsets, weights, mode, match):
    table = new_table(store_mod, store_mod.OptimizerConfig.sgd(lr=1.0))
    before = full_snapshot(table)
    grads = np.ones((len(offsets), DIM), np.float32)
    with pytest.raises(ValueError, match=match):
        table.update_pooled(np.array([1, 2, 3], np.uint64), np.array(offsets, np.int64), grads,
                            getattr(store_mod.PoolingMode, mode),
                            None if weights is None else np.array(weights, np.float32))
    assert full_snapshot(table) == before


def test_out_of_range_ids_and_no_optimizer_are_refused(store_mod):
    table = new_table(store_mod, store_mod.OptimizerConfig.sgd(lr=1.0))
    with pytest.raises(IndexError, match=f"row id {NUM_ROWS} .*out of range"):
        table.update_pooled(np.array([1, NUM_ROWS], np.uint64), np.array([0], np.int64), np.ones((1, DIM), np.float32))
    assert table.optimizer_step == 0
    with pytest.raises(ValueError, match="has no optimizer"):
        new_table(store_mod).update_pooled(np.array([1], np.uint64), np.array([0], np.int64),
                                           np.ones((1, DIM), np.float32))


def test_bag_gradient_shape_is_checked_by_the_binding(store_mod):
    table = new_table(store_mod, store_mod.OptimizerConfig.sgd(lr=1.0))
    with pytest.raises(ValueError, match=rf"bag_grads must have shape \(2, {DIM}\)"):
        table.update_pooled(np.array([1, 2], np.uint64), np.array([0, 1], np.int64), np.ones((1, DIM), np.float32))
