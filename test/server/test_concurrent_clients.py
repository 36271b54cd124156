"""Many clients at once on one server: concurrent UPDATEs of a shared named table lose nothing, and
readers on other connections see whole rows only."""

import threading

import numpy as np

from wire import init_rule, optimizer, u64

DIM = 16


def test_concurrent_updates_are_all_applied(server):
    with server.connect() as setup:
        table = setup.open_named("concurrent.shared", 10**6, DIM, init_rule("constant", 0.0))["table_id"]
        setup.call("SET_OPTIMIZER", u64(table) + optimizer("sgd", lr=1.0))
    ids = np.arange(0, 4000, 3, dtype=np.uint64)
    threads, steps = 4, 25
    failures = []

    def train(worker):
        try:
            with server.connect() as c:
                grads = np.full((ids.size, DIM), worker + 1, np.float32)
                for _ in range(steps):
                    c.update(table, ids, grads)
        except Exception as e:  # reported below: an assertion in a thread would be lost
            failures.append(e)

    def read():
        try:
            with server.connect() as c:
                for _ in range(40):
                    rows = c.gather(table, ids[:200]).reshape(-1, DIM)
                    # A row is never seen half updated: all its elements are equal.
                    assert (rows == rows[:, :1]).all()
        except Exception as e:
            failures.append(e)

    workers = [threading.Thread(target=train, args=(w,)) for w in range(threads)] + [threading.Thread(target=read)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not failures, failures
    with server.connect() as c:
        expected = -float(steps * sum(range(1, threads + 1)))
        np.testing.assert_array_equal(c.gather(table, ids), np.full(ids.size * DIM, expected, np.float32))
        assert c.info(table)["table"]["optimizer_step"] == threads * steps
