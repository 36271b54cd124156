"""The store's vector kernels give the same bits at every width (csrc/store/cpu_features.h): the
RowWiseAdagrad update with 4 or 8 doubles per vector and pooling with 4, 8 or 16 floats (into small
outputs, and into one large enough for streamed sums), on float32, float16 and bfloat16 rows. Each
width runs in a process of its own, ATEN_CPU_CAPABILITY capping it as it caps PyTorch's kernels. (The baseline build's RowWiseAdagrad sums its squares in one running
sum, not 8 lanes, so only its pooling is compared.)"""

from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("kernel_widths_worker.py")


def results_capped(run_capped, capability, out_path):
    """The worker's results, run with its kernels capped at `capability`."""
    run_capped([str(WORKER), str(out_path)], capability)
    return torch.load(out_path)


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() != "AVX512",
                    reason="needs a CPU with AVX-512 for two widths to compare")
def test_avx512_and_avx2_kernels_give_the_same_bits(tmp_path, run_capped):
    widest = results_capped(run_capped, None, tmp_path / "avx512.pt")
    avx2 = results_capped(run_capped, "avx2", tmp_path / "avx2.pt")
    assert (widest.pop("capability"), avx2.pop("capability")) == ("AVX512", "AVX2")
    assert widest.keys() == avx2.keys()
    for name, values in widest.items():
        assert values.dtype == avx2[name].dtype, name
        bits = torch.int16 if values.element_size() == 2 else torch.int32
        assert torch.equal(values.view(bits), avx2[name].view(bits)), f"{name}: the AVX-512 and AVX2 kernels differ"
        assert values.isfinite().all(), name


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"),
                    reason="needs a CPU with AVX2 for two widths to compare")
def test_baseline_pooling_gives_the_avx2_bits(tmp_path, run_capped):
    avx2 = results_capped(run_capped, "avx2", tmp_path / "avx2.pt")
    baseline = results_capped(run_capped, "default", tmp_path / "default.pt")
    assert (avx2.pop("capability"), baseline.pop("capability")) == ("AVX2", "DEFAULT")
    pooled = [name for name in avx2 if name.startswith("pooled")]
    assert len(pooled) == 15  # sums and weighted sums at two dims, and streamed sums, in 3 dtypes
    for name in pooled:
        bits = torch.int16 if avx2[name].element_size() == 2 else torch.int32
        assert torch.equal(avx2[name].view(bits), baseline[name].view(bits)), f"{name}: baseline and AVX2 pooling differ"
