"""Every fenced Python block of README.md and docs/*.md runs (doc_blocks.py says how blocks are marked),
so that the docs cannot drift from the code."""

import json
import os
import subprocess
import sys

import pytest

from doc_blocks import ROOT, doc_pages, python_blocks
from torch_recdev import local_shards

# Runs a page's blocks in order in one namespace; a failure names the page and the block's line.
_RUNNER = """
import json, sys
namespace = {"__name__": "__main__"}
for block in json.load(sys.stdin):
    code = compile("\\n" * block["line"] + block["code"], block["where"], "exec")
    exec(code, namespace)
"""

PAGES = [page for page in doc_pages() if python_blocks(page)]


def test_the_docs_have_blocks_to_run():
    assert len(PAGES) >= 5


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_page_blocks_run(page, tmp_path):
    blocks = [b for b in python_blocks(page) if b.skip is None]
    ports = sorted({port for block in blocks for port in block.shard_ports})
    servers = local_shards.start_shards(len(ports), log_dir=str(tmp_path)) if ports else []
    try:
        real = {port: server.address.rsplit(":", 1)[1] for port, server in zip(ports, servers)}
        payload = []
        for block in blocks:
            code = block.code
            for port in block.shard_ports:
                code = code.replace(f"127.0.0.1:{port}", f"127.0.0.1:{real[port]}")
            payload.append({"line": block.line, "code": code, "where": f"{page.relative_to(ROOT)}"})
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("RECDEV_SERVERS", None)
        result = subprocess.run([sys.executable, "-c", _RUNNER], input=json.dumps(payload), text=True,
                                capture_output=True, cwd=tmp_path, env=env, timeout=600)
    finally:
        for server in servers:
            server.kill()
    assert result.returncode == 0, f"a block of {page.name} failed:\n{result.stderr[-4000:]}"
