"""torch_recdev: the ``recdev`` PyTorch device, whose memory is a parameter server.

Importing this package (which ``import torch`` does on its own through the
``torch.backends`` entry point) registers the device on the PrivateUse1 key:
``torch.randn(3, device="recdev")``, ``x.recdev()``, ``model.to("recdev")``.
"""


def _autoload():
    """Entry point for ``torch.backends``. Importing this package does the work;
    it is defined before ``import torch`` so that importing torch_recdev first
    (which imports torch, which autoloads torch_recdev) finds it."""



import torch  # noqa: E402

from . import _C  # noqa: E402,F401  (loading it registers kernels, allocator, guard, hooks)
from . import device_module  # noqa: E402

_BACKEND = "recdev"


def _register_backend():
    current = torch._C._get_privateuse1_backend_name()
    if current == _BACKEND:
        return
    if current != "privateuseone":
        raise RuntimeError(
            f"torch_recdev needs the PrivateUse1 dispatch key, but backend '{current}' "
            "already holds it; only one PrivateUse1 backend can be loaded per process"
        )
    torch.utils.rename_privateuse1_backend(_BACKEND)
    torch._register_device_module(_BACKEND, device_module)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )


_register_backend()


def _run_backward_on_the_calling_thread():
    """recdev kernels complete synchronously, so autograd's per-device worker
    thread buys nothing, and it costs a thread hop per backward and an abort
    at exit: it releases each finished graph task (which holds Python
    thread-local state) just after backward() returns, and if the interpreter
    is finalizing by then, Python ends the thread mid-unwind. So backward runs
    on the thread that calls it, which is what set_multithreading_enabled
    (thread-local) controls; it is only turned off when no other accelerator
    could want the worker threads."""
    other_accelerator = torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
    if not other_accelerator:
        torch._C._set_multithreading_enabled(False)


_run_backward_on_the_calling_thread()


from . import compile_support, ops, optim, serialization, stores, traced_lookups  # noqa: E402,F401  (hooks into torch.compile, torch.save)
from .stores import StoreFullError, connect, fleet_store, server_stats, store_info  # noqa: E402
from .budgets import set_disk_dir, set_table_policy, table_policy  # noqa: E402
from .fleet import share_tables  # noqa: E402
from .ops import export_tables  # noqa: E402
from .lookups import embeddings  # noqa: E402
from .init import Constant, Normal, Uniform, Xavier, Zero  # noqa: E402
from .tables import (  # noqa: E402
    is_table,
    max_fallback_bytes,
    placement,
    set_max_fallback_bytes,
    set_table_min_bytes,
    table_min_bytes,
    table_stats,
)


stores._connect_from_environment()


__all__ = [
    "Constant",
    "Normal",
    "Uniform",
    "Xavier",
    "Zero",
    "connect",
    "store_info",
    "fleet_store",
    "server_stats",
    "StoreFullError",
    "share_tables",
    "export_tables",
    "embeddings",
    "ops",
    "optim",
    "is_table",
    "max_fallback_bytes",
    "placement",
    "set_max_fallback_bytes",
    "set_table_min_bytes",
    "table_min_bytes",
    "table_stats",
    "set_disk_dir",
    "set_table_policy",
    "table_policy",
]
