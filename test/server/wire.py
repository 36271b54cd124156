"""A small struct-based client of the recdev wire protocol (docs/protocol.md), written independently of
csrc/net so that the tests check the server against the documented bytes. It is also the tool that
sends hostile bytes: raw frames, raw payloads, anything."""

import socket
import struct

import numpy as np

MAGIC = b"RECDEVNP"
VERSION = 12
HEADER = struct.Struct("<IBBHQ")
MAX_PAYLOAD = 256 << 20
FLAG_ERROR = 1
LATENCY_BUCKETS = 27  # STATS' per-opcode histogram: bucket k <= 2^k microseconds, the last one the rest

OP = {
    "HELLO": 1, "PING": 2, "STATS": 3, "CREATE_TABLE": 10, "OPEN_NAMED": 11, "FIND": 12, "FREE_TABLE": 13,
    "LIST": 14, "GET_TABLE_INFO": 15, "SET_INIT": 16, "GATHER": 20, "PEEK": 21, "GATHER_POOLED_PARTIAL": 22,
    "WRITE": 23, "WRITE_BYTES": 24, "EXISTS": 25, "ERASE": 26, "UPDATE": 27, "GATHER_STATE": 28,
    "SET_OPTIMIZER": 30, "SET_LR": 31, "SET_STEP": 32, "SET_POLICY": 33, "GET_POLICY_STATE": 34,
    "RESTORE_POLICY": 35, "CHECK_POLICY": 36, "DUMP": 40, "BEGIN_LOAD": 41, "LOAD_ROWS": 42,
    "COMMIT_LOAD": 43, "ABORT_LOAD": 44, "STAGE_UPDATE": 50, "COMMIT_UPDATE": 51,
}
OPCODE_NAMES = {code: name for name, code in OP.items()}
ERROR_NAMES = {1: "InvalidArgument", 2: "OutOfRange", 3: "NotFound", 4: "Corrupt", 5: "Io", 6: "Full",
               7: "Unavailable", 8: "PermissionDenied", 9: "Protocol"}
INIT = {"zero": 0, "constant": 1, "normal": 2, "uniform": 3, "xavier": 4}
OPTIMIZER = {"none": 0, "sgd": 1, "adagrad": 2, "rowwise_adagrad": 3, "adam": 4}
OPTIMIZER_DEFAULTS = dict(lr=0.01, weight_decay=0.0, eps=1e-10, lr_decay=0.0, initial_accumulator_value=0.0,
                          beta1=0.9, beta2=0.999, stochastic_rounding=0, rounding_seed=0)


class ServerError(Exception):
    def __init__(self, code, message):
        super().__init__(f"{ERROR_NAMES.get(code, code)}: {message}")
        self.code = code
        self.name = ERROR_NAMES.get(code, str(code))
        self.message = message


# ---- Routing (docs/protocol.md, "Row ownership") ----

M64 = (1 << 64) - 1


def mix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def owner_shard(route_key, row_id, num_shards):
    return (mix64(mix64(row_id) ^ route_key) * num_shards) >> 64


def route_key_of_name(name):
    h = 0xCBF29CE484222325
    for byte in name.encode():
        h = ((h ^ byte) * 0x100000001B3) & M64
    return mix64(mix64(h))


def owned_ids(route_key, shard, num_shards, count, start=0):
    """The first `count` row ids from `start` that `shard` owns."""
    ids, row = [], start
    while len(ids) < count:
        if owner_shard(route_key, row, num_shards) == shard:
            ids.append(row)
        row += 1
    return ids


# ---- Encoding ----

def u8(v): return struct.pack("<B", v)
def u16(v): return struct.pack("<H", v)
def u32(v): return struct.pack("<I", v)
def u64(v): return struct.pack("<Q", v)
def i64(v): return struct.pack("<q", v)
def f64(v): return struct.pack("<d", v)
def string(s): return u32(len(s)) + (s.encode() if isinstance(s, str) else s)


def array(values, dtype):
    a = np.ascontiguousarray(values, dtype=dtype).ravel()
    return u32(a.size) + a.tobytes()


def init_rule(kind="zero", a=0.0, b=0.0, seed=0):
    return u32(INIT[kind]) + f64(a) + f64(b) + u64(seed)


DTYPE = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3, "bytes": 4}


def config(num_rows, dim, state_words=0, init=None, dtype="float32"):
    return u64(num_rows) + u32(dim) + u32(state_words) + (init or init_rule()) + u8(DTYPE[dtype])


def optimizer(kind="none", **params):
    values = dict(OPTIMIZER_DEFAULTS, **params)
    return u32(OPTIMIZER[kind]) + b"".join(f64(values[k]) for k in
                                          ("lr", "weight_decay", "eps", "lr_decay", "initial_accumulator_value",
                                           "beta1", "beta2")) + u8(values["stochastic_rounding"]) + u64(values["rounding_seed"])


def declaration(declares_init=False, fused=None, reset=False, declares_rounding=False):
    """OPEN_NAMED's fields after the TableConfig: what the declaration compares, reset, and whether
    the optimizer names its rounding."""
    return u8(declares_init) + u8(fused is not None) + (fused or optimizer()) + u8(reset) + u8(declares_rounding)


def table_ref(table, dtype="float32"):
    """The start of every request on a table's rows: its id and the element type the client holds it as."""
    return u64(table) + u8(DTYPE[dtype] if isinstance(dtype, str) else dtype)


NO_POLICY_STATE = u32(0)  # BEGIN_LOAD's policy_state: empty, the table keeps its policy

EVICT = {None: 0, "lru": 1, "lfu": 2, "ttl": 3}


def policy(max_rows=None, max_bytes=None, evict=None, half_life=1000.0, ttl_steps=0, ttl_seconds=0.0, admit_after=1,
           sketch_width=1 << 16, spill=False, max_disk_bytes=None):
    """A table policy as SET_POLICY carries it: budgets flagged present (bit 0 max_rows, bit 1 max_bytes, bit 3
    max_disk_bytes) and signed, so that zero and negative budgets can be sent (and must be refused); bit 2 spill."""
    flags = ((1 if max_rows is not None else 0) | (2 if max_bytes is not None else 0) | (4 if spill else 0)
             | (8 if max_disk_bytes is not None else 0))
    return (u8(flags) + i64(max_rows or 0) + i64(max_bytes or 0) + i64(max_disk_bytes or 0)
            + u8(EVICT.get(evict, evict)) + f64(half_life) + u64(ttl_steps) + f64(ttl_seconds) + u32(admit_after)
            + u32(sketch_width))


def step_tag_bytes(fleet, step, rank, world):
    return u64(fleet) + u64(step) + u32(rank) + u32(world)


def frame(opcode, payload=b"", request_id=0, flags=0, reserved=0, length=None):
    op = OP[opcode] if isinstance(opcode, str) else opcode
    return HEADER.pack(len(payload) if length is None else length, op, flags, reserved, request_id) + payload


def hello(token="", session_id=0, version=VERSION, magic=MAGIC):
    return magic + u16(version) + string(token) + u64(session_id)


# ---- Decoding ----

class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, n):
        assert self.pos + n <= len(self.data), "response shorter than its layout"
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def u8(self): return self.take(1)[0]
    def u16(self): return struct.unpack("<H", self.take(2))[0]
    def u32(self): return struct.unpack("<I", self.take(4))[0]
    def u64(self): return struct.unpack("<Q", self.take(8))[0]
    def i64(self): return struct.unpack("<q", self.take(8))[0]
    def f64(self): return struct.unpack("<d", self.take(8))[0]
    def string(self): return self.take(self.u32()).decode("utf-8", "replace")

    def array(self, dtype):
        n = self.u32()
        return np.frombuffer(self.take(n * np.dtype(dtype).itemsize), dtype=dtype).copy()

    def init_rule(self):
        return dict(kind=self.u32(), a=self.f64(), b=self.f64(), seed=self.u64())

    def config(self):
        return dict(num_rows=self.u64(), dim=self.u32(), state_words=self.u32(), init=self.init_rule(), dtype=self.u8())

    def optimizer(self):
        kind = self.u32()
        values = {k: self.f64() for k in ("lr", "weight_decay", "eps", "lr_decay", "initial_accumulator_value",
                                          "beta1", "beta2")}
        values["stochastic_rounding"] = self.u8()
        values["rounding_seed"] = self.u64()
        return dict(kind=kind, **values)

    def description(self):
        return dict(table_id=self.u64(), config=self.config(), init_stream=self.u64(), optimizer=self.optimizer(),
                    optimizer_step=self.u64())

    def stats(self):
        return dict(num_rows=self.u64(), dim=self.u32(), rows=self.u64(), bytes=self.u64(), reads=self.u64(),
                    writes=self.u64(), updates=self.u64(), evicted=self.u64(), admitted=self.u64(), pending=self.u64(),
                    rows_in_memory=self.u64(), rows_on_disk=self.u64(), disk_bytes=self.u64(),
                    disk_live_bytes=self.u64(), disk_reads=self.u64(), disk_read_ops=self.u64(),
                    disk_writes=self.u64())

    def policy(self):
        flags = self.u8()
        max_rows, max_bytes, max_disk_bytes = self.i64(), self.i64(), self.i64()
        return dict(max_rows=max_rows if flags & 1 else None, max_bytes=max_bytes if flags & 2 else None,
                    spill=bool(flags & 4), max_disk_bytes=max_disk_bytes if flags & 8 else None,
                    evict=self.u8(), half_life=self.f64(), ttl_steps=self.u64(), ttl_seconds=self.f64(),
                    admit_after=self.u32(), sketch_width=self.u32())

    def end(self):
        assert self.pos == len(self.data), f"{len(self.data) - self.pos} trailing bytes in a response"


# ---- Connections ----

class Connection:
    """One TCP connection; `call` sends a request and returns the response payload or raises ServerError."""

    def __init__(self, port, token="", session_id=0, host="127.0.0.1", handshake=True, timeout=20.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.next_id = 1
        self.welcome = None
        if handshake:
            r = Reader(self.call("HELLO", hello(token, session_id)))
            self.welcome = dict(version=r.u16(), shard=r.u32(), num_shards=r.u32(), session_id=r.u64(),
                                lease_seconds=r.f64(), max_payload_bytes=r.u32())
            r.end()

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send_raw(self, data):
        self.sock.sendall(data)

    def recv_exact(self, n):
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed")
            out += chunk
        return bytes(out)

    def read_frame(self):
        length, opcode, flags, reserved, request_id = HEADER.unpack(self.recv_exact(HEADER.size))
        assert reserved == 0
        return opcode, flags, request_id, self.recv_exact(length)

    def read_error(self):
        """Reads a frame that must be an error; returns (code, message, opcode, request_id)."""
        opcode, flags, request_id, payload = self.read_frame()
        assert flags == FLAG_ERROR, f"expected an error response, got opcode {opcode} flags {flags}"
        r = Reader(payload)
        code, message = r.u8(), r.string()
        r.end()
        return code, message, opcode, request_id

    def is_closed(self, wait=5.0):
        """True if the server closed the connection (EOF within `wait` seconds)."""
        self.sock.settimeout(wait)
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False

    def call(self, opcode, payload=b""):
        request_id = self.next_id
        self.next_id += 1
        self.sock.sendall(frame(opcode, payload, request_id))
        op, flags, rid, body = self.read_frame()
        assert rid == request_id and op == OP[opcode], (op, rid)
        if flags & FLAG_ERROR:
            r = Reader(body)
            code, message = r.u8(), r.string()
            raise ServerError(code, message)
        return body

    # -- typed helpers --

    def create_table(self, num_rows, dim, route_key=7, init=None, init_stream=None, state_words=0):
        payload = (config(num_rows, dim, state_words, init) + u8(init_stream is not None) + u64(init_stream or 0)
                   + u64(route_key))
        r = Reader(self.call("CREATE_TABLE", payload))
        return r.u64()

    def open_named(self, name, num_rows, dim, init=None, fused=None, reset=False):
        """A declaration: `init` (an init_rule) and `fused` (an optimizer) are compared when given."""
        payload = string(name) + config(num_rows, dim, 0, init) + declaration(init is not None, fused, reset)
        r = Reader(self.call("OPEN_NAMED", payload))
        d = r.description()
        r.end()
        return d

    def gather(self, table, ids, op="GATHER"):
        r = Reader(self.call(op, table_ref(table) + array(ids, np.uint64)))
        out = r.array(np.float32)
        r.end()
        return out

    def write(self, table, ids, rows):
        self.call("WRITE", table_ref(table) + array(ids, np.uint64) + array(rows, np.float32))

    def update(self, table, ids, grads):
        self.call("UPDATE", table_ref(table) + array(ids, np.uint64) + array(grads, np.float32))

    def stage_update(self, table, step_tag, ids, grads, timeout_ms, rank_rows=None):
        """This rank's part of a synchronous step; step_tag = (fleet, step, rank, world). Returns once
        every rank's part is in (or raises the shard's error)."""
        rank_rows = len(ids) if rank_rows is None else rank_rows
        self.call("STAGE_UPDATE", step_tag_bytes(*step_tag) + u64(rank_rows) + u32(timeout_ms) + table_ref(table)
                  + array(ids, np.uint64) + array(grads, np.float32))

    def commit_update(self, table, step_tag):
        self.call("COMMIT_UPDATE", u64(table) + step_tag_bytes(*step_tag))

    def exists(self, table, ids):
        r = Reader(self.call("EXISTS", table_ref(table) + array(ids, np.uint64)))
        return r.array(np.uint8)

    def info(self, table):
        r = Reader(self.call("GET_TABLE_INFO", u64(table)))
        out = dict(table=r.description(), name=r.string(), route_key=r.u64(), stats=r.stats(), policy=r.policy())
        r.end()
        return out

    def list(self):
        r = Reader(self.call("LIST"))
        out = [(r.u64(), r.string(), r.u64()) for _ in range(r.u32())]
        r.end()
        return out

    def stats(self):
        r = Reader(self.call("STATS"))
        keys = ["shard", "num_shards"]
        out = {k: r.u32() for k in keys}
        for k in ("tables", "named_tables", "rows", "bytes", "max_memory", "requests", "errors", "connections",
                  "sessions"):
            out[k] = r.u64()
        out["uptime_seconds"] = r.f64()
        out["table_counters"] = [dict(table_id=r.u64(), name=r.string(), rows=r.u64(), evicted=r.u64(),
                                      admitted=r.u64(), pending=r.u64(), rows_on_disk=r.u64(), disk_bytes=r.u64(),
                                      disk_reads=r.u64(), disk_writes=r.u64(), policy=r.policy())
                         for _ in range(r.u32())]
        out.update(serving_dir=r.string(), serving_version=r.u64(), serving_written_unix_ms=r.i64(),
                   staged_steps=r.u64(), staged_bytes=r.u64())
        out["opcodes"] = {}
        for _ in range(r.u32()):
            name = OPCODE_NAMES[r.u8()]
            entry = dict(errors=r.u64(), bytes_received=r.u64(), bytes_sent=r.u64(), rows=r.u64(),
                         latency_ns=r.u64(), latency_buckets=r.array(np.uint64).tolist())
            assert len(entry["latency_buckets"]) == LATENCY_BUCKETS
            out["opcodes"][name] = dict(entry, requests=sum(entry["latency_buckets"]))
        r.end()
        return out

    def dump_all(self, table, max_rows=1000, chain=0):
        """Every (id, record) of a table through DUMP (or of the change chain's cut), and the last
        response's header with the cut's whole flag, erased ids and policy state."""
        snapshot, ids, records, erased, header, policy = 0, [], [], [], None, b""
        while True:
            r = Reader(self.call("DUMP", u64(table) + u64(snapshot) + u32(max_rows) + u64(chain)))
            snapshot = r.u64()
            header = dict(table=r.description(), total_rows=r.u64(), record_words=r.u32())
            ids.append(r.array(np.uint64))
            records.append(r.array(np.float32))
            done = r.u8()
            header["whole"] = bool(r.u8())
            erased.append(r.array(np.uint64))
            policy = policy or r.array(np.uint8).tobytes()
            r.end()
            if done:
                break
        width = header["record_words"]
        header.update(erased=np.concatenate(erased), policy_state=policy)
        return np.concatenate(ids), np.concatenate(records).reshape(-1, width), header
