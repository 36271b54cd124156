"""Fixtures for the table-storage tests (DESIGN.md, "Memory model"). Global placement
settings are saved and restored around every test by test/conftest.py."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_recdev

HUGE_ROWS = 10**10


@pytest.fixture
def to_placement():
    """to_placement(cpu_tensor, "host" | "table") -> a recdev copy of it in that kind of storage."""

    def make(cpu_tensor, kind):
        with torch_recdev.placement(kind):
            out = torch.empty(cpu_tensor.shape, dtype=cpu_tensor.dtype, device="recdev")
        out.copy_(cpu_tensor)
        assert torch_recdev.is_table(out) == (kind == "table"), (kind, cpu_tensor.shape, cpu_tensor.dtype)
        return out

    return make


@pytest.fixture
def huge_table():
    """huge_table(dim=128, **embedding_kwargs) -> the (detached) weight of nn.Embedding(10**10, dim) on recdev."""

    def make(dim=128, **kwargs):
        with torch.no_grad():
            return torch.nn.Embedding(HUGE_ROWS, dim, device="recdev", **kwargs).weight.detach()

    return make


@pytest.fixture
def lazy_table():
    """lazy_table(rows, dim) -> a small float32 table with a normal init rule and no materialized row."""

    def make(rows, dim):
        with torch_recdev.placement("table"):
            w = torch.empty(rows, dim, device="recdev")
        w.normal_()
        assert torch_recdev.is_table(w)
        assert torch_recdev.table_stats(w)["rows"] == 0
        return w

    return make


@pytest.fixture
def run_python():
    """run_python(code, env_overrides) -> CompletedProcess of a fresh interpreter running `code`.

    `env_overrides` maps names to values; a value of None removes the variable.
    """

    def run(code, env_overrides=None, timeout=120):
        env = dict(os.environ)
        for name in ("RECDEV_TABLE_MIN_BYTES", "RECDEV_MAX_FALLBACK_BYTES"):
            env.pop(name, None)
        for name, value in (env_overrides or {}).items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run



@pytest.fixture(autouse=True)
def on_every_store(store_backend):
    """Each test runs on the embedded store and on two remote shards (test/conftest.py)."""
    yield store_backend
