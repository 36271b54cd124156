"""Sessions and leases: a session's anonymous tables, staged loads and snapshots are freed when it has
had no connection and no request for the lease (the module's server: --lease-seconds 1), and not
before; named tables are never freed by a lapse."""

import time

import numpy as np
import pytest

import wire
from wire import ServerError, array, config, optimizer, string, u32, u64, table_ref

LEASE = 1.0


def wait_past_lease():
    time.sleep(LEASE * 2.5)  # the lease plus the server's check interval (a quarter lease), with margin


def table_count(server):
    with server.connect() as c:
        return c.stats()["tables"]


def test_anonymous_table_freed_after_lease_lapse(server):
    with server.connect() as c:
        session = c.welcome["session_id"]
        table = c.create_table(100, 4)
        c.write(table, [1, 2], np.ones((2, 4)))
        named = c.open_named("sessions.kept", 100, 4)["table_id"]
        c.write(named, [3], np.ones((1, 4)))
    with_table = table_count(server)
    wait_past_lease()
    with pytest.raises(ServerError) as info:
        server.connect(session_id=session)
    assert info.value.name == "NotFound" and "lease lapsed" in info.value.message
    assert table_count(server) == with_table - 1
    with server.connect() as c:
        with pytest.raises(ServerError) as info:
            c.gather(table, [1])
        assert info.value.name == "NotFound"
        assert c.exists(named, [3]).tolist() == [1]  # named tables stay


def test_open_connection_keeps_the_session(server):
    with server.connect() as c:
        table = c.create_table(100, 4)
        c.write(table, [5], np.full((1, 4), 3.0))
        wait_past_lease()  # idle, but connected
        np.testing.assert_array_equal(c.gather(table, [5]), np.full(4, 3.0, np.float32))


def test_requests_renew_the_lease(server):
    with server.connect() as c:
        session = c.welcome["session_id"]
        table = c.create_table(100, 4)
    # Reconnect-and-ping more often than the lease: the session lives on.
    for _ in range(5):
        time.sleep(LEASE * 0.5)
        with server.connect(session_id=session) as c:
            assert c.call("PING") == b""
    with server.connect(session_id=session) as c:
        assert c.exists(table, [0]).tolist() == [0]


def test_staged_loads_and_snapshots_freed_with_the_session(server):
    with server.connect() as c:
        baseline = c.stats()["bytes"]
    with server.connect() as c:
        named = c.open_named("sessions.dumped", 10**6, 16)["table_id"]
        c.write(named, np.arange(2000), np.ones((2000, 16)))
        c.call("DUMP", u64(named) + u64(0) + u32(1) + u64(0))  # a snapshot left unfinished
        load = wire.Reader(c.call("BEGIN_LOAD", string("sessions.loaded") + u64(0) + config(10**6, 16) + u64(0)
                                  + optimizer() + u64(0) + wire.NO_POLICY_STATE)).u64()
        c.call("LOAD_ROWS", u64(load) + array(np.arange(1000), np.uint64) + array(np.ones(16000), np.float32))
        held = c.stats()["bytes"]
        c.call("ERASE", table_ref(named) + array(np.arange(2000), np.uint64))
        erased = c.stats()["bytes"]
    assert held > baseline
    wait_past_lease()
    with server.connect() as c:
        after = c.stats()["bytes"]
        # The snapshot (2000 rows) and the staged load (1000 rows) are gone.
        assert after < erased - 2000 * 16 * 4
        with pytest.raises(ServerError):
            c.call("COMMIT_LOAD", array([load], np.uint64))
        assert c.call("FIND", string("sessions.loaded")) == b"\x00"
