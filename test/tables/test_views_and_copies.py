"""Views of tables, copies to and from the CPU by row ranges, the fallback on table views, and the
max_fallback_bytes limit (DESIGN.md, "Memory model": table storage, Fallback)."""

import ctypes
import io
import time

import pytest
import torch
import torch.nn.functional as F

import torch_recdev
from torch_recdev import is_table, max_fallback_bytes, set_max_fallback_bytes, table_stats

OPAQUE_BEGIN = 1 << 55
OPAQUE_END = 1 << 56


def _counts(t):
    s = table_stats(t)
    return s["rows"], s["reads"], s["writes"]


@pytest.fixture
def small(to_placement):
    """A 10 x 8 float32 table and its CPU copy."""
    ref = torch.randn(10, 8, generator=torch.Generator().manual_seed(0))
    return to_placement(ref, "table"), ref.clone()


# --- addresses ---------------------------------------------------------------------------------------


def test_table_addresses_are_opaque_and_disjoint(huge_table, small):
    a = huge_table(128)
    b = huge_table(128)
    w, _ = small
    for t in (a, b, w):
        assert OPAQUE_BEGIN <= t.data_ptr() < OPAQUE_END
    # a 10**10 x 128 float32 table spans 5.12e12 bytes of address space; no two tables overlap
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in (a, b, w))
    for (_, end), (begin, _) in zip(spans, spans[1:]):
        assert end <= begin
    assert spans[-1][1] <= OPAQUE_END


def test_view_addresses_follow_the_storage(small):
    w, _ = small
    row_bytes = 8 * 4
    assert w[3].data_ptr() == w.data_ptr() + 3 * row_bytes
    assert w[2:5].data_ptr() == w.data_ptr() + 2 * row_bytes
    assert w[:, 5].data_ptr() == w.data_ptr() + 5 * 4
    assert w.view(-1)[13:].data_ptr() == w.data_ptr() + 13 * 4
    assert w[2:5].untyped_storage().data_ptr() == w.untyped_storage().data_ptr()


def test_host_storage_address_is_a_real_pointer():
    t = torch.arange(4, dtype=torch.int32, device="recdev")
    assert not is_table(t)
    assert not (OPAQUE_BEGIN <= t.data_ptr() < OPAQUE_END)
    assert ctypes.string_at(t.data_ptr(), 16) == torch.arange(4, dtype=torch.int32).numpy().tobytes()


def test_dereferencing_a_table_address_crashes_at_once(run_python):
    proc = run_python(
        """
        import ctypes, torch, torch_recdev
        with torch_recdev.placement("table"):
            w = torch.ones(4, 8, device="recdev")
        assert torch_recdev.is_table(w)
        print("BEFORE", flush=True)
        data = ctypes.string_at(w.data_ptr(), 4)
        print("READ", data, flush=True)
        """
    )
    assert "BEFORE" in proc.stdout, proc.stderr
    assert "READ" not in proc.stdout
    assert proc.returncode in (-11, -7), (proc.returncode, proc.stderr[-2000:])  # SIGSEGV / SIGBUS


# --- views alias -------------------------------------------------------------------------------------


def test_write_through_a_row_view(small):
    w, ref = small
    _, _, writes = _counts(w)
    w[3] = 7
    ref[3] = 7
    assert torch.equal(w[3].cpu(), torch.full((8,), 7.0))
    assert torch.equal(F.embedding(torch.tensor([3]), w).cpu()[0], torch.full((8,), 7.0))
    assert table_stats(w)["writes"] - writes == 1
    assert torch.equal(w.cpu(), ref)


def test_views_are_tables_and_share_storage(small):
    w, ref = small
    for view in (w[3], w[2:5], w[:, 1], w.t(), w.view(-1), w.view(5, 16), w.as_strided((3, 2), (8, 1), 4), w[::2]):
        assert is_table(view)
    v = w.view(5, 16)
    v[1, 0] = -1.0
    ref.view(5, 16)[1, 0] = -1.0
    w.t()[2, 4] = 11.0
    ref.t()[2, 4] = 11.0
    w.view(-1)[5] = 3.0
    ref.view(-1)[5] = 3.0
    w[::2][1] = 0.5
    ref[::2][1] = 0.5
    assert torch.equal(w.cpu(), ref)


def test_slices_to_cpu(small):
    w, ref = small
    for view, expected in (
        (w[2:5], ref[2:5]),
        (w[9:], ref[9:]),
        (w[:, 1], ref[:, 1]),
        (w[:, 2:5], ref[:, 2:5]),
        (w[1:7:3], ref[1:7:3]),
        (w.t(), ref.t()),
        (w[4, 3], ref[4, 3]),
        (w.as_strided((3, 2), (8, 1), 4), ref.as_strided((3, 2), (8, 1), 4)),
        (w[5:5], ref[5:5]),
        (w[-1], ref[-1]),
        (w.view(torch.int32), ref.view(torch.int32)),
        (w.narrow(0, 2, 3), ref.narrow(0, 2, 3)),
        (w[0:1].expand(4, 8), ref[0:1].expand(4, 8)),
        (w.unsqueeze(0), ref.unsqueeze(0)),
        (w.reshape(4, 20), ref.reshape(4, 20)),
        (w.view(-1).unfold(0, 5, 3), ref.view(-1).unfold(0, 5, 3)),
        (w[:8].diagonal(), ref[:8].diagonal()),
        (w.flip(0), ref.flip(0)),
        (w.t().contiguous(), ref.t().contiguous()),
    ):
        got = view.cpu()
        assert got.device.type == "cpu"
        assert torch.equal(got, expected)
    assert torch.equal(w.to("cpu"), ref)
    assert w[4, 3].item() == ref[4, 3].item()
    assert w[2:4].tolist() == ref[2:4].tolist()


def test_copy_into_slices(small, to_placement):
    w, ref = small
    w[5:7].copy_(torch.full((2, 8), 3.0))
    ref[5:7] = 3.0
    w[0:2].copy_(torch.arange(16.0).view(2, 8).to("recdev"))  # from host storage
    ref[0:2] = torch.arange(16.0).view(2, 8)
    other = to_placement(torch.randn(10, 8, generator=torch.Generator().manual_seed(1)), "table")
    w[7:9].copy_(other[1:3])  # table to table
    ref[7:9] = other[1:3].cpu()
    w[:, 6].copy_(torch.arange(10.0))  # a strided column
    ref[:, 6] = torch.arange(10.0)
    w[2:4].copy_(torch.ones(2, 8, dtype=torch.float64))  # with a dtype conversion
    ref[2:4] = 1.0
    assert torch.equal(w.cpu(), ref)


def test_copies_move_only_the_rows_they_cover(huge_table):
    w = huge_table(64)
    first = 3_000_000_000
    before = _counts(w)
    got = w[first : first + 3].cpu()
    rows, reads, writes = _counts(w)
    assert got.shape == (3, 64)
    assert reads - before[1] == 3
    assert rows == before[0]  # reading a slice computes the init value; it does not materialize
    assert writes == before[2]
    w[first + 10 : first + 12].copy_(torch.ones(2, 64))
    rows2, _, writes2 = _counts(w)
    assert rows2 - rows == 2
    assert writes2 - writes == 2
    assert torch.equal(w[first + 10 : first + 12].cpu(), torch.ones(2, 64))
    assert torch.equal(w[first : first + 3].cpu(), got)


def test_whole_table_copies(small, to_placement):
    w, ref = small
    host = torch.empty(10, 8, device="recdev")
    host.copy_(w)
    assert not is_table(host) and torch.equal(host.cpu(), ref)
    with torch_recdev.placement("table"):
        other = torch.empty(10, 8, device="recdev")
    other.copy_(w)
    assert is_table(other) and torch.equal(other.cpu(), ref)
    assert torch.equal(w.clone().cpu(), ref)
    assert torch.equal(w.to("recdev").cpu(), ref)
    assert torch.equal(w.double().cpu(), ref.double())
    assert torch.equal(w.cpu().to("recdev").cpu(), ref)


def test_whole_table_copy_of_many_rows_is_a_separate_table(lazy_table):
    # 150,000 rows over 64 sub-shards: many arena chunks each, and a copy on several threads. The copy
    # is whole indexes and arenas (Table::snapshot), so check that it is complete and shares nothing.
    rows, dim = 200_000, 4
    src = lazy_table(rows, dim)
    touched = torch.randperm(rows, generator=torch.Generator().manual_seed(0))[:150_000]
    values = torch.randn(len(touched), dim)
    torch_recdev.ops.emb_write(src, touched, values)
    dst = lazy_table(rows, dim)
    dst.copy_(src)
    assert table_stats(dst)["rows"] == 150_000
    assert torch.equal(dst.cpu(), src.cpu())
    before = src.cpu()
    torch_recdev.ops.emb_write(dst, touched[:10], torch.zeros(10, dim))
    torch_recdev.ops.emb_delete(dst, touched[10:20])
    untouched = torch.ones(rows, dtype=torch.bool)
    untouched[touched] = False
    new_rows = untouched.nonzero().flatten()[:1000]
    F.embedding(new_rows, dst)  # inserts into the copied indexes
    assert torch.equal(src.cpu(), before) and table_stats(src)["rows"] == 150_000
    assert table_stats(dst)["rows"] == 150_000 - 10 + 1000
    assert torch.equal(dst[touched[:10]].cpu(), torch.zeros(10, dim))
    assert torch.equal(dst[touched[20:]].cpu(), values[20:])
    assert not torch_recdev.ops.emb_exists(dst, touched[10:20]).any()


# --- the fallback on table views ---------------------------------------------------------------------


def test_fallback_ops_on_table_views_match_cpu(small):
    w, ref = small
    cases = [
        (lambda t: t[2:5] * 2, True),
        (lambda t: t.sum(), False),
        (lambda t: t.mean(0), False),
        (lambda t: t[1:3] + t[4:6], True),
        (lambda t: torch.matmul(t[0:4], t[4:8].t()), False),
        (lambda t: t[:, 3].max(), True),
        (lambda t: torch.relu(t.t()[1:3]), True),
        (lambda t: t[2:5].clone(), True),
        (lambda t: torch.cat([t[0:2], t[8:10]]), True),
        (lambda t: t.view(-1)[7:20].cumsum(0), False),
    ]
    for i, (op, exact) in enumerate(cases):
        got = op(w)
        expected = op(ref)
        assert got.device.type == "recdev", i
        if exact:
            assert torch.equal(got.cpu(), expected), i
        else:
            torch.testing.assert_close(got.cpu(), expected, msg=f"case {i}")


def test_inplace_fallback_ops_on_table_views(small):
    w, ref = small
    w[:, 1].mul_(2)
    ref[:, 1].mul_(2)
    w[2:4].add_(1.5)
    ref[2:4].add_(1.5)
    w.t()[3].neg_()
    ref.t()[3].neg_()
    w[6:8].clamp_(min=0)
    ref[6:8].clamp_(min=0)
    torch.add(w[0:2], w[8:10], out=w[4:6])
    torch.add(ref[0:2], ref[8:10], out=ref[4:6])
    assert torch.equal(w.cpu(), ref)


def test_fallback_reads_only_the_covered_rows(huge_table):
    w = huge_table(32)
    rows, reads, writes = _counts(w)
    out = w[10**9 : 10**9 + 3] * 2
    assert out.shape == (3, 32)
    assert not is_table(out)
    assert _counts(w) == (rows, reads + 3, writes)
    w[500:504].mul_(3)
    rows2, reads2, writes2 = _counts(w)
    assert (rows2, writes2) == (rows + 4, writes + 4)
    # the 4 covered rows are read in (today twice: once into the window, once more), never others
    assert 4 <= reads2 - (reads + 3) <= 8
    total = w[:5].sum()
    assert torch.allclose(total.cpu(), w[:5].cpu().sum())


# --- the max_fallback_bytes limit --------------------------------------------------------------------


def test_max_fallback_bytes_setting():
    assert max_fallback_bytes() > 0
    set_max_fallback_bytes(12345)
    assert max_fallback_bytes() == 12345
    with pytest.raises(ValueError):
        set_max_fallback_bytes(-1)
    assert max_fallback_bytes() == 12345


def test_fallback_limit_refuses_big_views(huge_table):
    w = huge_table(128)  # rows of 512 bytes
    set_max_fallback_bytes(4096)
    before = _counts(w)
    with pytest.raises(RuntimeError, match="max_fallback_bytes") as info:
        w[:100] * 2
    assert "mul" in str(info.value)
    with pytest.raises(RuntimeError, match="max_fallback_bytes"):
        w[:100].sum()
    with pytest.raises(RuntimeError, match="max_fallback_bytes"):
        w[:100].cpu()
    with pytest.raises(RuntimeError, match="max_fallback_bytes"):
        w[:100].copy_(torch.zeros(100, 128))
    with pytest.raises(RuntimeError, match="max_fallback_bytes"):
        w[:100].fill_(1.0)
    assert _counts(w) == before, "a refused op must neither read nor write the table"
    # the limit is inclusive: 8 rows of 512 bytes move, 9 do not
    assert (w[:8] * 2).shape == (8, 128)
    with pytest.raises(RuntimeError, match="max_fallback_bytes"):
        w[:9] * 2
    # store-side lookups are not limited by it: they move only the rows they gather
    out = F.embedding(torch.arange(50), w)
    assert out.shape == (50, 128)


def test_fallback_limit_on_small_table_whole_ops(small):
    w, ref = small  # 320 bytes
    set_max_fallback_bytes(319)
    with pytest.raises(RuntimeError, match="max_fallback_bytes"):
        w.sum()
    set_max_fallback_bytes(320)
    assert torch.allclose(w.sum().cpu(), ref.sum())


def test_cpu_of_huge_table_refuses_before_allocating(huge_table):
    w = huge_table(128)
    for copy in (lambda: w.cpu(), lambda: w.to("cpu"), lambda: w.sum(), lambda: w * 2):
        start = time.perf_counter()
        with pytest.raises(RuntimeError, match="max_fallback_bytes") as info:
            copy()
        assert time.perf_counter() - start < 1.0
        assert "allocate" not in str(info.value)
    assert table_stats(w)["rows"] == 0


def test_clone_of_huge_table_copies_the_table_not_its_rows(huge_table):
    # table to table moves nothing to the CPU: the clone gets the init rule and the rows touched
    w = huge_table(128)
    F.embedding(torch.tensor([5, 10**10 - 1]), w)
    start = time.perf_counter()
    clone = w.clone()
    assert time.perf_counter() - start < 1.0
    assert is_table(clone) and table_stats(clone)["rows"] == 2
    probe = torch.tensor([5, 6, 10**10 - 1])
    assert torch.equal(F.embedding(probe, clone).cpu(), F.embedding(probe, w).cpu())


def test_torch_save_of_huge_table_writes_its_rule_not_its_rows(huge_table):
    # a table pickles as its init rule plus its materialized rows (docs/tables.md, "Saving and
    # loading"), never through UntypedStorage.cpu(), which would allocate 5 TB on the CPU
    w = huge_table(128)
    buffer = io.BytesIO()
    start = time.perf_counter()
    torch.save(w, buffer)
    assert time.perf_counter() - start < 1.0
    assert len(buffer.getvalue()) < 10_000
    assert table_stats(w)["rows"] == 0


def test_torch_save_of_small_table_roundtrips(small):
    w, ref = small
    buffer = io.BytesIO()
    torch.save(w, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, map_location="cpu")
    assert torch.equal(loaded, ref)


def test_whole_table_copy_resolves_conjugate_and_negative_bits(to_placement):
    values = torch.randn(6, 4, dtype=torch.complex64)
    src = to_placement(values, "table")
    for view, expected in ((src.conj(), values.conj()), (torch._neg_view(src), -values)):
        dst = to_placement(torch.zeros(6, 4, dtype=torch.complex64), "table")
        dst.copy_(view)
        assert torch.equal(dst.cpu(), expected.resolve_conj().resolve_neg())
