"""recdev against fbgemm's CPU table-batched embedding (TBE), the kernel
production recommendation models run on (optional peer of the store-engine and
training issues).

1M × 128 float32 table, 65,536 uniform ids in bags of 4 (sum pooling), fixed
seed. Pooled forward: recdev table embedding_bag vs TBE forward. Training step:
recdev fused RowWiseAdagrad vs TBE EXACT_ROWWISE_ADAGRAD (the same math,
csrc/store/optimizer.h), forward + backward + update. The float16 row (issue 17): the same step on
a float16 table against TBE with float16 weights (weights_precision=SparseType.FP16, float32
optimizer state, round-to-nearest as recdev's default).

fbgemm-gpu-cpu 1.9.0 needs torch 2.14.1, so it runs in its own venv
(.venv-fbgemm, `make fbgemm-venv`), as a subprocess of this same run
(fbgemm_peer.py). Where that venv cannot be installed the rows say so."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

import torch_recdev
from harness import Fact, Row, median_seconds

NUM_ROWS, DIM, NUM_IDS, BAG = 1_000_000, 128, 65_536, 4
HERE = os.path.dirname(os.path.abspath(__file__))
PEER_PYTHON = os.path.join(HERE, os.pardir, ".venv-fbgemm", "bin", "python")


def _peer(rows: int, repeat: int) -> dict:
    cmd = [PEER_PYTHON, os.path.join(HERE, "fbgemm_peer.py"), "--rows", str(rows), "--dim", str(DIM),
           "--ids", str(NUM_IDS), "--bag", str(BAG), "--repeat", str(repeat)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())})
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no output")
    return json.loads(done.stdout)


def _recdev(rows: int, repeat: int, dtype: torch.dtype = torch.float32) -> tuple[float, float]:
    torch.manual_seed(0)
    with torch_recdev.placement("table"):
        bag = torch.nn.EmbeddingBag(rows, DIM, mode="sum", device="recdev", dtype=dtype)
    bag.weight.data.copy_(torch.randn(rows, DIM))  # every row materialized, as TBE's dense table is
    torch_recdev.optim.RowWiseAdagrad([bag.weight], lr=0.05, eps=1e-8)
    ids = torch.randint(0, rows, (NUM_IDS,))
    offsets = torch.arange(0, NUM_IDS, BAG)

    def forward():
        with torch.no_grad():
            bag(ids, offsets)

    def train_step():
        bag(ids, offsets).float().sum().backward()

    return median_seconds(forward, repeat=repeat), median_seconds(train_step, repeat=repeat)


def run(quick: bool = False) -> list:
    rows = NUM_ROWS // 10 if quick else NUM_ROWS
    repeat = 3 if quick else 15
    if not os.path.exists(PEER_PYTHON):
        note = "not run: .venv-fbgemm is missing (`make fbgemm-venv` installs torch 2.14.1 + fbgemm-gpu-cpu 1.9.0)"
        return [Fact("fbgemm CPU TBE, pooled forward and EXACT_ROWWISE_ADAGRAD step (optional peer)", note,
                     "parity / ≥ 2×", False)]
    try:
        peer = _peer(rows, repeat)
    except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as error:
        return [Fact("fbgemm CPU TBE (optional peer)", f"not run: the peer failed: {error}", "parity / ≥ 2×", False)]
    forward_s, step_s = _recdev(rows, repeat)
    _, half_step_s = _recdev(rows, repeat, torch.float16)
    peer_name = f"fbgemm-gpu-cpu 1.9.0 TBE (torch {peer['torch']})"
    return [
        Row("embedding_bag sum, bags of 4, vs fbgemm", forward_s, peer_name, peer["forward_s"], "parity (≥ 1×)", 1.0),
        Row("training step, RowWiseAdagrad vs fbgemm EXACT_ROWWISE_ADAGRAD", step_s, peer_name,
            peer["train_step_s"], "≥ 2×", 2.0),
        Row("training step float16, RowWiseAdagrad vs fbgemm FP16 weights", half_step_s, peer_name + ", FP16",
            peer["fp16_train_step_s"], "≥ 3×", 3.0),
    ]


if __name__ == "__main__":
    import harness

    print(harness.markdown("recdev vs fbgemm", run(quick="--quick" in sys.argv)))
