"""The client's Exchange (csrc/net/client/exchange.h) phase by phase — send, receive, deliver, fail, and run's
timeout — in C++ (exchange_phases.cpp) against a socketpair the test plays the server on. Built here
from the net sources it needs, with no torch: csrc/net is plain C++."""

import os
import shutil
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCES = ["test/net/exchange_phases.cpp", "csrc/net/client/exchange.cpp", "csrc/net/wire/protocol.cpp",
           "csrc/net/wire/socket.cpp", "csrc/store/trace_range.cpp"]


def test_exchange_phases(tmp_path):
    compiler = os.environ.get("CXX", shutil.which("c++") or "g++")
    binary = tmp_path / "exchange_phases"
    subprocess.run([compiler, "-std=c++20", "-O1", "-Wall", "-Werror", "-Wno-unused-parameter", "-pthread",
                    "-I", os.path.join(ROOT, "csrc"), "-o", str(binary), *[os.path.join(ROOT, s) for s in SOURCES]],
                   check=True, timeout=300)
    result = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok ")
