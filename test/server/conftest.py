"""Fixtures starting real recdev-server processes on 127.0.0.1 (port 0: the server picks one and
prints it), always stopped by the fixture that started them."""

import pytest

from server_process import ServerProcess


@pytest.fixture
def start_server():
    """start_server(*args) -> a running ServerProcess listening on a free loopback port."""
    started = []

    def start(*args):
        server = ServerProcess("--listen", "127.0.0.1:0", *args)
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


@pytest.fixture(scope="module")
def server():
    """One shard of one, shared by a test module, with a short lease."""
    process = ServerProcess("--listen", "127.0.0.1:0", "--lease-seconds", "1")
    yield process
    process.kill()
