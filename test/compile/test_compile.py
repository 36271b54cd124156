"""torch.compile on recdev (docs/compile.md): forward equals eager on every backend, the recdev
parts of an Inductor graph run as eager kernels while the CPU parts are compiled, the standard
model compiles without graph breaks, and training through Dynamo updates the store once per
backward."""

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
import torch.nn as nn

import torch_recdev

HUGE_ROWS = 10**10
DIM = 8


class BagMLP(nn.Module):
    """The standard model: an embedding bag on recdev, then an MLP on `dense_device`."""

    def __init__(self, placement="table", dense_device="cpu"):
        super().__init__()
        rows = HUGE_ROWS if placement == "table" else 100
        with torch_recdev.placement(placement):
            self.bag = nn.EmbeddingBag(rows, DIM, mode="sum", device="recdev")
        self.mlp = nn.Sequential(nn.Linear(DIM, 16), nn.ReLU(), nn.Linear(16, 1)).to(dense_device)
        self.dense_device = dense_device

    def forward(self, ids, offsets):
        return self.mlp(self.bag(ids, offsets).to(self.dense_device))


def _batch(rows, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, rows, (24,), generator=gen), torch.arange(0, 24, 3)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_dynamo_knows_the_device():
    from torch._dynamo.device_interface import get_interface_for_device

    interface = get_interface_for_device("recdev")
    assert interface.device_count() == 1 and interface.is_available()
    assert get_interface_for_device(torch.device("recdev", 0)) is interface


@pytest.mark.parametrize(
    "placement, dense_device, backend",
    [
        ("table", "cpu", "eager"),
        ("table", "cpu", "aot_eager"),
        ("table", "cpu", "inductor"),
        ("table", "recdev", "aot_eager"),
        ("host", "recdev", "inductor"),
        ("host", "cpu", "aot_eager"),
    ],
)
def test_compiled_forward_equals_eager(placement, dense_device, backend):
    torch.manual_seed(0)
    model = BagMLP(placement, dense_device)
    compiled = torch.compile(model, backend=backend)
    rows = model.bag.weight.shape[0]
    for seed in range(3):
        ids, offsets = _batch(rows, seed)
        with torch.no_grad():
            expected = model(ids, offsets).cpu()
            assert torch.equal(compiled(ids, offsets).cpu(), expected)


def test_inductor_compiles_the_cpu_part_and_runs_the_table_lookup_eagerly():
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    model = BagMLP("table", "cpu")
    ids, offsets = _batch(HUGE_ROWS, 0)
    with torch.no_grad():
        _, (code, *_) = run_and_get_code(torch.compile(model), ids, offsets)
    assert "torch.ops.recdev.embedding_bag_lookup.default(" in code  # the lookup in the store, eagerly
    assert "cpp_fused" in code  # the MLP's ReLU, generated C++
    assert torch_recdev.table_stats(model.bag.weight)["rows"] <= 24  # the store gathered, nothing dense


def test_standard_model_compiles_in_one_graph_without_breaks():
    model = BagMLP("table", "cpu")
    ids, offsets = _batch(HUGE_ROWS, 0)
    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(model, backend=counter)
    for seed in range(3):
        compiled(*_batch(HUGE_ROWS, seed))
    assert counter.frame_count == 1
    explanation = torch._dynamo.explain(model)(ids, offsets)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


def _train(model, forward, opt, dense_opt, steps):
    losses = []
    for seed in range(steps):
        loss = forward(*_batch(HUGE_ROWS, seed)).pow(2).mean()
        loss.backward()
        opt.step()
        dense_opt.step()
        dense_opt.zero_grad()
        losses.append(loss.item())
    return losses


class FieldsMLP(nn.Module):
    """nn.Embedding (F.embedding) with per-field ids, summed, then an MLP on the CPU."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(HUGE_ROWS, DIM, device="recdev", padding_idx=0)
        self.mlp = nn.Sequential(nn.Linear(DIM, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, ids, offsets):
        return self.mlp(self.emb(ids.view(-1, 3)).sum(1).cpu())


class WeightedMeanBag(BagMLP):
    """embedding_bag (sum) with per-sample weights that are themselves trained (on recdev)."""

    def __init__(self):
        super().__init__("table", "cpu")
        self.bag = nn.EmbeddingBag(HUGE_ROWS, DIM, mode="sum", device="recdev")
        self.sample_weight = nn.Parameter(torch.ones(24, device="recdev"))

    def forward(self, ids, offsets):
        return self.mlp(self.bag(ids, offsets, per_sample_weights=self.sample_weight).cpu())


MODELS = {"embedding_bag": lambda: BagMLP("table", "cpu"), "embedding": FieldsMLP, "weighted bag": WeightedMeanBag}


# Inductor's C++ compile takes tens of seconds per model on 2 cores: one model covers it.
TRAINING_CASES = [(m, h) for m in sorted(MODELS) for h in ["eager", "aot_eager", "inductor", "dense part only"]
                  if h != "inductor" or m == "embedding_bag"]


@pytest.mark.parametrize("model_name, how", TRAINING_CASES)
def test_compiled_training_with_a_fused_optimizer_equals_eager(model_name, how):

    def setup():
        torch.manual_seed(0)
        model = MODELS[model_name]()
        table = next(p for p in model.parameters() if torch_recdev.is_table(p))
        opt = torch_recdev.optim.Adagrad([table], lr=0.1)
        dense = [p for p in model.parameters() if p is not table]
        return model, table, opt, torch.optim.SGD(dense, lr=0.05)

    model, table, opt, dense_opt = setup()
    expected = _train(model, model, opt, dense_opt, 4)
    compiled_model, compiled_table, opt, dense_opt = setup()
    if how == "dense part only":
        compiled_model.mlp = torch.compile(compiled_model.mlp)
        forward = compiled_model
    else:
        forward = torch.compile(compiled_model, backend=how)
    losses = []
    for step in range(4):
        before = torch_recdev._C._table_optimizer_step(compiled_table)
        losses += _train(compiled_model, lambda ids, offsets, s=step: forward(*_batch(HUGE_ROWS, s)), opt, dense_opt, 1)
        # exactly one store update per backward
        assert torch_recdev._C._table_optimizer_step(compiled_table) == before + 1
    assert losses == pytest.approx(expected, rel=1e-5)
    assert compiled_table.grad is None
    probe = _batch(HUGE_ROWS, 2)[0]
    assert torch.allclose(
        torch_recdev.ops.emb_read(compiled_table, probe).cpu(), torch_recdev.ops.emb_read(table, probe).cpu(), rtol=1e-5, atol=1e-7
    )
    for compiled_p, p in zip(compiled_model.parameters(), model.parameters()):
        if p is not table:
            assert torch.allclose(compiled_p.detach().cpu(), p.detach().cpu(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_training_of_host_storage_embeddings_equals_eager(backend):
    def setup():
        torch.manual_seed(0)
        model = BagMLP("host", "recdev")
        return model, torch.optim.Adagrad(model.parameters(), lr=0.1)

    def train(forward, model, opt):
        losses = []
        for seed in range(3):
            loss = forward(*_batch(100, seed)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return losses

    model, opt = setup()
    expected = train(model, model, opt)
    compiled_model, opt = setup()
    assert train(torch.compile(compiled_model, backend=backend), compiled_model, opt) == pytest.approx(expected, rel=1e-5)
    assert torch.allclose(compiled_model.bag.weight.detach().cpu(), model.bag.weight.detach().cpu(), rtol=1e-5, atol=1e-7)


class SmallBagMLP(BagMLP):
    """BagMLP with 100 rows in either placement: a table and a host weight of the same shape, which
    torch.compile's guards and caches cannot tell apart by their metadata."""

    def __init__(self, placement):
        torch.manual_seed(0)
        super().__init__("host", "cpu")
        with torch_recdev.placement(placement):
            self.bag = nn.EmbeddingBag(100, DIM, mode="sum", device="recdev")


def _one_compiled_step(placement, backend):
    """One training step of a fresh SmallBagMLP through torch.compile: (weight, table update count)."""
    model = SmallBagMLP(placement)
    if placement == "table":
        torch_recdev.optim.SGD([model.bag.weight], lr=0.1)
    torch.compile(model, backend=backend)(*_batch(100, 0)).sum().backward()
    updates = torch_recdev._C._table_optimizer_step(model.bag.weight) if placement == "table" else None
    return model.bag.weight, updates


def test_a_cached_graph_serves_only_the_storage_kind_it_was_traced_for():
    from torch._dynamo.utils import counters

    eager = SmallBagMLP("host")
    eager(*_batch(100, 0)).sum().backward()
    for placement in ["table", "host", "table"]:
        torch._dynamo.reset()
        hits = counters["aot_autograd"]["autograd_cache_hit"]
        weight, updates = _one_compiled_step(placement, "inductor")
        if placement == "table":
            assert weight.grad is None and updates == 1  # the store took the update
        else:
            assert torch.equal(weight.grad.cpu(), eager.bag.weight.grad.cpu())  # the ordinary dense gradient
    # the second table compile reused the first one's cached graph: the cache still works
    assert counters["aot_autograd"]["autograd_cache_hit"] == hits + 1


@pytest.mark.parametrize("first, second", [("host", "table"), ("table", "host")])
def test_a_graph_reused_for_the_other_storage_kind_is_refused(first, second):
    _one_compiled_step(first, "aot_eager")
    model = SmallBagMLP(second)  # same shapes: Dynamo's guards pass and it reuses the first graph
    if second == "table":
        torch_recdev.optim.SGD([model.bag.weight], lr=0.1)
    with pytest.raises(RuntimeError, match=r"traced for an embedding weight in .*torch._dynamo.reset\(\)"):
        torch.compile(model, backend="aot_eager")(*_batch(100, 0))
    if second == "table":
        assert torch_recdev.table_stats(model.bag.weight)["rows"] == 0  # refused before the lookup


def test_compiled_training_of_a_spilled_table_equals_eager_without_a_budget(tmp_path):
    """A memory tier of 16 rows under a compiled model (the disk tier, docs/disk_tier.md): every batch
    brings rows back from disk and sends others there, and the losses and rows are those of eager
    training on an unbounded table."""
    torch_recdev.set_disk_dir(tmp_path)

    def setup(spill):
        torch.manual_seed(0)
        model = BagMLP("table", "cpu")
        if spill:
            torch_recdev.set_table_policy(model.bag.weight, max_rows=24, evict="lru", spill=True)
        opt = torch_recdev.optim.Adagrad([model.bag.weight], lr=0.1)
        return model, opt, torch.optim.SGD(model.mlp.parameters(), lr=0.05)

    model, opt, dense_opt = setup(False)
    expected = _train(model, model, opt, dense_opt, 8)
    spilled, opt, dense_opt = setup(True)
    losses = _train(spilled, torch.compile(spilled, backend="aot_eager"), opt, dense_opt, 8)
    assert losses == pytest.approx(expected, rel=1e-6)
    assert torch_recdev.table_stats(spilled.bag.weight)["rows_on_disk"] > 0
    for seed in range(8):  # a lookup stores at most the budget's rows
        ids = _batch(HUGE_ROWS, seed)[0].to("recdev")
        assert torch.equal(spilled.bag.weight.detach()[ids].cpu(), model.bag.weight.detach()[ids].cpu())
