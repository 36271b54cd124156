"""recdev-server processes on this machine: for single-machine runs, examples,
benchmarks and the tests. Each is a real `recdev-server` (the native executable,
`torch_recdev.server.executable()`) on 127.0.0.1, on a port it picks itself and
prints; whoever starts one stops it.

    servers = torch_recdev.local_shards.start_shards(2)
    try:
        torch_recdev.connect(torch_recdev.local_shards.server_list(servers))
        ...
    finally:
        for server in servers:
            server.stop()
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import tempfile
import time

from . import server

STARTUP_TIMEOUT = 120.0  # a server listens within milliseconds, but loads its checkpoint first
_LISTENING = re.compile(r"listening on 127\.0\.0\.1:(\d+)\n")


class ServerProcess:
    """`recdev-server ARGS...`; returns once it listens (its stderr goes to a log file)."""

    def __init__(self, *args: str, log_dir: str | None = None):
        self.args = args
        fd, self.stderr_path = tempfile.mkstemp(prefix="recdev-server-", suffix=".log", dir=log_dir)
        with os.fdopen(fd, "w") as stderr:
            self.proc = subprocess.Popen([server.executable(), *args], stdout=subprocess.PIPE, stderr=stderr,
                                         text=True)
        self.port = self._read_port()

    def _read_port(self) -> int:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if ready:
                line = self.proc.stdout.readline()
                match = _LISTENING.fullmatch(line)
                if match:
                    return int(match.group(1))
                if line == "":
                    break
            elif self.proc.poll() is not None:
                break
        self.kill()
        raise RuntimeError(f"recdev-server {' '.join(self.args)} did not start: {self.log()!r}")

    @property
    def address(self) -> str:
        """host:port, as `recdev-server --stats` takes it."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """tcp://host:port, as torch_recdev.connect takes it."""
        return f"tcp://{self.address}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        """What the server wrote to stderr so far."""
        with open(self.stderr_path) as f:
            return f.read()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Sends `sig` (SIGTERM: finish in-flight requests, checkpoint, exit) and returns the exit code."""
        if self.alive():
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


class Server(ServerProcess):
    """Shard `shard` of `num_shards`, on a free loopback port unless `listen` says otherwise."""

    def __init__(self, shard: int, num_shards: int, *extra: str, listen: str = "127.0.0.1:0",
                 log_dir: str | None = None):
        super().__init__("--listen", listen, "--shard", str(shard), "--num-shards", str(num_shards), *extra,
                         log_dir=log_dir)


def start_shards(num_shards: int, *extra: str, log_dir: str | None = None) -> list[Server]:
    """The num_shards servers of one store; extra arguments go to every one of them."""
    servers: list[Server] = []
    try:
        for shard in range(num_shards):
            servers.append(Server(shard, num_shards, *extra, log_dir=log_dir))
    except BaseException:
        for server in servers:
            server.kill()
        raise
    return servers


def server_list(servers: list[ServerProcess]) -> str:
    """The servers as torch_recdev.connect and RECDEV_SERVERS take them."""
    return ",".join(server.url for server in servers)
