"""torch_recdev.embeddings (torch_recdev/lookups.py): F.embedding of several tables in one call, on
the embedded store and on two shards. It must give F.embedding's rows and train the tables bit for
bit as F.embedding does (an unused output updates nothing), and refuse bad input naming what was
wrong, with nothing changed and the session usable after."""

import uuid

import pytest
import torch
import torch.nn.functional as F

import torch_recdev
from torch_recdev import _C, ops

DIM = 4


def tables(prefix):
    """Three tables with the same rows whatever the store (a shard draws Normal inits from its own
    streams), trained by order-sensitive optimizers."""
    made = []
    generator = torch.Generator().manual_seed(1)
    for name, optimizer in (("a", ("rowwise_adagrad", {"lr": 0.1})), ("b", ("adam", {"lr": 0.01})),
                            ("c", ("adagrad", {"lr": 0.05}))):
        table = ops.init_embedding_table(f"{prefix}.{name}", 500, DIM, init=torch_recdev.Zero(), optimizer=optimizer)
        ops.emb_write(table, torch.arange(500), torch.randn(500, DIM, generator=generator))
        made.append(table.requires_grad_(True))
    return made


def train(lookups, weights, steps=4):
    """Table a is looked up twice (two features share it), b with 2-D ids, c's output goes unused."""
    a, b, c = weights
    generator = torch.Generator().manual_seed(2)
    for _ in range(steps):
        first, second = torch.randint(0, 100, (2, 64), generator=generator)
        pairs = torch.randint(0, 500, (32, 2), generator=generator)
        unused = torch.randint(0, 500, (64,), generator=generator)
        ea, eb, ea2, _ = lookups([first, pairs, second, unused], [a, b, a, c])
        (ea.cpu().sin().sum() + eb.cpu().pow(2).sum() + (ea2.cpu() * 3).cos().sum()).backward()
    everything = torch.arange(500)
    return [ops.emb_read(t, everything).cpu() for t in weights], [_C._table_optimizer_step(t) for t in weights]


def one_by_one(inputs, weights):
    return [F.embedding(i, w) for i, w in zip(inputs, weights)]


def test_lookups_equal_f_embedding_and_train_the_tables_bit_for_bit():
    prefix = f"at_once_{uuid.uuid4().hex[:8]}"
    rows, steps = train(torch_recdev.embeddings, tables(prefix + "_together"))
    want_rows, want_steps = train(one_by_one, tables(prefix + "_one_by_one"))
    for name, got, want in zip("abc", rows, want_rows):
        assert torch.equal(got, want), f"table {name}: rows differ from F.embedding's training"
    assert steps == want_steps and steps[2] == 0  # a twice per step, c never: its output went unused

    a, b, _ = tables(prefix + "_forward")
    ids = [torch.randint(0, 500, (3, 5)), torch.tensor([], dtype=torch.long), torch.tensor([499, 0, 499])]
    got = torch_recdev.embeddings(ids, [a, b, a])
    for out, want in zip(got, one_by_one(ids, [a, b, a])):
        assert out.device.type == "recdev" and out.shape == want.shape and torch.equal(out.cpu(), want.cpu())


def test_bad_input_is_refused_saying_what_was_wrong_with_nothing_changed():
    a, b, _ = tables(f"refused_{uuid.uuid4().hex[:8]}")
    before = [ops.emb_read(t, torch.arange(500)).cpu() for t in (a, b)]
    ids = torch.arange(10)
    with pytest.raises(ValueError, match="2 index tensors for 1 tables; give one index tensor per table"):
        torch_recdev.embeddings([ids, ids], [a])
    with pytest.raises(RuntimeError, match=r"table 1 is not a whole 2-D store table \(got a cpu tensor .*F.embedding"):
        torch_recdev.embeddings([ids, ids], [a, torch.zeros(500, DIM)])
    with pytest.raises(RuntimeError, match=r"table 0 is not a whole 2-D store table"):
        torch_recdev.embeddings([ids], [a[10:]])
    # Out of range in the second table, after the first one's requests went out: F.embedding's error,
    # and the first table's answers are read before its output is freed.
    with pytest.raises(IndexError, match="index out of range in self"):
        torch_recdev.embeddings([ids, torch.tensor([3, 500])], [a, b])
    with pytest.raises(RuntimeError, match="Expected tensor for argument #1 'indices' to have one of the following scalar types"):
        torch_recdev.embeddings([ids, torch.ones(3)], [a, b])
    for table, old in zip((a, b), before):
        assert torch.equal(ops.emb_read(table, torch.arange(500)).cpu(), old)
    assert [_C._table_optimizer_step(t) for t in (a, b)] == [0, 0]
    assert torch.equal(torch_recdev.embeddings([ids], [b])[0].cpu(), before[1][:10])


def test_under_torch_compile_it_is_the_f_embedding_calls():
    prefix = f"compiled_{uuid.uuid4().hex[:8]}"
    eager, compiled = tables(prefix + "_eager"), tables(prefix + "_compiled")

    def loss(weights, first, second):
        a, b = torch_recdev.embeddings([first, second], weights[:2])
        return (a.cpu() * b.cpu()).sin().sum()

    step = torch.compile(loss, backend="aot_eager")
    ids = torch.randint(0, 500, (2, 32), generator=torch.Generator().manual_seed(3))
    for _ in range(2):
        want = loss(eager, *ids)
        got = step(compiled, *ids)
        assert torch.equal(got, want)
        want.backward()
        got.backward()
    for t_eager, t_compiled in zip(eager, compiled):
        assert torch.equal(ops.emb_read(t_compiled, torch.arange(500)).cpu(), ops.emb_read(t_eager, torch.arange(500)).cpu())
