"""Tables in float16, bfloat16 and float64 (issue 17), on the embedded store and on two shards
(test/tables/conftest.py runs every test on both).

Training: 50 steps of each fused optimizer against a CPU reference computed the same way. Half
rows: the table holds float16/bfloat16 weights with float32 optimizer state; each step widens the
row, applies the float32 rule (torch.optim's own, on a float32 copy) and rounds once, so the
reference keeps its weights in the half type and its state in float32 and must agree to the
rounding of one step. float64 tables follow torch.optim in float64. The gradients are fixed per id
(the loss is a fixed linear function of the looked-up rows), so the comparison is open loop: a
difference in one step cannot hide in later ones. Rows no batch names stay bit-identical."""

import os
import re
import tempfile
import uuid

import pytest
import torch
import torch.nn.functional as F

import torch_recdev
from torch_recdev import optim as rd_optim

ROWS = 64
TOUCHED = 32  # ids are drawn from [0, TOUCHED); the rest must never change
DIM = 8
STEPS = 50
HALF = (torch.float16, torch.bfloat16)
DTYPES = (torch.float16, torch.bfloat16, torch.float64)


class RowWiseAdagradReference(torch.optim.Optimizer):
    """EXACT_ROWWISE_ADAGRAD (csrc/store/optimizer.h) on sparse gradients, in float64, the
    accumulator kept in the parameter's dtype."""

    def __init__(self, params, lr):
        super().__init__(params, dict(lr=lr))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if "acc" not in state:
                    state["acc"] = torch.zeros(p.shape[0], dtype=p.dtype)
                grad = p.grad.coalesce()
                rows, g = grad.indices()[0], grad.values().double()
                acc = state["acc"][rows].double() + (g * g).sum(1) / p.shape[1]
                state["acc"][rows] = acc.to(p.dtype)
                multiplier = (group["lr"] / (acc.sqrt() + 1e-10)).unsqueeze(1)
                p[rows] = (p[rows].double() - g * multiplier).to(p.dtype)


# fused optimizer on the table, and the reference on a CPU parameter (sparse gradients).
OPTIMIZERS = {
    "sgd": (lambda p: rd_optim.SGD(p, lr=0.05), lambda p: torch.optim.SGD(p, lr=0.05)),
    "adagrad": (
        lambda p: rd_optim.Adagrad(p, lr=0.05, initial_accumulator_value=0.1),
        lambda p: torch.optim.Adagrad(p, lr=0.05, initial_accumulator_value=0.1),
    ),
    "rowwise_adagrad": (lambda p: rd_optim.RowWiseAdagrad(p, lr=0.05), lambda p: RowWiseAdagradReference(p, lr=0.05)),
    "adam": (lambda p: rd_optim.Adam(p, lr=0.01), lambda p: torch.optim.SparseAdam(p, lr=0.01)),
}


def table_of(dtype, rows=ROWS, dim=DIM):
    """A table of `dtype` with random weights, every row written (so all are materialized)."""
    with torch_recdev.placement("table"):
        weight = torch.empty(rows, dim, dtype=dtype, device="recdev")
    assert torch_recdev.is_table(weight)
    init = torch.randn(rows, dim, generator=torch.Generator().manual_seed(1)).to(dtype)
    with torch.no_grad():
        weight.copy_(init)
    return weight.requires_grad_(), init


def batches(dtype):
    """STEPS batches of (ids with duplicates, fixed output coefficients of the table's dtype)."""
    gen = torch.Generator().manual_seed(7)
    for _ in range(STEPS):
        ids = torch.randint(0, TOUCHED, (24,), generator=gen)
        ids[1] = ids[0]  # a duplicate in every batch
        coefficients = (torch.randn(24, DIM, generator=gen) * 0.5).to(dtype)
        yield ids, coefficients


def read(weight):
    return weight.detach()[torch.arange(weight.shape[0])].cpu()


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fifty_steps_match_the_reference(dtype, kind):
    fused, reference = OPTIMIZERS[kind]
    weight, init = table_of(dtype)
    optimizer = fused([weight])
    # The reference: float64 math on a float64 parameter; half weights in a float32 parameter whose
    # state stays float32, rounded to the half type after every step, as the store rounds.
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    ref_param = init.to(compute).clone().requires_grad_()
    ref_optimizer = reference([ref_param])
    for ids, coefficients in batches(dtype):
        optimizer.zero_grad()
        out = F.embedding(ids.to("recdev"), weight)
        assert out.dtype == dtype
        (out * coefficients.to("recdev")).sum().backward()
        optimizer.step()

        ref_param.grad = torch.sparse_coo_tensor(ids.unsqueeze(0), coefficients.to(compute), (ROWS, DIM))
        ref_optimizer.step()
        with torch.no_grad():
            ref_param.copy_(ref_param.to(dtype).to(compute))
    actual = read(weight)
    assert actual.dtype == dtype
    expected = ref_param.detach().to(dtype)
    if dtype == torch.float64:
        torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-14)
    else:
        # One rounding per step: rows agree to an ulp or two of the half type.
        ulp = 2.0**-10 if dtype == torch.float16 else 2.0**-7
        torch.testing.assert_close(actual.float(), expected.float(), rtol=2 * ulp, atol=1e-3)
    assert not torch.equal(actual[:TOUCHED], init[:TOUCHED]), "training moved nothing"
    # Never named: the same bits.
    assert torch.equal(actual[TOUCHED:].view(torch.int16 if dtype in HALF else torch.int64),
                       init[TOUCHED:].view(torch.int16 if dtype in HALF else torch.int64))


def rowwise_square_sums(squares, lanes):
    """Each row's sum of squares (float64), in the order the store adds them: with lanes, as its AVX2
    kernel does (blocks of 8 columns into two 4-lane sums, the lanes added pairwise, then the last
    columns one by one); without, one running sum."""
    dim = squares.shape[1]
    if not lanes:
        total = torch.zeros(squares.shape[0], dtype=torch.float64)
        for d in range(dim):
            total = total + squares[:, d]
        return total
    blocks = dim // 8 * 8
    low = torch.zeros(squares.shape[0], 4, dtype=torch.float64)
    high = torch.zeros_like(low)
    for d in range(0, blocks, 8):
        low, high = low + squares[:, d:d + 4], high + squares[:, d + 4:d + 8]
    lane = low + high
    total = (lane[:, 0] + lane[:, 1]) + (lane[:, 2] + lane[:, 3])
    for d in range(blocks, dim):
        total = total + squares[:, d]
    return total


def summed_in_first_occurrence_order(ids, grads):
    """The distinct ids in the order they first occur, and each one's gradient rows summed in float32
    in batch order, as the store coalesces a batch's repeated ids."""
    distinct = list(dict.fromkeys(ids.tolist()))
    sums = torch.zeros(len(distinct), grads.shape[1], dtype=torch.float32)
    for k, row in enumerate(distinct):
        for position in (ids == row).nonzero().flatten().tolist():
            sums[k] = sums[k] + grads[position].float()
    return torch.tensor(distinct), sums


@pytest.mark.parametrize("repeats", [False, True], ids=["distinct", "repeated"])
@pytest.mark.parametrize("decay", [0.01, 0.0])
@pytest.mark.parametrize("dim", [8, 20, 128])
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_rowwise_adagrad_on_half_rows_rounds_the_float32_update_once(dtype, dim, decay, repeats):
    # The store updates half rows in registers (widened, the rule's double arithmetic, each weight
    # rounded to float32 and then once to the half type, to nearest even). This is that rule written
    # out, bit for bit: the tolerance of test_fifty_steps_match_the_reference would hide a wrong
    # rounding of the last bit. Without decay the kernel reads no weight in its first pass; an id
    # named twice gets its rows' float32 sum, where a distinct one gets its half gradient as it is.
    lr, eps = 0.05, 1e-10
    weight, init = table_of(dtype, dim=dim)
    optimizer = rd_optim.RowWiseAdagrad([weight], lr=lr, eps=eps, weight_decay=decay)
    rows, accumulators = init.clone(), torch.zeros(ROWS, dtype=torch.float32)
    gen = torch.Generator().manual_seed(dim)
    for _ in range(10):
        picked = torch.randperm(TOUCHED, generator=gen)
        batch = picked[:6].repeat(2)[torch.randperm(12, generator=gen)] if repeats else picked[:12]
        batch_grads = torch.randn(12, dim, generator=gen).to(dtype)
        optimizer.zero_grad()
        (F.embedding(batch.to("recdev"), weight) * batch_grads.to("recdev")).sum().backward()
        optimizer.step()
        ids, grads = summed_in_first_occurrence_order(batch, batch_grads)
        assert len(ids) == (6 if repeats else 12)
        w, g = rows[ids].double(), grads.double()
        squares = (g + decay * w) ** 2
        candidates = []
        for lanes in (True, False):  # the AVX2 kernel's order, or the portable one's
            accumulator = accumulators[ids].double() + rowwise_square_sums(squares, lanes) / dim
            multiplier = (lr / (accumulator.sqrt() + eps)).unsqueeze(1)
            correction = 1.0 - multiplier * decay
            candidates.append(((correction * w - g * multiplier).float().to(dtype), accumulator.float()))
        actual = read(weight)[ids]
        new_rows, new_accumulators = next((c for c in candidates if torch.equal(actual, c[0])), candidates[0])
        assert torch.equal(actual.view(torch.int16), new_rows.view(torch.int16))
        rows[ids], accumulators[ids] = new_rows, new_accumulators


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_rowwise_adagrad_on_half_rows_rounds_ties_to_even(dtype):
    # A row [2^-k, 0, 0, 0] with gradient [2, 0, 0, 0], lr 0.5 and eps 0: the accumulator is 4 / 4 = 1,
    # so the first weight becomes 2^-k - 1 exactly, which is halfway between two neighbours of the half
    # type (k = 9 for bfloat16's 7 fraction bits, 12 for float16's 10): to nearest even it is -1.0.
    # Random updates almost never meet a tie.
    k = 9 if dtype == torch.bfloat16 else 12
    with torch_recdev.placement("table"):
        weight = torch.empty(4, 4, dtype=dtype, device="recdev")
    with torch.no_grad():
        weight.copy_(torch.tensor([[2.0**-k, 0, 0, 0]] * 4).to(dtype))
    weight.requires_grad_()
    optimizer = rd_optim.RowWiseAdagrad([weight], lr=0.5, eps=0.0)
    (F.embedding(torch.tensor([1]).to("recdev"), weight) * torch.tensor([[2.0, 0, 0, 0]]).to(dtype).to("recdev")).sum().backward()
    optimizer.step()
    assert read(weight)[1].tolist() == [-1.0, 0.0, 0.0, 0.0]
    assert read(weight)[0].tolist() == [2.0**-k, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("stochastic", [False, True], ids=["nearest", "stochastic"])
@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_bag_gradients_update_a_half_table_as_per_id_gradients_do(dtype, kind, stochastic):
    # Eager embedding_bag backward hands sum and mean bags' gradients to the store, which spreads them
    # over the bags' ids itself (Table::update_pooled); the op torch.compile's backward calls has no
    # offsets, so it expands a gradient row per id in the table's type and sends those (update). Both
    # must move a half table bit for bit alike: sum, mean and per-sample-weighted bags, with a
    # duplicate, a padding id and an empty bag, gradients whose mean and weighted shares round.
    def optimizer_of(weight):
        torch.manual_seed(11)  # the same rounding seed for both tables
        return OPTIMIZERS[kind][0]([weight]) if not stochastic else {
            "sgd": lambda p: rd_optim.SGD(p, lr=0.05, stochastic_rounding=True),
            "adagrad": lambda p: rd_optim.Adagrad(p, lr=0.05, initial_accumulator_value=0.1,
                                                  stochastic_rounding=True),
            "rowwise_adagrad": lambda p: rd_optim.RowWiseAdagrad(p, lr=0.05, stochastic_rounding=True),
            "adam": lambda p: rd_optim.Adam(p, lr=0.01, stochastic_rounding=True),
        }[kind]([weight])

    pooled, init = table_of(dtype)
    per_id, _ = table_of(dtype)
    optimizers = optimizer_of(pooled), optimizer_of(per_id)
    gen = torch.Generator().manual_seed(5)
    offsets = torch.tensor([0, 3, 3, 7, 12])  # bag 1 is empty
    for step in range(12):
        ids = torch.randint(0, TOUCHED, (16,), generator=gen)
        ids[4] = ids[3]
        padding_idx = int(ids[9])
        mode = step % 3  # sum, mean, weighted sum
        pooling = 1 if mode == 1 else 0  # embedding_bag's mode number
        weights = (torch.rand(16, generator=gen) * 3).to(dtype).to("recdev") if mode == 2 else None
        grad = (torch.randn(len(offsets), DIM, generator=gen) * 3).to(dtype).to("recdev")
        backward_both_ways(pooled, per_id, ids, offsets, grad, pooling, weights, padding_idx)
        for optimizer in optimizers:
            optimizer.step()
        assert torch.equal(read(pooled).view(torch.int16), read(per_id).view(torch.int16)), f"step {step}"
    assert not torch.equal(read(pooled)[:TOUCHED], init[:TOUCHED]), "training moved nothing"


def backward_both_ways(pooled, per_id, ids, offsets, grad, pooling, weights=None, padding_idx=None):
    """embedding_bag's backward into `pooled` as eager autograd sends it (bag gradients, where the
    store takes them), and into `per_id` as the compiled op does (a gradient row per id)."""
    args = (ids.to("recdev"), offsets.to("recdev"))
    out = F.embedding_bag(args[0], pooled, args[1], mode="mean" if pooling == 1 else "sum",
                          per_sample_weights=weights, padding_idx=padding_idx)
    out.backward(grad)
    aten_padding_idx = -1 if padding_idx is None else padding_idx  # F.embedding_bag's -1 is the last row
    with torch.no_grad():
        _, offset2bag, bag_size, max_indices = torch.ops.aten._embedding_bag(
            per_id, args[0], args[1], False, pooling, False, weights, False, aten_padding_idx)
    torch.ops.recdev.table_embedding_bag_backward(
        per_id, args[0], grad, offset2bag, bag_size, max_indices, weights, pooling, False, aten_padding_idx)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_bag_gradients_of_a_large_batch_update_a_half_table_as_per_id_gradients_do(dtype):
    # 6,000 bags of dim 64: the store checks the half bag gradients on both threads and hands them to
    # the optimizer as they are, without a widened copy.
    pooled, init = table_of(dtype, rows=3000, dim=64)
    per_id, _ = table_of(dtype, rows=3000, dim=64)
    optimizers = rd_optim.RowWiseAdagrad([pooled], lr=0.05), rd_optim.RowWiseAdagrad([per_id], lr=0.05)
    gen = torch.Generator().manual_seed(9)
    ids = torch.randint(0, 3000, (12_000,), generator=gen)
    offsets = torch.arange(0, 12_000, 2)
    grad = torch.randn(len(offsets), 64, generator=gen).to(dtype).to("recdev")
    backward_both_ways(pooled, per_id, ids, offsets, grad, pooling=0)
    for optimizer in optimizers:
        optimizer.step()
    assert torch.equal(read(pooled).view(torch.int16), read(per_id).view(torch.int16))
    assert not torch.equal(read(pooled), init), "training moved nothing"


@pytest.mark.parametrize("ids, dim, bad_at", [(4, 8, (2, 5)), (600, 64, (450, 37))], ids=["small", "blocks"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=str)
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_a_non_finite_half_gradient_is_refused_with_nothing_applied(dtype, bad, ids, dim, bad_at):
    # The store reads a half table's gradients in their own type: a nan or inf among them is found by
    # its exponent bits (in blocks of 64 and in the tail), while the largest finite value is not.
    weight, _ = table_of(dtype, rows=1000, dim=dim)
    optimizer = rd_optim.RowWiseAdagrad([weight], lr=0.05)
    index = torch.arange(ids) * 7 % 1000
    extreme = torch.full((ids, dim), torch.finfo(dtype).max, dtype=dtype)
    extreme[:, 1] = torch.finfo(dtype).smallest_normal / 4  # subnormal
    F.embedding(index.to("recdev"), weight).backward(extreme.to("recdev"))
    optimizer.step()
    before = read(weight)
    grad = torch.ones(ids, dim, dtype=dtype)
    grad[bad_at] = bad
    row = int(index[bad_at[0]])
    # (Raised in backward, where autograd reports what a kernel raised as a RuntimeError.)
    message = rf"row id {row} .*holds (nan|inf) at column {bad_at[1]}; nothing was applied"
    with pytest.raises(RuntimeError, match=message):
        F.embedding(index.to("recdev"), weight).backward(grad.to("recdev"))
        optimizer.step()
    assert torch.equal(read(weight).view(torch.int16), before.view(torch.int16))


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_a_step_of_sgd_moves_a_half_row_by_the_update(dtype):
    # The case: one step of lr 0.1 on a row of [-0.006, 0.777, 0.635, ...].
    with torch_recdev.placement("table"):
        weight = torch.nn.Embedding(5000, 8, dtype=dtype, device="recdev").weight
    with torch.no_grad():
        weight[3] = torch.tensor([-0.006, 0.777, 0.635, 0.1, -0.2, 0.3, -0.4, 0.5], dtype=dtype).to("recdev")
    before = read(weight)[3]
    optimizer = rd_optim.SGD([weight], lr=0.1)
    F.embedding(torch.tensor([3]).to("recdev"), weight).sum().backward()
    optimizer.step()
    assert torch.equal(read(weight)[3], (before.float() - 0.1).to(dtype))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_embedding_bag_matches_cpu(dtype, mode):
    weight, init = table_of(dtype)
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, ROWS, (40,), generator=gen)
    offsets = torch.tensor([0, 3, 3, 10, 22, 39])
    kwargs = dict(mode=mode, padding_idx=int(ids[5]))
    if mode == "sum":
        kwargs["per_sample_weights"] = torch.rand(40, generator=gen).to(dtype)
    with torch.no_grad():
        actual = F.embedding_bag(
            ids.to("recdev"),
            weight,
            offsets.to("recdev"),
            **{k: (v.to("recdev") if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()},
        )
    expected = F.embedding_bag(ids, init, offsets, **kwargs)
    assert actual.dtype == dtype
    assert torch.equal(actual.cpu(), expected)


def rounded_to(sums, dtype, ties_away):
    """float32 values rounded once into dtype as CPU's embedding_bag rounds pooled sums: to nearest
    even, or for bfloat16 pooled by fbgemm (no padding_idx), with ties away from zero."""
    if dtype == torch.bfloat16 and ties_away:
        bits = sums.view(torch.int32)
        sums = ((bits + 0x8000) & ~0xFFFF).view(torch.float32)
    return sums.to(dtype)


def pooled_in_float32(rows, ids, sizes, dtype, mode, weights=None, padding_idx=None):
    """Each bag's rows (and weights), but padding_idx's, widened, added in float32 in bag order and
    rounded once; mean then divides the rounded sum by the bag's count rounded to dtype, as CPU's
    apply_bag_size does."""
    out, begin = [], 0
    for size in sizes.tolist():
        acc, count = torch.zeros(rows.shape[1]), 0
        for position in range(begin, begin + size):
            if ids[position] == padding_idx:
                continue
            row = rows[ids[position]].float()
            acc = acc + (weights[position].float() * row if weights is not None else row)
            count += 1
        pooled = rounded_to(acc, dtype, ties_away=padding_idx is None)
        if mode == "mean" and count > 0:
            pooled = (pooled.float() / torch.tensor(float(count)).to(dtype).float()).to(dtype)
        out.append(pooled)
        begin += size
    return torch.stack(out)


@pytest.mark.parametrize("padding", [False, True], ids=["", "padding"])
@pytest.mark.parametrize("dim", [2, 8, 14, 16, 18, 40, 64, 100, 128, 130, 300])
@pytest.mark.parametrize("mode", ["sum", "mean", "weighted sum"])
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_sums_match_cpu_at_every_width(dtype, mode, dim, padding):
    # The embedded store widens half rows as it loads them, with the CPU's vector instructions where
    # it has them, 8 or 16 columns at a time, then blocks of fewer, then one by one; bags of more
    # than 32 rows go to the summer in groups. Every width and group boundary must give CPU's result:
    # the float32 sums of the widened rows in bag order, rounded once. Sums of a few bfloat16 rows are
    # often ties, which CPU rounds away from zero without padding_idx (fbgemm) and to nearest even with
    # one (its own loop); the reference checks that CPU does.
    weight, init = table_of(dtype, rows=200, dim=dim)
    gen = torch.Generator().manual_seed(dim)
    sizes = torch.cat([torch.randint(0, 9, (40,), generator=gen), torch.tensor([32, 33, 70])])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)[:-1]])
    ids = torch.randint(0, 200, (int(sizes.sum()),), generator=gen)
    kwargs = dict(mode="mean" if mode == "mean" else "sum")
    if mode == "weighted sum":
        kwargs["per_sample_weights"] = torch.randn(ids.numel(), generator=gen).to(dtype)
    if padding:
        kwargs["padding_idx"] = int(ids[7])
    with torch.no_grad():
        actual = F.embedding_bag(ids.to("recdev"), weight, offsets.to("recdev"),
                                 **{k: (v.to("recdev") if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()})
    expected = F.embedding_bag(ids, init, offsets, **kwargs)
    assert torch.equal(expected, pooled_in_float32(init, ids, sizes, dtype, kwargs["mode"],
                                                   kwargs.get("per_sample_weights"), kwargs.get("padding_idx")))
    assert torch.equal(actual.cpu(), expected)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_embedding_bag_trains_a_half_table(dtype):
    weight, init = table_of(dtype)
    optimizer = rd_optim.SGD([weight], lr=0.5)
    ids = torch.tensor([1, 2, 2, 5])
    psw = torch.tensor([1.0, 0.5, 2.0, 1.0], dtype=dtype)
    out = F.embedding_bag(
        ids.to("recdev"), weight, torch.tensor([0, 2]).to("recdev"), mode="sum", per_sample_weights=psw.to("recdev")
    )
    out.sum().backward()
    optimizer.step()
    # Row 2 got 0.5 + 2.0 times the bag's all-ones gradient, row 1 once, row 5 once.
    expected = init.float().clone()
    expected[1] -= 0.5 * 1.0
    expected[2] -= 0.5 * 2.5
    expected[5] -= 0.5 * 1.0
    assert torch.equal(read(weight), expected.to(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_named_table_keeps_its_dtype_and_shape(dtype):
    name = f"dtype-{uuid.uuid4().hex}"
    table = torch_recdev.ops.init_embedding_table(name, 100, 6, dtype=dtype, init=torch_recdev.Normal(0.0, 1.0))
    assert table.dtype == dtype and table.shape == (100, 6)
    keys = torch.tensor([4, 9])
    initial = torch_recdev.ops.emb_read(table, keys)
    assert initial.dtype == dtype and initial.shape == (2, 6)
    # Init values: the float32 values of a row converted to the type, so they agree with float32's.
    assert initial.abs().max() < 10 and initial.std() > 0.1
    rows = torch.arange(12, dtype=dtype).reshape(2, 6) / 4
    torch_recdev.ops.emb_write(table, keys, rows)
    assert torch.equal(torch_recdev.ops.emb_read(table, keys).cpu(), rows)
    assert torch.equal(table.detach()[keys.to("recdev")].cpu(), rows)
    with pytest.raises(ValueError, match="expected .* rows"):
        torch_recdev.ops.emb_write(table, keys, rows.float() if dtype != torch.float32 else rows.double())
    other = torch.float64 if dtype != torch.float64 else torch.float32
    with pytest.raises(ValueError, match=f"dtype: the table is {str(dtype).removeprefix('torch.')}, declared "
                                         f"{str(other).removeprefix('torch.')}"):
        torch_recdev.ops.init_embedding_table(name, 100, 6, dtype=other)
    # A declaration of another dtype never converts the rows: they are as written.
    assert torch.equal(torch_recdev.ops.emb_read(table, keys).cpu(), rows)
    assert torch_recdev.table_stats(table)["dtype"] == str(dtype).removeprefix("torch.")


def test_integer_tables_look_up_but_refuse_an_optimizer():
    with torch_recdev.placement("table"):
        table = torch.empty(50, 4, dtype=torch.int32, device="recdev")
    values = torch.arange(200, dtype=torch.int32).reshape(50, 4)
    table.copy_(values)
    assert torch.equal(table[torch.tensor([3, 7]).to("recdev")].cpu(), values[[3, 7]])
    with pytest.raises(Exception, match="non-floating dtype"):
        rd_optim.SGD([table], lr=0.1)


@pytest.mark.parametrize("dtype, value", [(torch.float16, 1e5), (torch.bfloat16, 1e39), (torch.float32, 1e39)], ids=str)
def test_fill_that_overflows_the_dtype_raises_as_cpu_and_keeps_the_rows(dtype, value):
    """fill_ on a whole table becomes its init rule; a value the dtype cannot hold must raise CPU's
    overflow error, not store inf in every row."""
    with torch_recdev.placement("table"):
        table = torch.empty(1000, 4, dtype=dtype, device="recdev")
    table.fill_(0.5)
    with pytest.raises(RuntimeError) as on_cpu:
        torch.empty(4, dtype=dtype).fill_(value)
    with pytest.raises(RuntimeError, match=re.escape(str(on_cpu.value).splitlines()[0])):
        table.fill_(value)
    assert torch.equal(table[:3].cpu(), torch.full((3, 4), 0.5, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_torch_save_round_trip_keeps_dtype_bits_and_state(dtype):
    weight, _ = table_of(dtype)
    optimizer = rd_optim.Adagrad([weight], lr=0.1)
    F.embedding(torch.tensor([1, 2]).to("recdev"), weight).sum().backward()
    optimizer.step()
    before = read(weight)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.pt")
        torch.save(weight.detach(), path)
        loaded = torch.load(path)
    assert loaded.dtype == dtype and torch_recdev.is_table(loaded)
    assert torch.equal(read(loaded), before)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_store_checkpoint_round_trip_and_dtype_mismatch(dtype, tmp_path):
    name = f"ckpt-{uuid.uuid4().hex}"
    table = torch_recdev.ops.init_embedding_table(name, 100, 4, dtype=dtype, optimizer=("adagrad", {"lr": 0.1}))
    keys = torch.tensor([0, 7, 8])
    torch_recdev.ops.emb_write(table, keys, torch.randn(3, 4).to(dtype))
    torch_recdev.ops.emb_update(table, keys, torch.ones(3, 4, dtype=dtype))
    saved = torch_recdev.ops.emb_read(table, keys).cpu()
    path = str(tmp_path / "store.ckpt")
    torch_recdev.ops.save(path)
    torch_recdev.ops.emb_write(table, keys, torch.zeros(3, 4, dtype=dtype))
    torch_recdev.ops.load(path)
    assert torch.equal(torch_recdev.ops.emb_read(table, keys).cpu(), saved)
    # The optimizer state came back too: the next step equals one from the saved state.
    torch_recdev.ops.emb_update(table, keys, torch.ones(3, 4, dtype=dtype))
    stepped = torch_recdev.ops.emb_read(table, keys).cpu()
    torch_recdev.ops.load(path)
    torch_recdev.ops.emb_update(table, keys, torch.ones(3, 4, dtype=dtype))
    assert torch.equal(torch_recdev.ops.emb_read(table, keys).cpu(), stepped)


def test_checkpoint_into_a_table_of_another_dtype_is_refused(run_python, tmp_path):
    """A store whose table of that name is float32 refuses the float16 table of a checkpoint and loads
    nothing (fresh interpreters: one store cannot hold both)."""
    path = tmp_path / "half.ckpt"
    save = f"""
        import torch, torch_recdev
        t = torch_recdev.ops.init_embedding_table("clash", 10, 4, dtype=torch.float16)
        torch_recdev.ops.emb_write(t, torch.tensor([1]), torch.ones(1, 4, dtype=torch.float16))
        torch_recdev.ops.save({str(path)!r})
    """
    result = run_python(save, {"RECDEV_SERVERS": None})
    assert result.returncode == 0, result.stderr
    load = f"""
        import torch, torch_recdev
        t = torch_recdev.ops.init_embedding_table("clash", 10, 4)
        torch_recdev.ops.emb_write(t, torch.tensor([1]), torch.full((1, 4), 3.0))
        try:
            torch_recdev.ops.load({str(path)!r})
        except Exception as error:
            print("refused:", error)
        print("row:", torch_recdev.ops.emb_read(t, torch.tensor([1])).tolist())
    """
    result = run_python(load, {"RECDEV_SERVERS": None})
    assert result.returncode == 0, result.stderr
    assert "refused:" in result.stdout and "float16" in result.stdout, result.stdout
    assert "row: [[3.0, 3.0, 3.0, 3.0]]" in result.stdout
