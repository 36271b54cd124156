"""A backward pass sends its remote tables' updates without waiting for each answer, and waits for
all of them at its end (docs/remote.md, "Updates from backward"): the tables must train bit for bit
as on the embedded store, a table updated twice in one pass must take its updates in order, and a
shard that does not answer must make backward() raise, naming it, with the session usable after."""

import signal
import threading
import time

import pytest
import torch
import torch.nn.functional as F

import torch_recdev
import wire  # test/server's, on the path by conftest.py
from test_remote_training import stop_process
from torch_recdev import local_shards, ops

DIM = 8


def make_tables(prefix):
    # Order-sensitive optimizers: two updates of one row give other bits if applied the other way round.
    declare = [("a", ("rowwise_adagrad", {"lr": 0.1})), ("b", ("adam", {"lr": 0.01})), ("c", ("adagrad", {"lr": 0.05}))]
    tables = []
    generator = torch.Generator().manual_seed(1)
    for name, optimizer in declare:
        table = ops.init_embedding_table(f"{prefix}.{name}", 1000, DIM, init=torch_recdev.Zero(), optimizer=optimizer)
        # The same rows on both stores (a shard draws a Normal init from its own streams).
        ops.emb_write(table, torch.arange(1000), torch.randn(1000, DIM, generator=generator))
        tables.append(table.requires_grad_(True))
    return tables


def train(tables, steps=6):
    """Steps of a model whose backward updates table a twice (two features share it), b per id and c
    from bags (its bags' gradients go to the store whole); returns what the tables hold after. Bags of
    one: shards pool a larger bag's rows in another order than CPU, which this test is not about."""
    a, b, c = tables
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        first, second = torch.randint(0, 300, (2, 256), generator=generator)  # overlapping ids
        per_id = torch.randint(0, 1000, (256,), generator=generator)
        bag_ids = torch.randint(0, 1000, (256,), generator=generator)
        weights = torch.rand(256, generator=generator)
        out = (F.embedding(first, a).cpu() * 2 + F.embedding(second, a).cpu().pow(2)
               + F.embedding(per_id, b).cpu()
               + F.embedding_bag(bag_ids, c, torch.arange(256), mode="sum", per_sample_weights=weights).cpu())
        out.sin().sum().backward()
    everything = torch.arange(1000)
    return [ops.emb_read(table, everything).cpu() for table in tables]


def test_backward_trains_bit_for_bit_as_on_the_embedded_store(start_shards):
    embedded = train(make_tables("answers"))
    torch_recdev.connect(local_shards.server_list(start_shards(2)))
    remote = train(make_tables("answers"))
    for name, want, got in zip("abc", embedded, remote):
        assert torch.equal(got, want), f"table {name}: the rows differ from the embedded store's"


def test_a_shard_that_does_not_answer_fails_backward_naming_it(start_shards):
    servers = start_shards(2)
    torch_recdev.connect(local_shards.server_list(servers), timeout=1.5)
    tables = make_tables("answers_hung")
    ids = torch.arange(0, 1000, 3)
    forward = lambda: sum(F.embedding(ids, table).cpu().sum() for table in tables)  # noqa: E731
    forward().backward()
    before = [ops.emb_read(table, ids).cpu() for table in tables]
    loss = forward()
    stop_process(servers[0].proc)
    try:
        start = time.monotonic()
        # Every table's update went out before the first answer was awaited: the three to shard 0 fail.
        with pytest.raises(Exception, match=r"\(shard 0 of 2\), UPDATE: no answer within 1.5 s .*and the updates "
                                            r"of 2 more tables in this backward failed") as failure:
            loss.backward()
        assert isinstance(failure.value, (ConnectionError, RuntimeError))
        # One timeout, not one per request: the later ones fail with the connection.
        assert time.monotonic() - start < 4.0
    finally:
        servers[0].proc.send_signal(signal.SIGCONT)
    # The session goes on: the next step is answered everywhere.
    forward().backward()
    for name, table, old in zip("abc", tables, before):
        assert not torch.equal(ops.emb_read(table, ids).cpu(), old)
        # Of the step that timed out, shard 1 applied its part; shard 0, resumed, applies the requests
        # it reads before it finds the connection closed (docs/remote.md, "Errors and failures").
        route = wire.route_key_of_name(f"answers_hung.{name}")
        on_shard_0 = sum(wire.owner_shard(route, int(i), 2) == 0 for i in ids)
        assert torch_recdev.table_stats(table)["updates"] in (3 * ids.numel(), 3 * ids.numel() - on_shard_0)


class _ReadFromAnotherThread(torch.autograd.Function):
    """The identity, whose backward has another thread read from the store: made before the
    lookups, it runs after their updates are sent and before the pass's end reads their answers."""

    @staticmethod
    def forward(ctx, x, read):
        ctx.read = read
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        outcome = []
        thread = threading.Thread(target=lambda: outcome.append(ctx.read()))
        thread.start()
        thread.join()
        assert outcome, "the other thread's read failed"
        return grad, None


def test_a_failure_read_by_another_thread_still_fails_backward(start_shards):
    """Another thread's request reads the answers owed before it is sent; a failed update among them
    is still backward's to raise (it was the other thread's, and backward returned as if applied)."""
    servers = start_shards(2)
    torch_recdev.connect(local_shards.server_list(servers), timeout=1.5)
    table, other = make_tables("answers_threads")[:2]
    ids = torch.arange(0, 1000, 3)
    F.embedding(ids, table).cpu().sum().backward()
    on_shard_1 = torch.tensor(wire.owned_ids(wire.route_key_of_name("answers_threads.b"), 1, 2, 8))
    scale = _ReadFromAnotherThread.apply(torch.ones(1, requires_grad=True),
                                         lambda: ops.emb_read(other, on_shard_1))  # shard 1 only
    loss = F.embedding(ids, table).cpu().sum() * scale
    stop_process(servers[0].proc)
    try:
        with pytest.raises(Exception, match=r"\(shard 0 of 2\), UPDATE: no answer within 1.5 s"):
            loss.backward()
    finally:
        servers[0].proc.send_signal(signal.SIGCONT)
    F.embedding(ids, table).cpu().sum().backward()  # the session goes on
