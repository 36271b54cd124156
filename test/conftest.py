"""Fixtures for the whole suite.

Every test runs with the global placement settings saved and restored, so a
test that changes table_min_bytes, max_fallback_bytes or the placement
override (or fails half-way through doing so) cannot leak into the next one.

`store_backend` runs a test once on the embedded store and once on a remote
store of two real recdev-server shards (started once per session); the
table-storage, training and store-API suites use it for every test
(their conftest.py files), so each of their tests checks both.
"""

import pytest
import torch

from torch_recdev import local_shards

import torch_recdev
from torch_recdev import _C


@pytest.fixture
def deterministic():
    """torch.use_deterministic_algorithms(True) with uninitialized memory filled, for one test."""
    enabled = torch.are_deterministic_algorithms_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(enabled)
    torch.utils.deterministic.fill_uninitialized_memory = fill


@pytest.fixture(autouse=True)
def restore_table_settings():
    min_bytes = torch_recdev.table_min_bytes()
    fallback_bytes = torch_recdev.max_fallback_bytes()
    placement = _C._placement()
    yield
    torch_recdev.set_table_min_bytes(min_bytes)
    torch_recdev.set_max_fallback_bytes(fallback_bytes)
    _C._set_placement(placement)


@pytest.fixture(scope="session", autouse=True)
def fresh_compile_caches(tmp_path_factory):
    """torch.compile's on-disk caches (Inductor's FX graphs, AOTAutograd) in a directory of this
    session: a graph cached by an earlier run, or by an earlier version of the code, must not make
    a compile test pass or fail."""
    import os

    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path_factory.mktemp("inductor-cache"))
    yield
    if previous is None:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous


@pytest.fixture(scope="session")
def remote_shards(tmp_path_factory):
    """Two recdev-server shards on loopback for the whole session, with a disk tier (spill=True): their
    server list."""
    servers = local_shards.start_shards(2, "--disk-dir", str(tmp_path_factory.mktemp("server-disk")),
                                        log_dir=str(tmp_path_factory.mktemp("server-logs")))
    yield local_shards.server_list(servers)
    for server in servers:
        server.stop()


@pytest.fixture(params=["embedded", "remote-2-shards"])
def store_backend(request, monkeypatch):
    """The current store for one test: embedded, or the two session shards (also for the fresh
    interpreters a test starts, through RECDEV_SERVERS)."""
    if request.param == "embedded":
        monkeypatch.delenv("RECDEV_SERVERS", raising=False)
        torch_recdev.connect(None)
        yield request.param
        return
    servers = request.getfixturevalue("remote_shards")
    monkeypatch.setenv("RECDEV_SERVERS", servers)
    torch_recdev.connect(servers)
    try:
        yield request.param
    finally:
        torch_recdev.connect(None)
