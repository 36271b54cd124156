"""gather_pooled: torch.nn.functional.embedding_bag (CPU) semantics, on store rows."""

import numpy as np
import pytest

NUM_ROWS, DIM = 60, 7


def reference_bag(weight, ids, offsets, mode, per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """embedding_bag in numpy (float64), with max positions as indices into ids."""
    n = len(ids)
    num_bags = len(offsets) - 1 if include_last_offset else len(offsets)
    ends = list(offsets[1:]) if include_last_offset else list(offsets[1:]) + [n]
    out = np.zeros((num_bags, weight.shape[1]))
    positions_out = np.full((num_bags, weight.shape[1]), -1, np.int64)
    for bag in range(num_bags):
        positions = np.array([p for p in range(offsets[bag], ends[bag]) if int(ids[p]) != padding_idx], np.int64)
        if len(positions) == 0:
            continue
        rows = weight[ids[positions].astype(np.int64)].astype(np.float64)
        if mode == "sum":
            scale = 1.0 if per_sample_weights is None else per_sample_weights[positions][:, None]
            out[bag] = (rows * scale).sum(axis=0)
        elif mode == "mean":
            out[bag] = rows.mean(axis=0)
        else:
            first_max = np.argmax(rows, axis=0)  # the first of equal maxima, as torch keeps
            out[bag] = rows[first_max, np.arange(rows.shape[1])]
            positions_out[bag] = positions[first_max]
    return out, positions_out


@pytest.fixture
def table(make_table, store_mod, rng):
    table = make_table(NUM_ROWS, DIM, init=store_mod.InitRule.normal(0, 1, seed=5))
    # Some rows hold small integers, so Max meets many ties.
    ids = np.arange(0, NUM_ROWS, 3, dtype=np.uint64)
    table.write(ids, rng.integers(-2, 3, size=(len(ids), DIM)).astype(np.float32))
    return table


def dense_weight(table):
    return table.read_bytes(0, NUM_ROWS * DIM * 4).view(np.float32).reshape(NUM_ROWS, DIM)


def random_bags(rng, num_bags, max_bag=6):
    sizes = rng.integers(0, max_bag + 1, size=num_bags)
    sizes[::5] = 0  # plenty of empty bags
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    ids = rng.integers(0, NUM_ROWS, size=int(sizes.sum())).astype(np.uint64)
    return ids, offsets, int(sizes.sum())


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("include_last_offset", [False, True])
@pytest.mark.parametrize("padding_idx", [-1, 3])
def test_matches_reference(store_mod, table, rng, mode, include_last_offset, padding_idx):
    ids, offsets, n = random_bags(rng, 40)
    ids[::4] = 3  # padding_idx shows up often when it is set
    if include_last_offset:
        offsets = np.append(offsets, n)
    weight = dense_weight(table)
    per_sample_weights = rng.standard_normal(n).astype(np.float32) if mode == "sum" else None

    pooled_mode = getattr(store_mod.PoolingMode, mode.capitalize())
    out, positions = table.gather_pooled(
        ids, offsets, pooled_mode, per_sample_weights, include_last_offset=include_last_offset, padding_idx=padding_idx
    )
    expected, expected_positions = reference_bag(
        weight, ids, offsets, mode, per_sample_weights, include_last_offset, padding_idx
    )
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    if mode == "max":
        np.testing.assert_array_equal(positions, expected_positions)
    else:
        assert positions is None


def test_empty_and_all_padding_bags_give_zeros(store_mod, table):
    ids = np.array([3, 3, 5], np.uint64)
    offsets = np.array([0, 0, 2], np.int64)  # bags: [], [3, 3], [5]
    for mode in (store_mod.PoolingMode.Sum, store_mod.PoolingMode.Mean, store_mod.PoolingMode.Max):
        out, positions = table.gather_pooled(ids, offsets, mode, padding_idx=3)
        assert np.all(out[:2] == 0)
        if positions is not None:
            assert np.all(positions[:2] == -1) and np.all(positions[2] == 2)


def test_mean_divides_by_the_non_padding_count(store_mod, table):
    weight = dense_weight(table)
    out, _ = table.gather_pooled(
        np.array([3, 7, 8], np.uint64), np.array([0], np.int64), store_mod.PoolingMode.Mean, padding_idx=3
    )
    np.testing.assert_allclose(out[0], (weight[7] + weight[8]) / 2, rtol=1e-6)


def test_max_keeps_a_leading_nan_only(store_mod, make_table):
    table = make_table(3, 2)
    table.write(np.arange(3, dtype=np.uint64), np.array([[1, np.nan], [2, 5], [2, 1]], np.float32))
    out, positions = table.gather_pooled(np.array([1, 0, 2], np.uint64), np.array([0]), store_mod.PoolingMode.Max)
    np.testing.assert_array_equal(out, [[2, 5]])  # a later nan loses; equal maxima keep the first
    np.testing.assert_array_equal(positions, [[0, 0]])
    out, positions = table.gather_pooled(np.array([0, 1, 2], np.uint64), np.array([0]), store_mod.PoolingMode.Max)
    assert out[0, 0] == 2 and np.isnan(out[0, 1])  # a leading nan stays
    np.testing.assert_array_equal(positions, [[1, 0]])


def test_padding_rows_are_not_materialized(store_mod, make_table):
    table = make_table(100, 4, init=store_mod.InitRule.normal(0, 1, seed=1))
    table.gather_pooled(np.array([7, 9, 7, 11], np.uint64), np.array([0, 2]), padding_idx=7)
    assert table.exists(np.array([7, 9, 11], np.uint64)).tolist() == [False, True, True]


@pytest.mark.parametrize("padding_idx", [-1, 7])
def test_bags_larger_than_a_block(store_mod, make_table, rng, padding_idx):
    """Bags are pooled in blocks of up to 8192 ids under one hold of the read locks; bags larger than
    a block and bags around block boundaries must pool exactly as one pass would, the first time
    (rows materialized by the gather a block falls back to) and once every row is in place."""
    table = make_table(5000, 3, init=store_mod.InitRule.uniform(-1, 1, seed=2))
    sizes = np.array([9000, 1, 0, 8191, 8193, 3, 16384, 0, 7])
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    ids = rng.integers(0, 5000, size=int(sizes.sum())).astype(np.uint64)
    weight = table.read_bytes(0, 5000 * 3 * 4).view(np.float32).reshape(5000, 3)
    for mode in ("sum", "max", "sum"):
        out, positions = table.gather_pooled(ids, offsets, getattr(store_mod.PoolingMode, mode.capitalize()),
                                             padding_idx=padding_idx)
        expected, expected_positions = reference_bag(weight, ids, offsets, mode, padding_idx=padding_idx)
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
        if mode == "max":
            np.testing.assert_array_equal(positions, expected_positions)


def test_matches_torch_embedding_bag(store_mod, table, rng):
    torch = pytest.importorskip("torch")
    ids, offsets, n = random_bags(rng, 30)
    weight = torch.from_numpy(dense_weight(table).copy())
    per_sample_weights = rng.standard_normal(n).astype(np.float32)
    t_ids, t_offsets = torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(offsets)
    for mode in ("sum", "mean", "max"):
        psw = per_sample_weights if mode == "sum" else None
        pooled_mode = getattr(store_mod.PoolingMode, mode.capitalize())
        out, positions = table.gather_pooled(ids, offsets, pooled_mode, psw, padding_idx=4)
        torch_psw = None if psw is None else torch.from_numpy(psw)
        mode_number = ["sum", "mean", "max"].index(mode)
        # The aten op, because F.embedding_bag does not return max_indices.
        expected, _, _, max_indices = torch.ops.aten._embedding_bag(
            weight, t_ids, t_offsets, False, mode_number, False, torch_psw, False, 4
        )
        np.testing.assert_allclose(out, expected.numpy(), rtol=1e-6, atol=1e-6)
        if mode == "max":
            non_empty = positions >= 0
            # torch reports the row id of the maximum; the store reports its position in ids.
            np.testing.assert_array_equal(ids[positions[non_empty]], max_indices.numpy()[non_empty])


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        (dict(offsets=[1, 2]), ValueError, "offsets\\[0\\] has to be 0"),
        (dict(offsets=[0, 3, 2]), ValueError, "non-decreasing"),
        (dict(offsets=[0, 9]), ValueError, "can not be greater than input's length 5"),
        (dict(offsets=[0, 9], include_last_offset=True), ValueError, "can not be greater"),
        (dict(mode="Mean", per_sample_weights=[1.0] * 5), ValueError, "only supported for mode='sum'"),
        (dict(padding_idx=NUM_ROWS), ValueError, "padding_idx"),
        (dict(padding_idx=-2), ValueError, "padding_idx"),
        (dict(ids=[1, 2, NUM_ROWS, 4, 5]), IndexError, "out of range"),
        (dict(per_sample_weights=[1.0] * 4), ValueError, "one weight per id"),
    ],
)
def test_bad_arguments_are_refused_before_reading(store_mod, make_table, kwargs, error, message):
    table = make_table(NUM_ROWS, DIM)
    call = dict(ids=[1, 2, 3, 4, 5], offsets=[0, 2], mode="Sum", per_sample_weights=None,
                include_last_offset=False, padding_idx=-1)
    call.update(kwargs)
    weights = call["per_sample_weights"]
    with pytest.raises(error, match=message):
        table.gather_pooled(
            np.array(call["ids"], np.uint64),
            np.array(call["offsets"], np.int64),
            getattr(store_mod.PoolingMode, call["mode"]),
            None if weights is None else np.array(weights, np.float32),
            include_last_offset=call["include_last_offset"],
            padding_idx=call["padding_idx"],
        )
    assert table.stats().rows == 0  # nothing was materialized


@pytest.mark.parametrize("dim", [1, 8, 15, 16, 17, 40, 64, 100, 128, 131, 200, 256, 300])
@pytest.mark.parametrize("mode", ["sum", "mean", "weighted sum"])
def test_sums_are_float32_additions_in_bag_order_at_every_width(store_mod, make_table, rng, dim, mode):
    # Sum and mean add rows with the widest vectors the CPU has, the sums of up to 8 vectors of columns
    # in registers, then blocks of 4, 2 and 1 vectors, then the last columns one by one; a bag's rows
    # go 32 at a time. Every element must still be the float32 sum of its bag's rows in bag order, as
    # CPU embedding_bag gives, whatever dim leaves for each block size and however many groups of 32 a
    # bag takes. A weighted row's product is rounded to float32 before it is added (no fused
    # multiply-add).
    table = make_table(200, dim)
    weight = rng.standard_normal((200, dim)).astype(np.float32)
    table.write(np.arange(200, dtype=np.uint64), weight)
    ids, offsets, n = random_bags(rng, 64, max_bag=9)
    offsets[-3:] = offsets[-3] + np.array([0, 32, 65])  # then bags of 32, 33 and 70 rows (over 3 groups)
    n = int(offsets[-1]) + 70
    ids = rng.integers(0, 200, size=n).astype(np.uint64)
    if mode == "weighted sum":
        per_sample = rng.standard_normal(n).astype(np.float32)
        out, _ = table.gather_pooled(ids, offsets, store_mod.PoolingMode.Sum, per_sample_weights=per_sample)
    else:
        per_sample = np.ones(n, np.float32)
        out, _ = table.gather_pooled(ids, offsets, getattr(store_mod.PoolingMode, mode.capitalize()))
    ends = list(offsets[1:]) + [n]
    for bag, (begin, end) in enumerate(zip(offsets, ends)):
        expected = np.zeros(dim, np.float32)
        for position in range(begin, end):
            expected = expected + per_sample[position] * weight[ids[position]]
        if mode == "mean" and end > begin:
            expected = expected / np.float32(end - begin)
        np.testing.assert_array_equal(out[bag], expected)
