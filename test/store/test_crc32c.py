"""CRC-32C (csrc/store/crc32c.cpp): the folded VPCLMULQDQ kernel, the SSE4.2 kernel with its three
interleaved streams, and the portable table-driven version give the checksum of RFC 3720's test
vectors and of a bit-by-bit reference, at every length around the folds' 256-byte steps and the
streams' 24 KiB blocks, from every alignment, and continued from any running checksum. Each kernel
this CPU has runs in a process of its own, ATEN_CPU_CAPABILITY capping the choice."""


import numpy as np
import pytest


def _reference(data: bytes) -> int:
    """CRC-32C bit by bit, from its definition (reflected polynomial 0x82F63B78), one byte at a time
    through a table built the same way."""
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table.append(crc)
    crc = 0xFFFFFFFF
    for byte in data:
        crc = (crc >> 8) ^ table[(crc ^ byte) & 0xFF]
    return crc ^ 0xFFFFFFFF


RFC_3720_VECTORS = [
    (b"123456789", 0xE3069283),
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
]


@pytest.mark.parametrize("data, expected", RFC_3720_VECTORS)
def test_rfc_3720_vectors(store_mod, data, expected):
    assert store_mod.crc32c(data) == expected
    assert store_mod.crc32c_portable(data) == expected


BLOCK = 8 << 10  # one stream's block: three of them are interleaved


FOLD_LENGTHS = [15, 16, 17, 255, 256, 511, 512, 513, 527, 528, 767, 768, 769, 1023, 1024, 4096 + 255]


@pytest.mark.parametrize(
    "length",
    [0, 1, 7, 8, 4095, 3 * BLOCK - 1, 3 * BLOCK, 3 * BLOCK + 1, 3 * BLOCK + 9, 6 * BLOCK + 5, 10 * BLOCK + 3]
    + FOLD_LENGTHS,
)
def test_every_length_around_the_interleaved_blocks_matches_the_reference(store_mod, length):
    data = np.random.default_rng(length).integers(0, 256, size=length + 7, dtype=np.uint8).tobytes()
    for offset in (0, 3, 7):  # unaligned starts
        piece = data[offset:offset + length]
        expected = _reference(piece)
        assert store_mod.crc32c(piece) == expected, (length, offset)
        assert store_mod.crc32c_portable(piece) == expected, (length, offset)


def test_a_single_flipped_bit_changes_it_in_every_stream(store_mod):
    data = bytearray(np.random.default_rng(1).integers(0, 256, size=3 * BLOCK, dtype=np.uint8).tobytes())
    clean = store_mod.crc32c(bytes(data))
    for position in (0, BLOCK - 1, BLOCK, 2 * BLOCK + 17, 3 * BLOCK - 1):
        data[position] ^= 0x10
        assert store_mod.crc32c(bytes(data)) != clean, position
        data[position] ^= 0x10


def test_a_running_checksum_continues_across_any_split(store_mod):
    data = np.random.default_rng(7).integers(0, 256, size=5000, dtype=np.uint8).tobytes()
    whole = _reference(data)
    for split in (0, 1, 4, 300, 511, 512, 2000, 4999, 5000):
        first = store_mod.crc32c(data[:split])
        assert store_mod.crc32c(data[split:], first) == whole, split
        assert store_mod.crc32c_portable(data[split:], store_mod.crc32c_portable(data[:split])) == whole, split


def test_a_flipped_bit_anywhere_in_a_folded_block_changes_it(store_mod):
    data = bytearray(np.random.default_rng(2).integers(0, 256, size=2048 + 13, dtype=np.uint8).tobytes())
    clean = store_mod.crc32c(bytes(data))
    for position in (0, 3, 4, 63, 64, 255, 256, 1000, 1791, 1792, 2047, 2048, 2060):
        data[position] ^= 0x01
        assert store_mod.crc32c(bytes(data)) != clean, position
        data[position] ^= 0x01


_KERNEL_WORKER = """
import importlib, os, sys, zlib
import numpy as np
store = importlib.import_module(os.environ.get("RECDEV_STORE_MODULE", "torch_recdev._testing"))._store
rng = np.random.default_rng(3)
sums = []
for length in [0, 9, 511, 512, 513, 1000, 4096 + 17, 3 * 8192 + 5, 100_000]:
    data = rng.integers(0, 256, size=length, dtype=np.uint8).tobytes()
    sums.append((store.crc32c(data), store.crc32c(data[length // 3:], store.crc32c(data[:length // 3]))))
print(store.crc32c_kernel(), sums)
"""


def test_every_kernel_this_cpu_has_gives_the_same_checksums(store_mod, run_capped):
    kernels = dict(run_capped(["-c", _KERNEL_WORKER], capability).split(" ", 1) for capability in (None, "avx2", "default"))
    assert "portable" in kernels  # "default" always caps it at the portable version
    reference = store_mod.crc32c_portable
    rng = np.random.default_rng(3)
    expected = []
    for length in [0, 9, 511, 512, 513, 1000, 4096 + 17, 3 * 8192 + 5, 100_000]:
        data = rng.integers(0, 256, size=length, dtype=np.uint8).tobytes()
        expected.append((reference(data), reference(data)))
    assert all(sums.strip() == str(expected) for sums in kernels.values()), kernels
    if store_mod.crc32c_kernel() == "vpclmulqdq":  # the uncapped process ran the folded kernel
        assert set(kernels) == {"vpclmulqdq", "sse4.2", "portable"}
