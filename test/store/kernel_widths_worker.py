"""Runs the store's vector kernels on fixed inputs and saves what they produced (test_kernel_widths.py
runs it once per ATEN_CPU_CAPABILITY). Usage: kernel_widths_worker.py OUT_PATH"""

import sys

import numpy as np
import torch
import torch.nn.functional as F

import torch_recdev

ROWS, STEPS = 300, 5
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def random(seed, *shape):
    """From numpy, not torch: ATEN_CPU_CAPABILITY changes torch's own random kernels' floats."""
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape, dtype=np.float32))


def table(dtype, dim):
    with torch_recdev.placement("table"):
        weight = torch.empty(ROWS, dim, dtype=dtype, device="recdev")
    with torch.no_grad():
        weight.copy_(random(dim, ROWS, dim).to(dtype))
    return weight.requires_grad_()


def main(out_path):
    results = {"capability": torch_recdev._C._store_kernel_capability()}
    for dtype in DTYPES:
        for dim in (20, 128):  # 20: vectors of 16, 8 and 4 lanes, and the scalar rest
            gen = torch.Generator().manual_seed(3)
            ids = torch.randint(0, ROWS, (512,), generator=gen)  # with repeats
            offsets = torch.arange(0, 512, 4)
            weights = random(4, 512).to(dtype)
            pooled = table(dtype, dim)
            results[f"pooled sum {dtype} {dim}"] = F.embedding_bag(ids, pooled, offsets, mode="sum").detach()
            results[f"pooled weighted {dtype} {dim}"] = F.embedding_bag(
                ids, pooled, offsets, mode="sum", per_sample_weights=weights).detach()
            if dim == 128:  # bags of 1 into an output of 5-10 MiB: its sums are streamed
                many = torch.randint(0, ROWS, (20_000,), generator=gen)
                results[f"pooled streamed {dtype} {dim}"] = F.embedding_bag(
                    many, pooled, torch.arange(20_000), mode="sum").detach()
            for decay in (0.0, 0.01):
                weight = table(dtype, dim)
                torch_recdev.optim.RowWiseAdagrad([weight], lr=0.05, weight_decay=decay)
                for _ in range(STEPS):
                    F.embedding_bag(ids, weight, offsets, mode="sum").float().square().sum().backward()
                results[f"rowwise {dtype} {dim} decay {decay}"] = weight.detach().cpu()
    torch.save(results, out_path)


if __name__ == "__main__":
    main(sys.argv[1])
