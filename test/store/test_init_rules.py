"""Init rules: a row's initial value is a pure function of (rule, table, row id, element)."""

import math

import numpy as np
import pytest

# Random123's known-answer vectors for Philox4x32-10: (counter, key, expected output).
PHILOX_KAT = [
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    (
        [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344],
        [0xA4093822, 0x299F31D0],
        [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1],
    ),
]


@pytest.mark.parametrize("counter,key,expected", PHILOX_KAT)
def test_philox_matches_known_answers(store_mod, counter, key, expected):
    assert list(store_mod.philox4x32_10(counter, key)) == expected


def first_table(store_mod, rule, num_rows=10**6, dim=24):
    """The first anonymous table of a fresh store: same id, hence same init stream, every time."""
    store = store_mod.Store()
    return store.table(store.create_table(store_mod.TableConfig(num_rows=num_rows, row_words=dim, init=rule)))


def test_same_seed_same_rows_whatever_the_order(store_mod, rng):
    rule = store_mod.InitRule.normal(0.5, 2.0, seed=99)
    ids = rng.choice(10**6, size=500, replace=False).astype(np.uint64)

    forward = first_table(store_mod, rule)
    expected = forward.gather(ids)

    backward = first_table(store_mod, rule)
    backward.write(np.array([7], np.uint64), np.ones((1, 24), np.float32))  # unrelated activity first
    got = np.empty_like(expected)
    for start in range(len(ids), 0, -37):  # reversed, in odd-sized batches
        batch = slice(max(0, start - 37), start)
        got[batch] = backward.gather(ids[batch][::-1])[::-1]
    np.testing.assert_array_equal(got, expected)

    # read_bytes computes the same values without materializing; init_row is the same function.
    peek = first_table(store_mod, rule)
    row = int(ids[3])
    np.testing.assert_array_equal(peek.read_bytes(row * 24 * 4, 24 * 4).view(np.float32), expected[3])
    assert not peek.exists(ids[3:4])[0]
    np.testing.assert_array_equal(store_mod.init_row(rule, peek.init_stream, row, 24, 10**6), expected[3])


def test_tables_and_seeds_draw_different_streams(store_mod):
    store = store_mod.Store()
    config = store_mod.TableConfig(num_rows=1000, row_words=16, init=store_mod.InitRule.normal(0, 1, seed=5))
    a = store.table(store.create_table(config))
    b = store.table(store.create_table(config))
    ids = np.arange(100, dtype=np.uint64)
    rows_a, rows_b = a.gather(ids), b.gather(ids)
    assert a.id != b.id
    assert not np.any(rows_a == rows_b)

    a.set_init(store_mod.InitRule.normal(0, 1, seed=6))
    assert not np.any(a.gather(ids) == rows_a)
    assert len(np.unique(rows_a)) == rows_a.size  # no repeats across rows or elements


def test_named_table_init_is_the_same_in_every_store(store_mod):
    """Shards and restarted servers must agree on a named table's unmaterialized rows."""
    config = store_mod.TableConfig(num_rows=10**9, row_words=8, init=store_mod.InitRule.uniform(-1, 1, seed=3))
    first, second = store_mod.Store(), store_mod.Store()
    second.create_table(config)  # shifts the ids of later tables
    a = first.table(first.create_named_table("user_emb", config))
    b = second.table(second.create_named_table("user_emb", config))
    assert a.id != b.id
    ids = np.array([0, 12345, 10**9 - 1], np.uint64)
    np.testing.assert_array_equal(a.gather(ids), b.gather(ids))


MASK64 = 2**64 - 1


def mix64(x):
    """csrc/store/mix64.h."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def assert_rows_are_the_reference(store_mod, rng, rule, table_id, reference):
    """fill_row's floats for edge and random row ids are reference(row_id, dim)'s, bit for bit (signed
    zeros included), at a dim of two 16-element chunks and a partial one."""
    dim = 37
    for row_id in [0, 1, 2**32 + 5, MASK64] + rng.integers(0, 2**63, size=300).tolist():
        got = store_mod.init_row(rule, table_id, int(row_id), dim, MASK64)
        np.testing.assert_array_equal(got.view(np.uint32), reference(int(row_id), dim).view(np.uint32))


def normal_row_reference(store_mod, mean, std, seed, table_id, row_id, dim):
    """The Normal rule as init_rule.cpp defines it: Box-Muller in double on the row's Philox words, with
    the C library's log, cos and sin (which the math module calls), rounded to float32 at the end."""
    key = seed ^ mix64(table_id)
    values = []
    for block in range((dim + 3) // 4):
        words = store_mod.philox4x32_10([block, 0, row_id & 0xFFFFFFFF, row_id >> 32], [key & 0xFFFFFFFF, key >> 32])
        for word1, word2 in ((words[0], words[1]), (words[2], words[3])):
            radius = math.sqrt(-2.0 * math.log((word1 + 1.0) * 2.0**-32))
            angle = 2 * math.pi * (word2 * 2.0**-32)
            values += [mean + std * radius * math.cos(angle), mean + std * radius * math.sin(angle)]
    return np.array(values[:dim], np.float32)


@pytest.mark.parametrize("mean,std", [(0.0, 1.0), (0.25, 3.0), (-2.0, 1e-3), (1e30, 1e28), (0.0, 0.0), (0.0, 1e-320)])
def test_normal_values_are_the_reference_box_muller_bit_for_bit(store_mod, rng, mean, std):
    """fill_row computes log, sin and cos its own way where it can, and must still give exactly the
    reference's floats, signed zeros included (the last two rules make it fall back to the reference
    for most elements)."""
    rule = store_mod.InitRule.normal(mean, std, seed=11)
    assert_rows_are_the_reference(store_mod, rng, rule, table_id=3,
                                  reference=lambda row_id, dim: normal_row_reference(store_mod, mean, std, 11, 3,
                                                                                     row_id, dim))


def test_normal_statistics(store_mod):
    mean, std = 0.25, 3.0
    table = first_table(store_mod, store_mod.InitRule.normal(mean, std, seed=1), dim=61)
    values = table.gather(np.arange(4000, dtype=np.uint64))  # 244k samples; odd dim covers a partial block
    n = values.size
    assert abs(values.mean() - mean) < 5 * std / math.sqrt(n)
    assert abs(values.std() / std - 1) < 0.01
    z = (values - mean) / std
    assert abs(np.mean(np.abs(z) < 1) - 0.6827) < 0.005
    assert abs(np.mean(np.abs(z) < 2) - 0.9545) < 0.003
    # The cos and sin halves of a Box-Muller pair, and neighbouring blocks, are uncorrelated.
    for lag in (1, 2, 4):
        assert abs(np.corrcoef(z[:, 0], z[:, lag])[0, 1]) < 0.06


def uniform_row_reference(store_mod, lower, upper, seed, table_id, row_id, dim):
    """The Uniform rule as init_rule.cpp defines it: the top 24 bits of each Philox word over 2^24, scaled
    in double and rounded to float32, a value that rounds up to upper replaced by the float below it."""
    key = seed ^ mix64(table_id)
    words = []
    for block in range((dim + 3) // 4):
        words += store_mod.philox4x32_10([block, 0, row_id & 0xFFFFFFFF, row_id >> 32], [key & 0xFFFFFFFF, key >> 32])
    unit = (np.array(words[:dim], np.uint64) >> 8).astype(np.float64) * 2.0**-24
    values = (lower + (upper - lower) * unit).astype(np.float32)
    below_upper = max(np.float32(lower), np.nextafter(np.float32(upper), np.float32(-np.inf)))
    return np.where(values >= np.float32(upper), below_upper, values).astype(np.float32)


@pytest.mark.parametrize("lower,upper", [(-1.0, 1.0), (-2.0, 5.0), (0.0, 1e-30), (1.0, 1.0 + 2**-22), (-3e38, 3e38)])
def test_uniform_values_are_the_reference_bit_for_bit(store_mod, rng, lower, upper):
    """fill_row computes 16 elements at a time where AVX2 is available; every float must still be the
    scalar definition's (the narrow ranges make many values round onto upper)."""
    rule = store_mod.InitRule.uniform(lower, upper, seed=5)
    assert_rows_are_the_reference(store_mod, rng, rule, table_id=9,
                                  reference=lambda row_id, dim: uniform_row_reference(store_mod, lower, upper, 5, 9,
                                                                                      row_id, dim))


def test_uniform_statistics(store_mod):
    lower, upper = -2.0, 5.0
    table = first_table(store_mod, store_mod.InitRule.uniform(lower, upper, seed=2), dim=50)
    values = table.gather(np.arange(4000, dtype=np.uint64)).astype(np.float64)
    assert values.min() >= lower and values.max() < upper
    width = upper - lower
    assert abs(values.mean() - (lower + upper) / 2) < 0.01 * width
    assert abs(values.var() / (width**2 / 12) - 1) < 0.01
    histogram, _ = np.histogram(values, bins=10, range=(lower, upper))
    assert np.all(np.abs(histogram / values.size - 0.1) < 0.005)


def test_uniform_with_equal_bounds_is_constant(store_mod):
    table = first_table(store_mod, store_mod.InitRule.uniform(1.5, 1.5, seed=2), dim=8)
    assert np.all(table.gather(np.arange(50, dtype=np.uint64)) == np.float32(1.5))


def test_xavier_bound_matches_xavier_uniform(store_mod):
    num_rows, dim = 3000, 64
    # torch.nn.init.xavier_uniform_ on a [num_rows, dim] weight: fan_in = dim, fan_out = num_rows.
    bound = math.sqrt(6.0 / (dim + num_rows))
    table = first_table(store_mod, store_mod.InitRule.xavier(seed=4), num_rows=num_rows, dim=dim)
    values = table.gather(np.arange(num_rows, dtype=np.uint64))
    assert np.all(np.abs(values) <= np.float32(bound))
    assert values.max() > 0.99 * bound and values.min() < -0.99 * bound
    assert abs(values.var() / (bound**2 / 3) - 1) < 0.02


def test_zero_and_constant_are_exact(store_mod):
    ids = np.array([0, 5, 999], np.uint64)
    zero = first_table(store_mod, store_mod.InitRule.zero(), num_rows=1000, dim=7)
    assert np.array_equal(zero.gather(ids), np.zeros((3, 7), np.float32))
    constant = first_table(store_mod, store_mod.InitRule.constant(-0.1), num_rows=1000, dim=7)
    assert np.array_equal(constant.gather(ids), np.full((3, 7), np.float32(-0.1)))
    # fill_(nan) is a valid torch op, so a nan constant is a valid rule.
    nan = first_table(store_mod, store_mod.InitRule.constant(float("nan")), num_rows=1000, dim=7)
    assert np.all(np.isnan(nan.gather(ids)))


@pytest.mark.parametrize(
    "make_rule,message",
    [
        (lambda s: s.InitRule.normal(0, -1), "std must be >= 0"),
        (lambda s: s.InitRule.normal(float("nan"), 1), "finite"),
        (lambda s: s.InitRule.normal(0, float("inf")), "finite"),
        (lambda s: s.InitRule.uniform(1, 0), "lower must be <= upper"),
        (lambda s: s.InitRule.uniform(-float("inf"), 0), "finite"),
        (lambda s: s.InitRule.uniform(-1e308, 1e308), "overflows"),
    ],
)
def test_invalid_rules_are_refused(store_mod, make_rule, message):
    rule = make_rule(store_mod)
    store = store_mod.Store()
    with pytest.raises(ValueError, match=message):
        store.create_table(store_mod.TableConfig(num_rows=10, row_words=4, init=rule))
    table = store.table(store.create_table(store_mod.TableConfig(num_rows=10, row_words=4)))
    with pytest.raises(ValueError, match=message):
        table.set_init(rule)
    assert table.config.init == store_mod.InitRule.zero()


def test_set_init_redefines_every_row(store_mod):
    table = first_table(store_mod, store_mod.InitRule.zero(), num_rows=100, dim=4)
    ids = np.arange(10, dtype=np.uint64)
    table.write(ids, np.ones((10, 4), np.float32))
    table.set_init(store_mod.InitRule.constant(3.0))
    assert table.stats().rows == 0
    assert not table.exists(ids).any()
    assert np.all(table.gather(ids) == 3.0)
    assert table.config.init == store_mod.InitRule.constant(3.0)
