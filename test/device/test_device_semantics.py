"""What PyTorch's device-generic tests expect of every accelerator (docs/device.md, "Mixed devices"
and "Forward-mode AD"): an out= tensor on another device is refused, whatever its shape; a CPU
tensor indexed by recdev indices is refused with CUDA's message; forward-mode AD goes through
embedding lookups; a half-precision bag's per-sample-weight gradient rounds as CPU's does."""

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F

import torch_recdev

SAME_DEVICE = "on the same device"


@pytest.mark.parametrize("call", [
    lambda x, out: torch.sum(x, 0, out=out),
    lambda x, out: torch.linalg.vector_norm(x, out=out),
    lambda x, out: torch.mean(x, 0, out=out),
    lambda x, out: torch.amax(x, 0, out=out),
    lambda x, out: torch.dot(x, x, out=out),
], ids=["sum", "vector_norm", "mean", "amax", "dot"])
def test_a_zero_dim_cpu_out_is_refused(call):
    """A 0-dim CPU tensor passes for a scalar as an input, never as the tensor written to."""
    x = torch.arange(4.0, device="recdev")
    out = torch.empty(())
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        call(x, out)
    assert out.device.type == "cpu"


@pytest.mark.parametrize("shape", [(0,), (3,), (2, 2), ()])
@pytest.mark.parametrize("out_shape", [(0, 1), (0,), ()])
def test_nonzero_into_a_cpu_out_is_refused_for_every_input(shape, out_shape):
    x = torch.ones(shape, device="recdev")
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        torch.nonzero(x, out=torch.empty(out_shape, dtype=torch.long))


def test_a_zero_dim_cpu_input_is_still_a_scalar():
    x = torch.arange(3.0, device="recdev")
    assert torch.equal(torch.add(x, torch.tensor(2.0)).cpu(), torch.tensor([2.0, 3.0, 4.0]))


@pytest.mark.parametrize("index", [
    lambda base, idx: base[idx],
    lambda base, idx: base.index_put_((idx,), torch.tensor(1.0)),
    lambda base, idx: base[idx, 0],
], ids=["index", "index_put_", "index-then-int"])
def test_a_cpu_tensor_indexed_by_recdev_indices_gets_cudas_message(index):
    base = torch.zeros(4, 3)
    idx = torch.tensor([0, 2], device="recdev")
    with pytest.raises(IndexError, match=r"indices should be either on cpu or on the same device as the "
                                         r"indexed tensor \(cpu\)"):
        index(base, idx)


def test_recdev_tensor_indexed_by_cpu_or_recdev_indices_works():
    base = torch.arange(12.0).view(4, 3)
    on = base.to("recdev")
    for idx in (torch.tensor([3, 1]), torch.tensor([3, 1], device="recdev")):
        assert torch.equal(on[idx].cpu(), base[torch.tensor([3, 1])])


# --- forward-mode AD ------------------------------------------------------------------------------

def jvp_on(device, fn, primals, tangents):
    moved = [p.to(device) if p is not None else None for p in primals]
    moved_tangents = [t.to(device) if t is not None else None for t in tangents]
    with fwAD.dual_level():
        duals = [fwAD.make_dual(p, t) if t is not None else p for p, t in zip(moved, moved_tangents)]
        out = fn(*duals)
        primal, tangent = fwAD.unpack_dual(out)
    return primal.cpu(), tangent.cpu()


IDS = torch.tensor([4, 0, 4, 9, 2, 7])
OFFSETS = torch.tensor([0, 2, 2, 5])  # bag 1 is empty


def test_forward_ad_through_embedding_equals_cpu():
    weight, tangent = torch.randn(10, 5), torch.randn(10, 5)
    fn = lambda w: F.embedding(IDS.to(w.device), w, padding_idx=2)  # noqa: E731
    cpu = jvp_on("cpu", fn, [weight], [tangent])
    recdev = jvp_on("recdev", fn, [weight], [tangent])
    assert torch.equal(recdev[0], cpu[0]) and torch.equal(recdev[1], cpu[1])


def reference_bag_tangent(mode, weight, weight_tangent, psw, psw_tangent):
    """An embedding bag is linear in its weight and, for a sum, in its per-sample weights; a max bag's
    element follows the row that holds the maximum. (CPU has no forward AD for embedding_bag.)"""
    if mode == "max":
        out = torch.zeros(len(OFFSETS), weight.shape[1])
        bounds = OFFSETS.tolist() + [len(IDS)]
        for b in range(len(OFFSETS)):
            rows = IDS[bounds[b]:bounds[b + 1]]
            if len(rows):
                best = weight[rows].argmax(0)
                out[b] = weight_tangent[rows[best], torch.arange(weight.shape[1])]
        return out
    tangent = torch.zeros(len(OFFSETS), weight.shape[1])
    if weight_tangent is not None:
        tangent += F.embedding_bag(IDS, weight_tangent, OFFSETS, mode=mode, per_sample_weights=psw)
    if psw_tangent is not None:
        tangent += F.embedding_bag(IDS, weight, OFFSETS, mode=mode, per_sample_weights=psw_tangent)
    return tangent


# Per-sample weights are for mode='sum' only.
@pytest.mark.parametrize("mode,tangent_of", [("sum", "weight"), ("sum", "per_sample_weights"), ("sum", "both"),
                                             ("mean", "weight"), ("max", "weight")])
def test_forward_ad_through_embedding_bag(mode, tangent_of):
    torch.manual_seed(0)
    weight, weight_tangent = torch.randn(10, 5), torch.randn(10, 5)
    psw, psw_tangent = (torch.randn(6), torch.randn(6)) if mode == "sum" else (None, None)
    tangents = [weight_tangent if tangent_of in ("weight", "both") else None,
                psw_tangent if tangent_of in ("per_sample_weights", "both") else None]

    def fn(w, p):
        return F.embedding_bag(IDS.to(w.device), w, OFFSETS.to(w.device), mode=mode, per_sample_weights=p)

    out, tangent = jvp_on("recdev", fn, [weight, psw], tangents)
    assert torch.equal(out, fn(weight, psw))
    torch.testing.assert_close(tangent, reference_bag_tangent(mode, weight, *tangents[:1], psw, tangents[1]),
                               rtol=1e-6, atol=1e-6)


def test_forward_ad_through_a_lookup_of_a_table():
    torch_recdev.connect(None)
    table = torch_recdev.ops.init_embedding_table("forward_ad", 10, 4, init=torch_recdev.Constant(0.5),
                                                  optimizer=("sgd", {"lr": 0.1}), reset=True)
    with fwAD.dual_level():
        dual = fwAD.make_dual(table, torch.ones(10, 4, device="recdev"))
        out, tangent = fwAD.unpack_dual(F.embedding(IDS.to("recdev"), dual))
    assert torch.equal(out.cpu(), torch.full((6, 4), 0.5))
    assert torch.equal(tangent.cpu(), torch.ones(6, 4))


def test_reverse_mode_is_unchanged_by_a_forward_ad_level():
    weight = torch.randn(10, 5, device="recdev", requires_grad=True)
    with fwAD.dual_level():
        out = F.embedding(IDS.to("recdev"), weight)
    out.sum().backward()
    want = torch.zeros(10, 5).index_add_(0, IDS, torch.ones(6, 5))
    assert torch.equal(weight.grad.cpu(), want)


# --- rounding --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_per_sample_weight_gradient_of_a_half_table_rounds_as_cpus(dtype):
    """A table's per-sample-weight gradient is a dot product rounded once, as CPU's: products
    rounded one by one were a step off in about one element in eight."""
    torch.manual_seed(3)
    rows, dim, n = 64, 32, 200
    weight = torch.randn(rows, dim).to(dtype)
    ids = torch.randint(0, rows, (n,))
    offsets = torch.arange(0, n, 4)
    psw = torch.randn(n).to(dtype)
    grad = torch.randn(n // 4, dim).to(dtype)

    cpu_psw = psw.clone().requires_grad_()
    F.embedding_bag(ids, weight, offsets, mode="sum", per_sample_weights=cpu_psw).backward(grad)

    torch_recdev.connect(None)
    table = torch_recdev.ops.init_embedding_table(f"psw_{dtype}", rows, dim, dtype=dtype,
                                                  optimizer=("sgd", {"lr": 0.0}), reset=True)
    torch_recdev.ops.emb_write(table, torch.arange(rows), weight)
    recdev_psw = psw.to("recdev").requires_grad_()
    F.embedding_bag(ids.to("recdev"), table, offsets.to("recdev"), mode="sum",
                    per_sample_weights=recdev_psw).backward(grad.to("recdev"))
    assert torch.equal(recdev_psw.grad.cpu(), cpu_psw.grad)
