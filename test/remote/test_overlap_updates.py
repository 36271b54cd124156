"""connect(..., overlap_updates=True): backward returns once its remote updates are sent, and the
session's next request reads their answers (docs/remote.md, "Overlapping updates with the next
step"). The tables must still train bit for bit as on the embedded store, lookups sent behind the
updates must see them, and an update the shards do not apply must be raised by the next request or
by synchronize, never lost: not by a request that frees or undoes (which swallows errors), and said
on stderr if the process ends first."""

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.nn.functional as F

import torch_recdev
from test_backward_answers import DIM, make_tables, train
from test_remote_training import stop_process
from torch_recdev import local_shards, ops

EARLIER = r"a table update sent by an earlier backward pass failed \(connect\(\.\.\., overlap_updates=True\)"


def train_with_table_lookups(tables, steps=6):
    """Steps whose lookups go out together (torch_recdev.embeddings, as the demo's): sent behind the
    previous step's updates, whose answers nothing has read yet."""
    a, b, _ = tables
    generator = torch.Generator().manual_seed(3)
    for _ in range(steps):
        ids_a, ids_b = torch.randint(0, 300, (2, 256), generator=generator)  # repeats across steps
        rows_a, rows_b = torch_recdev.embeddings([ids_a, ids_b], [a, b])
        (rows_a.cpu().pow(2).sum() + rows_b.cpu().sin().sum()).backward()
    return [ops.emb_read(table, torch.arange(1000)).cpu() for table in (a, b)]


def test_overlapped_updates_train_bit_for_bit_as_on_the_embedded_store(start_shards):
    embedded = train(make_tables("overlap")) + train_with_table_lookups(make_tables("overlap_lookups"))
    torch_recdev.connect(local_shards.server_list(start_shards(2)), overlap_updates=True)
    assert torch_recdev.store_info()["overlap_updates"] is True
    remote = train(make_tables("overlap")) + train_with_table_lookups(make_tables("overlap_lookups"))
    for k, (want, got) in enumerate(zip(embedded, remote)):
        assert torch.equal(got, want), f"table {k}: the rows differ from the embedded store's"


@pytest.fixture
def overlapped(start_shards):
    """2 shards, connected with overlap_updates and a 1.5 s timeout; three tables stepped once."""
    servers = start_shards(2)
    torch_recdev.connect(local_shards.server_list(servers), timeout=1.5, overlap_updates=True)
    tables = make_tables("overlap_refused")
    ids = torch.arange(0, 1000, 3)
    step = lambda: sum(F.embedding(ids, table).cpu().sum() for table in tables)  # noqa: E731
    step().backward()
    return servers, tables, ids, step


def test_a_refused_update_is_raised_by_the_next_request_not_by_backward(overlapped):
    servers, tables, ids, step = overlapped
    loss = step()
    stop_process(servers[0].proc)
    try:
        loss.backward()  # returns: it waits for no answer (waiting would raise shard 0's timeout)
        with pytest.raises(ConnectionError, match=EARLIER + r".*; this request was not sent: .*\(shard 0 of 2\), "
                                                  r"UPDATE: no answer within 1.5 s .*and 2 more requests sent with it"):
            ops.emb_read(tables[0], ids)
    finally:
        servers[0].proc.send_signal(signal.SIGCONT)
    # Raised once; the session goes on.
    before = ops.emb_read(tables[0], ids).cpu()
    step().backward()
    assert not torch.equal(ops.emb_read(tables[0], ids).cpu(), before)


@pytest.mark.parametrize("synchronize", [torch.recdev.synchronize, torch.accelerator.synchronize],
                         ids=["torch.recdev", "torch.accelerator"])
def test_synchronize_raises_a_refused_update(overlapped, synchronize):
    servers, tables, ids, step = overlapped
    loss = step()
    stop_process(servers[0].proc)
    try:
        loss.backward()
        with pytest.raises(ConnectionError, match=EARLIER + r".*may still apply it.*: recdev-server .*\(shard 0 of 2\), UPDATE: no answer "
                                                  r"within 1.5 s"):
            synchronize()
    finally:
        servers[0].proc.send_signal(signal.SIGCONT)
    synchronize()  # raised once


def test_freeing_a_table_does_not_swallow_a_refused_update(overlapped):
    """A table freed while the failure is read (its FREE_TABLE ignores errors) leaves it to the next
    request; so does a failed table creation's clean-up."""
    servers, tables, ids, step = overlapped
    with torch_recdev.placement("table"):
        anonymous = torch.zeros(100, 4, device="recdev")
    loss = step()
    stop_process(servers[0].proc)
    try:
        loss.backward()
        del anonymous
        gc.collect()  # FREE_TABLE: reads the answers owed first, and times out on shard 0 itself
    finally:
        servers[0].proc.send_signal(signal.SIGCONT)
    with pytest.raises(ConnectionError, match=EARLIER):
        ops.emb_read(tables[0], ids)
    ops.emb_read(tables[0], ids)


def test_a_pause_between_steps_keeps_the_session(start_shards):
    """Between steps the answers of the last updates are owed, on connections out of the pools: the
    heartbeat reads them after a quiet beat and gives the connections back, so that a pause longer
    than the servers' idle timeout and the session's lease (an evaluation, a barrier) loses neither
    the connections nor the session's anonymous tables."""
    servers = start_shards(2, "--idle-timeout", "2", "--lease-seconds", "1")
    torch_recdev.connect(local_shards.server_list(servers), overlap_updates=True)
    with torch_recdev.placement("table"):
        anonymous = torch.nn.Embedding(1000, DIM, device="recdev")
    torch_recdev.optim.SGD([anonymous.weight], lr=0.1)
    named = make_tables("overlap_pause")[0]
    ids = torch.arange(0, 1000, 3)

    def step():
        rows = torch_recdev.embeddings([ids, ids], [anonymous.weight, named])
        sum(r.cpu().pow(2).sum() for r in rows).backward()

    step()
    time.sleep(4)  # twice the idle timeout, four leases
    step()
    torch.recdev.synchronize()
    assert ops.emb_read(anonymous.weight, ids).shape == (len(ids), DIM)


def fork_and_read(table, ids):
    """A child forked now (as a DataLoader worker) reads rows of the table; its exit code."""
    pid = os.fork()
    if pid == 0:
        try:
            torch.set_num_threads(1)  # as a DataLoader worker: no OpenMP pool after a fork
            os._exit(0 if ops.emb_read(table, ids).shape == (len(ids), table.shape[1]) else 1)
        except BaseException:
            os._exit(2)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_forked_child_leaves_the_answers_owed_to_its_parent(start_shards):
    """A fork between steps inherits the answers owed: the child's own request must not read them
    off its parent's sockets, where the parent would then wait for them in vain."""
    ids = torch.arange(0, 1000, 7)

    def train_forking(tables):
        for _ in range(3):
            F.embedding(ids, tables[0]).cpu().pow(2).sum().backward()
            if torch_recdev.store_info()["kind"] == "remote":
                assert fork_and_read(tables[0], ids[:5]) == 0
        return ops.emb_read(tables[0], torch.arange(1000)).cpu()

    embedded = train_forking(make_tables("overlap_fork"))
    torch_recdev.connect(local_shards.server_list(start_shards(2)), timeout=5, overlap_updates=True)
    assert torch.equal(train_forking(make_tables("overlap_fork")), embedded)


_EXITS_WITH_A_REFUSAL = textwrap.dedent("""
    import sys
    import torch, torch.nn.functional as F
    import torch_recdev
    from torch_recdev import ops
    torch_recdev.connect(sys.argv[1], timeout=1.0, overlap_updates=True)
    table = ops.init_embedding_table("overlap_exit", 100, 4, optimizer=("sgd", {"lr": 0.1}))
    step = lambda: F.embedding(torch.arange(100), table.requires_grad_(True)).cpu().sum()
    step().backward()  # the first asks whether the table has an optimizer, and waits for it
    loss = step()
    print("ready", flush=True)
    sys.stdin.readline()  # the test stops shard 0
    loss.backward()
    print("backward returned", flush=True)
""")


def test_a_refusal_nothing_read_is_said_on_stderr_at_exit(start_shards):
    servers = start_shards(2)
    child = subprocess.Popen([sys.executable, "-c", _EXITS_WITH_A_REFUSAL, local_shards.server_list(servers)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        stop_process(servers[0].proc)
        out, err = child.communicate("go\n", timeout=60)
    finally:
        servers[0].proc.send_signal(signal.SIGCONT)
        if child.poll() is None:
            child.kill()
    assert "backward returned" in out
    assert child.returncode == 0
    assert "torch_recdev: at exit: " in err and "earlier backward pass failed" in err and "UPDATE: no answer" in err, err


@pytest.mark.parametrize("kwargs, error, match", [
    ({"overlap_updates": "yes"}, TypeError, "overlap_updates must be True or False"),
    ({"servers": None, "overlap_updates": True}, ValueError, "overlap_updates=True needs servers"),
])
def test_connect_checks_overlap_updates(kwargs, error, match):
    kwargs = {"servers": "tcp://127.0.0.1:1", **kwargs}
    with pytest.raises(error, match=match):
        torch_recdev.connect(**kwargs)


def test_the_embedded_store_and_a_default_connection_do_not_overlap(start_shards):
    assert "overlap_updates" not in torch_recdev.store_info()
    torch_recdev.connect(local_shards.server_list(start_shards(1)))
    assert torch_recdev.store_info()["overlap_updates"] is False
