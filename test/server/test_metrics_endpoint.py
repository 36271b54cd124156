"""recdev-server --metrics-listen: the Prometheus endpoint of a real shard. A known workload's
requests, rows and bytes per opcode read the same in a scrape (parsed by prometheus_client), in
STATS (server_stats) and in --stats; table labels escaped; HTTP errors; hostile clients of the
metrics port (garbage, huge heads, slow senders, abrupt closes, 200 connections at once) leave the
shard answering lookups and scrapes with its tables unchanged; bad flag values refused clearly."""

import re
import socket
import struct
import subprocess
import threading

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

import torch_recdev
import wire
from server_process import checksum
from torch_recdev import server as server_module

DIM = 4
METRICS = "--metrics-listen", "127.0.0.1:0"


def metrics_port(server):
    """The port the server logged for its metrics endpoint (it picks one for port 0)."""
    match = re.search(r"recdev-server: metrics on http://127\.0\.0\.1:(\d+)/metrics", server.log())
    assert match, server.log()
    return int(match.group(1))


def http(port, request, timeout=60.0):
    """Sends raw bytes to the metrics port and returns (status, headers, body) of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        return read_response(s)


def read_response(s):
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = dict(line.split(": ", 1) for line in lines[1:])
    assert not body or int(headers["Content-Length"]) == len(body)
    return status, headers, body


def scrape(port):
    status, headers, body = http(port, b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert status == 200 and headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    return body.decode()


def samples(text):
    """{(sample name, frozenset(labels)): value} of a scrape, parsed by prometheus_client."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in out, f"{key} twice"
            out[key] = sample.value
    return out


def by_opcode(values, name):
    return {dict(labels)["opcode"]: value for (sample, labels), value in values.items() if sample == name}


class Counted:
    """A wire connection that adds up the bytes of each opcode's request and response frames."""

    def __init__(self, conn):
        self.conn, self.sent, self.received = conn, {}, {}

    def call(self, opcode, payload=b""):
        self.sent[opcode] = self.sent.get(opcode, 0) + wire.HEADER.size + len(payload)
        try:
            body = self.conn.call(opcode, payload)
        except wire.ServerError as error:
            message = error.message.encode()
            self.received[opcode] = self.received.get(opcode, 0) + wire.HEADER.size + 1 + 4 + len(message)
            raise
        self.received[opcode] = self.received.get(opcode, 0) + wire.HEADER.size + len(body)
        return body


def test_a_scrape_reads_what_stats_and_the_stats_command_read(start_server):
    server = start_server(*METRICS)
    port = metrics_port(server)
    with server.connect() as raw:
        conn = Counted(raw)
        table = wire.Reader(conn.call("OPEN_NAMED", wire.string("clicks") + wire.config(10**6, DIM)
                                      + wire.declaration())).u64()
        for k in range(5):  # 5 GATHERs of 7 rows, 3 WRITEs of 2, one refused GATHER
            conn.call("GATHER", wire.table_ref(table) + wire.array(np.arange(7) + 10 * k, np.uint64))
        for k in range(3):
            conn.call("WRITE", wire.table_ref(table) + wire.array([k, k + 100], np.uint64)
                      + wire.array(np.ones((2, DIM)), np.float32))
        with pytest.raises(wire.ServerError):
            conn.call("GATHER", wire.table_ref(table) + wire.array([10**7], np.uint64))
        values = samples(scrape(port))
        stats = torch_recdev.server_stats(server.address)  # a HELLO and a STATS more, not in the scrape

    requests = by_opcode(values, "recdev_requests_total")
    assert requests == {"HELLO": 1, "OPEN_NAMED": 1, "GATHER": 6, "WRITE": 3}
    assert by_opcode(values, "recdev_request_errors_total") == {"HELLO": 0, "OPEN_NAMED": 0, "GATHER": 1, "WRITE": 0}
    rows = by_opcode(values, "recdev_request_rows_total")
    assert rows["GATHER"] == 5 * 7 + 1 and rows["WRITE"] == 3 * 2 and rows["OPEN_NAMED"] == 0
    received = by_opcode(values, "recdev_request_received_bytes_total")
    sent = by_opcode(values, "recdev_request_sent_bytes_total")
    for opcode in ("OPEN_NAMED", "GATHER", "WRITE"):
        assert received[opcode] == conn.sent[opcode] and sent[opcode] == conn.received[opcode], opcode
    # Histograms: cumulative buckets ending in +Inf, each count that opcode's requests.
    for opcode, count in requests.items():
        labels = {("opcode", opcode)}
        buckets = sorted(((float(dict(key)["le"]), value) for (name, key), value in values.items()
                          if name == "recdev_request_duration_seconds_bucket" and labels < key))
        assert len(buckets) == wire.LATENCY_BUCKETS and buckets[-1] == (float("inf"), count)
        assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:]))
        assert values[("recdev_request_duration_seconds_count", frozenset(labels))] == count
        assert values[("recdev_request_duration_seconds_sum", frozenset(labels))] > 0
    # STATS (through the client, after its HELLO) answered after the scrape: the same figures.
    assert stats["requests"] == sum(requests.values()) + 1 and stats["errors"] == 1
    assert stats["opcodes"]["HELLO"]["requests"] == 2 and "STATS" not in stats["opcodes"]
    for opcode, count in requests.items():
        if opcode == "HELLO":
            continue
        entry = stats["opcodes"][opcode]
        assert entry["requests"] == count == sum(entry["latency_buckets"])
        assert entry["rows"] == rows[opcode] and entry["bytes_received"] == received[opcode]
        assert entry["bytes_sent"] == sent[opcode]
    assert stats["latency_bucket_bounds_us"] == [1 << k for k in range(wire.LATENCY_BUCKETS - 1)]
    gauges = {name: values[(name, frozenset())] for name in
              ("recdev_tables", "recdev_named_tables", "recdev_rows", "recdev_connections", "recdev_sessions",
               "recdev_staged_steps", "recdev_staged_bytes", "recdev_max_memory_bytes")}
    assert gauges == {"recdev_tables": 1, "recdev_named_tables": 1, "recdev_rows": stats["rows"],
                      "recdev_connections": 1, "recdev_sessions": 1, "recdev_staged_steps": 0,
                      "recdev_staged_bytes": 0, "recdev_max_memory_bytes": 0}
    assert stats["rows"] == 5 * 7 + 3  # the gathered rows, and the written ones not gathered before
    assert values[("recdev_table_rows", frozenset({("table", "clicks")}))] == stats["rows"]
    info = frozenset({("shard", "0"), ("num_shards", "1"), ("protocol", str(wire.VERSION))})
    assert values[("recdev_server_info", info)] == 1

    result = subprocess.run([server_module.executable(), "--stats", server.address], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert re.search(r"^opcode       GATHER: requests 6, errors 1, rows 36, received "
                     rf"{received['GATHER']} bytes, sent {sent['GATHER']} bytes, latency mean [0-9.]+ us, "
                     r"p50 <= \d+ us, p99 <= \d+ us$", result.stdout, re.MULTILINE), result.stdout
    assert "staged steps 0 (0 bytes)" in result.stdout


def test_table_labels_are_escaped_and_made_utf8(start_server):
    server = start_server(*METRICS)
    names = {b'back\\slash': 1, b'quote"d': 2, b'new\nline': 3, b'caf\xc3\xa9': 4, b'bad\xe2\x82(': 5,
             b'\xff': 6, b'\xfe': 7}
    with server.connect() as conn:
        for name, rows in names.items():
            table = wire.Reader(conn.call("OPEN_NAMED", wire.string(name) + wire.config(1000, DIM)
                                          + wire.declaration())).u64()
            conn.gather(table, np.arange(rows))
        anonymous = [conn.create_table(1000, DIM) for _ in range(2)]
        for table in anonymous:
            conn.gather(table, np.arange(10))
        text = scrape(metrics_port(server))
    rows = {dict(labels)["table"]: value for (name, labels), value in samples(text).items()
            if name == "recdev_table_rows"}
    # \xff and \xfe both read as U+FFFD: one series, their rows added up; the anonymous tables under "".
    assert rows == {"back\\slash": 1, 'quote"d': 2, "new\nline": 3, "café": 4, "bad\ufffd(": 5, "\ufffd": 13,
                    "": 20}
    assert 'table="back\\\\slash"' in text and 'table="quote\\"d"' in text and 'table="new\\nline"' in text
    text.encode("utf-8")  # the whole exposition is UTF-8


def test_http_answers(start_server):
    server = start_server(*METRICS)
    port = metrics_port(server)
    assert http(port, b"GET /metrics HTTP/1.0\r\n\r\n")[0] == 200
    assert http(port, b"GET /metrics?name[]=x HTTP/1.1\nHost: a\n\n")[0] == 200  # bare LFs, a query
    status, headers, body = http(port, b"HEAD /metrics HTTP/1.1\r\n\r\n")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) > 0
    assert http(port, b"GET / HTTP/1.1\r\n\r\n")[0] == 404
    assert http(port, b"GET /metricsx HTTP/1.1\r\n\r\n")[0] == 404
    status, headers, _ = http(port, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    assert status == 405 and headers["Allow"] == "GET, HEAD"
    assert http(port, b"GET /metrics HTTP/2.0\r\n\r\n")[0] == 505
    assert http(port, b"hello there\r\n\r\n")[0] == 400
    assert http(port, b"GET  /metrics HTTP/1.1\r\n\r\n")[0] == 400
    assert http(port, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 10_000 + b"\r\n\r\n")[0] == 431
    assert http(port, wire.frame("HELLO", wire.hello()) + b"\r\n\r\n")[0] == 400  # the protocol is not spoken here


def test_hostile_clients_of_the_metrics_port_never_harm_the_shard(start_server):
    server = start_server(*METRICS)
    port = metrics_port(server)
    with server.connect() as conn:
        table = conn.open_named("kept", 10**6, DIM)["table_id"]
        conn.write(table, np.arange(50), np.random.default_rng(0).standard_normal((50, DIM)))
        before = checksum(conn)

        def lookups_and_scrapes_work():
            assert conn.gather(table, np.arange(50)).size == 50 * DIM
            assert 'recdev_table_rows{table="kept"} 50' in scrape(port)

        # A slow sender holds its connection, and nothing else, until the read deadline answers 408.
        slow = socket.create_connection(("127.0.0.1", port), timeout=60)
        slow.sendall(b"GET /metr")
        # Half-closed after a whole request: answered; after part of one: closed without an answer.
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
            s.shutdown(socket.SHUT_WR)
            assert read_response(s)[0] == 200
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            s.sendall(b"GET /met")
            s.shutdown(socket.SHUT_WR)
            assert s.recv(100) == b""
        lookups_and_scrapes_work()
        # Binary garbage, seeded; a head far past the cap; abrupt closes (RST) mid-request.
        rng = np.random.default_rng(37)
        for size in (1, 100, 5000, 8192, 100_000):
            with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
                try:
                    s.sendall(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
                    s.shutdown(socket.SHUT_WR)
                    s.recv(65536)
                except (ConnectionResetError, BrokenPipeError):
                    pass
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            try:
                s.sendall(b"GET /metrics HTTP/1.1\r\n" + b"X-Long: " + b"b" * (1 << 20))
                assert read_response(s)[0] == 431
            except (ConnectionResetError, BrokenPipeError):
                pass
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", port), timeout=60)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost")
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
        lookups_and_scrapes_work()
        # 200 connections at once, each scraping: some may be pushed out, none hangs, the shard serves.
        outcomes = []

        def scraper():
            try:
                outcomes.append(http(port, b"GET /metrics HTTP/1.1\r\n\r\n")[0])
            except (ConnectionResetError, BrokenPipeError, IndexError):
                outcomes.append("dropped")

        threads = [threading.Thread(target=scraper) for _ in range(200)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(outcomes) == 200 and 200 in outcomes and set(outcomes) <= {200, "dropped"}
        # 200 silent connections: a new scrape pushes the oldest out.
        silent = [socket.create_connection(("127.0.0.1", port), timeout=60) for _ in range(200)]
        lookups_and_scrapes_work()
        for s in silent:
            s.close()
        status = read_response(slow)[0] if slow.recv(1, socket.MSG_PEEK) else None
        assert status in (408, None)  # answered at its deadline, or pushed out by the newer connections
        slow.close()
        lookups_and_scrapes_work()
        assert checksum(conn) == before
    assert server.alive()
    assert server.stop() == 0


def test_the_metrics_need_no_token_and_show_no_rows(start_server, tmp_path):
    token = tmp_path / "token"
    token.write_text("secret\n")
    server = start_server(*METRICS, "--token-file", str(token))
    with server.connect(token="secret") as conn:
        table = conn.open_named("private", 100, DIM)["table_id"]
        conn.write(table, [7], np.full((1, DIM), 1234.5))
        text = scrape(metrics_port(server))
    assert 'recdev_table_rows{table="private"} 1' in text and "1234.5" not in text and "secret" not in text


def test_a_serving_shard_shows_its_version(start_server, tmp_path):
    server = start_server(*METRICS, "--serve", str(tmp_path))
    values = samples(scrape(metrics_port(server)))
    assert values[("recdev_serving_version", frozenset({("dir", str(tmp_path))}))] == 0


@pytest.mark.parametrize("value, code, message", [
    ("nowhere", 2, "--metrics-listen: address 'nowhere' has no host or no port"),
    ("127.0.0.1:99999", 2, "--metrics-listen: address '127.0.0.1:99999' has a port past 65535"),
    ("192.0.2.1:9464", 1, "--metrics-listen 192.0.2.1:9464: cannot listen on 192.0.2.1:9464"),
])
def test_bad_metrics_addresses_are_refused_before_serving(value, code, message):
    result = subprocess.run([server_module.executable(), "--listen", "127.0.0.1:0", "--metrics-listen", value],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == code and message in result.stderr, result.stderr
    assert "listening on" not in result.stdout


def test_a_metrics_port_in_use_is_refused_before_serving():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        result = subprocess.run([server_module.executable(), "--listen", "127.0.0.1:0", "--metrics-listen", address],
                                capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "listening on" not in result.stdout
    assert f"--metrics-listen {address}: cannot listen on {address}" in result.stderr
    assert "in use" in result.stderr and "a free port" in result.stderr, result.stderr
    result = subprocess.run([server_module.executable(), "--stats", "127.0.0.1:1", "--metrics-listen", address],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "does not go with --stats" in result.stderr
