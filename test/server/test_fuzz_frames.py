"""A structured fuzz of the wire protocol against a real recdev-server.

Every request message is described field by field below (docs/protocol.md, csrc/net/wire/protocol.h), with
a valid value for each; the mutator takes a valid request and breaks exactly one field of it — cut
short in the middle of that field, zeroed, all bits set, off by one (a count or length off by one
for strings and arrays), or random bytes — and the frame header's fields likewise. Each case goes on
its own connection (HELLO cases before the handshake, the others in one fuzzing session); the
server must answer with responses carrying the request's id and a known error code, or close the
connection, and a request with flags set must be refused as a Protocol error. After every batch the
server must be alive (a fresh connection answers), its RSS bounded, and tables of another session
and a named table the fuzzer does not address unchanged (checksums of descriptions and rows)."""

import random
import socket
import struct
import time

import numpy as np

import wire
from server_process import checksum
from wire import MAGIC, array, init_rule, optimizer, u64

SEED = 20261125
DIM = 4
ROUNDS = 2  # every (message, field, mutation) this many times, with different random draws
BATCH = 100
RSS_SLACK = 512 << 20

# ---- The messages, field by field: (name, kind, valid value or a function of the context) ----

CONFIG = [("num_rows", "u64", 1000), ("dim", "u32", DIM), ("state_words", "u32", 0), ("init.kind", "u32", 2),
          ("init.a", "f64", 0.0), ("init.b", "f64", 0.1), ("init.seed", "u64", 7), ("dtype", "u8", 0)]
INIT = CONFIG[3:7]
OPTIMIZER = [("optimizer.kind", "u32", 2), ("lr", "f64", 0.1), ("weight_decay", "f64", 0.0), ("eps", "f64", 1e-8),
             ("lr_decay", "f64", 0.0), ("initial_accumulator_value", "f64", 0.0), ("beta1", "f64", 0.9),
             ("beta2", "f64", 0.999), ("stochastic_rounding", "u8", 0), ("rounding_seed", "u64", 0)]
NO_OPTIMIZER = [("optimizer.kind", "u32", 0), ("lr", "f64", 0.01), ("weight_decay", "f64", 0.0), ("eps", "f64", 1e-10),
                ("lr_decay", "f64", 0.0), ("initial_accumulator_value", "f64", 0.0), ("beta1", "f64", 0.9),
                ("beta2", "f64", 0.999), ("stochastic_rounding", "u8", 0), ("rounding_seed", "u64", 0)]
TABLE = ("table", "u64", lambda ctx: ctx["table"])
IDS = ("ids", "u64[]", [1, 2, 3])
DTYPE = ("dtype", "u8", 0)
POLICY = [("budget_flags", "u8", 1), ("max_rows", "i64", 50), ("max_bytes", "i64", 0), ("evict", "u8", 1),
          ("half_life", "f64", 1000.0), ("ttl_steps", "u64", 0), ("ttl_seconds", "f64", 0.0),
          ("admit_after", "u32", 2), ("sketch_width", "u32", 1024)]
LOAD = ("load_id", "u64", lambda ctx: ctx["load"])

MESSAGES = {
    "HELLO": [("magic", "bytes", MAGIC), ("version", "u16", wire.VERSION), ("token", "string", ""),
              ("session_id", "u64", 0)],
    "PING": [],
    "STATS": [],
    "CREATE_TABLE": CONFIG + [("has_init_stream", "bool", 1), ("init_stream", "u64", 5), ("route_key", "u64", 7)],
    "OPEN_NAMED": [("name", "string", "fuzz.named")] + CONFIG + [("declares_init", "bool", 1),
                                                                 ("has_optimizer", "bool", 1)]
                  + OPTIMIZER + [("reset", "bool", 0), ("declares_rounding", "bool", 0)],
    "FIND": [("name", "string", "fuzz.named")],
    "FREE_TABLE": [TABLE],
    "LIST": [],
    "GET_TABLE_INFO": [TABLE],
    "SET_INIT": [TABLE] + INIT,
    "GATHER": [TABLE, DTYPE, IDS],
    "PEEK": [TABLE, DTYPE, IDS],
    "GATHER_POOLED_PARTIAL": [TABLE, DTYPE, ("ids", "u64[]", [1, 2, 3, 4]), ("offsets", "u64[]", [0, 2]), ("mode", "u8", 0),
                              ("has_weights", "bool", 1), ("per_sample_weights", "f32[]", [1.0, 0.5, 2.0, 1.0]),
                              ("padding_idx", "i64", -1), ("ignore_nan", "u8[]", [])],
    "WRITE": [TABLE, DTYPE, ("ids", "u64[]", [1, 2]), ("rows", "f32[]", [0.25] * (2 * DIM))],
    "WRITE_BYTES": [TABLE, DTYPE, ("byte_offset", "u64", 16), ("data", "u8[]", list(range(8)))],
    "EXISTS": [TABLE, DTYPE, IDS],
    "ERASE": [TABLE, DTYPE, ("ids", "u64[]", [3])],
    "UPDATE": [TABLE, DTYPE, ("ids", "u64[]", [1, 2]), ("grads", "f32[]", [0.5] * (2 * DIM))],
    "GATHER_STATE": [TABLE, DTYPE, IDS],
    "SET_OPTIMIZER": [TABLE] + OPTIMIZER,
    "SET_LR": [TABLE, ("lr", "f64", 0.05)],
    "SET_STEP": [TABLE, ("step", "u64", 3)],
    "SET_POLICY": [TABLE] + POLICY,
    "GET_POLICY_STATE": [TABLE],
    "RESTORE_POLICY": [TABLE, ("policy_state", "u8[]", lambda ctx: ctx["policy_state"])],
    "CHECK_POLICY": [TABLE, ("touch", "u8", 0), IDS],
    "DUMP": [TABLE, ("snapshot_id", "u64", 0), ("max_rows", "u32", 10), ("chain", "u64", 0)],
    "BEGIN_LOAD": [("name", "string", ""), TABLE] + CONFIG + [("init_stream", "u64", 0)] + NO_OPTIMIZER
                  + [("optimizer_step", "u64", 0), ("policy_state", "u8[]", [])],
    "LOAD_ROWS": [LOAD, ("ids", "u64[]", [5, 6]), ("records", "f32[]", [1.0] * (2 * DIM))],
    "COMMIT_LOAD": [("load_ids", "u64[]", lambda ctx: [ctx["load"]])],
    "ABORT_LOAD": [LOAD],
    # A fleet of one: the part completes its step at once (a world off by one waits its 50 ms out).
    "STAGE_UPDATE": [("fleet", "u64", 9), ("step", "u64", 1), ("rank", "u32", 0), ("world", "u32", 1),
                     ("rank_rows", "u64", 2), ("timeout_ms", "u32", 50), TABLE, DTYPE, ("ids", "u64[]", [1, 2]),
                     ("grads", "f32[]", [0.5] * (2 * DIM))],
    "COMMIT_UPDATE": [TABLE, ("fleet", "u64", 9), ("step", "u64", 1), ("rank", "u32", 0), ("world", "u32", 1)],
}
assert set(MESSAGES) == set(wire.OP), "every opcode of the protocol is described"

# The frame header, mutated on a valid request.
HEADER_FIELDS = [("length", "u32"), ("opcode", "u8"), ("flags", "u8"), ("reserved", "u16"), ("request_id", "u64")]
MUTATIONS = ("truncate", "zero", "max", "off_by_one", "random")

SCALARS = {"u8": "<B", "u16": "<H", "u32": "<I", "u64": "<Q", "i64": "<q", "f64": "<d", "bool": "<B"}
ARRAYS = {"u64[]": np.uint64, "f32[]": np.float32, "u8[]": np.uint8}


def encode(kind, value):
    if kind in SCALARS:
        return struct.pack(SCALARS[kind], value)
    if kind == "bytes":
        return value
    if kind == "string":
        return wire.string(value)
    return array(value, ARRAYS[kind])


def mutate(kind, value, mutation, rng):
    """The bytes of one field, broken by `mutation` ("truncate" is done by the caller)."""
    good = encode(kind, value)
    if mutation == "zero":
        return bytes(4) if kind in ("string",) or kind in ARRAYS else bytes(len(good))
    if mutation == "max":
        if kind == "string" or kind in ARRAYS:  # a count or length of 2^32-1 before the real elements
            return b"\xff\xff\xff\xff" + good[4:]
        return b"\xff" * len(good)
    if mutation == "off_by_one":
        if kind == "string" or kind in ARRAYS:
            count = struct.unpack("<I", good[:4])[0] + rng.choice((-1, 1))
            return struct.pack("<I", count % 2**32) + good[4:]
        if kind == "f64":
            return struct.pack("<d", value + rng.choice((-1.0, 1.0)))
        if kind == "bytes":
            return good[:-1] + bytes([(good[-1] + 1) % 256])
        if kind == "bool":
            return b"\x02"
        size = len(good)
        signed = kind == "i64"
        number = (value + rng.choice((-1, 1))) % (1 << (8 * size))
        if signed and number >= 1 << 63:
            number -= 1 << 64
        return number.to_bytes(size, "little", signed=signed)
    assert mutation == "random"
    if kind == "string":
        return wire.string(bytes(rng.randrange(256) for _ in range(rng.choice((1, 7, 300, 5000)))))
    if kind in ARRAYS:
        count = rng.choice((1, 2, 5, 64))
        itemsize = np.dtype(ARRAYS[kind]).itemsize
        return struct.pack("<I", count) + bytes(rng.randrange(256) for _ in range(count * itemsize))
    return bytes(rng.randrange(256) for _ in range(len(good)))


def build_payload(message, ctx, target=None, mutation=None, rng=None):
    """The payload of `message`, with field number `target` broken by `mutation`."""
    out = b""
    for index, (_, kind, value) in enumerate(MESSAGES[message]):
        value = value(ctx) if callable(value) else value
        if index != target:
            out += encode(kind, value)
        elif mutation == "truncate":
            good = encode(kind, value)
            return out + good[:rng.randrange(len(good))]
        else:
            out += mutate(kind, value, mutation, rng)
    return out


def header_case(message, ctx, field, mutation, rng):
    """A valid request whose header has `field` broken; returns (frame bytes, flags sent)."""
    payload = build_payload(message, ctx)
    values = dict(length=len(payload), opcode=wire.OP[message], flags=0, reserved=0, request_id=ctx["request_id"])
    head = b""
    for name, k in HEADER_FIELDS:
        if name != field:
            head += encode(k, values[name])
        elif mutation == "truncate":
            good = encode(k, values[name])
            return head + good[:rng.randrange(len(good))], 0
        else:
            head += mutate(k, values[name], mutation, rng)
    flags = head[5]
    return head + payload, flags


def cases(rng):
    """Every (message, field, mutation) and every header (field, mutation), ROUNDS times, shuffled."""
    plan = []
    for _ in range(ROUNDS):
        for message, fields in MESSAGES.items():
            for index in range(len(fields)):
                plan += [("field", message, index, m) for m in MUTATIONS]
        for field, _ in HEADER_FIELDS:
            for message in ("PING", "GATHER", "WRITE"):
                plan += [("header", message, field, m) for m in MUTATIONS]
    rng.shuffle(plan)
    return plan


def run_case(server, ctx, case, rng):
    """Sends one case on its own connection; returns a problem found, or None."""
    kind, message, field, mutation = case
    request_id = ctx["request_id"] = rng.randrange(1, 2**63)
    if kind == "field":
        payload = build_payload(message, ctx, field, mutation, rng)
        data, flags = wire.frame(message, payload, request_id=request_id), 0
    else:
        data, flags = header_case(message, ctx, field, mutation, rng)
    handshake = not (kind == "field" and message == "HELLO")
    try:
        conn = server.connect(handshake=handshake, session_id=ctx["session"])
    except (OSError, wire.ServerError) as e:
        return f"cannot connect: {e}"
    with conn:
        try:
            conn.send_raw(data)
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # closed on a refused header while the rest was in flight
        conn.sock.settimeout(20)
        answers = []
        try:
            while True:
                answers.append(conn.read_frame())
        except socket.timeout:
            return "neither answered nor closed the connection within 20 s"
        except (ConnectionError, OSError, AssertionError):
            pass  # closed, possibly in the middle of a frame it had no reason to finish
    for opcode, answer_flags, rid, body in answers:
        if answer_flags not in (0, wire.FLAG_ERROR):
            return f"answered with flags {answer_flags}"
        if answer_flags and (not body or body[0] not in wire.ERROR_NAMES):
            return f"an error answer with an unknown code {body[:1]!r}"
        if rid not in (request_id, struct.unpack("<Q", data[8:16])[0] if len(data) >= 16 else request_id):
            return f"an answer for request {rid}, not {request_id}"
    if flags != 0 and kind == "header" and field == "flags":
        if not answers or answers[0][1] != wire.FLAG_ERROR or wire.ERROR_NAMES[answers[0][3][0]] != "Protocol":
            return f"a request with flags {flags} was not refused as a Protocol error"
    return None


def test_fuzz_every_field_of_every_message(start_server):
    server = start_server("--max-memory", "256M", "--lease-seconds", "60")
    keeper = server.connect()
    protected_named = keeper.open_named("fuzz.protected", 10**6, DIM, init_rule("normal", 0.0, 0.1, seed=3))["table_id"]
    keeper.call("SET_OPTIMIZER", u64(protected_named) + optimizer("adagrad", lr=0.1))
    keeper.update(protected_named, np.arange(0, 3000, 3), np.random.default_rng(1).standard_normal((1000, DIM)))
    anonymous = keeper.create_table(1000, DIM, init=init_rule("uniform", -1.0, 1.0, seed=4))
    keeper.write(anonymous, np.arange(200), np.random.default_rng(2).standard_normal((200, DIM)))
    protected = [protected_named, anonymous]
    rows_before = {t: keeper.info(t)["stats"]["rows"] for t in protected}
    digest = checksum(keeper, tables=protected)

    owner = server.connect()  # keeps the fuzzing session alive
    ctx = {"session": owner.welcome["session_id"], "request_id": 1}
    rss_start = server.rss_bytes()
    rng = random.Random(SEED)
    plan = cases(rng)
    assert len(plan) >= 1000
    problems = []
    started = time.monotonic()
    for batch_start in range(0, len(plan), BATCH):
        # Fresh targets for every batch: the previous one may have freed its table or ended its load.
        ctx["table"] = owner.create_table(1000, DIM, init=init_rule("normal", 0.0, 0.1, seed=5))
        owner.write(ctx["table"], [1, 2, 3], np.ones((3, DIM)))
        owner.call("SET_POLICY", u64(ctx["table"]) + wire.policy(max_rows=50, evict="lru", admit_after=2,
                                                                 sketch_width=1024))
        ctx["policy_state"] = wire.Reader(owner.call("GET_POLICY_STATE", u64(ctx["table"]))).array(np.uint8)
        ctx["load"] = wire.Reader(owner.call("BEGIN_LOAD", build_payload("BEGIN_LOAD", ctx))).u64()
        for case in plan[batch_start:batch_start + BATCH]:
            problem = run_case(server, ctx, case, rng)
            if problem is not None:
                problems.append((case, problem))
        assert server.alive(), f"the server died in the batch from case {batch_start}: {server.log()[-2000:]}"
        with server.connect() as fresh:
            assert fresh.call("PING") == b""
        rss = server.rss_bytes()
        assert rss < 2 * rss_start + RSS_SLACK, f"RSS {rss >> 20} MiB from {rss_start >> 20} MiB"
        assert checksum(keeper, tables=protected) == digest, f"a protected table changed in batch {batch_start}"
    assert {t: keeper.info(t)["stats"]["rows"] for t in protected} == rows_before
    print(f"fuzz: {len(plan)} cases in {time.monotonic() - started:.1f} s, {len(problems)} problems")
    assert not problems, problems[:10]
    owner.close()
    keeper.close()
