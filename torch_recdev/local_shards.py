"""recdev-server shards on this machine, for single-machine runs, examples,
tests and benchmarks: each a real `recdev-server` process on 127.0.0.1 with a
port it picks itself, stopped when the context exits.

    with torch_recdev.start_local_shards(2) as shards:
        torch_recdev.connect(shards.url)
        ...
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from typing import Optional, Sequence

_LISTENING = re.compile(r"listening on (\S+:\d+)")


class LocalShards:
    """N recdev-server processes forming one store: shard i of N each."""

    def __init__(self, num_shards: int, *, token_file: Optional[str] = None,
                 checkpoint_dir: Optional[str] = None, extra_args: Sequence[str] = (),
                 start_timeout: float = 60.0):
        if num_shards < 1:
            raise ValueError(f"start_local_shards: num_shards must be >= 1, got {num_shards}")
        self.num_shards = num_shards
        self._token_file = token_file
        self._checkpoint_dir = checkpoint_dir
        self._extra_args = list(extra_args)
        self._start_timeout = start_timeout
        self.procs: list[Optional[subprocess.Popen]] = [None] * num_shards
        self.addresses: list[str] = [""] * num_shards
        try:
            for shard in range(num_shards):
                self.start(shard)
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        """The shards' addresses as torch_recdev.connect takes them."""
        return ",".join(self.addresses)

    def command(self, shard: int, listen: str) -> list[str]:
        cmd = [sys.executable, "-m", "torch_recdev.server", "--listen", listen,
               "--shard", str(shard), "--num-shards", str(self.num_shards)]
        if self._token_file:
            cmd += ["--token-file", self._token_file]
        if self._checkpoint_dir:
            cmd += ["--checkpoint-dir", os.path.join(self._checkpoint_dir, f"shard-{shard}")]
        return cmd + self._extra_args

    def start(self, shard: int) -> None:
        """Starts (or restarts, on the port it had) shard `shard`; returns once it listens."""
        previous = self.addresses[shard]
        listen = previous.removeprefix("tcp://") if previous else "127.0.0.1:0"
        if self._checkpoint_dir:
            os.makedirs(os.path.join(self._checkpoint_dir, f"shard-{shard}"), exist_ok=True)
        proc = subprocess.Popen(self.command(shard, listen), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        self.procs[shard] = proc
        address = self._wait_listening(proc, shard)
        self.addresses[shard] = f"tcp://{address}"

    def _wait_listening(self, proc: subprocess.Popen, shard: int) -> str:
        found: list[str] = []

        def read():
            for line in proc.stdout:
                match = _LISTENING.search(line)
                if match:
                    found.append(match.group(1))
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(self._start_timeout)
        if not found:
            proc.kill()
            _, err = proc.communicate(timeout=10)
            raise RuntimeError(f"recdev-server shard {shard} did not start within {self._start_timeout} s: "
                               f"{(err or '').strip()[-2000:] or 'no output'}")
        # Keep draining its output so the server never blocks on a full pipe.
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        return found[0]

    def kill(self, shard: int) -> None:
        """SIGKILL: the shard dies at once, without a checkpoint."""
        proc = self.procs[shard]
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)

    def terminate(self, shard: int) -> int:
        """SIGTERM: the shard finishes in-flight requests, checkpoints, exits. Returns its exit code."""
        proc = self.procs[shard]
        if proc is None:
            return 0
        if proc.poll() is None:
            proc.terminate()
        try:
            return proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"recdev-server shard {shard} did not exit within 60 s of SIGTERM; killed it")

    def stop(self) -> None:
        for shard, proc in enumerate(self.procs):
            if proc is not None and proc.poll() is None:
                try:
                    self.terminate(shard)
                except RuntimeError:
                    pass

    def __enter__(self) -> "LocalShards":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_local_shards(num_shards: int, **options) -> LocalShards:
    """Starts `num_shards` recdev-server processes on loopback (see LocalShards)."""
    return LocalShards(num_shards, **options)
