"""recdev-server is a native executable built from csrc/store, csrc/net and csrc/server alone: it links
no torch and no Python, the command on PATH is that executable, and an idle server is small. (How fast
it starts is measured by `make bench`, not asserted here.)"""

import os
import subprocess
import sys

from torch_recdev import server as server_module


def on_path_executable():
    return os.path.join(os.path.dirname(sys.executable), "recdev-server")


def test_links_no_torch_and_no_python():
    libraries = subprocess.run(["ldd", server_module.executable()], capture_output=True, text=True,
                               check=True).stdout
    assert "libstdc++" in libraries  # ldd read it: a dynamic executable
    for name in ("libtorch", "libc10", "libpython"):
        assert name not in libraries, f"recdev-server links {name}:\n{libraries}"


def test_the_command_on_path_is_the_native_executable():
    with open(on_path_executable(), "rb") as f:
        assert f.read(4) == b"\x7fELF"
    result = subprocess.run([on_path_executable(), "--help"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    for flag in ("--listen", "--shard", "--num-shards", "--token-file", "--checkpoint-dir", "--checkpoint-every",
                 "--max-memory", "--lease-seconds", "--max-connections", "--idle-timeout", "--stats", "--timeout",
                 "--metrics-listen"):
        assert flag in result.stdout


def test_an_idle_server_holds_under_20_mib(start_server):
    server = start_server()
    with server.connect() as conn:  # serving, not just started
        conn.call("STATS", b"")
    assert server.rss_bytes() < 20 << 20


def test_stats_report(start_server):
    server = start_server("--shard", "1", "--num-shards", "3", "--max-memory", "1G")
    result = subprocess.run([on_path_executable(), "--stats", server.address], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(None, 1) for line in result.stdout.splitlines())
    assert lines["server"] == f"{server.address} (shard 1 of 3)"
    assert lines["bytes"].endswith(f"(max-memory {1 << 30})")
    assert set(lines) >= {"tables", "rows", "requests", "errors", "connections", "sessions", "uptime"}


def test_command_line_errors_exit_2_with_the_usage():
    for args, message in [(["--bogus"], "unrecognized argument: --bogus"),
                          (["--num-shards", "0"], "--num-shards must be a whole number >= 1"),
                          (["--max-memory", "4X"], "'4X' is not a size"),
                          (["--checkpoint-every", "-1"], "not a number of seconds >= 0"),
                          (["--listen"], "expected one argument")]:
        result = subprocess.run([on_path_executable(), *args], capture_output=True, text=True, timeout=30)
        assert result.returncode == 2, args
        assert result.stderr.startswith("usage: recdev-server") and message in result.stderr, result.stderr
