"""Everyday tensor use on recdev host storage."""

import pytest
import torch


def test_round_trip_and_printing():
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    y = x.to("recdev")
    assert torch.equal(y.cpu(), x)
    assert "device='recdev:0'" in repr(y)
    assert y.tolist() == x.tolist()
    assert y[1, 2].item() == 5.0


def test_comparisons_and_reductions():
    x = torch.tensor([3.0, -1.0, 2.0], device="recdev")
    assert torch.equal((x > 0).cpu(), torch.tensor([True, False, True]))
    assert x.max().item() == 3.0 and x.argmin().item() == 1
    assert torch.equal(x.sort().values.cpu(), torch.tensor([-1.0, 2.0, 3.0]))
    assert bool((x == x).all())


def test_views_alias_their_base():
    x = torch.zeros(2, 3, device="recdev")
    y = x.view(-1)
    y[0] = 7
    assert x[0, 0].item() == 7
    x.t()[2, 1] = 5  # transpose is a view too
    assert x[1, 2].item() == 5
    x.select(0, 1).fill_(1)
    assert torch.equal(x.cpu(), torch.tensor([[7.0, 0, 0], [1, 1, 1]]))
    assert x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
    assert y._base is x


def test_views_made_by_the_fallback_alias_too():
    x = torch.arange(12.0, device="recdev")
    windows = x.unfold(0, 4, 4)  # unfold has a CPU kernel: it reaches the fallback
    windows[1, 1] = -1
    assert x[5].item() == -1


def test_indexing_and_index_assignment():
    x = torch.arange(10.0, device="recdev")
    assert torch.equal(x[torch.tensor([1, 3])].cpu(), torch.tensor([1.0, 3.0]))
    x[torch.tensor([0, 2], device="recdev")] = torch.tensor([9.0, 8.0], device="recdev")
    x[x > 8.5] = 0
    assert x.tolist() == [0.0, 1, 8, 3, 4, 5, 6, 7, 8, 0]
    m = torch.arange(12.0, device="recdev").reshape(3, 4)
    assert torch.equal(m[1:, ::2].cpu(), torch.arange(12.0).reshape(3, 4)[1:, ::2])


def test_in_place_and_out_variants_write_through():
    a = torch.ones(4, device="recdev")
    a.add_(1).mul_(3)
    assert a.tolist() == [6.0] * 4
    out = torch.empty(0, device="recdev")
    result = torch.add(a, 1, out=out)
    assert result is out and out.tolist() == [7.0] * 4  # out was resized by the CPU kernel


def test_out_variant_into_a_view_keeps_aliasing():
    base = torch.zeros(2, 4, device="recdev")
    torch.mul(torch.ones(4, device="recdev"), 2, out=base[1])
    assert base.tolist() == [[0.0] * 4, [2.0] * 4]


def test_resize_keeps_contents():
    x = torch.arange(4.0, device="recdev")
    x.resize_(8)
    assert x[:4].tolist() == [0.0, 1, 2, 3]


def test_non_blocking_copies():
    x = torch.randn(100)
    y = x.to("recdev", non_blocking=True)
    z = y.to("cpu", non_blocking=True)
    torch.recdev.synchronize()
    assert torch.equal(z, x)


def test_dtype_conversions_on_copy():
    x = torch.tensor([1.5, 2.5])
    assert torch.equal(x.to("recdev", torch.int64).cpu(), torch.tensor([1, 2]))
    assert x.to("recdev").double().dtype == torch.float64


def test_mixed_devices_error_like_cuda():
    x = torch.ones(3, device="recdev")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        x + torch.ones(3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.mm(torch.ones(2, 2, device="recdev"), torch.ones(2, 2))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.cat([torch.ones(2, device="recdev"), torch.ones(2)])


def test_cpu_scalars_and_cpu_indices_are_allowed():
    x = torch.ones(3, device="recdev")
    assert (x * torch.tensor(2.0)).tolist() == [2.0] * 3
    assert x[torch.tensor([0, 2])].tolist() == [1.0, 1.0]


def test_factories_with_a_device_argument():
    assert torch.ones(2, 2, device="recdev").sum().item() == 4
    assert torch.arange(5, device="recdev").tolist() == [0, 1, 2, 3, 4]
    assert torch.eye(3, device="recdev").trace().item() == 3
    assert torch.full((2,), 3.0, device="recdev").device.type == "recdev"
    assert torch.tril_indices(3, 3, device="recdev").device.type == "recdev"


def test_empty_tensor_and_zero_size_ops():
    x = torch.empty(0, 3, device="recdev")
    assert x.sum(0).tolist() == [0.0, 0.0, 0.0]
    assert x.cpu().shape == (0, 3)


def test_pin_memory_and_sparse_layouts_are_refused():
    with pytest.raises(RuntimeError, match="pin_memory"):
        torch.empty(2, device="recdev", pin_memory=True)


def test_pinning_a_cpu_tensor_gives_pinned_host_memory():
    # recdev is the accelerator: pin_memory() takes recdev's pinned allocator, and is_pinned() asks
    # recdev's hooks, which know every block it handed out (views and storage slices included).
    cpu = torch.randn(100)
    assert not cpu.is_pinned()
    pinned = cpu.pin_memory()
    assert pinned.device.type == "cpu" and pinned.is_pinned() and torch.equal(pinned, cpu)
    assert pinned.pin_memory() is pinned
    assert pinned[10:].is_pinned() and pinned.view(10, 10).t().is_pinned()
    assert torch.empty(0).set_(pinned.untyped_storage()[40:], 0, (5,), (1,)).is_pinned()
    assert not cpu.is_pinned() and not torch.randn(100).is_pinned()
    assert torch.empty(7, pin_memory=True).is_pinned()
    on_device = pinned.to("recdev", non_blocking=True)
    assert torch.equal(on_device.cpu(), cpu)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(cpu), batch_size=10, pin_memory=True)
    assert all(batch.is_pinned() for (batch,) in loader)


def test_a_recdev_tensor_cannot_be_pinned():
    with pytest.raises(RuntimeError, match="only dense CPU tensors can be pinned"):
        torch.ones(2, device="recdev").pin_memory()


FILL_DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
    torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool,
]

EMPTY_FACTORIES = {
    "empty": lambda dtype, device: torch.empty(3, 5, dtype=dtype, device=device),
    "empty_strided": lambda dtype, device: torch.empty_strided((3, 5), (1, 3), dtype=dtype, device=device),
    "empty_like": lambda dtype, device: torch.empty_like(torch.zeros(3, 5, dtype=dtype, device=device)),
    "empty_permuted": lambda dtype, device: torch.empty_permuted((3, 5), (1, 0), dtype=dtype, device=device),
    "new_empty": lambda dtype, device: torch.zeros(1, dtype=dtype, device=device).new_empty((3, 5)),
}



@pytest.mark.parametrize("factory", sorted(EMPTY_FACTORIES))
@pytest.mark.parametrize("dtype", FILL_DTYPES, ids=str)
def test_empty_is_filled_as_on_cpu_under_deterministic_algorithms(deterministic, factory, dtype):
    make = EMPTY_FACTORIES[factory]
    cpu = make(dtype, "cpu")
    for _ in range(2):  # the second one may reuse the first one's memory
        x = make(dtype, "recdev")
        assert x.shape == cpu.shape and x.stride() == cpu.stride()
        # bit for bit: NaN (floating, complex) and the maximum (integers, bool: True)
        assert torch.equal(x.cpu().contiguous().view(torch.uint8), cpu.contiguous().view(torch.uint8))
        del x
