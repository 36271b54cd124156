"""torch.compile on recdev (docs/compile.md).

Three registrations, each made when the part of torch it extends is first imported (importing
torch._dynamo costs seconds, and torch imports this package on every ``import torch``):

- Dynamo: ``register_interface_for_device("recdev", ...)`` — one device, synchronous, like the CPU.
- Fake tensors: recdev lookups take CPU ids (as the eager kernels do), so when an op mixes recdev
  and CPU tensors the fake result goes on recdev, as the eager result does
  (``torch._functorch.config.fake_tensor_prefer_device_type``, unless the user set it).
- Inductor: ``register_backend_for_device("recdev", ...)`` with a graph pass that marks every node
  reading or writing a recdev tensor to run as its eager recdev kernel. Inductor's generated code
  reads raw pointers, and a table's are opaque (never dereferenceable); so lookups in the store,
  and everything else on recdev, run eagerly inside the compiled graph, while the CPU parts of the
  same graph are compiled as usual.
"""

from __future__ import annotations

import importlib.abc
import sys

import torch

from .traced_lookups import compile_signature

__all__: list[str] = []

_DEVICE = "recdev"


def _register_dynamo(device_interface_module) -> None:
    class RecdevInterface(device_interface_module.CpuInterface):
        """recdev as Dynamo sees it: one device whose kernels complete before they return."""

        @staticmethod
        def is_available() -> bool:
            return True

        @staticmethod
        def device_count() -> int:
            return 1

        @staticmethod
        def current_device() -> int:
            return 0

        @staticmethod
        def synchronize(device=None) -> None:
            return None

    device_interface_module.register_interface_for_device(_DEVICE, RecdevInterface)
    device_interface_module.register_interface_for_device(f"{_DEVICE}:0", RecdevInterface)
    import torch._functorch.config as functorch_config

    if functorch_config.fake_tensor_prefer_device_type is None:
        functorch_config.fake_tensor_prefer_device_type = _DEVICE


def _touches_recdev(node) -> bool:
    def on_recdev(value) -> bool:
        return isinstance(value, torch.Tensor) and value.device.type == _DEVICE

    values = [node.meta.get("val")]
    values += [arg.meta.get("val") for arg in node.all_input_nodes]
    return any(on_recdev(v) for value in values for v in torch.utils._pytree.tree_leaves(value))


def _register_inductor(_compile_fx_module) -> None:
    from torch._inductor.codegen.common import register_backend_for_device, register_device_op_overrides
    from torch._inductor.codegen.cpu_device_op_overrides import CpuDeviceOpOverrides
    from torch._inductor.codegen.cpp import CppScheduling
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen
    from torch._inductor.custom_graph_pass import CustomGraphModulePass

    class RunRecdevNodesEagerly(CustomGraphModulePass):
        """Marks the nodes that touch a recdev tensor to run as their eager kernels."""

        def __call__(self, gm: torch.fx.GraphModule) -> None:
            for node in gm.graph.nodes:
                if node.op == "call_function" and _touches_recdev(node):
                    node.meta["should_fallback"] = True

        def uuid(self) -> str:
            # Part of every AOTAutograd and FX graph cache key: a cached graph traced for a table
            # must never serve a host weight of the same shape, nor the reverse (traced_lookups).
            return f"torch_recdev.compile.RunRecdevNodesEagerly.v2:{compile_signature()}"

    # CppScheduling never runs for recdev (no recdev node reaches code generation); the wrapper is
    # the ordinary Python one, which calls the eager kernels.
    register_backend_for_device(_DEVICE, CppScheduling, PythonWrapperCodegen, device_custom_pass=RunRecdevNodesEagerly())
    # No streams, no device switching: the wrapper's device code is the CPU's.
    register_device_op_overrides(_DEVICE, CpuDeviceOpOverrides())


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a hook right after a module is first imported (and at once if it already is)."""

    def __init__(self, hooks):
        self._hooks = dict(hooks)

    def install(self) -> None:
        for name in list(self._hooks):
            if name in sys.modules:
                self._hooks.pop(name)(sys.modules[name])
        if self._hooks:
            sys.meta_path.insert(0, self)

    def find_spec(self, name, path, target=None):
        hook = self._hooks.pop(name, None)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = spec.loader.exec_module

        def exec_then_hook(module):
            exec_module(module)
            hook(module)

        spec.loader.exec_module = exec_then_hook
        return spec


_AfterImport(
    {
        "torch._dynamo.device_interface": _register_dynamo,
        "torch._inductor.compile_fx": _register_inductor,
    }
).install()
