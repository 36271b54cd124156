"""The store API (torch_recdev.ops): every CommonOp operation, on named tables."""

import os
import subprocess
import sys
import uuid

import pytest
import torch

import torch_recdev as R
from torch_recdev import ops


def _table(rows=1000, dim=8, **kwargs):
    return ops.init_embedding_table(f"t_{uuid.uuid4().hex}", rows, dim, **kwargs)


def test_same_name_same_table_and_shape_mismatch_refused():
    name = f"shared_{uuid.uuid4().hex}"
    a = ops.init_embedding_table(name, 100, 4)
    b = ops.init_embedding_table(name, 100, 4)
    ops.emb_write(a, torch.tensor([7]), torch.full((1, 4), 3.0))
    assert ops.emb_read(b, torch.tensor([7])).tolist() == [[3.0] * 4]
    with pytest.raises(ValueError, match="the table is 100 x 4, declared 100 x 5"):
        ops.init_embedding_table(name, 100, 5)



def test_a_table_too_large_to_address_is_refused_with_its_true_size():
    # Its byte size, 2^63 - 1 rows of 32 bytes, does not fit in 64 bits: the message must not wrap.
    with pytest.raises(ValueError, match=r"a table of 9223372036854775807 rows of dim 8 \(32 bytes a row\) spans more"):
        ops.init_embedding_table(f"huge_{uuid.uuid4().hex}", 2**63 - 1, 8)


def test_read_write_with_int64_and_uint64_keys():
    t = _table()
    ops.emb_write(t, torch.tensor([1, 999], dtype=torch.uint64), torch.arange(16.0).view(2, 8))
    got = ops.emb_read(t, torch.tensor([999, 1]))
    assert torch.equal(got.cpu(), torch.arange(16.0).view(2, 8).flip(0))


@pytest.mark.parametrize(
    "strategy, check",
    [
        (R.Zero(), lambda rows: bool((rows == 0).all())),
        (R.Constant(2.5), lambda rows: bool((rows == 2.5).all())),
        (R.Uniform(-1, 1), lambda rows: bool(((rows >= -1) & (rows < 1)).all()) and rows.std() > 0.3),
        (R.Normal(3, 0.1), lambda rows: abs(rows.mean().item() - 3) < 0.05),
        (R.Xavier(), lambda rows: bool((rows.abs() <= (6 / (1000 + 8)) ** 0.5).all())),
    ],
)
def test_emb_init_with_a_strategy(strategy, check):
    t = _table()
    keys = torch.arange(200)
    ops.emb_init(t, keys, strategy)
    assert bool(ops.emb_exists(t, keys).all())
    assert check(ops.emb_read(t, keys).cpu())


def test_emb_init_with_values_and_table_wide_init():
    t = _table(init=R.Constant(-1.0))
    assert ops.emb_read(t, torch.tensor([5])).tolist() == [[-1.0] * 8]
    ops.emb_init(t, torch.tensor([5]), torch.ones(1, 8))
    assert ops.emb_read(t, torch.tensor([5, 6])).cpu()[:, 0].tolist() == [1.0, -1.0]


def test_same_seed_same_rows_whatever_the_touch_order():
    name = f"seeded_{uuid.uuid4().hex}"
    keys = torch.tensor([0, 500, 999])
    torch.manual_seed(4)
    t = ops.init_embedding_table(name, 1000, 8, init=R.Normal(0, 1))
    first = ops.emb_read(t, keys).cpu()
    torch.manual_seed(4)
    t = ops.init_embedding_table(name, 1000, 8, init=R.Normal(0, 1), reset=True)  # drops every row
    assert ops.emb_exists(t, keys).tolist() == [False] * 3
    assert torch.equal(ops.emb_read(t, keys.flip(0)).cpu().flip(0), first)


def test_exists_and_delete():
    t = _table(init=R.Constant(1.0))
    keys = torch.tensor([3, 4])
    assert ops.emb_exists(t, keys).tolist() == [False, False]
    ops.emb_write(t, keys[:1], torch.zeros(1, 8))
    assert ops.emb_exists(t, keys).tolist() == [True, False]
    ops.emb_delete(t, keys)
    assert ops.emb_exists(t, keys).tolist() == [False, False]
    assert ops.emb_read(t, keys[:1]).tolist() == [[1.0] * 8]  # back to its init value


def test_update_goes_through_the_optimizer_and_sums_duplicates():
    t = _table(init=R.Zero(), optimizer=("sgd", {"lr": 0.5}))
    ops.emb_update(t, torch.tensor([2, 2, 3]), torch.ones(3, 8))
    assert ops.emb_read(t, torch.tensor([2, 3])).cpu()[:, 0].tolist() == [-1.0, -0.5]


def test_update_without_optimizer_is_refused():
    t = _table()
    with pytest.raises(ValueError, match="optimizer"):
        ops.emb_update(t, torch.tensor([1]), torch.ones(1, 8))


def test_ordering_of_async_operations():
    t = _table(init=R.Zero(), optimizer=("sgd", {"lr": 1.0}))
    keys = torch.tensor([10, 11])
    ops.emb_write_async(t, keys, torch.full((2, 8), 4.0)).wait()
    assert ops.emb_read(t, keys).cpu()[:, 0].tolist() == [4.0, 4.0]
    prefetched = ops.emb_prefetch(t, keys)
    ops.emb_update(t, keys, torch.ones(2, 8))
    assert prefetched.wait().cpu()[:, 0].tolist() in ([4.0, 4.0], [3.0, 3.0])  # issued before the update
    assert ops.emb_prefetch(t, keys).wait().cpu()[:, 0].tolist() == [3.0, 3.0]


def test_async_errors_reach_the_future():
    t = _table()
    future = ops.emb_prefetch(t, torch.tensor([10**6]))
    with pytest.raises(IndexError, match="out of range"):
        future.wait()


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda t: ops.emb_read(t, torch.tensor([1000])), IndexError, "out of range"),
        (lambda t: ops.emb_read(t, torch.tensor([[1]])), TypeError, "1-D int64 or uint64"),
        (lambda t: ops.emb_read(t, torch.tensor([1.0])), TypeError, "1-D int64 or uint64"),
        (lambda t: ops.emb_write(t, torch.tensor([1, 2]), torch.ones(1, 8)), ValueError, r"shape \[2, 8\]"),
        (lambda t: ops.emb_write(t, torch.tensor([1]), torch.ones(1, 7)), ValueError, r"shape \[1, 8\]"),
        (lambda t: ops.emb_write(t, torch.tensor([1]), torch.ones(1, 8, dtype=torch.float64)), ValueError, "float32"),
        (lambda t: ops.emb_init(t, torch.tensor([1]), "normal"), TypeError, "init strategy"),
        (lambda t: ops.emb_init(t, torch.tensor([1]), R.Normal(0, -1)), ValueError, "std >= 0"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_written(call, error, match):
    t = _table(init=R.Constant(9.0))
    with pytest.raises(error, match=match):
        call(t)
    assert ops.emb_exists(t, torch.arange(1000)).sum().item() == 0


def test_unknown_optimizer_is_refused():
    with pytest.raises(ValueError, match="unknown optimizer"):
        _table(optimizer=("lamb", {"lr": 0.1}))


def test_save_then_load_in_a_fresh_process_is_bit_exact(tmp_path):
    name = f"ckpt_{uuid.uuid4().hex}"
    t = ops.init_embedding_table(name, 10**6, 16, init=R.Normal(0, 1), optimizer=("adam", {"lr": 0.01}))
    keys = torch.randint(0, 10**6, (300,))
    for _ in range(3):
        ops.emb_update(t, keys, torch.randn(300, 16))
    path = tmp_path / "store.recdev"
    ops.save(path)
    expected = ops.emb_read(t, keys).cpu()
    torch.save(expected, tmp_path / "expected.pt")
    torch.save(keys, tmp_path / "keys.pt")
    script = f"""
import torch, torch_recdev
from torch_recdev import ops
assert {name!r} in ops.load({str(path)!r})
t = ops.init_embedding_table({name!r}, 10**6, 16)
keys = torch.load({str(tmp_path / "keys.pt")!r})
assert torch.equal(ops.emb_read(t, keys).cpu(), torch.load({str(tmp_path / "expected.pt")!r}))
# the optimizer state came back too: one more identical update matches in both processes
torch.manual_seed(0)
ops.emb_update(t, keys, torch.randn(300, 16))
torch.save(ops.emb_read(t, keys).cpu(), {str(tmp_path / "after.pt")!r})
"""
    # The fresh process loads into its embedded store (also a file a remote store saved): on the
    # remote store, both processes would update the same rows.
    # The file holds every table of this process's store, spilling ones of earlier tests too: those
    # need a disk directory to load into.
    env = {k: v for k, v in os.environ.items() if k != "RECDEV_SERVERS"}
    env["RECDEV_DISK_DIR"] = str(tmp_path / "disk")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    torch.manual_seed(0)
    ops.emb_update(t, keys, torch.randn(300, 16))
    assert torch.equal(torch.load(tmp_path / "after.pt"), ops.emb_read(t, keys).cpu())


def test_corrupt_or_truncated_checkpoint_is_refused_and_nothing_loads(tmp_path):
    name = f"corrupt_{uuid.uuid4().hex}"
    t = ops.init_embedding_table(name, 100, 4)
    ops.emb_write(t, torch.tensor([1]), torch.ones(1, 4))
    path = tmp_path / "store.recdev"
    ops.save(path)
    data = path.read_bytes()
    ops.emb_write(t, torch.tensor([1]), torch.full((1, 4), 7.0))
    for damaged in (data[: len(data) // 2], data[:-1] + bytes([data[-1] ^ 0xFF])):
        path.write_bytes(damaged)
        with pytest.raises(ValueError):
            ops.load(path)
        assert ops.emb_read(t, torch.tensor([1])).tolist() == [[7.0] * 4]


def test_connect_embedded():
    assert ops.connect(None) == {"kind": "embedded", "servers": [], "shards": 0} == R.store_info()


def test_custom_ops_have_fake_kernels_that_agree_with_the_real_ones():
    # What torch.compile traces with. (torch.library.opcheck clones its inputs,
    # and a clone of a table is not the table, so the comparison is made here.)
    from torch._subclasses.fake_tensor import FakeTensorMode

    t = _table()
    keys = torch.tensor([1, 2])
    real = {
        "emb_read": ops.emb_read(t, keys),
        "emb_exists": ops.emb_exists(t, keys),
    }
    with FakeTensorMode() as mode:
        fake_t, fake_keys = mode.from_tensor(t), mode.from_tensor(keys)
        fake = {
            "emb_read": torch.ops.recdev.emb_read(fake_t, fake_keys),
            "emb_exists": torch.ops.recdev.emb_exists(fake_t, fake_keys),
        }
        assert torch.ops.recdev.emb_write(fake_t, fake_keys, mode.from_tensor(torch.ones(2, 8))) is None
    for name, value in real.items():
        assert (fake[name].shape, fake[name].dtype, fake[name].device) == (value.shape, value.dtype, value.device), name
    for name in ("emb_write", "emb_update", "emb_init", "emb_delete"):
        schema = getattr(torch.ops.recdev, name).default._schema
        assert schema.arguments[0].alias_info is not None and schema.arguments[0].alias_info.is_write, name
