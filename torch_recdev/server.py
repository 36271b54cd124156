"""The ``recdev-server`` command: serve one shard of a remote recdev store, or print a server's stats.

    recdev-server --listen 127.0.0.1:7070 --shard 0 --num-shards 2 [--token-file F]
                  [--checkpoint-dir D] [--checkpoint-every S] [--max-memory BYTES]
                  [--max-connections N] [--idle-timeout SECONDS]
    recdev-server --stats 127.0.0.1:7070 [--token-file F]

Also runnable as ``python -m torch_recdev.server``. See docs/server.md.
"""

import argparse
import re
import sys

_SIZE_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_bytes(text):
    """'1048576', '512M', '4GiB', '2g' -> bytes (binary units)."""
    match = re.fullmatch(r"\s*(\d+)\s*([kKmMgGtT]?)(?:i?[bB])?\s*", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: use bytes, or a number with K, M, G or T (binary units)")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]


def read_token(path):
    """The token in a file: its first line, without surrounding whitespace; it must not be empty."""
    if path is None:
        return ""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.readline().strip()
    except OSError as e:
        raise SystemExit(f"recdev-server: cannot read --token-file {path}: {e.strerror}")
    if not token:
        raise SystemExit(f"recdev-server: --token-file {path} is empty; put the token on its first line")
    return token


def _parser():
    p = argparse.ArgumentParser(
        prog="recdev-server",
        description="Serve one shard of a remote recdev store (docs/server.md), or print a server's stats.",
    )
    p.add_argument("--listen", default="127.0.0.1:7070", metavar="HOST:PORT",
                   help="address to listen on (default 127.0.0.1:7070, loopback only; port 0 picks a free port)")
    p.add_argument("--shard", type=int, default=0, metavar="I", help="this server's shard, 0 to N-1 (default 0)")
    p.add_argument("--num-shards", type=int, default=1, metavar="N", help="number of shards of the store (default 1)")
    p.add_argument("--token-file", metavar="F", help="require the token on this file's first line from every client")
    p.add_argument("--checkpoint-dir", metavar="D",
                   help="load this shard's checkpoint from D at start; write one there at shutdown")
    p.add_argument("--checkpoint-every", type=float, default=0.0, metavar="SECONDS",
                   help="also write a checkpoint every SECONDS (needs --checkpoint-dir)")
    p.add_argument("--max-memory", type=parse_bytes, default=0, metavar="BYTES",
                   help="answer 'store full' errors instead of growing past BYTES (e.g. 8G); default no limit")
    p.add_argument("--lease-seconds", type=float, default=60.0, metavar="SECONDS",
                   help="free a session's anonymous tables after SECONDS without a connection or request (default 60)")
    p.add_argument("--max-connections", type=int, default=64, metavar="N",
                   help="refuse connections past N open ones (default 64); connections that have not sent "
                        "HELLO take at most 16 and give way to newer ones")
    p.add_argument("--idle-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="close a connection after SECONDS without a request (default 300; clients reconnect "
                        "by themselves)")
    p.add_argument("--stats", metavar="HOST:PORT", help="print the stats of the server at HOST:PORT and exit")
    p.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS", help="--stats: give up after SECONDS")
    return p


def format_stats(address, stats):
    limit = "none" if stats["max_memory"] == 0 else str(stats["max_memory"])
    lines = [
        f"server       {address} (shard {stats['shard']} of {stats['num_shards']})",
        f"tables       {stats['tables']} ({stats['named_tables']} named)",
        f"rows         {stats['rows']}",
        f"bytes        {stats['bytes']} (max-memory {limit})",
        f"requests     {stats['requests']}",
        f"errors       {stats['errors']}",
        f"connections  {stats['connections']}",
        f"sessions     {stats['sessions']}",
        f"uptime       {stats['uptime_seconds']:.1f} s",
    ]
    return "\n".join(lines)


def main(argv=None):
    args = _parser().parse_args(argv)
    from torch_recdev import _C  # after argument errors, which need no torch

    token = read_token(args.token_file)
    try:
        if args.stats is not None:
            stats = _C._server.server_stats(args.stats, token, args.timeout)
            print(format_stats(args.stats, stats))
            return 0
        if args.shard < 0 or args.num_shards < 1 or args.max_connections < 1 or not args.idle_timeout > 0:
            raise ValueError("--shard must be >= 0, --num-shards >= 1, --max-connections >= 1 and --idle-timeout > 0")
        _C._server.run_server(
            args.listen, args.shard, args.num_shards, token, args.max_memory, args.lease_seconds,
            args.checkpoint_dir or "", args.checkpoint_every, args.max_connections, args.idle_timeout,
        )
    except (RuntimeError, ValueError, OSError, KeyError, MemoryError) as e:
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"recdev-server: {message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
