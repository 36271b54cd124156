"""torch_recdev.embeddings: F.embedding of several store tables in one call (docs/remote.md,
"Looking up several tables at once").

On a remote store, each F.embedding is a round trip, waited for before the next call starts: a
model with 8 tables waits for 8 in turn. ``embeddings`` sends every table's requests before it
awaits any answer (``recdev::gather_tables``), so the lookups cost one round trip together. Its
backward sends each table's gradient to the store as F.embedding's does
(``recdev::table_embedding_backward``); a backward pass sends remote tables' updates together too.
On the embedded store it gives the same results as the F.embedding calls it stands for.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

__all__ = ["embeddings"]


@torch.library.register_fake("recdev::gather_tables")
def _(weights, indices):
    # Every recdev op has a fake kernel (test/compile/test_registration.py); embeddings itself
    # becomes F.embedding calls under torch.compile.
    return [weight.new_empty((*ids.shape, weight.shape[1])) for weight, ids in zip(weights, indices)]


class _TableLookups(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inputs, *weights):
        # An output no loss uses gets no update (as an unused F.embedding), not a zero gradient.
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*inputs, *weights)
        return tuple(torch.ops.recdev.gather_tables(list(weights), list(inputs)))

    @staticmethod
    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        count = len(grads)
        inputs, weights = saved[:count], saved[count:]
        # Last lookup first: the order autograd runs the backwards of F.embedding calls made in turn,
        # which a table looked up twice takes its two updates in.
        for k in reversed(range(count)):
            if grads[k] is not None and ctx.needs_input_grad[1 + k]:
                torch.ops.recdev.table_embedding_backward(weights[k], inputs[k], grads[k], -1, False)
        return (None,) * (1 + count)


def embeddings(inputs: Sequence[torch.Tensor], weights: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``[F.embedding(input, weight) for input, weight in zip(inputs, weights)]``, with every
    remote table's lookup sent before any is awaited: one round trip for all of them.

    Every weight must be a whole store table (a recdev tensor made by ``ops.init_embedding_table``,
    ``nn.Embedding(..., device="recdev")`` or ``tensor.to("recdev")`` under table placement);
    ``padding_idx``, ``max_norm`` and slices of tables are F.embedding's. Under ``torch.compile`` the
    call is the F.embedding calls it stands for.
    """
    inputs, weights = list(inputs), list(weights)
    if len(inputs) != len(weights):
        raise ValueError(f"torch_recdev.embeddings: {len(inputs)} index tensors for {len(weights)} tables; "
                         "give one index tensor per table")
    if torch.compiler.is_compiling():
        return [F.embedding(indices, weight) for indices, weight in zip(inputs, weights)]
    return list(_TableLookups.apply(inputs, *weights))
