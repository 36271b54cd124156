"""The device module (torch.recdev), registration and the device guard."""

import os
import subprocess
import sys

import pytest
import torch


def test_registered_under_its_name():
    assert torch._C._get_privateuse1_backend_name() == "recdev"
    assert torch.recdev.is_available()
    assert torch.recdev.device_count() == 1
    assert torch.recdev.current_device() == 0
    torch.recdev.set_device(0)
    torch.recdev.set_device("recdev:0")
    torch.recdev.synchronize()


def test_only_one_device():
    with pytest.raises(ValueError, match="one device"):
        torch.recdev.set_device(1)
    with pytest.raises(RuntimeError, match="one device"):
        torch.empty(2, device="recdev:1")


def test_generated_methods():
    x = torch.ones(2)
    y = x.recdev()
    assert y.is_recdev and not x.is_recdev
    assert y.device == torch.device("recdev", 0)
    module = torch.nn.Linear(2, 2).recdev()
    assert module.weight.is_recdev
    storage = y.untyped_storage()
    assert storage.is_recdev and storage.device.type == "recdev"


@pytest.mark.parametrize(
    "dtype, name",
    [(torch.float32, "FloatStorage"), (torch.float64, "DoubleStorage"), (torch.int64, "LongStorage"),
     (torch.bool, "BoolStorage"), (torch.bfloat16, "BFloat16Storage"), (torch.complex64, "ComplexFloatStorage")],
)
def test_storage_type_is_the_legacy_storage_class_of_torch_recdev(dtype, name):
    # As on the CPU (torch.FloatStorage) and CUDA (torch.cuda.FloatStorage): the class torch.storage
    # finds on the device module.
    cpu = torch.zeros(2, dtype=dtype)
    x = cpu.to("recdev")
    assert cpu.storage_type() is getattr(torch, name)
    cls = x.storage_type()
    assert cls is getattr(torch.recdev, name)
    assert x.storage().type() == f"torch.recdev.{name}"
    assert isinstance(x.storage(), cls) and not isinstance(cpu.storage(), cls)
    assert cls.dtype == dtype
    made = cls(3)
    assert made.device.type == "recdev" and made.dtype == dtype and made.size() == 3


def test_device_context_manager_allocates_on_recdev():
    with torch.device("recdev"):
        x = torch.zeros(3)
    assert x.device.type == "recdev"


def _python(code, **env):
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )


def test_import_torch_alone_registers_recdev():
    result = _python("import torch; print(torch.ones(1, device='recdev').device)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "recdev:0"


def test_autoload_can_be_turned_off():
    result = _python(
        "import torch; print(torch._C._get_privateuse1_backend_name())",
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "privateuseone"
