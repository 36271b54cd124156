"""Real recdev-server processes for the tests (ServerProcess), and a checksum of every table a
connection can see. A module of its own, not conftest.py, so that test files can import it by a name
no other test directory uses."""

import hashlib
import os
import re
import select
import signal
import subprocess
import sys
import time

import numpy as np

import wire

STARTUP_TIMEOUT = 120.0  # importing torch on a loaded 2-core machine


class ServerProcess:
    def __init__(self, *args):
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.args = args
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torch_recdev.server", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        self.port = None
        deadline = time.monotonic() + STARTUP_TIMEOUT
        line = ""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if ready:
                line = self.proc.stdout.readline()
                match = re.fullmatch(r"listening on 127\.0\.0\.1:(\d+)\n", line)
                if match:
                    self.port = int(match.group(1))
                    return
                if line == "":
                    break
            elif self.proc.poll() is not None:
                break
        self.kill()
        raise RuntimeError(f"recdev-server {args} did not start: stdout {line!r}, stderr {self.stderr()!r}")

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def alive(self):
        return self.proc.poll() is None

    def connect(self, **kwargs):
        return wire.Connection(self.port, **kwargs)

    def stop(self, sig=signal.SIGTERM, timeout=60):
        """Sends `sig` and returns the exit code."""
        if self.alive():
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

    def stderr(self):
        if self.proc.poll() is None:
            return ""
        return self.proc.stderr.read()


def checksum(conn):
    """A digest of every table the connection can see: description (with optimizer step) and rows."""
    h = hashlib.sha256()
    for table_id, name, route_key in sorted(conn.list()):
        info = conn.info(table_id)
        h.update(repr((table_id, name, route_key, info["table"])).encode())
        ids, records, _ = conn.dump_all(table_id)
        order = np.argsort(ids)
        h.update(ids[order].tobytes())
        h.update(records[order].tobytes())
    return h.hexdigest()
