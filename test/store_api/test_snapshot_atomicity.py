"""Checkpoints are point-in-time: a save racing with requests holds each request wholly or not at all
(per shard, on a remote store). Each test races one kind of request against ops.save on purpose and
then inspects every file saved."""

import threading
import time

import numpy as np
import pytest
import torch

import torch_recdev
from shard_groups import shard_groups
from torch_recdev import ops

ROWS, DIM = 100_000, 16
# A tear needs the save to pass the request between two of its sub-shard locks: rare per save, so
# each test saves as often as it can for a while (about 20 saves a second here).
RACE_SECONDS, MAX_SAVES = 4.0, 150


@pytest.fixture
def race_table():
    """race_table(name, num_rows, **kwargs): a named zero-init table whose rows are dropped after the
    test: a named table outlives its test, and its records would hold store memory others measure."""
    made = []

    def make(name, num_rows, **kwargs):
        made.append((ops.init_embedding_table(name, num_rows, DIM, init=torch_recdev.Zero(), **kwargs), num_rows))
        return made[-1][0]

    yield make
    for table, num_rows in made:
        ops.emb_delete(table, torch.arange(num_rows))


def race_saves(tmp_path, request_forever):
    """Runs request_forever(stop) on a thread while saving checkpoints for RACE_SECONDS; returns
    their paths."""
    stop = threading.Event()
    errors = []

    def run():
        try:
            request_forever(stop)
        except BaseException as error:  # noqa: BLE001 - re-raised on the main thread
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    paths = []
    deadline = time.monotonic() + RACE_SECONDS
    try:
        while time.monotonic() < deadline and len(paths) < MAX_SAVES:
            paths.append(tmp_path / f"race{len(paths)}.ckpt")
            ops.save(paths[-1])
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not thread.is_alive(), "the request thread did not stop"
    if errors:
        raise errors[0]
    return paths


def saved_states(name, table, paths, ids):
    """(rows, exists) of `ids` in each saved file, loaded one after another."""
    for path in paths:
        assert name in ops.load(path)
        keys = torch.from_numpy(ids)
        yield ops.emb_read(table, keys).cpu().numpy(), ops.emb_exists(table, keys).cpu().numpy()


def test_a_save_holds_each_write_wholly_or_not_at_all(tmp_path, race_table):
    name = "snapshot_race_write"
    table = race_table(name, 2 * ROWS)
    ids = np.arange(0, 2 * ROWS, 2, dtype=np.int64)  # every sub-shard and every shard

    def write_forever(stop):
        value = 0
        while not stop.is_set():
            value += 1
            ops.emb_write(table, torch.from_numpy(ids), torch.full((len(ids), DIM), float(value)))

    paths = race_saves(tmp_path, write_forever)
    groups = shard_groups(name, ids)
    position = {int(row): k for k, row in enumerate(ids)}
    for k, (rows, _) in enumerate(saved_states(name, table, paths, ids)):
        for group in groups:
            values = np.unique(rows[[position[int(row)] for row in group]])
            assert len(values) == 1, f"save {k} holds parts of writes {values.tolist()} on one shard"


def test_a_save_holds_each_delete_wholly_or_not_at_all(tmp_path, race_table):
    name = "snapshot_race_delete"
    table = race_table(name, 2 * ROWS)
    ids = np.arange(0, 2 * ROWS, 2, dtype=np.int64)
    keys = torch.from_numpy(ids)

    def write_and_delete_forever(stop):
        while not stop.is_set():
            ops.emb_write(table, keys, torch.ones(len(ids), DIM))
            ops.emb_delete(table, keys)

    paths = race_saves(tmp_path, write_and_delete_forever)
    position = {int(row): k for k, row in enumerate(ids)}
    for k, (_, exists) in enumerate(saved_states(name, table, paths, ids)):
        for group in shard_groups(name, ids):
            held = exists[[position[int(row)] for row in group]]
            assert held.all() or not held.any(), f"save {k} holds {int(held.sum())} of {len(held)} rows of one delete"


def test_a_save_holds_each_update_wholly_or_not_at_all(tmp_path, race_table):
    name = "snapshot_race_update"
    table = race_table(name, 2 * ROWS, optimizer=("sgd", {"lr": 1.0}))
    ids = np.arange(0, 2 * ROWS, 2, dtype=np.int64)
    keys, grads = torch.from_numpy(ids), -torch.ones(len(ids), DIM)

    def update_forever(stop):
        while not stop.is_set():
            ops.emb_update(table, keys, grads)  # every row + 1.0 per update: exact in float32

    paths = race_saves(tmp_path, update_forever)
    position = {int(row): k for k, row in enumerate(ids)}
    for k, (rows, _) in enumerate(saved_states(name, table, paths, ids)):
        for group in shard_groups(name, ids):
            values = np.unique(rows[[position[int(row)] for row in group]])
            assert len(values) == 1, f"save {k} holds parts of updates {values.tolist()} on one shard"



def test_a_save_holds_each_tensor_copy_wholly_or_not_at_all(tmp_path, race_table):
    # copy_ into a table writes through write_bytes, a batch of rows at a time: one request still.
    name = "snapshot_race_copy"
    table = race_table(name, ROWS)
    ids = np.arange(ROWS, dtype=np.int64)

    def copy_forever(stop):
        value = 0
        while not stop.is_set():
            value += 1
            table.copy_(torch.full((ROWS, DIM), float(value)))

    paths = race_saves(tmp_path, copy_forever)
    for k, (rows, _) in enumerate(saved_states(name, table, paths, ids)):
        for group in shard_groups(name, ids):
            values = np.unique(rows[group])
            assert len(values) == 1, f"save {k} holds parts of copies {values.tolist()} on one shard"
