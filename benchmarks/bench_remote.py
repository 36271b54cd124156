"""The remote store on loopback (issue: remote store): 1 client, 2
recdev-server shards, a 1M × 128 float32 named table with every row written,
65,536 uniform ids, fixed seed.

- Remote gather (F.embedding on the table) vs Redis (Debian's redis-server)
  holding the same rows as one key each, read with pipelined MGET through
  redis-py with hiredis — the approach TorchRec's dynamic-embedding PS takes.
- Remote embedding_bag (sum, bags of 8), pooled on the shards, vs the same
  lookup as an unpooled remote gather pooled on the client: time and bytes on
  the loopback interface (from /proc/net/dev, headers included).
- Payload bandwidth of the remote gather vs a raw loopback TCP stream between
  two processes, measured in the same run, in alternating rounds.
- The native recdev-server: time from exec to `listening on`, and idle RSS."""

from __future__ import annotations

import shutil
import socket
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import torch_recdev
from torch_recdev import server
from harness import Fact, Row, compare
from local_servers import local_recdev_servers, local_redis_server

NUM_ROWS, DIM, NUM_IDS, BAG, SHARDS = 1_000_000, 128, 65_536, 8, 2
ROW_BYTES = DIM * 4
MGET_KEYS = 4096  # keys per MGET in the pipeline


def loopback_bytes() -> int:
    """Bytes received on the loopback interface so far (each byte sent over
    loopback is received once)."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, counters = line.partition(":")
            if name.strip() == "lo":
                return int(counters.split()[0])
    raise RuntimeError("no loopback interface in /proc/net/dev")


def wire_bytes(fn) -> int:
    before = loopback_bytes()
    fn()
    return loopback_bytes() - before


_SENDER = """
import socket, struct, sys
buf = bytearray(4 << 20)
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    header = s.recv(8, socket.MSG_WAITALL)
    n = struct.unpack("<Q", header)[0] if len(header) == 8 else 0
    if n == 0:
        break
    while n > 0:
        k = min(n, len(buf))
        s.sendall(memoryview(buf)[:k])
        n -= k
s.close()
"""


class RawLoopbackStream:
    """Another process streaming bytes over one loopback TCP connection on
    demand: the physical limit a remote gather could approach. receive(n)
    asks for n bytes (an 8-byte request) and reads them into a preallocated
    buffer, so it can be timed like any other workload."""

    def __enter__(self):
        self._listener = socket.create_server(("127.0.0.1", 0))
        port = self._listener.getsockname()[1]
        self._sender = subprocess.Popen([sys.executable, "-c", _SENDER, str(port)])
        self._listener.settimeout(60)
        self._conn, _ = self._listener.accept()
        self._conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._view = memoryview(bytearray(4 << 20))
        return self

    def receive(self, nbytes: int) -> None:
        self._conn.sendall(nbytes.to_bytes(8, "little"))
        received = 0
        while received < nbytes:
            got = self._conn.recv_into(self._view[: min(len(self._view), nbytes - received)])
            if got == 0:
                raise RuntimeError(f"raw loopback stream delivered {received} of {nbytes} bytes")
            received += got

    def __exit__(self, *exc):
        try:
            self._conn.sendall((0).to_bytes(8, "little"))
            self._sender.wait(timeout=60)
        finally:
            self._sender.kill()
            self._conn.close()
            self._listener.close()


def _fill_recdev(table: torch.Tensor, values: torch.Tensor) -> None:
    chunk = 65_536
    for start in range(0, values.shape[0], chunk):
        keys = torch.arange(start, min(start + chunk, values.shape[0]))
        torch_recdev.ops.emb_write(table, keys, values[start : start + chunk])


def _fill_redis(client, values: np.ndarray) -> None:
    pipe = client.pipeline(transaction=False)
    for start in range(0, values.shape[0], 10_000):
        block = values[start : start + 10_000]
        pipe.mset({start + i: block[i].tobytes() for i in range(block.shape[0])})
        pipe.execute()


def _redis_gather(client, ids: np.ndarray) -> np.ndarray:
    pipe = client.pipeline(transaction=False)
    keys = ids.tolist()
    for start in range(0, len(keys), MGET_KEYS):
        pipe.mget(keys[start : start + MGET_KEYS])
    rows = [row for reply in pipe.execute() for row in reply]
    return np.frombuffer(b"".join(rows), dtype=np.float32).reshape(len(rows), DIM)


def _against_redis(table, values: np.ndarray, ids: torch.Tensor, repeat: int):
    """The remote gather against Redis holding the same rows, or a note where redis-server is missing."""
    name = f"remote gather, {NUM_IDS:,} ids, {SHARDS} shards"
    if shutil.which("redis-server") is None:
        return Fact(f"{name}, vs Redis", "not run: redis-server is not installed (`make bench` installs it)",
                    "≥ 10×", False)
    import redis

    with local_redis_server() as redis_port:
        client = redis.Redis(port=redis_port)
        _fill_redis(client, values)
        if not np.array_equal(_redis_gather(client, ids.numpy()), values[ids.numpy()]):
            raise RuntimeError("Redis returned other rows than were written")
        recdev_s, redis_s = compare(
            lambda: F.embedding(ids, table), lambda: _redis_gather(client, ids.numpy()), repeat=repeat
        )
    return Row(name, recdev_s, "Redis pipelined MGET (redis-py + hiredis)", redis_s, "≥ 10×", 10.0)


def _server_start(runs: int) -> list:
    """How long the native recdev-server takes to listen, and what it holds idle."""
    times, rss = [], []
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.Popen([server.executable(), "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
        try:
            if not proc.stdout.readline().startswith("listening on"):
                raise RuntimeError("recdev-server did not start")
            times.append(time.perf_counter() - start)
            with open(f"/proc/{proc.pid}/status") as f:
                rss.append(int(next(line for line in f if line.startswith("VmRSS")).split()[1]) / 1024)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    start_ms, rss_mib = statistics.median(times) * 1000, statistics.median(rss)
    return [Fact("recdev-server: start to `listening on` (median)", f"{start_ms:.1f} ms", "< 100 ms", start_ms < 100),
            Fact("recdev-server: idle RSS", f"{rss_mib:.1f} MiB", "< 20 MiB", rss_mib < 20)]


def run(quick: bool = False) -> list:
    rows = NUM_ROWS // 20 if quick else NUM_ROWS
    repeat = 3 if quick else 10
    rng = np.random.default_rng(0)
    values = rng.standard_normal((rows, DIM), dtype=np.float32)
    ids = torch.from_numpy(rng.integers(0, rows, NUM_IDS, dtype=np.int64))
    offsets = torch.arange(0, NUM_IDS, BAG)
    results = _server_start(3 if quick else 10)
    with local_recdev_servers(SHARDS) as addresses:
        torch_recdev.connect(",".join(addresses))
        try:
            table = torch_recdev.ops.init_embedding_table("bench_remote", rows, DIM)
            _fill_recdev(table, torch.from_numpy(values))
            if not np.array_equal(F.embedding(ids, table).cpu().numpy(), values[ids.numpy()]):
                raise RuntimeError("remote gather returned other rows than were written")
            results.append(_against_redis(table, values, ids, repeat))

            def pooled():
                return F.embedding_bag(ids, table, offsets, mode="sum")

            def unpooled():
                return F.embedding(ids, table).view(-1, BAG, DIM).sum(1)

            if not torch.allclose(pooled(), unpooled(), rtol=1e-5, atol=1e-5):
                raise RuntimeError("pooled and unpooled remote lookups disagree")
            pooled_s, unpooled_s = compare(pooled, unpooled, repeat=repeat)
            results.append(Row(f"remote embedding_bag sum, bags of {BAG}, pooled on the shards", pooled_s,
                               "unpooled remote gather + pooling on the client", unpooled_s, "faster (> 1×)", 1.0))
            pooled_bytes, unpooled_bytes = wire_bytes(pooled), wire_bytes(unpooled)
            results.append(Fact(f"loopback bytes, embedding_bag bags of {BAG}: pooled vs unpooled",
                                f"{pooled_bytes / 2**20:.2f} MiB vs {unpooled_bytes / 2**20:.2f} MiB "
                                f"({unpooled_bytes / pooled_bytes:.1f}× fewer)",
                                f"fewer by bag size / shards ({BAG // SHARDS}×: each shard sends one partial per bag)",
                                unpooled_bytes / pooled_bytes >= 0.8 * BAG / SHARDS))

            # Timed like every other row: alternating rounds, the best round's median of each.
            payload = NUM_IDS * ROW_BYTES
            with RawLoopbackStream() as raw:
                gather_s, raw_s = compare(lambda: F.embedding(ids, table), lambda: raw.receive(payload), repeat=repeat)
            share = (payload / gather_s) / (payload / raw_s)
            results.append(Fact("remote gather payload bandwidth vs raw loopback TCP stream",
                                f"{payload / gather_s / 2**30:.2f} GiB/s vs {payload / raw_s / 2**30:.2f} GiB/s "
                                f"= {share:.0%}", "≥ 80% (issue 38)", share >= 0.8))
        finally:
            torch_recdev.connect(None)
    return results


if __name__ == "__main__":
    import harness

    print(harness.markdown("Remote store", run(quick="--quick" in sys.argv)))
