"""Real server processes on loopback for the benchmarks: recdev-server shards
and a Redis peer, each on a port it picks, stopped on exit."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import tempfile
import time

from torch_recdev import local_shards


@contextlib.contextmanager
def local_recdev_servers(num_shards: int):
    """Yields the shards' addresses ("tcp://127.0.0.1:PORT")."""
    servers = local_shards.start_shards(num_shards)
    try:
        yield [server.url for server in servers]
    finally:
        for server in servers:
            server.kill()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_redis_server():
    """Yields the port of a fresh redis-server with persistence off."""
    import redis

    port = _free_port()
    with tempfile.TemporaryDirectory() as workdir:
        proc = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", workdir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    redis.Redis(port=port).ping()
                    break
                except redis.ConnectionError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"redis-server did not start on port {port}")
                    time.sleep(0.05)
            yield port
        finally:
            proc.terminate()
            proc.wait(timeout=10)
