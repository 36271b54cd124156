"""torch.save / torch.load of recdev tables: init rule plus materialized rows, never num_rows rows.

PyTorch pickles a tensor through ``Tensor._reduce_ex_internal``, which writes a
device tensor's whole storage (``UntypedStorage.cpu()``); it has no per-backend
hook. So this module wraps that method once, at import, for tensors on recdev
table storage only: such a tensor pickles as ``_rebuild_table(snapshot...)``,
where the snapshot is the store's header (shape, init rule and its stream, the
fused optimizer and its step) and two CPU tensors, the materialized row ids and
their records (weight then optimizer state), with CRC-32s of the header's
numbers, the ids and the records that ``torch.load`` checks before it makes the
table. Every other tensor pickles exactly as before. ``_rebuild_table`` is registered with ``torch.serialization.add_safe_globals``
so that ``torch.load``'s default ``weights_only=True`` accepts it.

Where a table is rebuilt follows ``map_location`` through an empty recdev
"anchor" storage saved beside the snapshot (``torch.load`` maps it like any
storage): on recdev, a new table with the same rule whose rows wait in the
loaded CPU tensors until its first use, or until ``load_state_dict`` copies
them straight into the model's table (``TableBlock::defer_rows``); anywhere
else, a dense tensor, refused past ``max_fallback_bytes``.
"""

from __future__ import annotations

import torch

from . import _C
from .tables import max_fallback_bytes, placement

__all__: list[str] = []

_reduce_ex_internal = torch.Tensor._reduce_ex_internal


def _reduce_table_aware(self, proto):
    if (
        self.device.type == "recdev"
        and _C._is_table(self)
        and not torch.serialization._serialization_tls.skip_data
    ):
        return _reduce_table(self)
    return _reduce_ex_internal(self, proto)


def _reduce_table(t: torch.Tensor):
    header, ids, records = _C._table_snapshot(t)
    with placement("host"):
        anchor = torch.empty(0, dtype=torch.uint8, device=t.device)
    return (
        _rebuild_table,
        (header, ids, records, anchor, t.dtype, t.storage_offset(), tuple(t.size()), tuple(t.stride()), t.requires_grad),
    )


def _covered_bytes(size, stride, itemsize) -> int:
    if any(s == 0 for s in size):
        return 0
    return (sum((s - 1) * abs(st) for s, st in zip(size, stride)) + 1) * itemsize


def _rebuild_table(header, ids, records, anchor, dtype, offset, size, stride, requires_grad):
    if not isinstance(header, dict) or not isinstance(anchor, torch.Tensor):
        raise ValueError("torch.load: the saved recdev table is damaged or was not written by torch_recdev")
    size, stride = tuple(size), tuple(stride)
    if anchor.device.type == "meta":
        return torch.empty_strided(size, stride, dtype=dtype, device="meta").requires_grad_(requires_grad)
    dense = anchor.device.type != "recdev"
    if dense:
        nbytes = _covered_bytes(size, stride, dtype.itemsize)
        if nbytes > max_fallback_bytes():
            raise RuntimeError(
                f"torch.load: the recdev table of shape {list(size)} ({dtype}) mapped to {anchor.device} would be a "
                f"dense tensor of {nbytes} bytes, more than max_fallback_bytes ({max_fallback_bytes()}). Load it onto "
                "recdev (no map_location) and load_state_dict it into a model on recdev, where it stays lazy, or "
                "raise the limit with torch_recdev.set_max_fallback_bytes()."
            )
    raw = _C._restore_table(header, ids, records, f"{list(size)} ({dtype})")
    table = torch.empty(0, dtype=dtype, device=raw.device).set_(raw.untyped_storage(), offset, size, stride)
    if dense:
        table = table.to(anchor.device)
    return table.requires_grad_(requires_grad)


torch.Tensor._reduce_ex_internal = _reduce_table_aware
torch.serialization.add_safe_globals([_rebuild_table])
