"""Hostile bytes: truncated frames, lengths past the caps, unknown opcodes, bad headers, a wrong
version, malformed payloads for every opcode, and random garbage from a fixed seed. The server answers
or closes that one connection, stays up, keeps serving the others, and every table's data is
unchanged (a checksum of every table's description and rows before and after)."""

import random
import socket
import struct

import numpy as np
import pytest

import wire
from server_process import checksum
from wire import OP, ServerError, array, frame, hello, init_rule, optimizer, u32, u64, table_ref

DIM = 8


@pytest.fixture(scope="module")
def populated(server):
    """A long-lived connection owning an anonymous table, plus a named table with optimizer state."""
    keeper = server.connect()
    named = keeper.open_named("hostile.named", 10**6, DIM, init_rule("normal", 0.0, 0.1, seed=1))["table_id"]
    keeper.call("SET_OPTIMIZER", u64(named) + optimizer("adagrad", lr=0.1))
    ids = np.arange(0, 5000, 7, dtype=np.uint64)
    keeper.update(named, ids, np.random.default_rng(1).standard_normal((ids.size, DIM)).astype(np.float32))
    anonymous = keeper.create_table(1000, DIM, init=init_rule("uniform", -1.0, 1.0, seed=2))
    keeper.write(anonymous, np.arange(100), np.random.default_rng(2).standard_normal((100, DIM)))
    yield keeper, named, anonymous, checksum(keeper)
    keeper.close()


def still_healthy(server, populated):
    keeper, _, _, digest = populated
    assert server.alive()
    assert keeper.call("PING") == b""
    with server.connect() as fresh:
        assert fresh.call("PING") == b""
    assert checksum(keeper) == digest


def answered_or_closed(conn):
    """Reads until the server closes the connection (which it must, within the timeout). Noise can
    form a valid request (PING, LIST, a PEEK of other rows), so answers need not be errors; an error
    answer must carry a known code."""
    conn.sock.settimeout(40)
    try:
        while True:
            _, flags, _, payload = conn.read_frame()
            if flags == wire.FLAG_ERROR:
                assert payload[0] in wire.ERROR_NAMES
    except socket.timeout:
        pytest.fail("the server neither answered nor closed the connection")
    except (ConnectionError, OSError):
        return


def test_truncated_frames(server, populated):
    whole = frame("HELLO", hello())
    for cut in (1, 7, 15, 16, len(whole) - 1):
        with server.connect(handshake=False) as c:
            c.send_raw(whole[:cut])
            c.sock.shutdown(socket.SHUT_WR)
            assert c.is_closed()
    with server.connect() as c:  # truncated after the handshake
        c.send_raw(frame("GATHER", table_ref(1) + array([1, 2], np.uint64))[:-5])
        c.sock.shutdown(socket.SHUT_WR)
        assert c.is_closed()
    still_healthy(server, populated)


def test_lengths_past_the_cap(server, populated):
    for length in (wire.MAX_PAYLOAD + 1, 2**31, 2**32 - 1):
        for handshake in (False, True):
            with server.connect(handshake=handshake) as c:
                c.send_raw(frame("PING", b"", request_id=9, length=length))
                code, message, _, request_id = c.read_error()
                assert wire.ERROR_NAMES[code] == "Protocol" and "past the limit" in message and request_id == 9
                assert c.is_closed()
    still_healthy(server, populated)


def test_counts_past_the_payload(server, populated):
    keeper, named, _, _ = populated
    with server.connect() as c:
        # An id array announcing 2^32-1 elements in a small frame: refused before any allocation.
        with pytest.raises(ServerError) as info:
            c.call("GATHER", table_ref(named) + u32(2**32 - 1) + b"\x00" * 64)
        assert info.value.name == "Protocol" and "needs" in info.value.message
        assert c.is_closed()
    with server.connect() as c:
        with pytest.raises(ServerError) as info:
            c.call("OPEN_NAMED", u32(10**6) + b"name")
        assert info.value.name == "Protocol"
    still_healthy(server, populated)


@pytest.mark.parametrize("opcode", [0, 4, 9, 45, 99, 200, 255])
def test_unknown_opcodes(server, populated, opcode):
    for handshake in (False, True):
        with server.connect(handshake=handshake) as c:
            c.send_raw(frame(opcode, b"abc", request_id=5))
            code, message, op, request_id = c.read_error()
            assert wire.ERROR_NAMES[code] == "Protocol" and f"unknown opcode {opcode}" in message
            assert op == OP["PING"] and request_id == 5
            assert c.is_closed()
    still_healthy(server, populated)


def test_bad_flags_and_reserved(server, populated):
    for kwargs, text in (({"flags": 2}, "flags"), ({"reserved": 1}, "reserved")):
        with server.connect() as c:
            c.send_raw(frame("PING", b"", request_id=3, **kwargs))
            code, message, _, _ = c.read_error()
            assert wire.ERROR_NAMES[code] == "Protocol" and text in message
            assert c.is_closed()
    still_healthy(server, populated)


def test_malformed_payloads_for_every_opcode(server, populated):
    """Each opcode with payloads cut short or padded: a Protocol error, the connection closed."""
    keeper, named, anonymous, _ = populated
    valid = {
        "GATHER": table_ref(named) + array([1, 2], np.uint64),
        "WRITE": table_ref(named) + array([1], np.uint64) + array(np.zeros(DIM), np.float32),
        "UPDATE": table_ref(named) + array([1], np.uint64) + array(np.zeros(DIM), np.float32),
        "SET_OPTIMIZER": u64(named) + optimizer("sgd", lr=1.0),
        "SET_INIT": u64(named) + init_rule("zero"),
        "SET_STEP": u64(named) + u64(0),
        "ERASE": table_ref(named) + array([7], np.uint64),
        "FREE_TABLE": u64(named),
        "WRITE_BYTES": table_ref(named) + u64(0) + array(np.zeros(4), np.uint8),
    }
    for name, payload in valid.items():
        for broken in (payload[:-1], payload[:3], payload + b"\x01"):
            with server.connect() as c:
                with pytest.raises(ServerError) as info:
                    c.call(name, broken)
                assert info.value.name == "Protocol", (name, info.value)
                assert c.is_closed()
    for name in OP:
        if name == "HELLO":
            continue
        with server.connect() as c:
            try:
                c.call(name, b"\xff" * 3)
            except ServerError as e:
                assert e.name == "Protocol", (name, e)
    # Bad enum values inside otherwise well-formed messages.
    with server.connect() as c:
        with pytest.raises(ServerError) as info:
            c.call("SET_OPTIMIZER", u64(named) + u32(99) + b"\x00" * 56)
        assert info.value.name == "Protocol" and "optimizer kind 99" in info.value.message
    still_healthy(server, populated)


def test_wrong_version_mid_stream_and_hello_garbage(server, populated):
    rng = random.Random(1234)
    for _ in range(20):
        with server.connect(handshake=False) as c:
            c.send_raw(frame("HELLO", wire.MAGIC + struct.pack("<H", rng.choice([0, wire.VERSION - 1, rng.randrange(wire.VERSION + 1, 65536)]))
                             + bytes(rng.randrange(256) for _ in range(rng.randrange(40)))))
            code, message, _, _ = c.read_error()
            assert wire.ERROR_NAMES[code] == "Protocol"
            assert c.is_closed()
    still_healthy(server, populated)


def test_random_garbage(server, populated):
    rng = random.Random(20261122)
    for round_ in range(150):
        handshake = round_ % 2 == 1
        with server.connect(handshake=handshake) as c:
            kind = round_ % 3
            if kind == 0:  # pure noise
                data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 600)))
            elif kind == 1:  # a plausible header with a random opcode and a noisy payload
                payload = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 200)))
                opcode = rng.choice(list(OP.values()))
                data = frame(opcode, payload, request_id=rng.randrange(2**64))
            else:  # a valid (read-only) frame with random bits flipped
                data = bytearray(frame("PEEK", table_ref(populated[1]) + array([1, 2, 3], np.uint64)))
                for _ in range(rng.randrange(1, 6)):
                    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
                data = bytes(data)
            try:
                c.send_raw(data)
                c.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            answered_or_closed(c)
    still_healthy(server, populated)


def test_hostile_values_in_valid_frames(server, populated):
    """Well-formed requests with bad values: errors, nothing changes, the connection stays usable."""
    keeper, named, anonymous, _ = populated
    attempts = [
        ("WRITE", table_ref(named) + array([1, 10**6], np.uint64) + array(np.zeros(2 * DIM), np.float32), "OutOfRange"),
        ("UPDATE", table_ref(named) + array([1], np.uint64) + array(np.full(DIM, np.inf), np.float32), "InvalidArgument"),
        ("UPDATE", table_ref(named) + array([1, 1], np.uint64) + array(np.full(2 * DIM, 3e38), np.float32), "InvalidArgument"),
        ("WRITE_BYTES", table_ref(named) + u64(2**63) + array(np.zeros(8), np.uint8), "OutOfRange"),
        ("GATHER", table_ref(anonymous + 1000) + array([1], np.uint64), "NotFound"),
        ("SET_INIT", u64(named) + init_rule("normal", 0.0, float("nan")), "InvalidArgument"),
        ("SET_STEP", u64(2**63) + u64(1), "NotFound"),
        ("GATHER_POOLED_PARTIAL", table_ref(named) + array([1], np.uint64) + array([0], np.uint64) + wire.u8(0) + wire.u8(0)
         + wire.i64(10**7) + array([], np.uint8), "InvalidArgument"),
        ("COMMIT_LOAD", array([1, 2, 3], np.uint64), "NotFound"),
    ]
    for opcode, payload, expected in attempts:
        with pytest.raises(ServerError) as info:
            keeper.call(opcode, payload)
        assert info.value.name == expected, (opcode, info.value)
    # The UPDATE with 3e38 + 3e38 overflowing in the sum was refused whole: the step did not move.
    still_healthy(server, populated)


def test_requests_carrying_the_error_flag_are_refused(server, populated):
    for handshake, opcode, payload in ((False, "HELLO", hello()), (True, "PING", b""), (True, "LIST", b"")):
        with server.connect(handshake=handshake) as c:
            c.send_raw(frame(opcode, payload, request_id=11, flags=wire.FLAG_ERROR))
            code, message, _, request_id = c.read_error()
            assert wire.ERROR_NAMES[code] == "Protocol" and "error flag" in message and request_id == 11
            assert c.is_closed()
    still_healthy(server, populated)


def test_ids_without_bag_offsets_are_refused(server, populated):
    keeper, named, _, _ = populated
    with pytest.raises(ServerError) as info:
        keeper.call("GATHER_POOLED_PARTIAL", table_ref(named) + array([1, 2], np.uint64) + array([], np.uint64)
                    + wire.u8(0) + wire.u8(0) + wire.i64(-1) + array([], np.uint8))
    assert info.value.name == "InvalidArgument" and "2 ids but no bag offsets" in info.value.message
    still_healthy(server, populated)


@pytest.mark.parametrize("opcode", ["CREATE_TABLE", "OPEN_NAMED"])
def test_tables_of_no_rows_or_past_2_to_the_64_bytes_are_refused(server, populated, opcode):
    keeper = populated[0]
    for rows, text in ((0, "at least 1 row; num_rows is 0"),
                       (2**63 - 1, f"a table of {2**63 - 1} rows of dim 8 is {(2**63 - 1) * 32} bytes")):
        payload = wire.config(rows, 8) + wire.u8(0) + u64(0) + u64(7)
        if opcode == "OPEN_NAMED":
            payload = wire.string("hostile.shape") + wire.config(rows, 8) + wire.declaration()
        with pytest.raises(ServerError) as info:
            keeper.call(opcode, payload)
        assert info.value.name == "InvalidArgument" and text in info.value.message, info.value.message
    still_healthy(server, populated)
