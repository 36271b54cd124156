"""Lookups on tables inside graphs that torch.compile traces (docs/compile.md, "Training").

Eager autograd sends a table's row gradients to the store from recdev's C++ autograd kernels
(csrc/kernels/embedding_autograd.cpp). AOTAutograd does not run those kernels: it traces the joint
graph with fake tensors and would derive the ordinary dense gradient of the whole weight. So,
while torch traces (the Python dispatcher is on), ``aten.embedding`` and ``aten._embedding_bag``
on a recdev weight go through the Python kernels below: on a table, they become the custom ops
``recdev::embedding_lookup`` / ``recdev::embedding_bag_lookup``, whose registered backward calls
``recdev::table_embedding_backward`` / ``recdev::table_embedding_bag_backward`` — ops that update
the table through its fused optimizer and give the weight no gradient. On host storage they run
recdev's C++ autograd kernel, as in eager mode.

Fake tensors cannot tell a table from host storage, so the choice is made from the real tensor
the fake stands for (the fake mode's memo of the tensors it converted); a weight with none (made
inside the graph) is host storage.
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from typing import Optional

import torch
from torch._C import DispatchKey

from . import _C

__all__ = ["compile_signature"]

_AUTOGRAD = DispatchKey.AutogradPrivateUse1


def _real_tensor(t: torch.Tensor) -> Optional[torch.Tensor]:
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    if isinstance(t, FunctionalTensor):
        t = torch._from_functional_tensor(t.elem)
    if not isinstance(t, FakeTensor):
        return t
    converter = t.fake_mode.fake_tensor_converter.meta_converter
    for real, tensor_id in converter.describer.lookup_tensor.items():
        if converter.tensor_memo.get(tensor_id) is t:
            return real
    return None


def _is_table(weight: torch.Tensor) -> bool:
    real = _real_tensor(weight)
    return real is not None and _C._is_table(real)


# --- storage kind: invisible to torch.compile's guards and caches ------------------------------
#
# A traced graph depends on whether each recdev weight is a table or host storage, but neither
# Dynamo's tensor guards nor the AOTAutograd / FX graph cache keys see a storage kind (they see
# dtype, device, shape, strides). Left alone, a graph compiled for a host weight would be reused
# for a table of the same shape (training it through a dense gradient and never updating the
# store), and vice versa. Two defences:
# - `compile_signature()` goes into the cache keys (compile_support's custom-pass uuid), so a
#   cached graph is only reused for the same storage kinds and the same tracing code;
# - every traced lookup first runs `recdev::expect_storage`, which refuses, at run time, a weight
#   whose storage kind differs from the one the graph was traced for (Dynamo reusing a graph for
#   another model of the same shapes).

_TRACING_CODE = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def compile_signature() -> str:
    """The storage kinds of the recdev tensors that the current compilation sees, in the order it
    saw them ("T" table, "H" host), plus a hash of this file's code."""
    context = torch._guards.TracingContext.try_get()
    if context is None or context.fake_mode is None:
        # Outside a compilation there is nothing to tell graphs apart by: never share.
        return f"{_TRACING_CODE}:untraced:{uuid.uuid4().hex}"
    describer = context.fake_mode.fake_tensor_converter.meta_converter.describer
    kinds = "".join(
        "T" if _C._is_table(real) else "H"
        for real in list(describer.lookup_tensor.keys())
        if real.device.type == "recdev"
    )
    return f"{_TRACING_CODE}:{kinds}"


@torch.library.custom_op("recdev::expect_storage", mutates_args=())
def _expect_storage(weight: torch.Tensor, table: bool) -> None:
    if bool(_C._is_table(weight)) == table:
        return
    traced, given = ("a table", "host storage") if table else ("host storage", "a table")
    raise RuntimeError(
        f"recdev: this compiled graph was traced for an embedding weight in {traced}, but was called "
        f"with one in {given} (shape {tuple(weight.shape)}). torch.compile's guards do not see a "
        "tensor's storage kind, so it reused a graph compiled for another model of the same shapes. "
        "Call torch._dynamo.reset() before compiling a model whose weights differ from an "
        "already compiled one only in placement."
    )


@_expect_storage.register_fake
def _(weight, table):
    return None


torch.fx.node.has_side_effect(torch.ops.recdev.expect_storage.default)


# --- embedding ---------------------------------------------------------------------------------


@torch.library.custom_op("recdev::embedding_lookup", mutates_args=())
def _embedding_lookup(weight: torch.Tensor, indices: torch.Tensor, padding_idx: int, scale_grad_by_freq: bool) -> torch.Tensor:
    return torch.ops.aten.embedding.default(weight, indices, padding_idx, scale_grad_by_freq, False)


@_embedding_lookup.register_fake
def _(weight, indices, padding_idx, scale_grad_by_freq):
    return torch.ops.aten.embedding.default(weight, indices, padding_idx, scale_grad_by_freq, False)


def _embedding_setup(ctx, inputs, output):
    weight, indices, ctx.padding_idx, ctx.scale_grad_by_freq = inputs
    ctx.save_for_backward(weight, indices)


def _embedding_backward(ctx, grad):
    weight, indices = ctx.saved_tensors
    torch.ops.recdev.table_embedding_backward(weight, indices, grad, ctx.padding_idx, ctx.scale_grad_by_freq)
    return None, None, None, None


_embedding_lookup.register_autograd(_embedding_backward, setup_context=_embedding_setup)


@torch.ops.aten.embedding.default.py_impl(_AUTOGRAD)
def _traced_embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    table = _is_table(weight)
    torch.ops.recdev.expect_storage(weight, table)
    if table:
        return torch.ops.recdev.embedding_lookup(weight, indices, padding_idx, scale_grad_by_freq)
    return torch.ops.aten.embedding.default._op_dk(_AUTOGRAD, weight, indices, padding_idx, scale_grad_by_freq, sparse)


# --- embedding_bag -----------------------------------------------------------------------------


@torch.library.custom_op("recdev::embedding_bag_lookup", mutates_args=())
def _embedding_bag_lookup(
    weight: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    scale_grad_by_freq: bool,
    mode: int,
    per_sample_weights: Optional[torch.Tensor],
    include_last_offset: bool,
    padding_idx: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.ops.aten._embedding_bag.default(
        weight, indices, offsets, scale_grad_by_freq, mode, False, per_sample_weights, include_last_offset, padding_idx
    )


@_embedding_bag_lookup.register_fake
def _(weight, indices, offsets, scale_grad_by_freq, mode, per_sample_weights, include_last_offset, padding_idx):
    return torch.ops.aten._embedding_bag.default(
        weight, indices, offsets, scale_grad_by_freq, mode, False, per_sample_weights, include_last_offset, padding_idx
    )


def _embedding_bag_setup(ctx, inputs, output):
    weight, indices, _, ctx.scale_grad_by_freq, ctx.mode, per_sample_weights, _, ctx.padding_idx = inputs
    _, offset2bag, bag_size, max_indices = output
    ctx.weighted = per_sample_weights is not None
    ctx.save_for_backward(weight, indices, offset2bag, bag_size, max_indices, per_sample_weights)


def _embedding_bag_backward(ctx, grad, *_unused_grads):
    weight, indices, offset2bag, bag_size, max_indices, per_sample_weights = ctx.saved_tensors
    grad_per_sample_weights = None
    if ctx.weighted and ctx.needs_input_grad[5]:
        grad_per_sample_weights = torch.ops.recdev.table_embedding_bag_per_sample_weights_backward(
            weight, indices, grad, offset2bag, ctx.padding_idx
        )
    torch.ops.recdev.table_embedding_bag_backward(
        weight, indices, grad, offset2bag, bag_size, max_indices,
        per_sample_weights if ctx.weighted else None, ctx.mode, ctx.scale_grad_by_freq, ctx.padding_idx,
    )
    return None, None, None, None, None, grad_per_sample_weights, None, None


_embedding_bag_lookup.register_autograd(_embedding_bag_backward, setup_context=_embedding_bag_setup)


@torch.ops.aten._embedding_bag.default.py_impl(_AUTOGRAD)
def _traced_embedding_bag(
    weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False, per_sample_weights=None,
    include_last_offset=False, padding_idx=-1,
):
    table = _is_table(weight)
    torch.ops.recdev.expect_storage(weight, table)
    if table:
        return torch.ops.recdev.embedding_bag_lookup(
            weight, indices, offsets, scale_grad_by_freq, mode, per_sample_weights, include_last_offset, padding_idx
        )
    return torch.ops.aten._embedding_bag.default._op_dk(
        _AUTOGRAD, weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
        include_last_offset, padding_idx,
    )


# --- the backward ops (csrc/kernels/embedding_autograd.cpp) -----------------------------------------

# They update the store and return nothing: side effects that graph passes must keep and not reorder
# away (see the comment on their schemas).
torch.fx.node.has_side_effect(torch.ops.recdev.table_embedding_backward.default)
torch.fx.node.has_side_effect(torch.ops.recdev.table_embedding_bag_backward.default)



@torch.library.register_fake("recdev::table_embedding_backward")
def _(weight, indices, grad, padding_idx, scale_grad_by_freq):
    return None


@torch.library.register_fake("recdev::table_embedding_bag_backward")
def _(weight, indices, grad, offset2bag, bag_size, max_indices, per_sample_weights, pooling_mode, scale_grad_by_freq, padding_idx):
    return None


@torch.library.register_fake("recdev::table_embedding_bag_per_sample_weights_backward")
def _(weight, indices, grad, offset2bag, padding_idx):
    return grad.new_empty(indices.shape)
