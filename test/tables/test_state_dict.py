"""torch.save / torch.load / load_state_dict of tables (docs/tables.md, "Saving and loading"): a
table is written as its init rule plus its materialized rows, restored exactly, mapped to the CPU
under max_fallback_bytes, and bad files are refused with nothing loaded."""

import io
import pickle
import struct
import threading
import zlib

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_recdev
from torch_recdev import set_max_fallback_bytes, table_stats
from torch_recdev._testing import _store

HUGE_ROWS = 10**10

def _save(obj, path=None):
    buffer = io.BytesIO() if path is None else path
    torch.save(obj, buffer)
    if path is None:
        buffer.seek(0)
    return buffer


class Bag(nn.Module):
    """An embedding bag on a huge lazy table followed by a linear layer on the CPU."""

    def __init__(self, rows=HUGE_ROWS, dim=16):
        super().__init__()
        self.bag = nn.EmbeddingBag(rows, dim, mode="sum", device="recdev")
        self.head = nn.Linear(dim, 1)

    def forward(self, ids, offsets):
        return self.head(self.bag(ids, offsets).cpu())


def _touch(weight, ids):
    with torch.no_grad():
        return F.embedding(ids, weight).cpu()


def test_file_grows_with_rows_touched_not_num_embeddings():
    model = Bag()
    empty = len(_save(model.state_dict()).getvalue())
    _touch(model.bag.weight, torch.arange(1000) * 7_000_003)
    touched = len(_save(model.state_dict()).getvalue())
    row_bytes = 8 + 16 * 4  # id + weight (no optimizer)
    assert empty < 20_000
    assert 1000 * row_bytes <= touched - empty < 1000 * row_bytes + 10_000


def test_round_trip_restores_touched_and_untouched_rows_exactly(tmp_path):
    torch.manual_seed(3)
    model = Bag()
    touched = torch.tensor([0, 5, 9_999_999_999, 123_456_789])
    with torch.no_grad():
        model.bag.weight[touched[:2]]  # reads materialize
        torch_recdev.ops.emb_write(model.bag.weight, touched[2:], torch.full((2, 16), 2.5))
    probe = torch.tensor([0, 5, 9_999_999_999, 123_456_789, 42, 77_777_777_777 % HUGE_ROWS])
    path = tmp_path / "model.pt"
    _save(model.state_dict(), path)
    expected = _touch(model.bag.weight, probe)  # after the save: 42 and the last id stay untouched in the file

    torch.manual_seed(99)  # another init rule in the destination
    restored = Bag()
    restored.load_state_dict(torch.load(path))  # weights_only=True, torch.load's default
    assert table_stats(restored.bag.weight)["rows"] == 4
    assert torch.equal(_touch(restored.bag.weight, probe), expected)
    assert torch.equal(restored.head.weight, model.head.weight)


def test_load_without_state_dict_gives_a_lazy_recdev_table():
    weight = nn.Embedding(HUGE_ROWS, 8, device="recdev").weight.detach()
    _touch(weight, torch.tensor([3, 4]))
    loaded = torch.load(_save(weight))
    assert loaded.device.type == "recdev" and torch_recdev.is_table(loaded)
    assert loaded.shape == weight.shape and loaded.dtype == weight.dtype
    assert table_stats(loaded)["rows"] == 2
    probe = torch.tensor([3, 4, 5, HUGE_ROWS - 1])
    assert torch.equal(_touch(loaded, probe), _touch(weight, probe))


def test_views_of_tables_keep_their_offset_and_strides(lazy_table):
    w = lazy_table(40, 6)
    view = w[10:20].t()
    loaded = torch.load(_save(view))
    assert loaded.shape == view.shape and loaded.stride() == view.stride()
    assert torch.equal(loaded.cpu(), view.cpu())


def test_map_location_cpu_gives_a_dense_tensor_under_the_limit(lazy_table):
    w = lazy_table(50, 4)
    _touch(w, torch.tensor([1, 2]))
    dense = torch.load(_save(w), map_location="cpu")
    assert dense.device.type == "cpu" and torch.equal(dense, w.cpu())
    for location in (torch.device("cpu"), {"recdev:0": "cpu"}, lambda storage, loc: storage):
        assert torch.equal(torch.load(_save(w), map_location=location), dense)


def test_map_location_cpu_refuses_past_max_fallback_bytes(lazy_table):
    weight = nn.Embedding(HUGE_ROWS, 8, device="recdev").weight.detach()
    with pytest.raises(RuntimeError, match="max_fallback_bytes") as info:
        torch.load(_save(weight), map_location="cpu")
    assert "load_state_dict" in str(info.value)
    small = lazy_table(50, 4)
    set_max_fallback_bytes(50 * 4 * 4 - 1)
    with pytest.raises(RuntimeError, match="max_fallback_bytes"):
        torch.load(_save(small), map_location="cpu")


def test_load_state_dict_is_rows_touched_not_a_dense_copy():
    model = Bag()
    _touch(model.bag.weight, torch.arange(10))
    state = torch.load(_save(model.state_dict()))
    set_max_fallback_bytes(0)  # a dense copy of any part of the table would be refused
    restored = Bag()
    restored.load_state_dict(state)
    assert table_stats(restored.bag.weight)["rows"] == 10


def _train(model, opt, gen, steps):
    losses = []
    for _ in range(steps):
        ids = torch.randint(0, 1000, (24,), generator=gen) * 9_999_991
        offsets = torch.arange(0, 24, 3)
        loss = model(ids, offsets).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _assert_resumed(losses, reference, store_backend):
    # Embedded: bit-exact. On shards, a table loaded into another table routes its rows by that
    # table's key, so pooled sums add in another order (docs/remote.md): equal to float rounding.
    if store_backend == "embedded":
        assert losses == reference
    else:
        assert losses == pytest.approx(reference, rel=1e-6)


@pytest.mark.parametrize("fused", [torch_recdev.optim.Adagrad, torch_recdev.optim.Adam, torch_recdev.optim.RowWiseAdagrad])
def test_training_resumes_exactly_with_fused_optimizer_state(tmp_path, fused, store_backend):
    torch.manual_seed(0)
    model = Bag()
    emb_opt = fused([model.bag.weight], lr=0.05)
    head_opt = torch.optim.SGD(model.head.parameters(), lr=0.1)

    class Both:
        def step(self):
            emb_opt.step(), head_opt.step()

        def zero_grad(self):
            emb_opt.zero_grad(), head_opt.zero_grad()

    _train(model, Both(), torch.Generator().manual_seed(1), 3)
    path = tmp_path / "ckpt.pt"
    _save({"model": model.state_dict(), "emb_opt": emb_opt.state_dict(), "head_opt": head_opt.state_dict()}, path)
    reference = _train(model, Both(), torch.Generator().manual_seed(2), 3)

    torch.manual_seed(5)
    resumed = Bag()
    emb_opt = fused([resumed.bag.weight], lr=0.5)  # the checkpoint's hyperparameters win
    head_opt = torch.optim.SGD(resumed.head.parameters(), lr=0.1)
    ckpt = torch.load(path)
    resumed.load_state_dict(ckpt["model"])
    emb_opt.load_state_dict(ckpt["emb_opt"])
    head_opt.load_state_dict(ckpt["head_opt"])
    _assert_resumed(_train(resumed, Both(), torch.Generator().manual_seed(2), 3), reference, store_backend)
    probe = torch.randint(0, 1000, (50,), generator=torch.Generator().manual_seed(2)) * 9_999_991
    rows, expected = _touch(resumed.bag.weight, probe), _touch(model.bag.weight, probe)
    assert torch.equal(rows, expected) if store_backend == "embedded" else torch.allclose(rows, expected, rtol=1e-5)


def test_optimizer_created_after_load_keeps_the_row_state(tmp_path, store_backend):
    torch.manual_seed(0)
    model = Bag()
    opt = torch_recdev.optim.Adagrad([model.bag.weight], lr=0.05)
    _train(model, opt, torch.Generator().manual_seed(1), 2)
    state = torch.load(_save({"model": model.state_dict(), "opt": opt.state_dict()}))
    reference = _train(model, opt, torch.Generator().manual_seed(2), 2)

    resumed = Bag()
    resumed.load_state_dict(state["model"])
    opt = torch_recdev.optim.Adagrad([resumed.bag.weight], lr=0.05)
    opt.load_state_dict(state["opt"])
    _assert_resumed(_train(resumed, opt, torch.Generator().manual_seed(2), 2), reference, store_backend)


def test_a_file_of_another_shape_is_refused_and_nothing_loads():
    source = Bag(dim=16)
    _touch(source.bag.weight, torch.arange(5))
    state = torch.load(_save(source.state_dict()))
    other = Bag(dim=8)
    _touch(other.bag.weight, torch.tensor([7]))
    before = _touch(other.bag.weight, torch.arange(10))
    with pytest.raises(RuntimeError, match="size mismatch for bag.weight"):
        other.load_state_dict(state)
    assert table_stats(other.bag.weight)["rows"] == 10
    assert torch.equal(_touch(other.bag.weight, torch.arange(10)), before)


def test_a_file_of_another_dtype_is_refused_for_huge_tables():
    weight = nn.Embedding(HUGE_ROWS, 8, device="recdev").weight.detach()
    with torch_recdev.placement("table"):
        as_double = torch.empty(HUGE_ROWS, 4, dtype=torch.float64, device="recdev")
    loaded = torch.load(_save(as_double))
    assert loaded.dtype == torch.float64 and torch_recdev.is_table(loaded)
    with pytest.raises(RuntimeError, match="max_fallback_bytes"):
        weight.copy_(loaded)
    assert table_stats(weight)["rows"] == 0


def test_a_truncated_file_is_refused_and_nothing_loads(tmp_path):
    source = Bag()
    _touch(source.bag.weight, torch.arange(100))
    data = _save(source.state_dict()).getvalue()
    target = Bag()
    for cut in (len(data) // 2, len(data) - 30):
        path = tmp_path / f"cut{cut}.pt"
        path.write_bytes(data[:cut])
        # torch's zip reader refuses it before any tensor is built: "failed finding central
        # directory", or EINVAL when the cut lands in its end-of-archive search
        with pytest.raises((RuntimeError, OSError)):
            target.load_state_dict(torch.load(path))
    assert table_stats(target.bag.weight)["rows"] == 0


# The checksummed layout of a snapshot's header (csrc/python/table_serialization.cpp, header_checksum):
# storage size and row width, shape, init rule, init stream, optimizer and step, row count.
_HEADER_LAYOUT = "<QIQIIIddQQI7dQQ"


# A snapshot format's checksum: its function and the suffix of its header fields.
_CHECKSUMS = {3: (_store.crc32c, "crc32c"), 2: (zlib.crc32, "crc32")}


def _resealed(args):
    """The snapshot args with checksums recomputed over what they now hold, in their format's
    checksum: what a forger, rather than a damaged file, would write. Headers too broken to checksum
    are left as they are."""
    header, ids, records = args[0], args[1], args[2]
    if header.get("format") not in _CHECKSUMS:
        return args
    crc, suffix = _CHECKSUMS[header["format"]]
    try:
        init_kind, a, b = header["init"]
        header_bytes = struct.pack(
            _HEADER_LAYOUT, header["nbytes"], header["row_bytes"], header["num_rows"], header["dim"],
            header["state_floats"], init_kind, a, b, header["init_seed"], header["init_stream"],
            *header["optimizer"], header["optimizer_step"], len(ids),
        )
        chunk = header[f"{suffix}_chunk_bytes"]
    except (KeyError, TypeError, ValueError, struct.error):
        return args

    def crcs(t):
        data = t.contiguous().numpy().tobytes()
        return [crc(data[i : i + chunk]) for i in range(0, len(data), chunk)]

    sealed = {
        **header,
        f"header_{suffix}": crc(header_bytes),
        f"ids_{suffix}": crcs(ids),
        f"records_{suffix}": crcs(records),
    }
    return [sealed] + list(args[1:])


def _tampered(weight, change, reseal=True):
    """A pickle of the table whose snapshot `change(args)` edited, checksums recomputed unless
    `reseal` is False."""
    func, args = weight._reduce_ex_internal(2)
    args = change(list(args))
    return func, _resealed(args) if reseal else args


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: a[:1] + [a[1].flip(0), a[2].flip(0)] + a[3:], None),  # harmless: row order does not matter
        (lambda a: a[:1] + [a[1] + 10**10] + a[2:], "out of range"),
        (lambda a: a[:2] + [a[2][:, :3]] + a[3:], "records"),
        (lambda a: [{**a[0], "dim": 9}] + a[1:], "does not match"),
        (lambda a: [{**a[0], "format": 7}] + a[1:], r"\[30, 8\] \(torch.float32\) has snapshot format 7"),
        (lambda a: [{**a[0], "init": (99, 0.0, 1.0)}] + a[1:], "unknown init rule"),
        (lambda a: [{k: v for k, v in a[0].items() if k != "init_stream"}] + a[1:], "no 'init_stream'"),
        (lambda a: [{**a[0], "optimizer": (2, 0.1)}] + a[1:], "'optimizer' has 2 fields"),
    ],
)
def test_a_damaged_snapshot_is_refused_before_a_table_is_made(lazy_table, change, message):
    w = lazy_table(30, 8)
    _touch(w, torch.tensor([1, 2, 3]))
    func, args = _tampered(w, change)
    if message is None:
        assert torch.equal(func(*args).cpu(), w.cpu())
    else:
        with pytest.raises(ValueError, match=message):
            func(*args)


def _flip_byte(data: bytes, known: bytes, offset: int) -> bytes:
    """`data` with one byte of the only occurrence of `known` flipped."""
    at = data.find(known)
    assert at >= 0 and data.find(known, at + 1) < 0, "the known bytes must occur exactly once in the file"
    damaged = bytearray(data)
    damaged[at + offset] ^= 0x40
    return bytes(damaged)


@pytest.mark.parametrize("mmap", [False, True])
def test_a_flipped_byte_in_the_saved_rows_or_ids_is_refused_at_load_and_nothing_loads(tmp_path, mmap):
    source = Bag()
    row_id = 4_886_718_345  # 0x123456789: bytes that occur nowhere else in the file
    row = torch.arange(16, dtype=torch.float32) / 64 + 1000.0
    torch_recdev.ops.emb_write(source.bag.weight, torch.tensor([row_id]), row[None])
    _touch(source.bag.weight, torch.arange(100))
    data = _save(source.state_dict()).getvalue()
    target = Bag()
    probe = torch.tensor([0, 5, 99, row_id, row_id ^ 0x40])
    before = _touch(target.bag.weight, probe)
    cases = {
        # the exponent byte of the row's third float: 1000.03 would load as 2.9e-36 ...
        "records": _flip_byte(data, row.numpy().tobytes(), 11),
        # ... and the id's low byte would move the row to another id
        "ids": _flip_byte(data, struct.pack("<q", row_id), 0),
    }
    for part, damaged in cases.items():
        path = tmp_path / f"{part}.pt"
        path.write_bytes(damaged)
        with pytest.raises(ValueError) as info:
            target.load_state_dict(torch.load(path, mmap=mmap))
        message = str(info.value)
        assert r"recdev table [10000000000, 16] (torch.float32) is damaged" in message, message
        assert f"row {part}" in message and "Nothing of this table was loaded" in message, message
        assert table_stats(target.bag.weight)["rows"] == 5
        assert torch.equal(_touch(target.bag.weight, probe), before)
    target.load_state_dict(torch.load(_save(source.state_dict())))  # the intact file loads
    assert torch.equal(_touch(target.bag.weight, torch.tensor([row_id]))[0], row)


def test_a_changed_header_number_is_refused_by_its_checksum(lazy_table):
    w = lazy_table(30, 8)
    _touch(w, torch.tensor([1, 2, 3]))
    for field, value in (("init_seed", 12345), ("init", (1, 7.0, 0.0)), ("optimizer_step", 9)):
        func, args = _tampered(w, lambda a: [{**a[0], field: value}] + a[1:], reseal=False)
        with pytest.raises(ValueError, match=r"table \[30, 8\] \(torch.float32\) is damaged: .* its header"):
            func(*args)


def test_snapshots_of_format_1_without_checksums_still_load(lazy_table):
    w = lazy_table(30, 8)
    _touch(w, torch.tensor([1, 2, 3]))
    checksums = ("crc32c_chunk_bytes", "header_crc32c", "ids_crc32c", "records_crc32c")

    def format_1(a):
        return [{**{k: v for k, v in a[0].items() if k not in checksums}, "format": 1}] + a[1:]

    func, args = _tampered(w, format_1, reseal=False)
    assert torch.equal(func(*args).cpu(), w.cpu())
    # a format-3 file whose format number was damaged into 1 still carries its checksums: refused
    func, args = _tampered(w, lambda a: [{**a[0], "format": 1}] + a[1:], reseal=False)
    with pytest.raises(ValueError, match="says format 1, which has no checksums"):
        func(*args)


def test_snapshots_of_format_2_with_crc32_still_load_and_are_checked(lazy_table):
    w = lazy_table(30, 8)
    _touch(w, torch.tensor([1, 2, 3]))
    crc32c_fields = ("crc32c_chunk_bytes", "header_crc32c", "ids_crc32c", "records_crc32c")

    def format_2(a):
        header = {k: v for k, v in a[0].items() if k not in crc32c_fields}
        return [{**header, "format": 2, "crc32_chunk_bytes": a[0]["crc32c_chunk_bytes"]}] + a[1:]

    func, args = _tampered(w, format_2)  # sealed with zlib's CRC-32, as format 2 was
    assert torch.equal(func(*args).cpu(), w.cpu())
    args[2] = args[2].clone()
    args[2][0, 0] += 1
    with pytest.raises(ValueError, match=r"is damaged: the checksum \(CRC-32\) of its row records"):
        func(*args)


def test_tables_pickle_only_through_torch_save_safe_globals():
    w = nn.Embedding(HUGE_ROWS, 4, device="recdev").weight.detach()
    buffer = _save({"w": w})
    assert torch.load(buffer, weights_only=True)["w"].shape == w.shape
    assert len(pickle.dumps(torch.arange(3))) > 0  # other tensors are untouched by the table hook



def test_a_repeated_row_is_refused_where_the_rows_are_installed_and_nothing_loads(lazy_table):
    # Finding a repeat takes the index the rows are installed into, so it is found there: at
    # load_state_dict (straight into the model's table), or at the loaded tensor's first use.
    w = lazy_table(30, 8)
    _touch(w, torch.tensor([1, 2, 3]))
    func, args = _tampered(w, lambda a: a[:1] + [a[1] * 0 + 2] + a[2:])
    loaded = func(*args)
    target = lazy_table(30, 8)
    _touch(target, torch.tensor([7]))
    before = target.cpu()
    with pytest.raises(ValueError, match="damaged or was not written by torch_recdev: row 2 appears twice"):
        target.copy_(loaded)  # what load_state_dict does
    assert torch.equal(target.cpu(), before) and table_stats(target)["rows"] == 1
    for _ in range(2):  # still refused on every use, never half installed
        with pytest.raises(ValueError, match="row 2 appears twice"):
            loaded.cpu()


def test_restoring_many_rows_names_the_first_repeated_id(lazy_table):
    # 140,000 rows are inserted on several threads (RowSet::insert_all); the error still names the
    # first id that repeats an earlier one, whichever thread finds which repeat.
    w = lazy_table(1_000_000, 2)
    ids = torch.randperm(1_000_000, generator=torch.Generator().manual_seed(0))[:140_000]
    torch_recdev.ops.emb_write(w, ids, torch.randn(len(ids), 2))
    func, args = _tampered(w, lambda a: a)
    assert torch.equal(func(*args).cpu(), w.cpu())

    def repeat(a):
        saved = a[1].clone()
        saved[90_000] = saved[7]  # repeats the row at position 7 ...
        saved[120_000] = saved[3]  # ... and a later one; the first repeat is named
        return a[:1] + [saved] + a[2:]

    func, args = _tampered(w, repeat)
    with pytest.raises(ValueError, match=f"row {int(args[1][7])} appears twice"):
        func(*args).cpu()


def test_load_state_dict_copies_the_loaded_rows_once_and_both_tables_stay_independent(tmp_path, store_backend):
    model = Bag(rows=10**8, dim=8)
    ids = torch.arange(0, 10**8, 9973)
    torch_recdev.ops.emb_write(model.bag.weight, ids, torch.randn(len(ids), 8))
    expected = torch_recdev.ops.emb_read(model.bag.weight, ids).cpu()
    path = tmp_path / "model.pt"
    _save(model.state_dict(), path)
    for mmap in (False, True):
        state = torch.load(path, mmap=mmap)
        loaded = state["bag.weight"]
        restored = Bag(rows=10**8, dim=8)
        restored.load_state_dict(state)
        assert torch.equal(torch_recdev.ops.emb_read(restored.bag.weight, ids).cpu(), expected)
        # The loaded tensor still holds the file's rows, installed into its own table on first use,
        # and writes to either table stay out of the other.
        torch_recdev.ops.emb_write(restored.bag.weight, ids[:5], torch.zeros(5, 8))
        assert torch.equal(torch_recdev.ops.emb_read(loaded, ids).cpu(), expected)
        torch_recdev.ops.emb_write(loaded, ids[5:10], torch.ones(5, 8))
        assert torch.equal(torch_recdev.ops.emb_read(restored.bag.weight, ids[5:10]).cpu(), expected[5:10])
        assert table_stats(loaded)["rows"] == len(ids)


def test_first_uses_of_a_loaded_table_from_many_threads_install_its_rows_once(lazy_table):
    w = lazy_table(100_000, 4)
    ids = torch.arange(0, 100_000, 3)
    torch_recdev.ops.emb_write(w, ids, torch.randn(len(ids), 4))
    loaded = torch.load(_save(w))
    expected = torch_recdev.ops.emb_read(w, ids).cpu()
    results = [None] * 8

    def read(k):
        results[k] = torch_recdev.ops.emb_read(loaded, ids).cpu()

    threads = [threading.Thread(target=read, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(r, expected) for r in results)
    assert table_stats(loaded)["rows"] == len(ids)


def test_a_restored_table_holds_the_memory_the_saved_one_did(lazy_table, store_backend):
    # The restore sizes each sub-shard's index for its rows up front (RowIndex::reserve): the bucket
    # arrays the saved table grew to one row at a time, not larger ones. (On shards the restored
    # table's rows route by its own key, so each shard holds other rows than the saved table's.)
    if store_backend != "embedded":
        pytest.skip("compares one process's indexes")
    w = lazy_table(1_000_000, 8)
    ids = torch.randperm(1_000_000, generator=torch.Generator().manual_seed(1))[:200_000]
    torch_recdev.ops.emb_write(w, ids, torch.randn(len(ids), 8))
    func, args = _tampered(w, lambda a: a)
    restored = func(*args)
    assert table_stats(restored)["rows"] == 200_000
    assert table_stats(restored)["bytes"] == table_stats(w)["bytes"]
    assert torch.equal(torch_recdev.ops.emb_read(restored, ids).cpu(), torch_recdev.ops.emb_read(w, ids).cpu())


def test_large_snapshots_are_copied_into_huge_page_mappings(lazy_table):
    # Rows copied out for torch.save fault 2 MiB at a time (csrc/python/table_serialization.cpp).
    w = lazy_table(1_000_000, 8)
    ids = torch.randperm(1_000_000, generator=torch.Generator().manual_seed(2))[:300_000]
    values = torch.randn(len(ids), 8)
    torch_recdev.ops.emb_write(w, ids, values)
    _, saved_ids, records = torch_recdev._C._table_snapshot(w)  # 2.4 MB of ids, 9.6 MB of records
    assert saved_ids.data_ptr() % (2 << 20) == 0 and records.data_ptr() % (2 << 20) == 0
    order = saved_ids.argsort()
    assert torch.equal(saved_ids[order], ids.sort().values)
    assert torch.equal(records[order], values[ids.argsort()])
    del saved_ids, records  # handed back to the chunk pool
    small = lazy_table(100, 8)
    torch_recdev.ops.emb_write(small, torch.tensor([3, 5]), torch.ones(2, 8))
    _, few_ids, few_records = torch_recdev._C._table_snapshot(small)  # below 2 MiB: the CPU allocator's
    assert torch.equal(few_records, torch.ones(2, 8)) and sorted(few_ids.tolist()) == [3, 5]


@pytest.mark.parametrize("dim", [3, 16, 20, 64])
def test_a_large_load_installs_every_row_exactly_at_every_record_width(dim):
    # Loads of 4 MiB of records and more store them with streaming stores where a record starts at a
    # multiple of the store width, and with ordinary ones where it does not (csrc/store/row_copier.h):
    # records of 12, 64, 80 and 256 bytes, in chunks of the arenas that are aligned and that are not.
    rows = (4 << 20) // (4 * dim) + 5_000
    generator = torch.Generator().manual_seed(dim)
    ids = torch.randint(0, 10**9, (rows + rows // 100,), generator=generator).unique()[:rows]
    values = torch.randn(rows, dim, generator=generator)
    source = nn.Embedding(10**9, dim, device="recdev")
    torch_recdev.ops.emb_write(source.weight, ids, values)
    buffer = _save(source.state_dict())
    destination = nn.Embedding(10**9, dim, device="recdev")
    destination.load_state_dict(torch.load(buffer))
    assert table_stats(destination.weight)["rows"] == rows
    assert torch.equal(torch_recdev.ops.emb_read(destination.weight, ids).cpu(), values)
