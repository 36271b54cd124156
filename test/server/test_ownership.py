"""Row ownership: owner_shard and route_key_of_name as documented (known answers, the Python twin of
the rule here agreeing with the server), rows spread evenly over a server's sub-shards, and a server
refusing rows that are not its own."""

import numpy as np
import pytest

import wire
from wire import ServerError, array, init_rule, string, config, u64, u8, i64, optimizer, table_ref

ROUTE_KEY = 0x1234


def test_known_answers():
    assert wire.route_key_of_name("user") == 0xFB431516A6BE08EB
    assert [wire.owner_shard(ROUTE_KEY, i, 2) for i in (0, 1, 2, 12345)] == [0, 0, 0, 1]
    assert [wire.owner_shard(ROUTE_KEY, i, 3) for i in (0, 1, 2, 12345)] == [1, 0, 0, 2]
    assert all(wire.owner_shard(k, i, 1) == 0 for k in (0, 5) for i in range(100))


def test_even_over_shards_and_their_sub_shards():
    """Each server's rows fall evenly into the store's 64 sub-shards (the top 6 bits of mix64(id))."""
    num_shards, n = 3, 60000
    owners = np.array([wire.owner_shard(ROUTE_KEY, i, num_shards) for i in range(n)])
    counts = np.bincount(owners, minlength=num_shards)
    assert np.all(np.abs(counts - n / num_shards) < 5 * np.sqrt(n / num_shards))
    for shard in range(num_shards):
        ids = np.nonzero(owners == shard)[0]
        sub = np.array([wire.mix64(int(i)) >> 58 for i in ids])
        histogram = np.bincount(sub, minlength=64)
        expected = ids.size / 64
        chi2 = ((histogram - expected) ** 2 / expected).sum()
        assert chi2 < 130, chi2  # 63 degrees of freedom: p < 1e-6 beyond this


@pytest.fixture(scope="module")
def shard1(request):
    from server_process import ServerProcess

    process = ServerProcess("--listen", "127.0.0.1:0", "--shard", "1", "--num-shards", "2")
    yield process
    process.kill()


def test_welcome_names_the_shard(shard1):
    with shard1.connect() as c:
        assert (c.welcome["shard"], c.welcome["num_shards"]) == (1, 2)
        assert c.stats()["shard"] == 1


def test_server_agrees_with_the_rule(shard1):
    with shard1.connect() as c:
        table = c.create_table(10**6, 2, route_key=ROUTE_KEY)
        for row in range(200):
            owned = wire.owner_shard(ROUTE_KEY, row, 2) == 1
            try:
                c.exists(table, [row])
                assert owned, row
            except ServerError as e:
                assert not owned and e.name == "InvalidArgument", (row, e)
                assert f"row id {row}" in e.message and "belongs to shard 0" in e.message


def test_foreign_rows_refused_and_nothing_changes(shard1):
    with shard1.connect() as c:
        table = c.create_table(10**6, 2, route_key=ROUTE_KEY, init=init_rule("constant", 1.0))
        c.call("SET_OPTIMIZER", u64(table) + optimizer("sgd", lr=1.0))
        mine = wire.owned_ids(ROUTE_KEY, 1, 2, 5)
        foreign = wire.owned_ids(ROUTE_KEY, 0, 2, 1)[0]
        batch = np.array(mine[:3] + [foreign] + mine[3:], np.uint64)
        rows = np.ones((batch.size, 2), np.float32)
        offsets = array([0], np.uint64)
        for opcode, payload in [
            ("GATHER", table_ref(table) + array(batch, np.uint64)),
            ("PEEK", table_ref(table) + array(batch, np.uint64)),
            ("WRITE", table_ref(table) + array(batch, np.uint64) + array(rows, np.float32)),
            ("UPDATE", table_ref(table) + array(batch, np.uint64) + array(rows, np.float32)),
            ("ERASE", table_ref(table) + array(batch, np.uint64)),
            ("EXISTS", table_ref(table) + array(batch, np.uint64)),
            ("GATHER_STATE", table_ref(table) + array(batch, np.uint64)),
            ("GATHER_POOLED_PARTIAL",
             table_ref(table) + array(batch, np.uint64) + offsets + u8(0) + u8(0) + i64(-1) + array([], np.uint8)),
            ("WRITE_BYTES", table_ref(table) + u64(foreign * 8) + array(np.zeros(8), np.uint8)),
        ]:
            with pytest.raises(ServerError) as info:
                c.call(opcode, payload)
            assert info.value.name == "InvalidArgument" and "belongs to shard 0" in info.value.message, opcode
        assert c.exists(table, mine).tolist() == [0] * 5
        assert c.info(table)["table"]["optimizer_step"] == 0
        c.update(table, mine, np.ones((5, 2)))
        np.testing.assert_array_equal(c.gather(table, mine), np.zeros(10, np.float32))


def test_named_tables_route_by_name(shard1):
    name = "ownership.items"
    key = wire.route_key_of_name(name)
    with shard1.connect() as c:
        table = c.open_named(name, 10**6, 2)["table_id"]
        mine = wire.owned_ids(key, 1, 2, 20)
        foreign = wire.owned_ids(key, 0, 2, 1)
        c.write(table, mine, np.ones((20, 2)))
        with pytest.raises(ServerError):
            c.write(table, foreign, np.ones((1, 2)))
        load = wire.Reader(c.call("BEGIN_LOAD", string(name) + u64(0) + config(10**6, 2) + u64(0) + optimizer() + u64(0)
                                    + wire.NO_POLICY_STATE)).u64()
        with pytest.raises(ServerError) as info:
            c.call("LOAD_ROWS", u64(load) + array(foreign, np.uint64) + array(np.zeros(2), np.float32))
        assert "belongs to shard 0" in info.value.message
