"""Connections that hold resources without authenticating or without working: floods of sockets that
never say HELLO, huge frames announced before HELLO, idle connections and the buffers they keep. The
server bounds each, and a client with the token still gets in."""

import select
import socket
import threading
import time

import numpy as np
import pytest

import wire
from wire import frame

TOKEN = "admission-token"


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return str(path)


class Flood:
    """`count` sockets that never send a byte, each reopened as soon as the server drops it."""

    def __init__(self, port, count):
        self.port, self.count = port, count
        self.reopened = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def open(self):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", self.port))
        return s

    def run(self):
        sockets = [self.open() for _ in range(self.count)]
        try:
            while not self.stop.is_set():
                readable, _, _ = select.select(sockets, [], [], 0.01)
                for s in readable:  # dropped: an error frame, then the close
                    s.close()
                    sockets[sockets.index(s)] = self.open()
                    self.reopened += 1
        finally:
            for s in sockets:
                s.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(30)


def test_a_client_with_the_token_gets_in_through_a_flood_of_silent_sockets(start_server, token_file):
    import torch_recdev

    server = start_server("--token-file", token_file, "--max-connections", "32")
    with Flood(server.port, 70) as flood:
        time.sleep(0.5)  # the flood fills every slot it can
        for _ in range(30):
            info = torch_recdev.connect(server.url, token=TOKEN, timeout=10)
            assert info["kind"] == "remote"
            torch_recdev.connect(None)
        assert flood.reopened > 0  # the server did drop silent sockets for the client's
    assert server.alive()


def test_silent_connections_are_closed_after_the_hello_deadline(start_server):
    server = start_server()
    with server.connect(handshake=False) as c:
        start = time.monotonic()
        code, message, _, _ = c.read_error()
        assert wire.ERROR_NAMES[code] == "Protocol" and "no HELLO within" in message
        assert c.is_closed()
        assert time.monotonic() - start < 15


def test_idle_connections_are_closed_after_the_idle_timeout(start_server):
    server = start_server("--idle-timeout", "1")
    with server.connect() as c:
        assert c.call("PING") == b""
        c.sock.settimeout(15)
        code, message, _, _ = c.read_error()
        assert wire.ERROR_NAMES[code] == "Unavailable" and "--idle-timeout" in message
        assert c.is_closed()
    with server.connect() as busy:  # a connection that keeps working is not closed
        for _ in range(8):
            time.sleep(0.25)
            assert busy.call("PING") == b""


def test_a_huge_frame_before_hello_is_refused_and_holds_no_memory(start_server, token_file):
    server = start_server("--token-file", token_file)
    with server.connect(handshake=False) as c:
        c.send_raw(frame("HELLO", b"", request_id=4, length=200 << 20))
        c.sock.settimeout(10)
        code, message, _, request_id = c.read_error()
        assert wire.ERROR_NAMES[code] == "Protocol" and "before HELLO" in message and request_id == 4
        assert c.is_closed()

    before = server.rss_bytes()
    chunk = bytes(1 << 20)

    def stream():
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            try:
                s.sendall(frame("HELLO", b"", length=200 << 20))
                for _ in range(48):
                    s.sendall(chunk)
            except OSError:
                pass  # refused and closed: the rest could not be sent
            grown.append(server.rss_bytes() - before)

    grown = []
    threads = [threading.Thread(target=stream) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(grown) == 4 and max(grown) < (32 << 20), [g >> 20 for g in grown]
    assert server.alive()
    with server.connect(token=TOKEN) as c:
        assert c.call("PING") == b""


def test_request_buffers_are_released_and_counted(start_server):
    server = start_server()
    with server.connect() as c:
        table = c.create_table(100_000, 1024)
        baseline = c.stats()["bytes"]
        rss_before = server.rss_bytes()
        # 96 MiB of rows for a table that does not exist: read whole, refused, nothing stored.
        rows = np.zeros((24576, 1024), np.float32)
        with pytest.raises(wire.ServerError) as info:
            c.write(table + 1000, np.arange(24576), rows)
        assert info.value.name == "NotFound"
        del rows
        time.sleep(0.5)
        assert server.rss_bytes() - rss_before < (32 << 20)
        # A 32 MiB answer's buffer is kept for the next answers, and counted while kept...
        c.gather(table, np.arange(8192), op="PEEK")
        assert c.stats()["bytes"] >= baseline + (32 << 20)
        # ...and released once the connection is idle.
        time.sleep(2.5)
        assert c.stats()["bytes"] < baseline + (1 << 20)
