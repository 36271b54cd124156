"""Checkpoint files: bit-exact round trips, and refusal of anything damaged or mismatched — with the
destination left exactly as it was."""

import os
import struct
import zlib

import numpy as np
import pytest


def make_store_table(store_mod, store=None, num_rows=1000, dim=6, init=None, name=None):
    store = store or store_mod.Store()
    config = store_mod.TableConfig(
        num_rows=num_rows, row_words=dim, init=init or store_mod.InitRule.normal(0, 1, seed=21)
    )
    table_id = store.create_named_table(name, config) if name else store.create_table(config)
    return store.table(table_id)


def special_rows(dim):
    """Floats a checkpoint must keep bit-exactly: a nan with a payload, -0, infinities, a subnormal."""
    bits = np.array([0x7FC12345, 0x80000000, 0x7F800000, 0xFF800000, 0x00000001, 0x3F800000], np.uint32)
    return np.resize(bits, (2, dim)).view(np.float32)


def populated_table(store_mod, store=None, name=None):
    table = make_store_table(store_mod, store, name=name)
    table.write(np.array([998, 3], np.uint64), special_rows(6))
    table.gather(np.array([0, 500, 999], np.uint64))  # materialized init values
    return table


def snapshot(table):
    num_rows, dim = table.config.num_rows, table.config.row_words
    return (
        table.read_bytes(0, num_rows * dim * 4).tobytes(),
        table.exists(np.arange(num_rows, dtype=np.uint64)).tobytes(),
        repr(table.config),
        table.init_stream,
    )


def test_round_trip_is_bit_exact(store_mod, tmp_path):
    source = populated_table(store_mod)
    path = tmp_path / "table.ckpt"
    store_mod.save_table(path, source, "user")

    # Another store, another table id, another init rule: the load restores all of it.
    other = store_mod.Store()
    other.create_table(store_mod.TableConfig(num_rows=1, row_words=1))
    destination = make_store_table(store_mod, other, init=store_mod.InitRule.constant(7.0))
    destination.write(np.array([1, 2], np.uint64), np.zeros((2, 6), np.float32))
    assert destination.id != source.id
    store_mod.load_table(path, destination)
    assert snapshot(destination) == snapshot(source)
    assert destination.stats().rows == 5

    [info] = store_mod.read_checkpoint_info(path)
    assert (info.name, info.row_count, info.init_stream) == ("user", 5, source.init_stream)
    assert info.config == source.config


def test_file_layout_and_checksum(store_mod, tmp_path):
    table = make_store_table(store_mod, dim=3, init=store_mod.InitRule.zero())
    table.write(np.array([42], np.uint64), np.array([[1.0, 2.0, 3.0]], np.float32))
    path = tmp_path / "table.ckpt"
    store_mod.save_table(path, table, "t")
    data = path.read_bytes()
    assert data[:8] == b"RECDEVTB"
    assert struct.unpack_from("<II", data, 8) == (6, 1)  # version, table count
    assert struct.unpack_from("<I", data, 16) == (1,) and data[20:21] == b"t"  # name
    assert len(data) == 16 + (4 + 1 + 144) + (8 + 3 * 4) + 8 + 4
    # After the init stream: the optimizer (None, no flags, its defaults, no rounding seed) and its
    # step, then the row count.
    kind, flags, *params, rounding_seed, step, row_count = struct.unpack_from("<II7dQQQ", data, 16 + 5 + 56)
    assert (kind, flags, params, rounding_seed, step, row_count) == (
        0, 0, [0.01, 0, 1e-10, 0, 0, 0.9, 0.999], 0, 0, 1)
    row_id, *row = struct.unpack_from("<Q3f", data, 16 + 149)
    assert (row_id, row) == (42, [1.0, 2.0, 3.0])
    assert struct.unpack_from("<Q", data, 16 + 149 + 20) == (0,)  # policy block: none
    assert struct.unpack("<I", data[-4:]) == (store_mod.crc32c(data[:-4]),)


def refused_load(store_mod, path, destination, match):
    before = snapshot(destination)
    with pytest.raises(ValueError, match=match):
        store_mod.load_table(path, destination)
    assert snapshot(destination) == before


def test_every_flipped_byte_is_refused(store_mod, tmp_path):
    source = make_store_table(store_mod, dim=4)
    source.write(np.array([1, 2, 3], np.uint64), np.ones((3, 4), np.float32))
    path = tmp_path / "table.ckpt"
    store_mod.save_table(path, source, "x")
    good = path.read_bytes()
    destination = make_store_table(store_mod, dim=4, init=store_mod.InitRule.constant(5.0))
    destination.write(np.array([9], np.uint64), np.full((1, 4), 2.0, np.float32))
    damaged = tmp_path / "damaged.ckpt"
    for position in range(len(good)):
        flipped = bytearray(good)
        flipped[position] ^= 0x10
        damaged.write_bytes(bytes(flipped))
        refused_load(store_mod, damaged, destination, "checkpoint")


def test_truncated_files_are_refused(store_mod, tmp_path):
    source = populated_table(store_mod)
    path = tmp_path / "table.ckpt"
    store_mod.save_table(path, source)
    good = path.read_bytes()
    destination = make_store_table(store_mod)
    destination.write(np.array([5], np.uint64), np.ones((1, 6), np.float32))
    for length in (0, 7, 16, 40, len(good) - 30, len(good) - 4, len(good) - 1):
        path.write_bytes(good[:length])
        refused_load(store_mod, path, destination, "too small|truncated|checksum")
    path.write_bytes(good + b"\x00")
    refused_load(store_mod, path, destination, "unexpected bytes")


def test_bad_magic_and_version_are_named(store_mod, tmp_path):
    good_path = tmp_path / "good.ckpt"
    store_mod.save_table(good_path, populated_table(store_mod))
    good = good_path.read_bytes()
    destination = make_store_table(store_mod)
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"NOTACKPT" + good[8:])
    refused_load(store_mod, bad, destination, "bad magic")
    bad.write_bytes(good[:8] + struct.pack("<I", 7) + good[12:])
    refused_load(store_mod, bad, destination, "unsupported format version 7; this build reads versions 2 to 6")
    # Version 1 (before optimizers) is refused as such, even with a valid checksum.
    old = good[:8] + struct.pack("<I", 1) + good[12:-4]
    bad.write_bytes(old + struct.pack("<I", zlib.crc32(old)))
    refused_load(store_mod, bad, destination, "unsupported format version 1; this build reads versions 2 to 6")


def test_format_5_files_with_a_crc32_still_load_and_are_checked(store_mod, tmp_path):
    source = populated_table(store_mod)
    store_mod.save_table(tmp_path / "v6.ckpt", source)
    body = bytearray((tmp_path / "v6.ckpt").read_bytes()[:-4])
    body[8:12] = struct.pack("<I", 5)  # version 6 is version 5's bytes with a CRC-32C at the end
    v5 = tmp_path / "v5.ckpt"
    v5.write_bytes(bytes(body) + struct.pack("<I", zlib.crc32(body)))
    destination = make_store_table(store_mod)
    store_mod.load_table(v5, destination)
    assert snapshot(destination) == snapshot(source)
    v5.write_bytes(bytes(body) + struct.pack("<I", store_mod.crc32c(bytes(body))))  # the wrong checksum for 5
    refused_load(store_mod, v5, make_store_table(store_mod), "checksum")


@pytest.mark.parametrize("shape", [dict(num_rows=1001), dict(dim=7)], ids=str)
def test_mismatched_config_is_refused(store_mod, tmp_path, shape):
    path = tmp_path / "table.ckpt"
    store_mod.save_table(path, populated_table(store_mod))
    destination = make_store_table(store_mod, **shape)
    destination.gather(np.array([0], np.uint64))
    refused_load(store_mod, path, destination, "does not match|but the destination table")


def test_missing_file_is_an_os_error(store_mod, tmp_path):
    with pytest.raises(OSError, match="cannot open"):
        store_mod.load_table(tmp_path / "absent.ckpt", make_store_table(store_mod))


def test_no_temporary_file_lingers(store_mod, tmp_path):
    table = populated_table(store_mod)
    path = tmp_path / "table.ckpt"
    store_mod.save_table(path, table)
    store_mod.save_table(path, table)  # replacing an existing file
    assert os.listdir(tmp_path) == ["table.ckpt"]

    (tmp_path / "a_directory").mkdir()
    with pytest.raises(OSError, match="cannot rename"):
        store_mod.save_table(tmp_path / "a_directory", table)
    assert sorted(os.listdir(tmp_path)) == ["a_directory", "table.ckpt"]
    with pytest.raises(OSError, match="cannot create"):
        store_mod.save_table(tmp_path / "no_such_dir" / "t.ckpt", table)


def test_store_round_trip(store_mod, tmp_path):
    store = store_mod.Store()
    user = populated_table(store_mod, store, name="user")
    item = make_store_table(store_mod, store, num_rows=50, dim=3, name="item", init=store_mod.InitRule.uniform(0, 1, 4))
    item.write(np.array([49], np.uint64), np.full((1, 3), 8.0, np.float32))
    make_store_table(store_mod, store).gather(np.array([1], np.uint64))  # anonymous: not saved
    path = tmp_path / "store.ckpt"
    store_mod.save_store(path, store)
    assert [info.name for info in store_mod.read_checkpoint_info(path)] == ["item", "user"]

    restored = store_mod.Store()
    restored.create_table(store_mod.TableConfig(num_rows=1, row_words=1))  # different ids than the source
    assert store_mod.load_store(path, restored) == ["item", "user"]
    for name, table in (("user", user), ("item", item)):
        assert snapshot(restored.table(restored.find(name))) == snapshot(table)

    # Loading again into a store that already has the tables fills them in place.
    user.write(np.array([7], np.uint64), np.ones((1, 6), np.float32))
    store_mod.load_store(path, store)
    assert not user.exists(np.array([7], np.uint64))[0]


def test_store_load_checks_every_table_before_changing_any(store_mod, tmp_path):
    source = store_mod.Store()
    populated_table(store_mod, source, name="a_first")
    populated_table(store_mod, source, name="b_second")
    path = tmp_path / "store.ckpt"
    store_mod.save_store(path, source)

    destination = store_mod.Store()
    first = make_store_table(store_mod, destination, name="a_first", init=store_mod.InitRule.constant(1.0))
    first.gather(np.array([10], np.uint64))
    make_store_table(store_mod, destination, name="b_second", dim=5)  # mismatched shape
    before = snapshot(first)
    with pytest.raises(ValueError, match="'b_second' with num_rows=1000, dim=6, but .*has num_rows=1000, dim=5$"):
        store_mod.load_store(path, destination)
    assert snapshot(first) == before
    assert destination.find("a_first") is not None and len(destination.list()) == 2


def test_table_and_store_files_are_not_interchangeable(store_mod, tmp_path):
    store = store_mod.Store()
    populated_table(store_mod, store, name="a")
    populated_table(store_mod, store, name="b")
    store_file, table_file = tmp_path / "store.ckpt", tmp_path / "table.ckpt"
    store_mod.save_store(store_file, store)
    store_mod.save_table(table_file, populated_table(store_mod))
    refused_load(store_mod, store_file, make_store_table(store_mod), "more than one table")
    with pytest.raises(ValueError, match="anonymous table"):
        store_mod.load_store(table_file, store_mod.Store())


def test_empty_table_round_trip(store_mod, tmp_path):
    source = make_store_table(store_mod, num_rows=10**12, init=store_mod.InitRule.uniform(-1, 1, seed=3))
    path = tmp_path / "empty.ckpt"
    store_mod.save_table(path, source)
    assert path.stat().st_size == 16 + 148 + 8 + 4  # cost follows rows touched, not num_rows
    destination = make_store_table(store_mod, num_rows=10**12)
    destination.write(np.array([5], np.uint64), np.ones((1, 6), np.float32))
    store_mod.load_table(path, destination)
    assert destination.stats().rows == 0
    ids = np.array([0, 10**12 - 1], np.uint64)
    np.testing.assert_array_equal(destination.gather(ids), source.gather(ids))
