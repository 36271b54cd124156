"""Every opcode against a real server: its happy path, checked against the store's meaning, and its
errors (each with the documented code, leaving the connection usable and the table unchanged)."""

import numpy as np
import pytest

import wire
from wire import ServerError, array, config, init_rule, optimizer, string, u8, u32, u64, i64, f64, table_ref, NO_POLICY_STATE

DIM = 4


@pytest.fixture
def conn(server):
    with server.connect() as c:
        yield c


def expect_error(conn, name, opcode, payload=b"", contains=None):
    with pytest.raises(ServerError) as info:
        conn.call(opcode, payload)
    assert info.value.name == name, info.value
    if contains is not None:
        assert contains in info.value.message, info.value.message
    conn.call("PING")  # the connection is still usable
    return info.value


def test_ping_and_welcome(server, conn):
    assert conn.welcome["version"] == wire.VERSION
    assert (conn.welcome["shard"], conn.welcome["num_shards"]) == (0, 1)
    assert conn.welcome["session_id"] != 0
    assert conn.welcome["lease_seconds"] == 1.0
    assert conn.welcome["max_payload_bytes"] == wire.MAX_PAYLOAD
    assert conn.call("PING") == b""
    with pytest.raises(ServerError) as info:
        conn.call("PING", b"\x00")
    assert info.value.name == "Protocol" and "unexpected bytes" in info.value.message
    assert conn.is_closed()


def test_create_gather_write_exists_erase(conn):
    table = conn.create_table(100, DIM, init=init_rule("constant", 0.5))
    rows = np.arange(3 * DIM, dtype=np.float32).reshape(3, DIM)
    assert conn.exists(table, [1, 2, 3]).tolist() == [0, 0, 0]
    conn.write(table, [1, 2, 3], rows)
    assert conn.exists(table, [1, 2, 3, 4]).tolist() == [1, 1, 1, 0]
    got = conn.gather(table, [3, 4, 1]).reshape(3, DIM)
    np.testing.assert_array_equal(got, np.stack([rows[2], np.full(DIM, 0.5, np.float32), rows[0]]))
    assert conn.exists(table, [4]).tolist() == [1]  # gather materialized it
    conn.call("ERASE", table_ref(table) + array([1, 4], np.uint64))
    assert conn.exists(table, [1, 2, 4]).tolist() == [0, 1, 0]
    np.testing.assert_array_equal(conn.gather(table, [1]), np.full(DIM, 0.5, np.float32))
    # Empty batches are legal.
    assert conn.gather(table, []).size == 0
    conn.write(table, [], np.zeros((0, DIM)))


def test_peek_does_not_materialize(conn):
    table = conn.create_table(50, DIM, init=init_rule("normal", 0.0, 1.0, seed=3), init_stream=11)
    peeked = conn.gather(table, [5, 6], op="PEEK")
    assert conn.exists(table, [5, 6]).tolist() == [0, 0]
    np.testing.assert_array_equal(conn.gather(table, [5, 6]), peeked)
    assert conn.exists(table, [5, 6]).tolist() == [1, 1]


def test_init_stream_decides_init_values(conn):
    rule = init_rule("normal", 0.0, 1.0, seed=3)
    a = conn.create_table(50, DIM, init=rule, init_stream=11)
    b = conn.create_table(50, DIM, init=rule, init_stream=11)
    c = conn.create_table(50, DIM, init=rule)  # the server's id
    np.testing.assert_array_equal(conn.gather(a, [7]), conn.gather(b, [7]))
    assert conn.info(c)["table"]["init_stream"] == c


def test_row_ops_errors(conn):
    table = conn.create_table(10, DIM)
    conn.write(table, [1], np.ones((1, DIM)))
    expect_error(conn, "OutOfRange", "GATHER", table_ref(table) + array([3, 10], np.uint64), "row id 10")
    expect_error(conn, "NotFound", "GATHER", table_ref(999999) + array([1], np.uint64), "no table with id 999999")
    expect_error(conn, "InvalidArgument", "WRITE", table_ref(table) + array([1], np.uint64) + array(np.zeros(3), np.float32),
                 "need 4")
    expect_error(conn, "OutOfRange", "EXISTS", table_ref(table) + array([11], np.uint64))
    expect_error(conn, "OutOfRange", "ERASE", table_ref(table) + array([1, 12], np.uint64))
    # Nothing changed.
    assert conn.exists(table, [1, 3]).tolist() == [1, 0]
    np.testing.assert_array_equal(conn.gather(table, [1]), np.ones(DIM, np.float32))


def test_write_bytes(conn):
    table = conn.create_table(10, DIM)
    conn.call("WRITE_BYTES", table_ref(table) + u64(2 * DIM * 4 + 4) + array(np.array([7.0, 8.0], np.float32).view(np.uint8), np.uint8))
    np.testing.assert_array_equal(conn.gather(table, [2]), np.array([0, 7, 8, 0], np.float32))
    expect_error(conn, "OutOfRange", "WRITE_BYTES", table_ref(table) + u64(10 * DIM * 4 - 2) + array(np.zeros(4), np.uint8))


def test_named_tables_open_find_list_free(conn, server):
    d = conn.open_named("opcodes.users", 1000, DIM, init_rule("uniform", -1.0, 1.0, seed=5))
    again = conn.open_named("opcodes.users", 1000, DIM, init_rule("uniform", -1.0, 1.0, seed=5))
    assert again["table_id"] == d["table_id"]
    assert d["config"]["num_rows"] == 1000 and d["config"]["dim"] == DIM
    assert d["optimizer"]["kind"] == 0 and d["optimizer_step"] == 0
    err = expect_error(conn, "InvalidArgument", "OPEN_NAMED", string("opcodes.users") + config(1000, DIM + 1)
                       + wire.declaration(), "already exists")
    assert "opcodes.users" in err.message
    r = wire.Reader(conn.call("FIND", string("opcodes.users")))
    assert r.u8() == 1 and r.description()["table_id"] == d["table_id"]
    assert conn.call("FIND", string("opcodes.nobody")) == b"\x00"
    # Another session sees the named table, but not this session's anonymous one.
    anonymous = conn.create_table(10, DIM)
    listed = conn.list()
    assert (d["table_id"], "opcodes.users", wire.route_key_of_name("opcodes.users")) in listed
    assert (anonymous, "", 7) in listed
    with server.connect() as other:
        other_ids = [t for t, _, _ in other.list()]
        assert d["table_id"] in other_ids and anonymous not in other_ids
        expect_error(other, "NotFound", "GATHER", table_ref(anonymous) + array([0], np.uint64))
        expect_error(other, "NotFound", "FREE_TABLE", u64(anonymous))
    info = conn.info(d["table_id"])
    assert info["name"] == "opcodes.users" and info["route_key"] == wire.route_key_of_name("opcodes.users")
    conn.call("FREE_TABLE", u64(d["table_id"]))
    assert conn.call("FIND", string("opcodes.users")) == b"\x00"
    expect_error(conn, "NotFound", "FREE_TABLE", u64(d["table_id"]))


def test_create_table_errors(conn):
    expect_error(conn, "InvalidArgument", "CREATE_TABLE", config(10, 0) + u8(0) + u64(0) + u64(1), "dim")
    expect_error(conn, "InvalidArgument", "CREATE_TABLE", config(10, (1 << 24) + 1) + u8(0) + u64(0) + u64(1),
                 "limit")
    expect_error(conn, "InvalidArgument", "CREATE_TABLE",
                 config(10, 4, init=init_rule("normal", 0.0, -1.0)) + u8(0) + u64(0) + u64(1))
    expect_error(conn, "InvalidArgument", "OPEN_NAMED", string("") + config(10, 4) + wire.declaration(), "name")


def test_set_init(conn):
    table = conn.create_table(10, DIM)
    conn.write(table, [1], np.ones((1, DIM)))
    conn.call("SET_INIT", u64(table) + init_rule("constant", 2.0))
    assert conn.exists(table, [1]).tolist() == [0]
    np.testing.assert_array_equal(conn.gather(table, [1]), np.full(DIM, 2.0, np.float32))
    expect_error(conn, "InvalidArgument", "SET_INIT", u64(table) + init_rule("uniform", 1.0, 0.0))


def test_optimizer_update_state_step_lr(conn):
    table = conn.create_table(10, DIM, init=init_rule("constant", 1.0))
    expect_error(conn, "InvalidArgument", "UPDATE", table_ref(table) + array([1], np.uint64) + array(np.ones(DIM), np.float32),
                 "no optimizer")
    expect_error(conn, "InvalidArgument", "SET_LR", u64(table) + f64(0.1), "no optimizer")
    conn.call("SET_OPTIMIZER", u64(table) + optimizer("adagrad", lr=0.5))
    grads = np.array([[1, 2, 3, 4], [1, 1, 1, 1]], np.float32)
    conn.update(table, [2, 2], grads)  # duplicates summed: g = [2, 3, 4, 5]
    g = grads.sum(0)
    expected = 1.0 - 0.5 * g / (np.sqrt(g * g) + 1e-10)
    np.testing.assert_allclose(conn.gather(table, [2]), expected, rtol=1e-6)
    r = wire.Reader(conn.call("GATHER_STATE", table_ref(table) + array([2, 3], np.uint64)))
    width, state = r.u32(), r.array(np.float32)
    assert width == DIM
    np.testing.assert_allclose(state.reshape(2, DIM), np.stack([g * g, np.zeros(DIM)]), rtol=1e-6)
    assert conn.info(table)["table"]["optimizer_step"] == 1
    conn.update(table, [], np.zeros((0, DIM)))  # an empty update only advances the step
    assert conn.info(table)["table"]["optimizer_step"] == 2
    np.testing.assert_allclose(conn.gather(table, [2]), expected, rtol=1e-6)
    conn.call("SET_STEP", u64(table) + u64(40))
    conn.call("SET_LR", u64(table) + f64(0.25))
    info = conn.info(table)
    assert info["table"]["optimizer_step"] == 40 and info["table"]["optimizer"]["lr"] == 0.25
    assert info["table"]["config"]["state_words"] == DIM
    bad = np.ones(DIM, np.float32)
    bad[2] = np.nan
    expect_error(conn, "InvalidArgument", "UPDATE", table_ref(table) + array([2], np.uint64) + array(bad, np.float32), "nan")
    assert conn.info(table)["table"]["optimizer_step"] == 40
    expect_error(conn, "InvalidArgument", "SET_OPTIMIZER", u64(table) + optimizer("sgd", lr=-1.0))
    expect_error(conn, "InvalidArgument", "SET_LR", u64(table) + f64(float("nan")))


def test_gather_pooled_partial(conn):
    table = conn.create_table(100, DIM, init=init_rule("normal", 0.0, 1.0, seed=1), init_stream=5)
    ids = np.array([3, 7, 7, 50, 9, 0], np.uint64)
    offsets = np.array([0, 2, 2, 5], np.uint64)  # bags [3,7] [] [7,50,9] [0]
    rows = conn.gather(table, ids).reshape(-1, DIM)
    weights = np.array([0.5, 2, 1, -1, 3, 1], np.float32)

    def pooled(mode, weights=None, padding_idx=-1, ignore_nan=None):
        if ignore_nan is None:
            ignore_nan = [0] * len(offsets) if mode == 2 else []
        payload = (table_ref(table) + array(ids, np.uint64) + array(offsets, np.uint64) + u8(mode)
                   + (u8(1) + array(weights, np.float32) if weights is not None else u8(0)) + i64(padding_idx)
                   + array(ignore_nan, np.uint8))
        r = wire.Reader(conn.call("GATHER_POOLED_PARTIAL", payload))
        out = r.array(np.float32).reshape(-1, DIM), r.array(np.uint32), r.array(np.int32)
        r.end()
        return out

    bags = [(0, 2), (2, 2), (2, 5), (5, 6)]
    values, counts, positions = pooled(0)
    np.testing.assert_allclose(values, np.stack([rows[b:e].sum(0) for b, e in bags]), rtol=1e-6)
    assert counts.tolist() == [2, 0, 3, 1] and positions.size == 0
    values, counts, _ = pooled(0, weights)
    np.testing.assert_allclose(values, np.stack([(rows[b:e] * weights[b:e, None]).sum(0) for b, e in bags]),
                               rtol=1e-6, atol=1e-6)
    values, counts, _ = pooled(1, padding_idx=7)  # Mean: sums and counts without the padding rows
    keep = ids != 7
    np.testing.assert_allclose(values, np.stack([(rows[b:e] * keep[b:e, None]).sum(0) for b, e in bags]), rtol=1e-6)
    assert counts.tolist() == [1, 0, 2, 1]
    values, counts, positions = pooled(2)
    positions = positions.reshape(-1, DIM)
    assert counts.size == 0
    for bag, (b, e) in enumerate(bags):
        if b == e:
            assert (positions[bag] == -1).all() and (values[bag] == 0).all()
        else:
            np.testing.assert_array_equal(values[bag], rows[b:e].max(0))
            np.testing.assert_array_equal(positions[bag], b + rows[b:e].argmax(0))
    no_flags = array([], np.uint8)
    expect_error(conn, "InvalidArgument", "GATHER_POOLED_PARTIAL",
                 table_ref(table) + array(ids, np.uint64) + array([0, 9], np.uint64) + u8(0) + u8(0) + i64(-1) + no_flags,
                 "past")
    expect_error(conn, "InvalidArgument", "GATHER_POOLED_PARTIAL",
                 table_ref(table) + array(ids, np.uint64) + array([1], np.uint64) + u8(0) + u8(0) + i64(-1) + no_flags)
    expect_error(conn, "InvalidArgument", "GATHER_POOLED_PARTIAL",
                 table_ref(table) + array(ids, np.uint64) + array(offsets, np.uint64) + u8(1) + u8(1)
                 + array(weights, np.float32) + i64(-1) + no_flags, "per_sample_weights")
    expect_error(conn, "InvalidArgument", "GATHER_POOLED_PARTIAL",
                 table_ref(table) + array(ids, np.uint64) + array(offsets, np.uint64) + u8(0) + u8(1)
                 + array(weights[:2], np.float32) + i64(-1) + no_flags, "per_sample_weights")
    # ignore_nan: one flag per bag with Max, none with Sum and Mean
    for mode, flags in ((2, [0, 0]), (2, []), (0, [0, 0, 0, 0]), (1, [1])):
        expect_error(conn, "InvalidArgument", "GATHER_POOLED_PARTIAL",
                     table_ref(table) + array(ids, np.uint64) + array(offsets, np.uint64) + u8(mode) + u8(0) + i64(-1)
                     + array(flags, np.uint8), "ignore_nan")


def test_gather_pooled_partial_max_ignores_nan_where_told(conn):
    table = conn.create_table(10, 2)
    nan = float("nan")
    conn.call("WRITE", table_ref(table) + array([1, 2, 3], np.uint64)
              + array([[nan, 1.0], [5.0, nan], [2.0, 7.0]], np.float32))
    payload = table_ref(table) + array([1, 2, 3, 1, 2, 3], np.uint64) + array([0, 3], np.uint64) + u8(2) + u8(0) + i64(-1)
    r = wire.Reader(conn.call("GATHER_POOLED_PARTIAL", payload + array([0, 1], np.uint8)))
    values, _, positions = r.array(np.float32).reshape(2, 2), r.array(np.uint32), r.array(np.int32).reshape(2, 2)
    # Bag 0 as the CPU pools it: the first row's nan stays, a later nan never counts.
    assert np.isnan(values[0, 0]) and positions[0, 0] == 0
    assert values[0, 1] == 7.0 and positions[0, 1] == 2
    # Bag 1, whose first row is on another shard: no nan counts.
    assert values[1].tolist() == [5.0, 7.0] and positions[1].tolist() == [4, 5]


def test_dump_and_staged_load(conn, server):
    name = "opcodes.dumped"
    d = conn.open_named(name, 10**9, DIM, init_rule("normal", 0.0, 0.1, seed=9))
    table = d["table_id"]
    conn.call("SET_OPTIMIZER", u64(table) + optimizer("adam", lr=0.01))
    ids = np.array([5, 10**8, 77, 123456789], np.uint64)
    conn.update(table, ids, np.random.default_rng(0).standard_normal((4, DIM)).astype(np.float32))
    dumped_ids, records, header = conn.dump_all(table, max_rows=3)
    assert header["total_rows"] == 4 and header["record_words"] == 3 * DIM
    assert sorted(dumped_ids.tolist()) == sorted(ids.tolist())
    assert header["table"]["optimizer_step"] == 1
    expect_error(conn, "InvalidArgument", "DUMP", u64(table) + u64(0) + u32(0) + u64(0), "max_rows")
    expect_error(conn, "NotFound", "DUMP", u64(table) + u64(123456) + u32(5) + u64(0), "snapshot")

    # Load the dump into a new named table, then into the same one over changed rows.
    desc = header["table"]
    begin = (string(name) + u64(0) + config(10**9, DIM, 2 * DIM, init_rule("normal", 0.0, 0.1, seed=9)) + u64(desc["init_stream"])
             + optimizer("adam", lr=0.01) + u64(7) + NO_POLICY_STATE)
    conn.write(table, [5], np.zeros((1, DIM)))
    load = wire.Reader(conn.call("BEGIN_LOAD", begin)).u64()
    conn.call("LOAD_ROWS", u64(load) + array(dumped_ids[:2], np.uint64) + array(records[:2], np.float32))
    conn.call("LOAD_ROWS", u64(load) + array(dumped_ids[2:], np.uint64) + array(records[2:], np.float32))
    r = wire.Reader(conn.call("COMMIT_LOAD", array([load], np.uint64)))
    assert r.array(np.uint64).tolist() == [table]
    ids2, records2, header2 = conn.dump_all(table)
    order, order2 = np.argsort(dumped_ids), np.argsort(ids2)
    np.testing.assert_array_equal(ids2[order2], dumped_ids[order])
    np.testing.assert_array_equal(records2[order2], records[order])
    assert header2["table"]["optimizer_step"] == 7

    # Errors: nothing is installed.
    bad_state = string(name) + u64(0) + config(10**9, DIM, 3, init_rule()) + u64(0) + optimizer("adam") + u64(0) + NO_POLICY_STATE
    expect_error(conn, "InvalidArgument", "BEGIN_LOAD", bad_state, "state_words")
    wrong_shape = string(name) + u64(0) + config(10, DIM, 0) + u64(0) + optimizer() + u64(0) + NO_POLICY_STATE
    expect_error(conn, "InvalidArgument", "BEGIN_LOAD", wrong_shape, "exists")
    load = wire.Reader(conn.call("BEGIN_LOAD", begin)).u64()
    expect_error(conn, "InvalidArgument", "LOAD_ROWS", u64(load) + array([1], np.uint64) + array(np.zeros(DIM), np.float32))
    expect_error(conn, "OutOfRange", "LOAD_ROWS", u64(load) + array([10**9], np.uint64)
                 + array(np.zeros(3 * DIM), np.float32))
    conn.call("LOAD_ROWS", u64(load) + array([1], np.uint64) + array(np.zeros(3 * DIM), np.float32))
    expect_error(conn, "InvalidArgument", "LOAD_ROWS", u64(load) + array([2, 2], np.uint64)
                 + array(np.zeros(6 * DIM), np.float32), "twice")
    expect_error(conn, "NotFound", "COMMIT_LOAD", array([load], np.uint64))  # dropped by the duplicate
    load = wire.Reader(conn.call("BEGIN_LOAD", begin)).u64()
    conn.call("ABORT_LOAD", u64(load))
    expect_error(conn, "NotFound", "ABORT_LOAD", u64(load))
    # Another session cannot commit this session's load.
    load = wire.Reader(conn.call("BEGIN_LOAD", begin)).u64()
    with server.connect() as other:
        expect_error(other, "NotFound", "COMMIT_LOAD", array([load], np.uint64))
    ids3, records3, _ = conn.dump_all(table)
    np.testing.assert_array_equal(records3[np.argsort(ids3)], records[order])


def test_staged_load_into_an_existing_table_by_id(conn, server):
    # What torch.load of a table on a remote store does: install rows into an anonymous table of
    # this session, found by its id, keeping its routing key.
    table = conn.create_table(1000, DIM, route_key=7, init=init_rule("constant", 0.5))
    conn.write(table, [3], np.full((1, DIM), 9.0))

    def begin(name="", table_id=0, num_rows=1000, dim=DIM):
        return (string(name) + u64(table_id) + config(num_rows, dim, 0, init_rule("constant", 2.0)) + u64(0)
                + optimizer() + u64(4) + NO_POLICY_STATE)

    load = wire.Reader(conn.call("BEGIN_LOAD", begin(table_id=table))).u64()
    conn.call("LOAD_ROWS", u64(load) + array([8, 1], np.uint64) + array(np.arange(2 * DIM), np.float32))
    assert conn.gather(table, [3]).tolist() == [9.0] * DIM  # nothing changes before the commit
    r = wire.Reader(conn.call("COMMIT_LOAD", array([load], np.uint64)))
    assert r.array(np.uint64).tolist() == [table]
    ids, records, header = conn.dump_all(table)
    assert sorted(ids.tolist()) == [1, 8] and header["table"]["optimizer_step"] == 4
    np.testing.assert_array_equal(conn.gather(table, [8, 1, 3]).reshape(3, DIM),
                                  np.concatenate([np.arange(2 * DIM).reshape(2, DIM), np.full((1, DIM), 2.0)]))

    expect_error(conn, "InvalidArgument", "BEGIN_LOAD", begin(), "exactly one target")
    expect_error(conn, "InvalidArgument", "BEGIN_LOAD", begin(name="opcodes.both", table_id=table), "exactly one target")
    expect_error(conn, "InvalidArgument", "BEGIN_LOAD", begin(table_id=table, num_rows=999), "exists with")
    expect_error(conn, "NotFound", "BEGIN_LOAD", begin(table_id=987654321))
    with server.connect() as other:  # another session's anonymous table is not there for it
        expect_error(other, "NotFound", "BEGIN_LOAD", begin(table_id=table))
    # A table freed between BEGIN_LOAD and COMMIT_LOAD: the commit changes nothing.
    doomed = conn.create_table(1000, DIM)
    load = wire.Reader(conn.call("BEGIN_LOAD", begin(table_id=doomed))).u64()
    conn.call("FREE_TABLE", u64(doomed))
    expect_error(conn, "NotFound", "COMMIT_LOAD", array([load], np.uint64))


def test_stats(conn):
    before = conn.stats()
    table = conn.create_table(10, DIM)
    conn.write(table, [1, 2], np.ones((2, DIM)))
    with pytest.raises(ServerError):
        conn.gather(table, [99])
    after = conn.stats()
    assert after["tables"] == before["tables"] + 1
    assert after["rows"] == before["rows"] + 2
    assert after["bytes"] > before["bytes"]
    assert after["requests"] >= before["requests"] + 4
    assert after["errors"] == before["errors"] + 1
    assert after["connections"] >= 1 and after["sessions"] >= 1
    assert after["max_memory"] == 0
