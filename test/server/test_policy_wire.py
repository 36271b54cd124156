"""Protocol 6 against a real server, with frames the Python client would never send: table policies
(SET_POLICY, GET_POLICY_STATE, RESTORE_POLICY, the policy in GET_TABLE_INFO and STATS) with every kind
of bad field, and the element type every row request carries, refused when it is not the table's.
Each bad request gets an error reply, the server stays up and nothing changes."""

import math

import numpy as np
import pytest

import wire
from server_process import checksum
from wire import ServerError, array, config, init_rule, u8, u64, i64, table_ref

DIM = 4


@pytest.fixture
def conn(server):
    with server.connect() as c:
        yield c


def expect_error(conn, name, opcode, payload, contains):
    with pytest.raises(ServerError) as info:
        conn.call(opcode, payload)
    assert info.value.name == name, info.value
    assert contains in info.value.message, info.value.message
    if name != "Protocol":
        conn.call("PING")  # the connection is still usable


def test_set_policy_is_enforced_and_read_back(conn):
    table = conn.create_table(10**6, DIM, init=init_rule("constant", 0.5))
    conn.call("SET_POLICY", u64(table) + wire.policy(max_rows=10, evict="lru"))
    info = conn.info(table)
    assert info["policy"]["max_rows"] == 10 and info["policy"]["max_bytes"] is None
    assert info["policy"]["evict"] == wire.EVICT["lru"]
    for first in range(0, 25, 5):
        conn.gather(table, np.arange(first, first + 5))
    stats = conn.info(table)["stats"]
    assert (stats["rows"], stats["evicted"], stats["admitted"]) == (10, 15, 25)
    assert conn.exists(table, np.arange(25)).tolist() == [0] * 15 + [1] * 10
    (entry,) = [t for t in conn.stats()["table_counters"] if t["table_id"] == table]
    assert (entry["rows"], entry["evicted"], entry["admitted"], entry["pending"]) == (10, 15, 25, 0)
    assert entry["policy"]["max_rows"] == 10


def test_bad_policies_get_an_error_and_change_nothing(server, conn):
    table = conn.create_table(10**6, DIM)
    conn.call("SET_POLICY", u64(table) + wire.policy(max_rows=50, evict="lfu"))
    conn.gather(table, np.arange(30))
    before = (conn.info(table), checksum(conn, tables=[table]))
    invalid = [
        (wire.policy(max_rows=0, evict="lru"), "max_rows must be a positive number"),
        (wire.policy(max_rows=-5, evict="lru"), "got -5"),
        (wire.policy(max_bytes=-(2**63), evict="lru"), "max_bytes must be a positive number"),
        (wire.policy(max_rows=5, evict=9), "unknown evict policy"),
        (wire.policy(max_rows=5, evict=255), "unknown evict policy"),
        (wire.policy(ttl_steps=5), "a ttl needs evict='ttl'"),
        (wire.policy(ttl_seconds=1.5), "a ttl needs evict='ttl'"),
        (wire.policy(evict="ttl"), "needs a ttl"),
        (wire.policy(evict="ttl", ttl_steps=3, ttl_seconds=2.0), "not both"),
        (wire.policy(evict="ttl", ttl_seconds=math.nan), "finite"),
        (wire.policy(evict="ttl", ttl_seconds=-1.0), "finite"),
        (wire.policy(evict="lru"), "needs a budget"),
        (wire.policy(max_rows=5, evict="lfu", half_life=0.0), "half_life"),
        (wire.policy(max_rows=5, evict="lfu", half_life=math.inf), "half_life"),
        (wire.policy(admit_after=0), "admit_after"),
        (wire.policy(admit_after=70000), "admit_after"),
        (wire.policy(admit_after=2, sketch_width=1000), "sketch_width"),
        (wire.policy(admit_after=2, sketch_width=1 << 30), "sketch_width"),
    ]
    for payload, text in invalid:
        expect_error(conn, "InvalidArgument", "SET_POLICY", u64(table) + payload, text)
    expect_error(conn, "NotFound", "SET_POLICY", u64(987654) + wire.policy(max_rows=5, evict="lru"), "no table")
    # Malformed: unknown flag bits, a budget flagged absent but sent, a short payload. The connection ends.
    for payload, text in ((u8(16) + wire.policy()[1:], "unknown budget flags"),
                          (u8(0) + i64(7) + wire.policy()[9:], "flagged absent"),
                          (wire.policy(max_rows=5, evict="lru")[:-3], "needs 4 bytes")):
        with server.connect() as c:
            expect_error(c, "Protocol", "SET_POLICY", u64(table) + payload, text)
            assert c.is_closed()
    assert (conn.info(table), checksum(conn, tables=[table])) == before
    assert server.alive()


def test_policy_state_round_trip_and_damaged_states(server, conn):
    table = conn.create_table(10**6, DIM)
    assert wire.Reader(conn.call("GET_POLICY_STATE", u64(table))).array(np.uint8).size == 0  # no policy
    conn.call("SET_POLICY", u64(table) + wire.policy(max_rows=8, evict="lru", admit_after=2, sketch_width=64))
    for first in (0, 6):
        for _ in range(2):  # the second lookup admits
            conn.gather(table, np.arange(first, first + 6))
    state = wire.Reader(conn.call("GET_POLICY_STATE", u64(table))).array(np.uint8)
    assert state.size > 0
    conn.call("SET_POLICY", u64(table) + wire.policy())  # removes the policy
    assert conn.info(table)["policy"]["evict"] == 0
    conn.call("RESTORE_POLICY", u64(table) + array(state, np.uint8))
    info = conn.info(table)
    assert info["policy"]["max_rows"] == 8 and info["stats"]["evicted"] == 4 and info["stats"]["admitted"] == 12
    before = (conn.info(table), checksum(conn, tables=[table]))
    damaged = [
        (b"", "Corrupt"),
        (state[:10].tobytes(), "Corrupt"),
        (state.tobytes() + b"\x00", "Corrupt"),
        (b"\xff" * 200, "Corrupt"),
    ]
    # A touch count far past the bytes present: refused before anything is allocated.
    huge = bytearray(state.tobytes())
    touches_at = len(huge) - 8 * 40 - 8  # 8 rows of metadata (40 bytes each) after the count
    huge[touches_at:touches_at + 8] = (2**62).to_bytes(8, "little")
    damaged.append((bytes(huge), "Corrupt"))
    for payload, name in damaged:
        expect_error(conn, name, "RESTORE_POLICY", u64(table) + array(np.frombuffer(payload, np.uint8), np.uint8),
                     "policy")
    assert (conn.info(table), checksum(conn, tables=[table])) == before
    assert server.alive()


def test_every_row_request_carries_the_dtype_and_a_mismatch_is_refused(server, conn):
    payload = config(1000, DIM, 0, init_rule("constant", 1.0), dtype="float16") + u8(0) + u64(0) + u64(3)
    half = wire.Reader(conn.call("CREATE_TABLE", payload)).u64()
    single = conn.create_table(1000, DIM)
    rows = np.ones((2, DIM), np.float32)
    before = checksum(conn, tables=[half, single])
    for table, held, sent in ((half, "float16", "float32"), (single, "float32", "float16"),
                              (single, "float32", "bfloat16"), (single, "float32", "float64")):
        ref = table_ref(table, sent)
        requests = [
            ("GATHER", ref + array([1, 2], np.uint64)),
            ("PEEK", ref + array([1, 2], np.uint64)),
            ("EXISTS", ref + array([1], np.uint64)),
            ("ERASE", ref + array([1], np.uint64)),
            ("GATHER_STATE", ref + array([1], np.uint64)),
            ("WRITE", ref + array([1, 2], np.uint64) + array(rows, np.float32)),
            ("UPDATE", ref + array([1, 2], np.uint64) + array(rows, np.float32)),
            ("WRITE_BYTES", ref + u64(0) + array(np.zeros(4), np.uint8)),
            ("GATHER_POOLED_PARTIAL", ref + array([1, 2], np.uint64) + array([0], np.uint64) + u8(0) + u8(0)
             + i64(-1) + array([], np.uint8)),
        ]
        for opcode, request in requests:
            expect_error(conn, "InvalidArgument", opcode, request,
                         f"{opcode} of table {table} as {sent} refused: this shard holds the table's rows as {held}")
    # An element type that is no type at all is a malformed request.
    with server.connect() as c:
        expect_error(c, "Protocol", "GATHER", table_ref(single, 9) + array([1], np.uint64), "element type 9")
        assert c.is_closed()
    assert checksum(conn, tables=[half, single]) == before
    # The right dtype works.
    assert conn.gather(single, [1]).tolist() == [0.0] * DIM
    words = wire.Reader(conn.call("GATHER", table_ref(half, "float16") + array([1], np.uint64))).array(np.float32)
    assert words.view(np.float16).tolist() == [1.0] * (2 * DIM)
    assert server.alive()


def test_stats_lists_every_table_with_its_counters(server, conn):
    table = conn.create_table(10**6, DIM)
    conn.call("SET_POLICY", u64(table) + wire.policy(max_rows=3, evict="ttl", ttl_steps=100, admit_after=2,
                                                     sketch_width=16))
    conn.gather(table, np.arange(5))
    (entry,) = [t for t in conn.stats()["table_counters"] if t["table_id"] == table]
    assert entry["name"] == "" and (entry["rows"], entry["pending"]) == (0, 5)
    assert entry["policy"]["ttl_steps"] == 100 and entry["policy"]["evict"] == wire.EVICT["ttl"]
    assert entry["policy"]["ttl_seconds"] == 0.0 and entry["policy"]["admit_after"] == 2
