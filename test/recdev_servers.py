"""Real recdev-server processes for the client tests: started on 127.0.0.1 port 0 (each prints the
port it got), stopped by whoever started them."""

import os
import re
import select
import signal
import subprocess
import sys
import time

STARTUP_TIMEOUT = 120.0  # importing torch on a loaded 2-core machine


def server_env():
    """The environment of a server process: no RECDEV_SERVERS, or importing torch would connect it."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for name in ("RECDEV_SERVERS", "RECDEV_TOKEN", "RECDEV_TIMEOUT"):
        env.pop(name, None)
    return env


class Server:
    """One `recdev-server` process. `listen` defaults to a free loopback port."""

    def __init__(self, shard, num_shards, *extra, listen="127.0.0.1:0", log_dir=None):
        self.args = ["--listen", listen, "--shard", str(shard), "--num-shards", str(num_shards), *extra]
        self.stderr_path = os.path.join(log_dir or "/tmp", f"recdev-server-{os.getpid()}-{shard}-{time.monotonic_ns()}.log")
        with open(self.stderr_path, "w") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "torch_recdev.server", *self.args],
                stdout=subprocess.PIPE, stderr=stderr, text=True, env=server_env(),
            )
        self.port = self._read_port()

    def _read_port(self):
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if ready:
                line = self.proc.stdout.readline()
                match = re.fullmatch(r"listening on 127\.0\.0\.1:(\d+)\n", line)
                if match:
                    return int(match.group(1))
                if line == "":
                    break
            elif self.proc.poll() is not None:
                break
        self.kill()
        raise RuntimeError(f"recdev-server {self.args} did not start: {self.log()!r}")

    @property
    def address(self):
        return f"tcp://127.0.0.1:{self.port}"

    def log(self):
        with open(self.stderr_path) as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


def start_shards(num_shards, *extra, log_dir=None):
    """num_shards servers of one store, started in parallel (each import of torch takes seconds)."""
    servers = []
    try:
        for shard in range(num_shards):
            servers.append(Server(shard, num_shards, *extra, log_dir=log_dir))
    except BaseException:
        for server in servers:
            server.kill()
        raise
    return servers


def server_list(servers):
    return ",".join(server.address for server in servers)
