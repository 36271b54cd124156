"""Re-signing a checkpoint file whose bytes a test rewrote: the checksum its format version ends with
(csrc/store/checkpoint.h): CRC-32C from version 6, zlib's CRC-32 in versions 2 to 5."""

import importlib
import os
import struct
import zlib

_store = importlib.import_module(os.environ.get("RECDEV_STORE_MODULE", "torch_recdev._testing"))._store


def file_checksum(body: bytes) -> bytes:
    """The 4 bytes that end a checkpoint file of these `body` bytes."""
    version = struct.unpack_from("<I", body, 8)[0]
    crc = _store.crc32c(bytes(body)) if version >= 6 else zlib.crc32(bytes(body))
    return struct.pack("<I", crc)
