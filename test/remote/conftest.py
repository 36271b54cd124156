"""Fixtures for the remote-store tests: real recdev-server processes on loopback, stopped by the
fixture that started them, and the embedded store made current again after each test."""

import os
import sys

import pytest

from torch_recdev import local_shards
import torch_recdev

# The routing of docs/protocol.md ("Row ownership"), for tests that pick the rows of one shard.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))


@pytest.fixture
def start_shards(tmp_path):
    """start_shards(n, *server_args) -> n running local_shards.Server of one store;
    start_shards.restart(shard, n, *server_args, listen=...) starts one again."""
    started = []

    def start(num_shards, *extra):
        servers = local_shards.start_shards(num_shards, *extra, log_dir=str(tmp_path))
        started.extend(servers)
        return servers

    def restart(shard, num_shards, *extra, listen):
        """One shard started again (on its old port), stopped with the others."""
        server = local_shards.Server(shard, num_shards, *extra, listen=listen, log_dir=str(tmp_path))
        started.append(server)
        return server

    start.restart = restart
    yield start
    torch_recdev.connect(None)
    for server in started:
        server.kill()


@pytest.fixture(autouse=True)
def embedded_after():
    yield
    torch_recdev.connect(None)
