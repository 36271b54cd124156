"""CRC-32C (csrc/store/crc32c.cpp): the SSE4.2 kernel, its three interleaved streams and the portable
table-driven version give the checksum of RFC 3720's test vectors and of a bit-by-bit reference, at
every length around the streams' 24 KiB blocks and from every alignment."""

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


@pytest.mark.parametrize(
    "length", [0, 1, 7, 8, 4095, 3 * BLOCK - 1, 3 * BLOCK, 3 * BLOCK + 1, 3 * BLOCK + 9, 6 * BLOCK + 5, 10 * BLOCK + 3]
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
