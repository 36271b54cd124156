"""torch.autocast("recdev") (csrc/kernels/autocast.cpp; docs/device.md, "Autocast"): the same ops and
cast policies as CPU autocast, so a module autocasts on recdev exactly as on the CPU, forward and
backward, and embedding lookups from tables pass through unchanged."""

import pytest
import torch
import torch.nn.functional as F
from torch.testing._internal.common_methods_invocations import op_db

import torch_recdev

DTYPES = [torch.bfloat16, torch.float16]


def test_the_ops_autocast_are_cpus():
    """The registrations are CPU's for this torch: an upgrade that changes CPU's list fails here."""
    cpu = set(torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCPU"))
    recdev = set(torch._C._dispatch_get_registrations_for_dispatch_key("AutocastPrivateUse1"))
    assert recdev == cpu, f"only on CPU: {sorted(cpu - recdev)}; only on recdev: {sorted(recdev - cpu)}"


def test_supported_dtypes_and_an_unsupported_one():
    assert torch.recdev.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    with pytest.warns(UserWarning, match="not supported"):
        with torch.autocast("recdev", dtype=torch.float64):
            out = torch.ones(2, 2, device="recdev") @ torch.ones(2, 2, device="recdev")
    assert out.dtype == torch.float32  # disabled, as the warning says


class CTRModel(torch.nn.Module):
    """An MLP over embedding bags, as the demo's."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.bag = torch.nn.EmbeddingBag(50, 8, mode="sum")
        self.mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def forward(self, ids, offsets, dense):
        pooled = self.bag(ids, offsets)
        return self.mlp(torch.cat([pooled, dense], dim=1)).squeeze(1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_model_autocasts_as_on_cpu_forward_and_backward(dtype):
    torch.manual_seed(1)
    ids, offsets = torch.randint(0, 50, (40,)), torch.arange(0, 40, 4)
    dense, labels = torch.randn(10, 8), torch.rand(10).round()
    results = {}
    for device in ("cpu", "recdev"):
        model = CTRModel().to(device)  # the same weights on both
        with torch.autocast(device, dtype=dtype):
            logits = model(ids.to(device), offsets.to(device), dense.to(device))
            loss = F.binary_cross_entropy_with_logits(logits, labels.to(device))
        loss.backward()
        results[device] = (logits.detach().cpu(), loss.detach().cpu(),
                           [p.grad.cpu() for p in model.parameters()])
    (cpu_logits, cpu_loss, cpu_grads), (logits, loss, grads) = results["cpu"], results["recdev"]
    assert logits.dtype == cpu_logits.dtype == dtype, "the MLP ran in the lower precision"
    assert loss.dtype == cpu_loss.dtype == torch.float32, "the loss ran in float32"
    assert torch.equal(logits, cpu_logits) and torch.equal(loss, cpu_loss)
    for got, want in zip(grads, cpu_grads):
        assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_lookups_from_a_float32_table_stay_float32(dtype):
    torch_recdev.connect(None)
    table = torch_recdev.ops.init_embedding_table("autocast_lookup", 1000, 8, optimizer=("sgd", {"lr": 0.1}),
                                                  reset=True)
    ids = torch.tensor([3, 5, 999])
    with torch.autocast("recdev", dtype=dtype):
        rows = F.embedding(ids.to("recdev"), table)
        pooled = F.embedding_bag(ids.to("recdev"), table, torch.tensor([0], device="recdev"))
    with torch.autocast("cpu", dtype=dtype):
        cpu_rows = F.embedding(ids, table.cpu())
    assert rows.dtype == pooled.dtype == cpu_rows.dtype == torch.float32


def _ops_autocast_touches():
    names = {name.removeprefix("aten::").split(".")[0]
             for name in torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCPU")}
    return [op for op in op_db if op.aten_name in names and op.supports_autograd
            and torch.float32 in op.supported_dtypes("cpu")][:40]


@pytest.mark.parametrize("op", _ops_autocast_touches(), ids=lambda op: op.full_name if hasattr(op, "full_name") else op.name)
def test_opinfo_ops_autocast_as_on_cpu(op):
    """The first OpInfo sample of each op that autocast casts: the same result dtype and values under
    recdev autocast as under CPU autocast (bfloat16)."""
    sample = next(iter(op.sample_inputs("cpu", torch.float32)))

    def run(device):
        moved = sample.transform(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t)
        with torch.autocast(device, dtype=torch.bfloat16):
            torch.manual_seed(0)
            out = op(moved.input, *moved.args, **moved.kwargs)
        return [t.cpu() for t in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor)]

    for got, want in zip(run("recdev"), run("cpu"), strict=True):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
