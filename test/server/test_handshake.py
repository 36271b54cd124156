"""The handshake: magic, version, token, sessions; and the connection cap."""

import time

import numpy as np
import pytest

import wire
from wire import ServerError, frame, hello

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def token_server(tmp_path_factory):
    from server_process import ServerProcess

    path = tmp_path_factory.mktemp("token") / "token"
    path.write_text(TOKEN + "\n")
    process = ServerProcess("--listen", "127.0.0.1:0", "--token-file", str(path), "--max-connections", "3")
    yield process
    process.kill()


def raw(server):
    return server.connect(handshake=False)


def refused(server, payload, opcode="HELLO"):
    """Sends one frame on a new connection; returns the error, after checking the server closed it."""
    with raw(server) as c:
        c.send_raw(frame(opcode, payload, request_id=42))
        code, message, op, request_id = c.read_error()
        assert request_id == 42
        assert c.is_closed()
        return wire.ERROR_NAMES[code], message


def test_right_token(token_server):
    with token_server.connect(token=TOKEN) as c:
        assert c.call("PING") == b""


@pytest.mark.parametrize("token", ["", "wrong", TOKEN + "x", TOKEN[:-1]])
def test_wrong_or_missing_token(token_server, token):
    name, message = refused(token_server, hello(token))
    assert name == "PermissionDenied"
    assert ("requires a token" in message) == (token == "")


def test_server_without_token_ignores_it(server):
    with server.connect(token="anything") as c:
        assert c.call("PING") == b""


def test_wrong_version(server):
    newer = wire.VERSION + 1
    name, message = refused(server, wire.MAGIC + wire.u16(newer) + b"whatever follows in a newer version")
    assert name == "Protocol" and f"version {newer} is not supported" in message
    assert f"speaks version {wire.VERSION}" in message


def test_wrong_magic(server):
    name, message = refused(server, hello(magic=b"REDIS000"))
    assert name == "Protocol" and "magic" in message


def test_first_frame_must_be_hello(server):
    name, message = refused(server, b"", opcode="PING")
    assert name == "Protocol" and "first frame must be HELLO" in message


def test_second_hello_refused(server):
    with server.connect() as c:
        with pytest.raises(ServerError) as info:
            c.call("HELLO", hello())
        assert info.value.name == "Protocol"
        assert c.is_closed()


def test_truncated_hello(server):
    name, _ = refused(server, hello()[:-3])
    assert name == "Protocol"


def test_session_shared_by_connections_and_resumed(server):
    with server.connect() as first:
        session = first.welcome["session_id"]
        table = first.create_table(10, 4)
        first.write(table, [1], np.ones((1, 4)))
        with server.connect(session_id=session) as second:
            assert second.welcome["session_id"] == session
            np.testing.assert_array_equal(second.gather(table, [1]), np.ones(4, np.float32))
    # Resumed after the connections closed, within the lease.
    with server.connect(session_id=session) as again:
        assert again.exists(table, [1]).tolist() == [1]


def test_unknown_session_refused(server):
    name, message = refused(server, hello(session_id=0x1234567))
    assert name == "NotFound" and "session 19088743" in message


def test_connection_cap(token_server):
    conns = [token_server.connect(token=TOKEN) for _ in range(3)]
    try:
        with raw(token_server) as extra:
            code, message, _, _ = extra.read_error()
            assert wire.ERROR_NAMES[code] == "Unavailable" and "too many connections" in message
            assert extra.is_closed()
        for c in conns:
            assert c.call("PING") == b""
    finally:
        for c in conns:
            c.close()
    # Freed slots are reusable (the server notices the closes within its poll interval).
    for _ in range(50):
        try:
            with token_server.connect(token=TOKEN) as c:
                assert c.call("PING") == b""
                break
        except (AssertionError, ServerError, ConnectionError):
            time.sleep(0.1)
    else:
        pytest.fail("connections were not freed")


def test_binding_constants_match_the_documented_ones():
    from torch_recdev import _testing

    assert _testing._server.PROTOCOL_VERSION == wire.VERSION
    assert _testing._server.MAX_PAYLOAD_BYTES == wire.MAX_PAYLOAD
