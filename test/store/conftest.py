"""Fixtures for the store engine tests.

The binding is the `_store` submodule of torch_recdev._testing (build_native.py --testing). Set RECDEV_STORE_MODULE to test another
build of it, e.g. a standalone one: RECDEV_STORE_MODULE=_store_dev PYTHONPATH=/tmp pytest test/store
"""

import importlib
import os
import subprocess
import sys

import numpy as np
import pytest


@pytest.fixture(scope="session")
def store_mod():
    module = importlib.import_module(os.environ.get("RECDEV_STORE_MODULE", "torch_recdev._testing"))
    return module._store


@pytest.fixture
def make_table(store_mod):
    """make_table(num_rows, dim, init=None, state_words=0) -> a new anonymous Table of a fresh Store."""

    def make(num_rows, dim, init=None, state_words=0):
        store = store_mod.Store()
        config = store_mod.TableConfig(
            num_rows=num_rows, row_words=dim, state_words=state_words, init=init or store_mod.InitRule.zero()
        )
        return store.table(store.create_table(config))

    return make


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(scope="session")
def run_capped():
    """run_capped(args, capability) -> the standard output of `python *args` in a process of its own,
    its kernels capped by ATEN_CPU_CAPABILITY=capability (None: uncapped, the widest this CPU has);
    the test fails with the process's error output if it does."""

    def run(args, capability):
        env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
        if capability is not None:
            env["ATEN_CPU_CAPABILITY"] = capability
        done = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    return run
