"""Training against real shards: two trainers sharing a table lose no update; a killed shard gives
a clear error within the timeout, and once restarted from its checkpoint training goes on; a hung
shard times out instead of hanging the trainer."""

import inspect
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from torch_recdev import local_shards
import torch_recdev
from torch_recdev import _C, ops

ROWS, DIM = 2000, 8


def shared_table(name):
    # Zero init and SGD with lr 1 on integer gradients: every sum is exact in float32, in any order.
    return ops.init_embedding_table(name, ROWS, DIM, init=torch_recdev.Zero(), optimizer=("sgd", {"lr": 1.0}))


def trainer_grads(seed, steps, batch=256):
    """The trainers' batches, run by each trainer process (its source is part of TRAINER) and by the
    test to compute the expected rows."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        keys = torch.randint(0, ROWS, (batch,), generator=gen)
        grads = torch.randint(-3, 4, (batch, DIM), generator=gen).float()
        yield keys, grads


TRAINER = f"import torch\nROWS, DIM = {ROWS}, {DIM}\n" + inspect.getsource(trainer_grads) + """
import torch_recdev
from torch_recdev import ops
table = ops.init_embedding_table("shared", ROWS, DIM)  # made by the parent: no init, no optimizer here
for keys, grads in trainer_grads({seed}, {steps}):
    ops.emb_update(table, keys, grads)
"""


def test_two_trainers_updating_one_table_lose_no_update(start_shards):
    servers = local_shards.server_list(start_shards(2))
    torch_recdev.connect(servers)
    table = shared_table("shared")
    steps = 40
    env = dict(os.environ, RECDEV_SERVERS=servers)
    trainers = [
        subprocess.Popen([sys.executable, "-c", TRAINER.format(seed=seed, steps=steps)],
                         env=env, stderr=subprocess.PIPE, text=True)
        for seed in (1, 2)
    ]
    for trainer in trainers:
        _, stderr = trainer.communicate(timeout=300)
        assert trainer.returncode == 0, stderr
    expected = torch.zeros(ROWS, DIM)
    for seed in (1, 2):
        for keys, grads in trainer_grads(seed, steps):
            expected.index_add_(0, keys, -grads)
    assert torch.equal(ops.emb_read(table, torch.arange(ROWS)).cpu(), expected)
    # Every update reached both shards: the step counts both trainers' calls.
    assert _C._table_optimizer_step(table) == 2 * steps


def step_all(table, keys):
    ops.emb_update(table, keys, torch.ones(keys.numel(), DIM))


def test_killed_shard_errors_in_time_and_training_resumes_from_its_checkpoint(start_shards, tmp_path):
    checkpoints = tmp_path / "ckpt"
    servers = start_shards(2, "--checkpoint-dir", str(checkpoints))
    torch_recdev.connect(local_shards.server_list(servers), timeout=5.0)
    table = shared_table("resumed")
    keys = torch.arange(0, ROWS, 7)
    for _ in range(3):
        step_all(table, keys)
    # A clean stop writes shard 1's checkpoint (rows at -3); the restarted server loads it and the
    # client, whose connection the restart broke, carries on.
    port = servers[1].port
    assert servers[1].stop() == 0
    servers[1] = start_shards.restart(1, 2, "--checkpoint-dir", str(checkpoints), listen=f"127.0.0.1:{port}")
    for _ in range(2):
        step_all(table, keys)
    assert torch.equal(ops.emb_read(table, keys).cpu(), torch.full((keys.numel(), DIM), -5.0))

    # SIGKILL during training: the next step fails within the timeout, naming the server.
    killed_at = []
    killer = threading.Timer(0.3, lambda: (killed_at.append(time.monotonic()), servers[1].proc.send_signal(signal.SIGKILL)))
    killer.start()
    steps_done = 0
    with pytest.raises(ConnectionError, match=rf"recdev-server 127.0.0.1:{port} \(shard 1 of 2\)"):
        while True:
            step_all(table, keys)
            steps_done += 1
            assert steps_done < 100000
    assert time.monotonic() - killed_at[0] < 5.0
    killer.join()
    servers[1].kill()

    # Restarted from its checkpoint: shard 1's rows are back at -3, shard 0's kept every step.
    servers[1] = start_shards.restart(1, 2, "--checkpoint-dir", str(checkpoints), listen=f"127.0.0.1:{port}")
    for _ in range(4):
        step_all(table, keys)
    rows = ops.emb_read(table, keys).cpu()
    assert (rows == rows[:, :1]).all()
    values = rows[:, 0]
    on_restarted = values == -7.0
    # The step that failed may have reached shard 0 before shard 1 died.
    on_other = (values == -(5 + steps_done + 4)) | (values == -(5 + steps_done + 5))
    assert on_restarted.any() and on_other.any() and (on_restarted | on_other).all()
    restarted_rows = torch_recdev.server_stats(f"127.0.0.1:{port}")["rows"]
    assert int(on_restarted.sum()) == restarted_rows


def stop_process(proc):
    """SIGSTOP, then wait until every thread of the process is stopped: the signal only marks them,
    and a thread running on another core could still answer a request sent right after kill()."""
    proc.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while True:
        states = []
        for task in os.listdir(f"/proc/{proc.pid}/task"):
            with open(f"/proc/{proc.pid}/task/{task}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        if all(state in ("T", "t") for state in states):
            return
        assert time.monotonic() < deadline, f"recdev-server {proc.pid} did not stop: thread states {states}"
        time.sleep(0.01)


def test_a_hung_shard_times_out(start_shards):
    servers = start_shards(2)
    torch_recdev.connect(local_shards.server_list(servers), timeout=1.5)
    table = shared_table("hung")
    keys = torch.arange(0, ROWS, 3)
    step_all(table, keys)
    stop_process(servers[0].proc)
    try:
        start = time.monotonic()
        with pytest.raises(ConnectionError, match=r"\(shard 0 of 2\), [A-Z_]+: no answer within 1.5 s"):
            step_all(table, keys)
        assert time.monotonic() - start < 6.0
    finally:
        servers[0].proc.send_signal(signal.SIGCONT)
    # The timed-out update reached shard 1, which applied it, and sits in shard 0's socket, which
    # applies it when it resumes (docs/remote.md, "Errors and failures"): every row took it, or will.
    # Once the shard answers again, so does the table: the next update applies on every shard.
    before = ops.emb_read(table, keys).cpu()
    assert set(before.unique().tolist()) <= {-2.0, -3.0}
    step_all(table, keys)
    after = ops.emb_read(table, keys).cpu()
    assert torch.equal(after, before - 1) or after.eq(-4.0).all()
