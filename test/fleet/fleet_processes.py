"""Runs a worker script (test/fleet/fleet_worker.py unless told) as N real trainer processes with
torchrun's environment on 127.0.0.1, bounded in time; what each rank saw comes back as a dict."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import torch

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fleet_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_fleet(scenario: str, out_dir, world: int = 2, servers: str | None = None, env_all: dict | None = None,
              timeout: float = 120, worker: str = WORKER) -> list[dict]:
    """Each rank runs `scenario` (worker functions, comma-separated) of `worker`, which writes what it
    saw to OUT_DIR/rank<r>.pt; RECDEV_SERVERS on rank 0 only."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = {k: v for k, v in os.environ.items() if k not in ("RECDEV_SERVERS", "RECDEV_TOKEN")}
        env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1", **(env_all or {}))
        if servers and rank == 0:
            env["RECDEV_SERVERS"] = servers
        procs.append(subprocess.Popen([sys.executable, worker, scenario, str(out_dir)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for rank, (proc, text) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"rank {rank} exited with {proc.returncode}:\n{text}"
    return [torch.load(os.path.join(out_dir, f"rank{rank}.pt")) for rank in range(world)]
