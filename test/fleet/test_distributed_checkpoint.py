"""torch.distributed.checkpoint with torch_recdev's planners, in fleets of real processes
(fleet_processes.py, gloo on 127.0.0.1): a model with two shared tables under fused optimizers and a
dense head is saved by 2 ranks and loaded by 1 and by 3, with its tables on recdev-server shards (the
3 ranks on 3 other shards) and on the embedded store. The tables (held rows, optimizer state, init
rule, untouched rows), the head and the optimizers' steps come back; each table is written once, by
the rank the planner names, with only its held rows; a damaged table is named in DCP's error."""

import concurrent.futures
import shutil
import uuid
import zlib

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException, FileSystemReader

import torch_recdev
from torch_recdev import local_shards
from torch_recdev.distributed_checkpoint import TableLoadPlanner

import dcp_worker
from fleet_processes import run_fleet

TABLES = {"users": "model.users.weight", "items": "model.items.weight"}
# Bytes of a held row in the checkpoint: its id and its record (8 weights, then the optimizer's state).
ROW_BYTES = {"users": 8 + 4 * (8 + 8), "items": 8 + 4 * (8 + 16)}  # Adagrad: a sum per weight; Adam: two moments


def fleet(scenario, tmp, where, world, servers, prefix):
    out = tmp / f"{where}-{scenario}-{world}"
    out.mkdir()
    return run_fleet(scenario, out, world=world, servers=servers, timeout=180, worker=dcp_worker.__file__,
                     env_all={"DCP_DIR": str(tmp / where), "DCP_PREFIX": prefix})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Per store: the save (2 ranks) and the loads (1 rank; 3 ranks, on 3 shards for the shards). The
    fleets of one phase run side by side (each process spends seconds importing torch)."""
    tmp = tmp_path_factory.mktemp("dcp")
    two, three = local_shards.start_shards(2, log_dir=str(tmp)), local_shards.start_shards(3, log_dir=str(tmp))
    servers = {"shards": (local_shards.server_list(two), local_shards.server_list(three)), "embedded": (None, None)}
    try:
        with concurrent.futures.ThreadPoolExecutor() as pool:
            saves = {where: pool.submit(fleet, "save", tmp, where, 2, saving, "dcp.saved.")
                     for where, (saving, _) in servers.items()}
            runs = {where: {"saved": saved.result(), "dir": tmp / where} for where, saved in saves.items()}
            # The same shards with other table names (nothing of the saved tables reused), and 3 new shards.
            loads = {(where, loaded_by): pool.submit(fleet, "load", tmp, where, world, shards, "dcp.loaded.")
                     for where, (saving, loading) in servers.items()
                     for loaded_by, world, shards in (("1 rank", 1, saving), ("3 ranks", 3, loading))}
            for (where, loaded_by), loaded in loads.items():
                runs[where][loaded_by] = loaded.result()
        yield runs
    finally:
        for server in two + three:
            server.stop()


@pytest.mark.parametrize("where", ["shards", "embedded"])
@pytest.mark.parametrize("loaded_by", ["1 rank", "3 ranks"])
def test_tables_optimizer_state_and_head_come_back_in_a_fleet_of_another_size(runs, where, loaded_by):
    saved = runs[where]["saved"][0]  # on the embedded store, rank 0's replica is the one written
    assert saved["store"] == ("remote" if where == "shards" else "embedded")
    for rank in runs[where][loaded_by]:
        for name in TABLES:
            table, expected = rank["tables"][name], saved["tables"][name]
            assert len(expected["ids"]) > 0
            for key, value in expected.items():
                same = torch.equal(table[key], value) if isinstance(value, torch.Tensor) else table[key] == value
                assert same, (name, key, table[key], value)
        for key, value in saved["head"].items():
            assert torch.equal(rank["head"][key], value)
        assert rank["optim"] == saved["optim"]
        assert rank["grads"] == [None] * 4  # get_state_dict made no zero gradients to step the optimizers


@pytest.mark.parametrize("where", ["shards", "embedded"])
def test_each_table_is_written_once_by_its_rank_with_only_its_held_rows(runs, where):
    storage = FileSystemReader(str(runs[where]["dir"])).read_metadata().storage_data
    held = {name: len(table["ids"]) for name, table in runs[where]["saved"][0]["tables"].items()}
    for name, key in TABLES.items():
        (info,) = [info for index, info in storage.items() if index.fqn == key]
        writer = zlib.crc32(key.encode()) % 2 if where == "shards" else 0
        assert info.relative_path.startswith(f"__{writer}_"), info
        # The store's serialization: the rows' bytes and a header, never the table's 10**5 or 10**6 rows.
        assert held[name] * ROW_BYTES[name] <= info.length <= held[name] * ROW_BYTES[name] + 8192, (name, info.length)
    # Every byte of the files is one item's: no table was written a second time under no key.
    assert sum(f.stat().st_size for f in runs[where]["dir"].glob("*.distcp")) == sum(i.length for i in storage.values())


def test_a_damaged_table_is_named_in_dcps_error_and_nothing_of_it_is_installed(runs, tmp_path, monkeypatch):
    damaged = tmp_path / "damaged"
    shutil.copytree(runs["shards"]["dir"], damaged)
    storage = FileSystemReader(str(damaged)).read_metadata().storage_data
    (info,) = [info for index, info in storage.items() if index.fqn == TABLES["users"]]
    with open(damaged / info.relative_path, "r+b") as f:  # flip bytes amid the table's records
        f.seek(info.offset + info.length // 2)
        data = f.read(16)
        f.seek(info.offset + info.length // 2)
        f.write(bytes(b ^ 0xFF for b in data))
    torch_recdev.connect(None)  # this process, on its embedded store, is a fleet of 1 rank
    monkeypatch.setenv("DCP_PREFIX", f"dcp.damaged.{uuid.uuid4().hex}.")
    model, optimizers = dcp_worker.build(seed=1)
    with pytest.raises(CheckpointException, match="recdev table 'model.users.weight': its part of the checkpoint "
                                                  "cannot be read, so it is damaged"):
        dcp.load(dcp_worker.state_of(model, optimizers), checkpoint_id=str(damaged), planner=TableLoadPlanner())
    assert torch_recdev.table_stats(model.users.weight)["rows"] == 0
