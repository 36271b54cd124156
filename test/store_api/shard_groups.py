"""Which shard owns which rows, for tests of what is atomic per shard."""

import importlib.util
import pathlib

import numpy as np
import torch_recdev


def _wire():
    """The wire protocol's Python twin (test/server/wire.py), for owner_shard."""
    path = pathlib.Path(__file__).parents[1] / "server" / "wire.py"
    spec = importlib.util.spec_from_file_location("recdev_test_wire", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shard_groups(name, ids):
    """The ids each shard owns (one group for the embedded store): the unit a snapshot is atomic for."""
    num_shards = torch_recdev.store_info()["shards"] or 1
    if num_shards == 1:
        return [ids]
    wire = _wire()
    key = wire.route_key_of_name(name)
    owners = np.array([wire.owner_shard(key, int(i), num_shards) for i in ids])
    return [ids[owners == shard] for shard in range(num_shards)]
