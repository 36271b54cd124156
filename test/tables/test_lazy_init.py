"""Lazy rows: O(1) creation and whole-table init rules; partial inits write rows
(DESIGN.md, "Memory model": Lazy rows)."""

import math
import time

import pytest
import torch
import torch.nn.functional as F

import torch_recdev
from torch_recdev import is_table, table_stats

N = 10**10
DIM = 128
# 2000 rows spread over the whole 10**10 range
SAMPLE_IDS = torch.arange(2000, dtype=torch.int64) * 4_999_999_937 % N


def _sample(w, ids=SAMPLE_IDS):
    return F.embedding(ids, w).cpu()


def test_huge_embedding_is_created_at_once_and_holds_no_row():
    start = time.perf_counter()
    emb = torch.nn.Embedding(N, DIM, device="recdev")
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0
    w = emb.weight
    assert w.shape == (N, DIM) and w.device.type == "recdev" and w.requires_grad
    assert is_table(w)
    stats = table_stats(w)
    assert stats["rows"] == 0
    assert stats["writes"] == 0
    assert stats["bytes"] < 1 << 20


def test_huge_embedding_bag_is_created_at_once_and_holds_no_row():
    start = time.perf_counter()
    bag = torch.nn.EmbeddingBag(N, DIM, mode="sum", device="recdev")
    assert time.perf_counter() - start < 1.0
    assert is_table(bag.weight)
    assert table_stats(bag.weight)["rows"] == 0


def _check_normal(v, mean, std):
    assert abs(v.mean().item() - mean) < 0.05 * std
    assert abs(v.std().item() - std) < 0.05 * std


def _check_uniform(v, low, high):
    assert v.min().item() >= low and v.max().item() < high
    width = high - low
    assert abs(v.mean().item() - (low + high) / 2) < 0.02 * width
    assert abs(v.std().item() - width / math.sqrt(12)) < 0.02 * width


_XAVIER_BOUND = math.sqrt(6.0 / (N + DIM))
_KAIMING_BOUND = math.sqrt(3.0) * math.sqrt(2.0) / math.sqrt(DIM)

_INITS = {
    "normal_": (lambda w: w.normal_(2.0, 0.5), lambda v: _check_normal(v, 2.0, 0.5)),
    "uniform_": (lambda w: w.uniform_(-3.0, -1.0), lambda v: _check_uniform(v, -3.0, -1.0)),
    "zero_": (lambda w: w.zero_(), lambda v: torch.equal(v, torch.zeros_like(v)) or pytest.fail("not zero")),
    "fill_": (lambda w: w.fill_(1.25), lambda v: torch.equal(v, torch.full_like(v, 1.25)) or pytest.fail("not 1.25")),
    "fill_negative": (lambda w: w.fill_(-7.5), lambda v: torch.equal(v, torch.full_like(v, -7.5)) or pytest.fail("not -7.5")),
    "init.normal_": (lambda w: torch.nn.init.normal_(w, 0.0, 0.01), lambda v: _check_normal(v, 0.0, 0.01)),
    "init.uniform_": (lambda w: torch.nn.init.uniform_(w, 0.5, 0.75), lambda v: _check_uniform(v, 0.5, 0.75)),
    "init.xavier_uniform_": (
        lambda w: torch.nn.init.xavier_uniform_(w),
        lambda v: _check_uniform(v, -_XAVIER_BOUND, _XAVIER_BOUND),
    ),
    "init.kaiming_uniform_": (
        lambda w: torch.nn.init.kaiming_uniform_(w),
        lambda v: _check_uniform(v, -_KAIMING_BOUND, _KAIMING_BOUND),
    ),
    "init.constant_": (lambda w: torch.nn.init.constant_(w, 0.125), lambda v: torch.equal(v, torch.full_like(v, 0.125)) or pytest.fail("not 0.125")),
    "init.ones_": (lambda w: torch.nn.init.ones_(w), lambda v: torch.equal(v, torch.ones_like(v)) or pytest.fail("not ones")),
    "init.zeros_": (lambda w: torch.nn.init.zeros_(w), lambda v: torch.equal(v, torch.zeros_like(v)) or pytest.fail("not zeros")),
}


@pytest.mark.parametrize("name", sorted(_INITS))
def test_whole_table_init_sets_rule_in_constant_time(name, huge_table):
    apply, check = _INITS[name]
    w = huge_table(DIM)
    # materialize a few rows first: the init must replace them too
    touched = torch.tensor([0, 17, N - 1])
    before = F.embedding(touched, w).cpu()
    assert table_stats(w)["rows"] == 3
    start = time.perf_counter()
    with torch.no_grad():
        result = apply(w)
    elapsed = time.perf_counter() - start
    assert result is w or result.data_ptr() == w.data_ptr()
    assert elapsed < 0.5, f"{name} took {elapsed:.3f}s on a 10**10-row table"
    assert table_stats(w)["rows"] == 0, "an init on the whole table must drop rows, not write them"
    after_touched = F.embedding(touched, w).cpu()
    assert not torch.equal(after_touched, before)
    check(torch.cat([after_touched, _sample(w)]))


def test_init_on_small_table_sets_rule_too(lazy_table):
    w = lazy_table(100, 16)
    w[3] = 5.0
    assert table_stats(w)["rows"] == 1
    w.uniform_(-1, 1)
    assert table_stats(w)["rows"] == 0
    v = w.cpu()
    assert v.min() >= -1 and v.max() < 1 and v.std() > 0.4
    w.zero_()
    assert table_stats(w)["rows"] == 0
    assert torch.equal(w.cpu(), torch.zeros(100, 16))


def test_same_seed_same_contents_whatever_the_touch_order(huge_table):
    ids = torch.tensor([7, 10**9, 3, 42, N - 1, 123_456_789, 5, 999_999_999])
    torch.manual_seed(1234)
    a = huge_table(DIM)
    torch.manual_seed(1234)
    b = huge_table(DIM)
    # a: one id at a time in the given order; b: all at once in reverse order
    rows_a = torch.stack([F.embedding(ids[i : i + 1], a).cpu()[0] for i in range(len(ids))])
    order = torch.arange(len(ids)).flip(0)
    rows_b = F.embedding(ids[order], b).cpu()[order.argsort()]
    assert torch.equal(rows_a, rows_b)
    assert table_stats(a)["rows"] == len(ids) and table_stats(b)["rows"] == len(ids)
    # the values are real draws, not a constant
    assert rows_a.std() > 0.5
    assert not torch.equal(rows_a[0], rows_a[1])


def test_same_seed_same_contents_whatever_thread_materializes(huge_table):
    import threading

    ids = torch.arange(4000, dtype=torch.int64) * 2_499_999_967 % N
    torch.manual_seed(77)
    a = huge_table(32)
    torch.manual_seed(77)
    b = huge_table(32)
    errors = []

    def touch(part):
        try:
            for chunk in part.split(50):
                F.embedding(chunk, a)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    # four threads, interleaved and reversed subsets, all at once
    threads = [threading.Thread(target=touch, args=(ids[i::4].flip(0) if i % 2 else ids[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert table_stats(a)["rows"] == ids.unique().numel()
    assert torch.equal(F.embedding(ids, a).cpu(), F.embedding(ids, b).cpu())


def test_same_seed_same_contents_through_every_read_path(huge_table):
    ids = torch.tensor([11, 5_000_000_000, N - 2])
    torch.manual_seed(99)
    a = huge_table(32)
    torch.manual_seed(99)
    b = huge_table(32)
    torch.manual_seed(99)
    c = huge_table(32)
    via_embedding = F.embedding(ids, a).cpu()
    # b: rows read through copies of slices (not materialized) and through weight[ids]
    via_slices = torch.stack([b[i : i + 1].cpu()[0] for i in ids.tolist()])
    assert table_stats(b)["rows"] == 0
    via_index = b[ids.flip(0)].cpu().flip(0)
    # c: pooled (a bag per id), then index_select
    via_bag = F.embedding_bag(ids, c, torch.arange(3), mode="sum").cpu()
    via_select = c.index_select(0, ids).cpu()
    for other in (via_slices, via_index, via_bag, via_select):
        assert torch.equal(other, via_embedding)


def test_different_seed_or_second_init_gives_different_contents(huge_table):
    ids = torch.tensor([1, 2, 3, 10**9])
    torch.manual_seed(1)
    a = huge_table(DIM)
    torch.manual_seed(2)
    b = huge_table(DIM)
    va, vb = F.embedding(ids, a).cpu(), F.embedding(ids, b).cpu()
    assert not torch.equal(va, vb)
    with torch.no_grad():
        a.normal_()
    assert not torch.equal(F.embedding(ids, a).cpu(), va)


def test_same_seed_same_contents_for_small_tables():
    torch.manual_seed(5)
    with torch_recdev.placement("table"):
        a = torch.randn(64, 16, device="recdev")
    torch.manual_seed(5)
    with torch_recdev.placement("table"):
        b = torch.randn(64, 16, device="recdev")
    assert is_table(a) and is_table(b)
    assert table_stats(a)["rows"] == 0
    ids = torch.arange(64)
    va = torch.stack([a[i].cpu() for i in ids.tolist()])
    vb = F.embedding(ids.flip(0), b).cpu().flip(0)
    assert torch.equal(va, vb)
    assert va.std() > 0.5


def test_partial_fill_writes_only_those_rows(huge_table):
    torch.manual_seed(7)
    w = huge_table(DIM)
    torch.manual_seed(7)
    twin = huge_table(DIM)
    w[2:4].fill_(5.0)
    stats = table_stats(w)
    assert stats["rows"] == 2
    assert stats["writes"] == 2
    ids = torch.arange(6)
    got = F.embedding(ids, w).cpu()
    expected = F.embedding(ids, twin).cpu()
    expected[2:4] = 5.0
    assert torch.equal(got, expected)


@pytest.mark.parametrize(
    "op",
    [
        lambda v: v.normal_(3.0, 0.1),
        lambda v: v.uniform_(10.0, 11.0),
        lambda v: v.zero_(),
        lambda v: v.fill_(-2.0),
        lambda v: torch.nn.init.xavier_uniform_(v),
    ],
    ids=["normal_", "uniform_", "zero_", "fill_", "xavier_uniform_"],
)
def test_partial_init_of_a_slice_writes_only_its_rows(op, huge_table):
    torch.manual_seed(8)
    w = huge_table(64)
    torch.manual_seed(8)
    twin = huge_table(64)
    first = 1_000_000
    with torch.no_grad():
        op(w[first : first + 10])
    stats = table_stats(w)
    assert stats["rows"] == 10
    assert stats["writes"] == 10
    ids = torch.arange(first - 2, first + 12)
    got = F.embedding(ids, w).cpu()
    untouched = F.embedding(ids, twin).cpu()
    # the rows around the slice keep their init values, the slice does not
    assert torch.equal(got[:2], untouched[:2]) and torch.equal(got[-2:], untouched[-2:])
    assert not torch.equal(got[2:12], untouched[2:12])
    ref = torch.empty(10, 64)
    torch.manual_seed(0)
    op(ref)
    # the slice got a value of the op's kind (range / constant) — compared by summary, not by draw
    part = got[2:12]
    assert part.min() >= ref.min() - 0.5 and part.max() <= ref.max() + 0.5
    assert abs(part.mean() - ref.mean()) < 0.1


def test_partial_init_of_an_element_range(lazy_table):
    w = lazy_table(20, 8)
    before = w.cpu()
    w.view(-1)[12:20].fill_(4.0)  # the second half of row 1 and the first half of row 2
    expected = before.clone()
    expected.view(-1)[12:20] = 4.0
    assert torch.equal(w.cpu(), expected)
    assert table_stats(w)["rows"] == 2


def test_embedding_padding_idx_row_is_zero(huge_table):
    torch.manual_seed(3)
    w = huge_table(DIM, padding_idx=7)
    stats = table_stats(w)
    assert stats["rows"] <= 1, "only the padding row may be written at construction"
    rows = F.embedding(torch.tensor([6, 7, 8]), w).cpu()
    assert torch.equal(rows[1], torch.zeros(DIM))
    assert rows[0].abs().sum() > 0 and rows[2].abs().sum() > 0


@pytest.mark.parametrize("kind", ["host", "table"])
def test_embedding_negative_padding_idx_row_is_zero(kind):
    torch.manual_seed(4)
    with torch_recdev.placement(kind):
        emb = torch.nn.Embedding(100, 16, padding_idx=-3, device="recdev")
    assert is_table(emb.weight) == (kind == "table")
    assert emb.padding_idx == 97
    w = emb.weight.detach().cpu()
    assert torch.equal(w[97], torch.zeros(16))
    assert (w.abs().sum(1) > 0).sum() == 99
    # standard normal, like nn.Embedding's own reset on the CPU
    assert abs(w.std().item() - 1.0) < 0.1



def test_empty_tables_are_filled_by_a_lazy_rule_under_deterministic_algorithms(deterministic):
    # The CPU fills torch.empty with NaN under deterministic algorithms; a float32 table gets that as
    # its Constant init rule, in O(1), whatever its size or strides.
    nan_bits = torch.empty(1, 16).view(torch.int32)  # the CPU's NaN, filled the same way
    for make in (
        lambda: torch.empty(N, 16, device="recdev"),
        lambda: torch.empty_strided((16, N), (1, 16), device="recdev"),
        lambda: torch.empty_like(torch.nn.Embedding(N, 16, device="recdev").weight),
    ):
        start = time.perf_counter()
        w = make()
        assert time.perf_counter() - start < 1.0
        assert is_table(w) and table_stats(w)["rows"] == 0
        rows = w.as_strided((N, 16), (16, 1))
        for row in (rows[0], rows[N - 1]):  # read through windows, which materialize nothing
            assert torch.equal(row.cpu().view(torch.int32), nan_bits[0])
        assert table_stats(w)["rows"] == 0
    # Other dtypes have no constant rule: their rows stay zeros rather than be materialized.
    with torch_recdev.placement("table"):
        ints = torch.empty(N, 4, dtype=torch.int64, device="recdev")
    assert is_table(ints) and table_stats(ints)["rows"] == 0
    assert ints[0].tolist() == ints[N - 1].tolist() == [0] * 4
