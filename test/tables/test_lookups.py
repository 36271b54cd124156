"""Store-side lookups (embedding, embedding_bag, index_select on dim 0, weight[ids]) against the CPU
result on weight.cpu(), for host and table placement (DESIGN.md, "Memory model": Embedding ops)."""


import pytest
import torch
import torch.nn.functional as F

import torch_recdev
from torch_recdev import is_table

PLACEMENTS = ["host", "table"]
# where the ids live: a CPU tensor, recdev host storage, or recdev table storage
ID_KINDS = ["cpu", "recdev", "recdev_table"]


def _ids_as(ids, kind):
    if kind == "cpu":
        return ids
    if kind == "recdev":
        with torch_recdev.placement("host"):
            out = ids.to("recdev")
        assert not is_table(out)
        return out
    with torch_recdev.placement("table"):
        out = torch.empty(ids.shape, dtype=ids.dtype, device="recdev")
    out.copy_(ids)
    assert is_table(out) == (ids.numel() > 0)  # an empty tensor holds no bytes, so no table
    return out


@pytest.fixture
def weight(to_placement):
    """weight(kind, rows=20, dim=8, dtype=float32) -> (recdev weight, its CPU copy)."""

    def make(kind, rows=20, dim=8, dtype=torch.float32, seed=0):
        g = torch.Generator().manual_seed(seed)
        ref = torch.randn(rows, dim, generator=g)
        ref = (ref * 10).to(dtype) if not dtype.is_floating_point else ref.to(dtype)
        w = to_placement(ref, kind)
        return w, w.cpu()

    return make


def _check_out(out, expected, exact=True):
    assert out.device.type == "recdev"
    assert not is_table(out), "lookup outputs are host storage"
    assert out.shape == expected.shape and out.dtype == expected.dtype
    got = out.cpu()
    if exact:
        assert torch.equal(got, expected)
    else:
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


# --- embedding ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", PLACEMENTS)
@pytest.mark.parametrize("ids_kind", ID_KINDS)
def test_embedding(kind, ids_kind, weight):
    w, ref = weight(kind)
    for ids in (torch.tensor([3, 1, 19, 3, 0]), torch.tensor([[1, 2, 3], [19, 0, 0]]), torch.tensor(7)):
        _check_out(F.embedding(_ids_as(ids, ids_kind), w), F.embedding(ids, ref))


@pytest.mark.parametrize("kind", PLACEMENTS)
def test_embedding_padding_idx_and_module(kind, weight):
    w, ref = weight(kind)
    ids = torch.tensor([[2, 5, 2], [0, 19, 5]])
    for padding_idx in (2, -1):
        _check_out(F.embedding(ids, w, padding_idx=padding_idx), F.embedding(ids, ref, padding_idx=padding_idx))
    emb = torch.nn.Embedding.from_pretrained(w, freeze=True, padding_idx=5)
    _check_out(emb(ids), F.embedding(ids, ref, padding_idx=5))


@pytest.mark.parametrize("kind", PLACEMENTS)
def test_embedding_int32_ids_and_noncontiguous_ids(kind, weight):
    w, ref = weight(kind)
    ids = torch.tensor([[4, 1], [9, 9], [0, 19]])
    _check_out(F.embedding(ids.int(), w), F.embedding(ids, ref))
    _check_out(F.embedding(ids.t(), w), F.embedding(ids.t(), ref))
    _check_out(F.embedding(torch.arange(20)[::3], w), F.embedding(torch.arange(20)[::3], ref))


@pytest.mark.parametrize("kind", PLACEMENTS)
def test_embedding_empty_ids(kind, weight):
    w, ref = weight(kind)
    ids = torch.empty(0, dtype=torch.int64)
    _check_out(F.embedding(ids, w), F.embedding(ids, ref))
    ids = torch.empty(3, 0, dtype=torch.int64)
    _check_out(F.embedding(ids, w), F.embedding(ids, ref))


@pytest.mark.parametrize("kind", PLACEMENTS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_embedding_other_float_dtypes(kind, dtype, weight):
    w, ref = weight(kind, dtype=dtype)
    ids = torch.tensor([[5, 0], [19, 5]])
    _check_out(F.embedding(ids, w), F.embedding(ids, ref))


@pytest.mark.parametrize("kind", PLACEMENTS)
def test_embedding_wide_and_odd_rows(kind, weight):
    for dim, dtype in ((1, torch.float32), (3, torch.float32), (129, torch.float32), (3, torch.float16), (1, torch.float16)):
        w, ref = weight(kind, rows=50, dim=dim, dtype=dtype)
        ids = torch.tensor([49, 0, 17, 17])
        _check_out(F.embedding(ids, w), F.embedding(ids, ref))
        _check_out(w[ids], ref[ids])
        _check_out(w.index_select(0, ids), ref.index_select(0, ids))


def test_lookups_into_outputs_of_many_mib(to_placement, lazy_table):
    # Outputs from 4 MiB up are written with streaming stores (csrc/store/row_copier.h) as wide as
    # the CPU and the rows' alignment allow (rows of 512, 544, 528 bytes: 64-, 32-, 16-byte stores),
    # with memcpy otherwise (516 bytes); rows not yet materialized go a second way.
    # Each checked lookup follows one of another table: the output's recycled memory then holds
    # other rows, so a row copied short shows. The expected rows come from the CPU tensors the
    # tables were copied from, not through any lookup path.
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 20_000, (20_000,), generator=g)
    for dim in (128, 136, 132, 129):  # 10 MiB of rows: 5 MiB per thread
        ref = torch.randn(20_000, dim, generator=g)
        w, other = to_placement(ref, "table"), to_placement(-ref, "table")
        F.embedding(ids, other)
        _check_out(F.embedding(ids, w), ref[ids])
        other[ids]
        _check_out(w[ids], ref[ids])
    lazy = lazy_table(20_000, 128)
    lazy[ids[: ids.numel() // 2]].sum()  # materializes about half of the rows looked up below
    # init values read without materializing, in pieces too small for streaming stores
    expected = torch.cat([lazy[start : start + 4000].cpu() for start in range(0, 20_000, 4000)])[ids]
    materialized = torch_recdev.table_stats(lazy)["rows"]
    other[ids]
    assert torch.equal(lazy[ids].cpu(), expected)
    assert torch_recdev.table_stats(lazy)["rows"] > materialized


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_pooled_outputs_of_many_mib_match_small_ones_bit_for_bit(to_placement, dtype):
    # Sum bags pooled into an output of 4 MiB or more store their sums with streaming stores
    # (PooledOutput::streams) where each output row starts at a multiple of 64 bytes: dims 128 and 96
    # here in every dtype; not dim 100 (400 and 200 bytes), whose rows are stored as usual. Each bag's
    # sum is its own, so the same bags pooled a few at a time (outputs of under 1 MiB, never
    # streamed) must give the same bits. A lookup into another table first leaves other sums in the
    # output's recycled memory, so a sum not stored shows.
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 20_000, (60_000,), generator=g)
    for dim in (128, 96, 100):
        ref = torch.randn(20_000, dim, generator=g).to(dtype)
        w, other = to_placement(ref, "table"), to_placement(-ref, "table")
        for offsets in (torch.arange(60_000), torch.arange(0, 60_000, 2)):  # bags of 1 and of 2
            for psw in (None, torch.rand(60_000, generator=g).to(dtype)):
                F.embedding_bag(ids, other, offsets, mode="sum", per_sample_weights=psw)
                whole = F.embedding_bag(ids, w, offsets, mode="sum", per_sample_weights=psw).cpu()
                assert whole.numel() * whole.element_size() >= 4 << 20
                bounds = offsets.tolist() + [60_000]
                pieces = []
                for first in range(0, len(offsets), 1000):
                    last = min(first + 1000, len(offsets))
                    begin, end = bounds[first], bounds[last]
                    pieces.append(F.embedding_bag(ids[begin:end], w, offsets[first:last] - begin, mode="sum",
                                                  per_sample_weights=None if psw is None else psw[begin:end]).cpu())
                assert torch.equal(whole, torch.cat(pieces)), (dim, len(offsets), psw is None)
                expected = F.embedding_bag(ids, ref, offsets, mode="sum", per_sample_weights=psw)
                torch.testing.assert_close(whole, expected, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("kind", PLACEMENTS)
def test_embedding_on_a_row_slice_of_the_weight(kind, weight):
    w, ref = weight(kind)
    ids = torch.tensor([0, 4, 1])
    _check_out(F.embedding(ids, w[5:10]), F.embedding(ids, ref[5:10]))
    _check_out(F.embedding(ids, w[:, 2:6]), F.embedding(ids, ref[:, 2:6]))


@pytest.mark.parametrize("kind", PLACEMENTS)
def test_embedding_with_requires_grad_weight_forward(kind, weight):
    w, ref = weight(kind)
    w.requires_grad_(True)
    ids = torch.tensor([1, 2, 2])
    out = F.embedding(ids, w)
    assert out.requires_grad
    _check_out(out.detach(), F.embedding(ids, ref))


# --- embedding_bag -----------------------------------------------------------------------------------

_BAG_IDS = torch.tensor([1, 2, 3, 4, 5, 2, 7, 19, 0, 2])
_BAG_OFFSETS = torch.tensor([0, 2, 2, 5, 9])  # bags: [1,2] [] [3,4,5] [2,7,19,0] [2]


@pytest.mark.parametrize("kind", PLACEMENTS)
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("include_last_offset", [False, True])
@pytest.mark.parametrize("padding_idx", [None, 2, -18])
def test_embedding_bag_modes_and_options(kind, mode, include_last_offset, padding_idx, weight):
    w, ref = weight(kind)
    offsets = _BAG_OFFSETS
    if include_last_offset:
        offsets = torch.cat([offsets, torch.tensor([len(_BAG_IDS)])])
    kwargs = dict(mode=mode, include_last_offset=include_last_offset, padding_idx=padding_idx)
    expected = F.embedding_bag(_BAG_IDS, ref, offsets, **kwargs)
    _check_out(F.embedding_bag(_BAG_IDS, w, offsets, **kwargs), expected, exact=False)


@pytest.mark.parametrize("kind", PLACEMENTS)
@pytest.mark.parametrize("ids_kind", ID_KINDS)
def test_embedding_bag_ids_and_offsets_placement(kind, ids_kind, weight):
    w, ref = weight(kind)
    for mode in ("sum", "max"):
        expected = F.embedding_bag(_BAG_IDS, ref, _BAG_OFFSETS, mode=mode)
        got = F.embedding_bag(_ids_as(_BAG_IDS, ids_kind), w, _ids_as(_BAG_OFFSETS, ids_kind), mode=mode)
        _check_out(got, expected, exact=False)


@pytest.mark.parametrize("kind", PLACEMENTS)
@pytest.mark.parametrize("padding_idx", [None, 2])
@pytest.mark.parametrize("include_last_offset", [False, True])
@pytest.mark.parametrize("psw_kind", ["recdev", "recdev_table"])
def test_embedding_bag_per_sample_weights(kind, padding_idx, include_last_offset, psw_kind, weight):
    w, ref = weight(kind)
    psw = torch.rand(len(_BAG_IDS), generator=torch.Generator().manual_seed(1))
    offsets = _BAG_OFFSETS
    if include_last_offset:
        offsets = torch.cat([offsets, torch.tensor([len(_BAG_IDS)])])
    kwargs = dict(mode="sum", include_last_offset=include_last_offset, padding_idx=padding_idx)
    expected = F.embedding_bag(_BAG_IDS, ref, offsets, per_sample_weights=psw, **kwargs)
    got = F.embedding_bag(_BAG_IDS, w, offsets, per_sample_weights=_ids_as(psw, psw_kind), **kwargs)
    _check_out(got, expected, exact=False)


@pytest.mark.parametrize("kind", PLACEMENTS)
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 3])
def test_embedding_bag_2d_input(kind, mode, padding_idx, weight):
    w, ref = weight(kind)
    ids = torch.tensor([[1, 3, 3, 19], [0, 0, 5, 3], [3, 3, 3, 3]])
    expected = F.embedding_bag(ids, ref, mode=mode, padding_idx=padding_idx)
    _check_out(F.embedding_bag(ids, w, mode=mode, padding_idx=padding_idx), expected, exact=False)
    psw = torch.rand(3, 4, generator=torch.Generator().manual_seed(2))
    if mode == "sum":
        expected = F.embedding_bag(ids, ref, mode=mode, per_sample_weights=psw, padding_idx=padding_idx)
        got = F.embedding_bag(ids, w, mode=mode, per_sample_weights=psw.to("recdev"), padding_idx=padding_idx)
        _check_out(got, expected, exact=False)


@pytest.mark.parametrize("kind", PLACEMENTS)
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_module(kind, mode, weight):
    w, ref = weight(kind)
    bag = torch.nn.EmbeddingBag.from_pretrained(w, freeze=True, mode=mode)
    cpu_bag = torch.nn.EmbeddingBag.from_pretrained(ref, freeze=True, mode=mode)
    _check_out(bag(_BAG_IDS, _BAG_OFFSETS), cpu_bag(_BAG_IDS, _BAG_OFFSETS), exact=False)


@pytest.mark.parametrize("kind", PLACEMENTS)
@pytest.mark.parametrize("index_dtype, offset_dtype", [(torch.int32, torch.int32), (torch.int32, torch.int64), (torch.int64, torch.int32)])
def test_embedding_bag_int32_ids_and_offsets(kind, index_dtype, offset_dtype, weight):
    w, ref = weight(kind)
    for mode in ("sum", "mean", "max"):
        expected = F.embedding_bag(_BAG_IDS.to(index_dtype), ref, _BAG_OFFSETS.to(offset_dtype), mode=mode)
        got = F.embedding_bag(_BAG_IDS.to(index_dtype), w, _BAG_OFFSETS.to(offset_dtype), mode=mode)
        _check_out(got, expected, exact=False)


@pytest.mark.parametrize("kind", PLACEMENTS)
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_empty_input(kind, mode, weight):
    w, ref = weight(kind)
    ids = torch.empty(0, dtype=torch.int64)
    for offsets in (torch.tensor([0]), torch.tensor([0, 0, 0])):
        expected = F.embedding_bag(ids, ref, offsets, mode=mode)
        _check_out(F.embedding_bag(ids, w, offsets, mode=mode), expected)


@pytest.mark.parametrize("kind", PLACEMENTS)
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_all_padding_bag(kind, mode, weight):
    w, ref = weight(kind)
    ids = torch.tensor([4, 4, 1, 4])
    offsets = torch.tensor([0, 2])  # the first bag is padding only
    expected = F.embedding_bag(ids, ref, offsets, mode=mode, padding_idx=4)
    _check_out(F.embedding_bag(ids, w, offsets, mode=mode, padding_idx=4), expected, exact=False)


@pytest.mark.parametrize("kind", PLACEMENTS)
def test_embedding_bag_larger_random(kind, weight):
    w, ref = weight(kind, rows=1000, dim=128, seed=3)
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 1000, (4000,), generator=g)
    offsets = torch.cat([torch.tensor([0]), torch.randint(0, 4000, (255,), generator=g).sort().values])
    psw = torch.rand(4000, generator=g)
    for mode in ("sum", "mean", "max"):
        _check_out(F.embedding_bag(ids, w, offsets, mode=mode), F.embedding_bag(ids, ref, offsets, mode=mode), exact=False)
    _check_out(
        F.embedding_bag(ids, w, offsets, mode="sum", per_sample_weights=psw.to("recdev")),
        F.embedding_bag(ids, ref, offsets, mode="sum", per_sample_weights=psw),
        exact=False,
    )


def test_lookups_split_into_tasks_match_one_thread_and_cpu(to_placement):
    # A batch goes to the intra-op threads in tasks of 8,192 ids (run_in_tasks in
    # csrc/kernels/table_rows.h), each thread taking the next as it finishes one: the tasks' order
    # then changes from call to call. 20,003 ids make three tasks, the last a short one, and bags of
    # random sizes put task boundaries inside runs of bags; every result must be the one a single
    # thread gives, bit for bit, and CPU's.
    g = torch.Generator().manual_seed(5)
    ref = torch.randn(30_000, 64, generator=g)
    w = to_placement(ref, "table")
    ids = torch.randint(0, 30_000, (20_003,), generator=g)
    offsets = torch.cat([torch.tensor([0]), torch.randint(0, 20_003, (4_999,), generator=g).sort().values])
    psw = torch.rand(20_003, generator=g)
    calls = {
        "embedding": lambda: F.embedding(ids, w),
        "sum": lambda: F.embedding_bag(ids, w, offsets, mode="sum"),
        "mean": lambda: F.embedding_bag(ids, w, offsets, mode="mean"),
        "max": lambda: F.embedding_bag(ids, w, offsets, mode="max"),
        "weighted": lambda: F.embedding_bag(ids, w, offsets, mode="sum", per_sample_weights=psw),
    }
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one_thread = {name: call().cpu() for name, call in calls.items()}
        torch.set_num_threads(2)
        for _ in range(3):
            for name, call in calls.items():
                assert torch.equal(call().cpu(), one_thread[name]), name
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(one_thread["embedding"], F.embedding(ids, ref), rtol=0, atol=0)
    for mode in ("sum", "mean", "max"):
        torch.testing.assert_close(one_thread[mode], F.embedding_bag(ids, ref, offsets, mode=mode), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        one_thread["weighted"], F.embedding_bag(ids, ref, offsets, mode="sum", per_sample_weights=psw), rtol=1e-5, atol=1e-5
    )


# --- index_select and weight[ids] --------------------------------------------------------------------


@pytest.mark.parametrize("kind", PLACEMENTS)
@pytest.mark.parametrize("ids_kind", ID_KINDS)
def test_index_select_dim0(kind, ids_kind, weight):
    w, ref = weight(kind)
    for ids in (torch.tensor([4, 4, 7, 0, 19]), torch.tensor([], dtype=torch.int64), torch.tensor([3]).int()):
        _check_out(w.index_select(0, _ids_as(ids, ids_kind)), ref.index_select(0, ids))
        _check_out(torch.index_select(w, 0, _ids_as(ids, ids_kind)), ref.index_select(0, ids))


@pytest.mark.parametrize("kind", PLACEMENTS)
def test_index_select_with_0d_index(kind, weight):
    # CPU treats a 0-d index as a 1-element vector: the result keeps dim 0
    w, ref = weight(kind)
    ids = torch.tensor(5)
    _check_out(w.index_select(0, ids), ref.index_select(0, ids))


@pytest.mark.parametrize("kind", PLACEMENTS)
def test_index_select_other_dims_and_views(kind, weight):
    w, ref = weight(kind)
    ids = torch.tensor([1, 0, 7, 1])
    _check_out(w.index_select(1, ids), ref.index_select(1, ids))
    _check_out(w.index_select(-1, ids), ref.index_select(-1, ids))
    _check_out(w[3:15].index_select(0, ids), ref[3:15].index_select(0, ids))
    _check_out(w.t().index_select(0, ids), ref.t().index_select(0, ids))


@pytest.mark.parametrize("kind", PLACEMENTS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.int64, torch.int32, torch.int8, torch.bool])
def test_index_select_and_getitem_other_dtypes(kind, dtype, to_placement):
    ref = (torch.randn(12, 6, generator=torch.Generator().manual_seed(5)) * 10).to(dtype)
    w = to_placement(ref, kind)
    ids = torch.tensor([3, 1, 11, 3])
    _check_out(w.index_select(0, ids), ref.index_select(0, ids))
    _check_out(w[ids], ref[ids])


@pytest.mark.parametrize("kind", PLACEMENTS)
def test_index_select_and_getitem_3d_weight(kind, to_placement):
    ref = torch.randn(10, 3, 4, generator=torch.Generator().manual_seed(6))
    w = to_placement(ref, kind)
    ids = torch.tensor([9, 0, 4])
    _check_out(w.index_select(0, ids), ref.index_select(0, ids))
    _check_out(w[ids], ref[ids])
    _check_out(w[torch.tensor([[1, 2], [3, 9]])], ref[torch.tensor([[1, 2], [3, 9]])])


@pytest.mark.parametrize("kind", PLACEMENTS)
@pytest.mark.parametrize("ids_kind", ID_KINDS)
def test_getitem_with_ids(kind, ids_kind, weight):
    w, ref = weight(kind)
    for ids in (
        torch.tensor([4, 4, 7, 0, 19]),
        torch.tensor([[1, 2], [19, 0]]),
        torch.tensor([3]).int(),
        torch.tensor([], dtype=torch.int64),
    ):
        _check_out(w[_ids_as(ids, ids_kind)], ref[ids])


@pytest.mark.parametrize("kind", PLACEMENTS)
def test_getitem_with_negative_ids_wraps_like_cpu(kind, weight):
    w, ref = weight(kind)
    ids = torch.tensor([-1, 0, -20, 5])
    _check_out(w[ids], ref[ids])


@pytest.mark.parametrize("kind", PLACEMENTS)
def test_getitem_masks_and_mixed_indexing(kind, weight):
    w, ref = weight(kind)
    mask = torch.arange(20) % 3 == 0
    _check_out(w[mask], ref[mask])
    ids = torch.tensor([2, 5])
    _check_out(w[ids, 1:4], ref[ids, 1:4])
    _check_out(w[ids, torch.tensor([0, 7])], ref[ids, torch.tensor([0, 7])])
    _check_out(w[5:15][ids], ref[5:15][ids])


def test_lookups_on_huge_table_agree_with_each_other(huge_table):
    w = huge_table(64)
    ids = torch.tensor([5, 10**10 - 1, 123_456_789_012 % 10**10, 5])
    rows = F.embedding(ids, w).cpu()
    for other in (w[ids], w.index_select(0, ids), F.embedding_bag(ids, w, torch.arange(4), mode="max")):
        assert not is_table(other)
        assert torch.equal(other.cpu(), rows)
    pooled = F.embedding_bag(ids, w, torch.tensor([0, 2]), mode="sum").cpu()
    torch.testing.assert_close(pooled, torch.stack([rows[:2].sum(0), rows[2:].sum(0)]))
    mean = F.embedding_bag(ids, w, torch.tensor([0]), mode="mean").cpu()
    torch.testing.assert_close(mean[0], rows.mean(0))


def test_lookup_outputs_are_host_storage_even_inside_placement_table(weight):
    # Lookups on a table return rows in host storage whatever the placement; on a
    # host weight they are ordinary ops, whose results placement("table") places.
    w, ref = weight("table")
    ids = torch.tensor([1, 2, 2])
    with torch_recdev.placement("table"):
        outs = [
            (F.embedding(ids, w), F.embedding(ids, ref)),
            (F.embedding_bag(ids, w, torch.tensor([0, 1]), mode="sum"), F.embedding_bag(ids, ref, torch.tensor([0, 1]), mode="sum")),
            (w.index_select(0, ids), ref.index_select(0, ids)),
            (w[ids], ref[ids]),
        ]
    for out, expected in outs:
        _check_out(out, expected, exact=False)
