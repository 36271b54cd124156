"""Bad input to table storage: the same exception type as CPU raises (IndexError for out-of-range ids,
RuntimeError otherwise), a clear message, and nothing half-written (table_stats rows/writes and the
contents unchanged)."""

import pytest
import torch
import torch.nn.functional as F

import torch_recdev
from torch_recdev import is_table, table_stats

def L(data, like=None):
    """A tensor of `data` on the device of `like` (ids travel with the weight, as CUDA requires for
    non-integer or non-index tensors)."""
    return torch.tensor(data, device=None if like is None else like.device)


# name -> (op on a [10, 8] float32 weight, fragment of the error message or None).
# The CPU result decides the expected exception type; the fragment must be in both messages.
LOOKUP_CASES = {
    "embedding_out_of_range": (lambda w: F.embedding(L([1, 10]), w), "out of range"),
    "embedding_negative": (lambda w: F.embedding(L([1, -1]), w), "out of range"),
    "embedding_huge_id": (lambda w: F.embedding(L([2**62]), w), "out of range"),
    "embedding_2d_out_of_range": (lambda w: F.embedding(L([[1, 2], [3, 11]]), w), "out of range"),
    "embedding_float_ids": (lambda w: F.embedding(L([1.0, 2.0], w), w), "Long, Int"),
    "index_select_out_of_range": (lambda w: w.index_select(0, L([1, 10])), "out of range"),
    "index_select_negative": (lambda w: w.index_select(0, L([-1])), "out of range"),
    "index_select_float_ids": (lambda w: w.index_select(0, L([1.0], w)), "index_select"),
    "index_select_2d_ids": (lambda w: w.index_select(0, L([[1], [2]])), "vector"),
    "getitem_out_of_range": (lambda w: w[L([1, 10])], "out of"),
    "getitem_negative_out_of_range": (lambda w: w[L([-11])], "out of"),
    "getitem_float_ids": (lambda w: w[L([1.0], w)], "long, int"),
    "bag_out_of_range": (lambda w: F.embedding_bag(L([1, 10]), w, L([0])), "range"),
    "bag_negative": (lambda w: F.embedding_bag(L([1, -1]), w, L([0])), "range"),
    "bag_out_of_range_in_a_later_bag_max": (lambda w: F.embedding_bag(L([1, 2, 3, 12]), w, L([0, 2]), mode="max"), None),
    "bag_out_of_range_2d_mean": (lambda w: F.embedding_bag(L([[1, 2], [3, 10]]), w, mode="mean"), None),
    "bag_float_ids": (lambda w: F.embedding_bag(L([1.0, 2.0], w), w, L([0], w)), "Long, Int"),
    "bag_first_offset_not_zero": (lambda w: F.embedding_bag(L([1, 2, 3]), w, L([1, 2])), "offsets[0]"),
    "bag_offsets_decreasing": (lambda w: F.embedding_bag(L([1, 2, 3]), w, L([0, 2, 1])), None),
    "bag_last_offset_past_input": (lambda w: F.embedding_bag(L([1, 2, 3]), w, L([0, 4])), "offsets[-1]"),
    "bag_offsets_2d": (lambda w: torch.ops.aten._embedding_bag(w, L([1, 2, 3]), L([[0], [1]]))[0], "1D"),
    "bag_offsets_float": (lambda w: torch.ops.aten._embedding_bag(w, L([1, 2, 3], w), L([0.0, 1.0], w))[0], None),
    "bag_input_3d": (lambda w: torch.ops.aten._embedding_bag(w, L([[[1]]]), L([0]))[0], "2D"),
    "bag_mode_3": (lambda w: torch.ops.aten._embedding_bag(w, L([1, 2, 3]), L([0, 1]), False, 3)[0], "mode"),
    "bag_psw_wrong_size": (
        lambda w: torch.ops.aten._embedding_bag(w, L([1, 2, 3]), L([0, 1]), False, 0, False, torch.ones(2, device=w.device))[0],
        None,
    ),
    "bag_psw_with_max": (
        lambda w: torch.ops.aten._embedding_bag(w, L([1, 2, 3]), L([0, 1]), False, 2, False, torch.ones(3, device=w.device))[0],
        "per_sample_weights",
    ),
}

WRITE_CASES = {
    "index_put_out_of_range": (lambda w: w.__setitem__(L([1, 10]), 5.0), "out of"),
    "index_put_negative_out_of_range": (lambda w: w.__setitem__(L([2, -11]), 5.0), "out of"),
    "index_add_out_of_range": (lambda w: w.index_add_(0, L([1, 10], w), torch.ones(2, 8, device=w.device)), None),
    "index_copy_out_of_range": (lambda w: w.index_copy_(0, L([3, 10], w), torch.ones(2, 8, device=w.device)), "out of"),
    "copy_wrong_shape_into_slice": (lambda w: w[1:3].copy_(torch.ones(3, 8)), "size"),
    "masked_fill_wrong_mask": (lambda w: w.masked_fill_(torch.ones(3, 3, dtype=torch.bool, device=w.device), 1.0), "size"),
}


@pytest.fixture
def weight_and_ref(to_placement, lazy_table):
    """(recdev weight of the given placement, CPU copy of its contents). Table weights are lazy (a normal
    init rule, no row materialized), so that a half-done op would show in table_stats."""

    def make(kind):
        if kind == "table":
            w = lazy_table(10, 8)
        else:
            w = to_placement(torch.randn(10, 8, generator=torch.Generator().manual_seed(0)), "host")
        return w, w.cpu()

    return make


def _raised(fn, arg):
    try:
        fn(arg)
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return e
    return None


def _check_like_cpu(kind, op, fragment, weight_and_ref, expected_type=None):
    w, ref = weight_and_ref(kind)
    cpu_after = ref.clone()
    cpu_error = _raised(op, cpu_after)
    assert cpu_error is not None, "the CPU reference must raise for this case"
    expected_type = expected_type or type(cpu_error)
    if fragment is not None:
        assert fragment.lower() in str(cpu_error).lower(), f"fragment {fragment!r} not in CPU's {cpu_error!r}"
    before = table_stats(w) if is_table(w) else None
    with pytest.raises(Exception) as info:
        op(w)
    assert type(info.value) is expected_type, f"CPU raised {cpu_error!r}; recdev raised {info.value!r}"
    if fragment is not None:
        assert fragment.lower() in str(info.value).lower(), str(info.value)
    if before is not None:
        after = table_stats(w)
        assert after["rows"] == before["rows"], "an error must not materialize rows"
        assert after["writes"] == before["writes"], "an error must not write rows"
    if is_table(w):
        assert torch.equal(w.cpu(), ref), "an error must leave the table's contents unchanged"
    else:
        # host storage runs the CPU kernel in place: whatever CPU leaves behind (it may write part)
        assert torch.equal(w.cpu(), cpu_after)


@pytest.mark.parametrize("kind", ["host", "table"])
@pytest.mark.parametrize("case", sorted(LOOKUP_CASES))
def test_bad_lookup_input(kind, case, weight_and_ref):
    op, fragment = LOOKUP_CASES[case]
    _check_like_cpu(kind, op, fragment, weight_and_ref)


@pytest.mark.parametrize("kind", ["host", "table"])
@pytest.mark.parametrize("case", sorted(WRITE_CASES))
def test_bad_write_input(kind, case, weight_and_ref):
    op, fragment = WRITE_CASES[case]
    _check_like_cpu(kind, op, fragment, weight_and_ref)


@pytest.mark.parametrize("kind", ["host", "table"])
def test_negative_offsets_are_a_runtime_error(kind, weight_and_ref):
    # Malformed offsets are a RuntimeError. (CPU happens to report offsets [0, -1] as
    # "index out of range in self", an IndexError, from deep inside its kernel.)
    w, ref = weight_and_ref(kind)
    before = table_stats(w) if is_table(w) else None
    with pytest.raises((RuntimeError, IndexError)) as info:
        F.embedding_bag(L([1, 2, 3]), w, L([0, -1]))
    if kind == "table":
        assert type(info.value) is RuntimeError
        after = table_stats(w)
        assert (after["rows"], after["writes"]) == (before["rows"], before["writes"])
    assert torch.equal(w.cpu(), ref)


def test_include_last_offset_with_no_offsets(run_python):
    # CPU: RuntimeError "include_last_offset: number of offset should be at least 1". Run in a child
    # process: this must be an error, not a crash.
    proc = run_python(
        """
        import torch, torch_recdev
        import torch.nn.functional as F
        with torch_recdev.placement("table"):
            w = torch.empty(10, 8, device="recdev")
        w.normal_()
        for name, x in (("cpu", w.cpu()), ("table", w)):
            try:
                F.embedding_bag(torch.tensor([1, 2, 3]), x, torch.empty(0, dtype=torch.int64), include_last_offset=True)
                print(name, "NO ERROR", flush=True)
            except Exception as e:
                print(name, type(e).__name__, str(e).splitlines()[0], flush=True)
        print("rows", torch_recdev.table_stats(w)["rows"], flush=True)
        """
    )
    lines = proc.stdout.splitlines()
    assert any(l.startswith("cpu RuntimeError") for l in lines), proc.stdout + proc.stderr
    table = [l for l in lines if l.startswith("table ")]
    assert table, f"no result for the table (exit code {proc.returncode}): {proc.stderr[-2000:]}"
    assert table[0].startswith("table RuntimeError"), table[0]
    assert "include_last_offset" in table[0] or "offset" in table[0]
    assert "rows 0" in lines


# --- bad ids against a 10**10-row table: no row is touched -------------------------------------------


@pytest.mark.parametrize(
    "op, expected",
    [
        (lambda w: F.embedding(L([5, 10**10]), w), IndexError),
        (lambda w: F.embedding(L([5, -1]), w), IndexError),
        (lambda w: w.index_select(0, L([5, 10**10 + 3])), IndexError),
        (lambda w: w[L([5, 10**10])], IndexError),
        (lambda w: F.embedding_bag(L([5, 6, 10**10]), w, L([0, 2]), mode="sum"), None),
        (lambda w: F.embedding_bag(L([5, 6, 7]), w, L([0, 4])), RuntimeError),
        (lambda w: F.embedding_bag(L([5, 6, 7]), w, L([0, 2, 1]), mode="max"), RuntimeError),
    ],
    ids=["embedding", "embedding_negative", "index_select", "getitem", "bag_id", "bag_offsets", "bag_decreasing"],
)
def test_bad_input_on_huge_table_touches_nothing(op, expected, huge_table):
    w = huge_table(64)
    F.embedding(L([1, 2]), w)
    before = table_stats(w)
    # embedding_bag's out-of-range id: whichever type CPU raises for it (checked against CPU above)
    with pytest.raises((IndexError, RuntimeError)) as info:
        op(w)
    if expected is not None:
        assert type(info.value) is expected
    after = table_stats(w)
    assert after["rows"] == before["rows"] == 2
    assert after["writes"] == before["writes"]
    # row 5 was not materialized by the refused call
    assert after["rows"] == 2


# --- a table whose byte size cannot be addressed -----------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.empty(10**15, 1024, device="recdev"),
        lambda: torch.nn.Embedding(10**14, 1024, device="recdev"),
        lambda: torch.zeros(2**40, 2**20, dtype=torch.int8, device="recdev"),
    ],
    ids=["empty", "nn.Embedding", "zeros_int8"],
)
def test_unaddressable_table_is_a_clear_error(make):
    with pytest.raises(RuntimeError) as info:
        make()
    message = str(info.value)
    assert "cannot be addressed" in message or "overflow" in message, message
    assert "allocate memory" not in message


def test_unaddressable_1d_table_inside_placement():
    with torch_recdev.placement("table"):
        with pytest.raises(RuntimeError, match="cannot be addressed"):
            torch.empty(2**60, dtype=torch.int8, device="recdev")


def test_failed_table_creations_leak_no_address_space(huge_table):
    # every live table holds a range of the opaque address space; a refused creation must give its
    # back (there are only a few thousand ranges)
    for _ in range(3000):
        with pytest.raises(RuntimeError):
            torch.empty(10**15, 1024, device="recdev")
    tables = [huge_table(128) for _ in range(8)]
    assert all(is_table(t) for t in tables)
    out = F.embedding(L([1, 10**10 - 1]), tables[-1])
    assert out.shape == (2, 128)


@pytest.mark.parametrize("kind", ["host", "table"])
@pytest.mark.parametrize("psw_dtype", [torch.float64, torch.float16], ids=str)
def test_per_sample_weights_of_another_dtype_than_the_weight_fail_as_on_cpu(kind, psw_dtype, weight_and_ref):
    def op(w):
        psw = torch.ones(3, dtype=psw_dtype, device=w.device)
        return F.embedding_bag(L([1, 2, 3]), w, L([0, 1]), mode="sum", per_sample_weights=psw)

    cpu_message = str(_raised(op, torch.zeros(10, 8)))
    assert "does not equal" in cpu_message  # RuntimeError: weight and per_sample_weights types differ
    _check_like_cpu(kind, op, cpu_message, weight_and_ref)  # the whole message, word for word
