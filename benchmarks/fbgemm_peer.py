"""The fbgemm peer: fbgemm's CPU table-batched embedding (TBE) timed on the
workloads of bench_fbgemm.py. Runs in its own venv (.venv-fbgemm: torch 2.14.1,
fbgemm-gpu-cpu 1.9.0, which cannot share a venv with torch 2.13.0), started by
bench_fbgemm.py in the same `make bench` run; prints one JSON object.

    .venv-fbgemm/bin/python benchmarks/fbgemm_peer.py --rows 1000000 --dim 128 --ids 65536 --bag 4
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)

from harness import median_seconds  # stdlib only, so it imports in the peer's venv too


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--dim", type=int, required=True)
    parser.add_argument("--ids", type=int, required=True)
    parser.add_argument("--bag", type=int, required=True)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--eps", type=float, default=1e-8)
    args = parser.parse_args(argv)
    torch.manual_seed(0)

    ids = torch.randint(0, args.rows, (args.ids,), dtype=torch.int64)
    # TBE takes B + 1 offsets (the last one ends the last bag).
    offsets = torch.arange(0, args.ids + 1, args.bag, dtype=torch.int64)

    def timed(precision):
        """(forward, training step) seconds of a TBE whose weights are of `precision`."""
        tbe = SplitTableBatchedEmbeddingBagsCodegen(
            embedding_specs=[(args.rows, args.dim, EmbeddingLocation.HOST, ComputeDevice.CPU)],
            optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
            learning_rate=args.lr,
            eps=args.eps,
            pooling_mode=PoolingMode.SUM,
            weights_precision=precision,
            stochastic_rounding=False,  # round to nearest, as recdev does by default
        )

        def forward():
            with torch.no_grad():
                tbe(ids, offsets)

        def train_step():
            out = tbe(ids, offsets)
            out.sum().backward()  # the fused EXACT_ROWWISE_ADAGRAD update runs inside backward

        return median_seconds(forward, repeat=args.repeat), median_seconds(train_step, repeat=args.repeat)

    forward_s, train_step_s = timed(SparseType.FP32)
    # float16 weights with float32 optimizer state: the peer of recdev's float16 tables (issue 17).
    fp16_forward_s, fp16_train_step_s = timed(SparseType.FP16)
    result = {
        "torch": torch.__version__,
        "forward_s": forward_s,
        "train_step_s": train_step_s,
        "fp16_forward_s": fp16_forward_s,
        "fp16_train_step_s": fp16_train_step_s,
        "threads": torch.get_num_threads(),
    }
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
