"""Saving and loading a lazy table (issue: torch.compile and state_dict checkpoints).

A 10^9 x 64 float32 nn.Embedding on recdev with 10^6 random rows written (10^5 in --quick).
torch.save(model.state_dict()) and torch.load + load_state_dict into a fresh model, against a raw
numpy.tofile / numpy.fromfile of the same bytes (the row ids and the rows) in the same run, and
the file against a dense save of the whole table (num_rows x dim x 4 bytes).

The targets are judged with integrity on (issue 38): the table's own CRC-32Cs, written by torch.save
and checked by every torch.load. PyTorch's zip writer adds a CRC-32 of its own that its reader never
checks, so torch.save runs with that one off and torch.load with mmap=True (which does not read the
file whole). The default paths are reported too, beside what torch.save and torch.load take for the
same bytes as plain CPU tensors: PyTorch's own cost, which no table can beat."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import torch
import torch.nn as nn

import torch_recdev
from harness import Fact, Row, compare

NUM_ROWS, DIM = 10**9, 64


def _model():
    return nn.Embedding(NUM_ROWS, DIM, device="recdev")


def run(quick: bool = False) -> list:
    touched = 10**5 if quick else 10**6
    repeat = 1 if quick else 3
    torch.manual_seed(0)
    model = _model()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, NUM_ROWS, (touched,), generator=gen).unique()  # a few collisions dropped
    values = torch.randn(len(ids), DIM, generator=gen)
    torch_recdev.ops.emb_write(model.weight, ids, values)
    raw_ids, raw_rows = ids.numpy().astype(np.int64), values.numpy()

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ours, peer = os.path.join(tmp, "model.pt"), os.path.join(tmp, "raw.bin")

        def save_raw():
            with open(peer, "wb") as f:
                raw_ids.tofile(f)
                raw_rows.tofile(f)

        def load_raw():
            with open(peer, "rb") as f:
                np.fromfile(f, dtype=np.int64, count=len(raw_ids))
                np.fromfile(f, dtype=np.float32)

        def save_without_zip_crc32():
            # The table's CRC-32Cs are written; PyTorch's CRC-32 of its zip records, checked by no one, is not.
            torch.serialization.set_crc32_options(False)
            try:
                torch.save(model.state_dict(), ours)
            finally:
                torch.serialization.set_crc32_options(True)

        save_s, raw_save_s = compare(save_without_zip_crc32, save_raw, repeat=repeat)
        rows.append(Row(f"torch.save, 10^9-row table, {len(ids):,} rows touched, table CRC-32C on, zip CRC-32 off", save_s,
                        "numpy.tofile of the same bytes", raw_save_s, "within 1.5× (≥ 0.67)", 1 / 1.5))
        crc_s, raw_save_s = compare(lambda: torch.save(model.state_dict(), ours), save_raw, repeat=repeat)
        rows.append(Row("torch.save of it, default (zip CRC-32 on too)", crc_s, "numpy.tofile of the same bytes", raw_save_s,
                        "none: see the next row", 0.0))
        # What torch.save itself costs for these bytes (its zip writer and CRC-32), without the table:
        # the floor under the row above, which no table can beat.
        cpu_ids, cpu_rows = torch.from_numpy(raw_ids), torch.from_numpy(raw_rows)
        cpu_path = ours + ".cpu"
        floor_s, raw_floor_s = compare(lambda: torch.save((cpu_ids, cpu_rows), cpu_path), save_raw, repeat=repeat)
        rows.append(Row("for reference: torch.save of the same bytes as two CPU tensors", floor_s,
                        "numpy.tofile of the same bytes", raw_floor_s, "none (torch.save's own cost)", 0.0))
        destination = _model()
        mmap_s, raw_load_s = compare(lambda: destination.load_state_dict(torch.load(ours, mmap=True)), load_raw,
                                     repeat=repeat)
        rows.append(Row("torch.load(mmap=True) + load_state_dict of it (checks the table's CRC-32C)", mmap_s, "numpy.fromfile of the same bytes",
                        raw_load_s, "within 1.5× (≥ 0.67)", 1 / 1.5))
        load_s, raw_load_s = compare(lambda: destination.load_state_dict(torch.load(ours)), load_raw, repeat=repeat)
        rows.append(Row("torch.load + load_state_dict of it, default (reads the file whole)", load_s,
                        "numpy.fromfile of the same bytes", raw_load_s, "none: see the next row", 0.0))
        cpu_load_s, raw_load_s = compare(lambda: torch.load(cpu_path), load_raw, repeat=repeat)
        rows.append(Row("for reference: torch.load of the two CPU tensors", cpu_load_s, "numpy.fromfile of the same bytes",
                        raw_load_s, "none (torch.load's own cost)", 0.0))
        restored = torch_recdev.ops.emb_read(destination.weight, ids[:1000]).cpu()
        file_bytes, raw_bytes = os.path.getsize(ours), os.path.getsize(peer)
    dense_bytes = NUM_ROWS * DIM * 4
    rows.append(Fact("file size vs the raw bytes of the rows touched", f"{file_bytes / raw_bytes:.4f}× ({file_bytes:,} B)",
                     "≤ 1.01×", file_bytes <= 1.01 * raw_bytes))
    rows.append(Fact("file size vs a dense save of the whole table", f"1/{dense_bytes / file_bytes:,.0f} of {dense_bytes:,} B",
                     "rows touched, not num_rows", file_bytes < dense_bytes / 100))
    rows.append(Fact("restored rows equal the saved ones", str(torch.equal(restored, values[:1000])), "exact",
                     torch.equal(restored, values[:1000])))
    return rows


if __name__ == "__main__":
    import harness

    print(harness.markdown("Saving and loading a lazy table", run()))
