"""The model-based test of the whole store (issue 33; DESIGN.md, "Features compose"): random
sequences of store operations against the reference model, on the embedded store and on two real
recdev-server shards with restarts.

CI runs a fixed, derandomized set of sequences. `make soak SOAK_MINUTES=30` (RECDEV_SOAK_MINUTES)
runs random ones instead until the time is up.
"""

import gc
import os
import time

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from store_machine import RemoteStoreMachine, StoreMachine

SOAK_MINUTES = float(os.environ.get("RECDEV_SOAK_MINUTES", "0"))
STEPS = 30

# CI: embedded 72 x 30 + remote 12 x 30 = 2,520 steps at most (2,170 + about 350 measured), about a
# minute; RECDEV_MODEL_SCALE multiplies the examples, make soak runs random ones for as long as asked.
EXAMPLES = {"embedded": 72, "remote": 12}
MACHINES = {"embedded": StoreMachine, "remote": RemoteStoreMachine}


def ci_settings(examples: int, derandomize: bool = True) -> settings:
    examples = max(1, round(examples * float(os.environ.get("RECDEV_MODEL_SCALE", "1"))))
    return settings(max_examples=examples, stateful_step_count=STEPS, deadline=None, derandomize=derandomize,
                    database=None, print_blob=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@pytest.mark.skipif(SOAK_MINUTES > 0, reason="the soak runs instead")
@pytest.mark.parametrize("store", ["embedded", "remote"])
def test_store_model(store):
    before = table_memory()
    run_state_machine_as_test(MACHINES[store], settings=ci_settings(EXAMPLES[store]))
    if store == "embedded":
        # Every example erased its rows in its teardown. Whatever the examples did (resets, dtype
        # changes, loads, restores, evictions, spills), the store's table memory, counted per chunk
        # (torch.recdev.memory_stats), is back where it started: no chunk leaked or was counted twice.
        # (Checked over the run, not per example: a table an example dropped is freed when the last
        # object holding it is collected, which may be during the next example.)
        assert table_memory() == before, f"{table_memory() - before} bytes of table memory left counted"


def table_memory() -> int:
    gc.collect()
    return torch.recdev.memory_stats()["table_allocated_bytes.current"]


@pytest.mark.skipif(SOAK_MINUTES <= 0, reason="set RECDEV_SOAK_MINUTES (make soak SOAK_MINUTES=30)")
def test_soak():
    """Random sequences (a new seed each round), one remote round for every four embedded ones,
    until the time is up; the first failure stops it, shrunk."""
    deadline = time.monotonic() + SOAK_MINUTES * 60
    rounds = 0
    while time.monotonic() < deadline:
        store = "remote" if rounds % 5 == 4 else "embedded"
        run_state_machine_as_test(MACHINES[store], settings=ci_settings(20 if store == "remote" else 100, False))
        rounds += 1
