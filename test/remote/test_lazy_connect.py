"""RECDEV_SERVERS is read at `import torch` but connected at the store's first use: the import opens no
socket, and an unreachable server is an error at that first use, naming RECDEV_SERVERS."""

import os
import socket
import subprocess
import sys
import textwrap

from torch_recdev import local_shards


def run_python(code, servers, timeout=120, **env_extra):
    env = dict(os.environ, RECDEV_SERVERS=servers, RECDEV_TIMEOUT="5", **env_extra)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_import_torch_opens_no_socket():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setblocking(False)
        port = listener.getsockname()[1]
        # The interpreter stops right after the import, before any use of the store.
        result = run_python("import torch, torch_recdev; print(torch.empty(2, device='recdev').device)",
                            f"tcp://127.0.0.1:{port}")
        assert result.returncode == 0, result.stderr
        assert "recdev:0" in result.stdout
        try:
            connection, _ = listener.accept()
        except BlockingIOError:
            connection = None
        assert connection is None, "import torch (or a host tensor) connected to RECDEV_SERVERS"


def test_the_first_use_connects(start_shards):
    servers = local_shards.server_list(start_shards(2))
    result = run_python(
        """
        import torch, torch_recdev
        t = torch_recdev.ops.init_embedding_table("lazy", 10, 2)
        torch_recdev.ops.emb_write(t, torch.tensor([3]), torch.tensor([[4.0, 5.0]]))
        info = torch_recdev.store_info()
        assert info["kind"] == "remote" and info["shards"] == 2, info
        """,
        servers,
    )
    assert result.returncode == 0, result.stderr


def test_recdev_overlap_updates_is_connects_overlap_updates(start_shards):
    servers = local_shards.server_list(start_shards(1))
    code = "import torch_recdev; print(torch_recdev.store_info()['overlap_updates'])"
    for value, expected in (("1", "True"), ("0", "False")):
        result = run_python(code, servers, RECDEV_OVERLAP_UPDATES=value)
        assert result.returncode == 0 and result.stdout.strip() == expected, result.stderr
    result = run_python(code, servers, RECDEV_OVERLAP_UPDATES="yes")
    assert result.returncode != 0 and "RECDEV_OVERLAP_UPDATES must be 0 or 1; got 'yes'" in result.stderr


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_server_fails_at_first_use_naming_recdev_servers():
    servers = f"tcp://127.0.0.1:{free_port()}"
    result = run_python(
        """
        import torch, torch_recdev
        print("imported", flush=True)
        for use in (torch_recdev.store_info, lambda: torch_recdev.ops.init_embedding_table("t", 10, 2)):
            try:
                use()
            except ConnectionError as error:
                print("refused:", error)
        """,
        servers,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("imported")
    refusals = [line for line in result.stdout.splitlines() if line.startswith("refused:")]
    assert len(refusals) == 2, result.stdout  # every use fails the same clear way, none hangs
    assert all(f"RECDEV_SERVERS='{servers}'" in line and "cannot connect" in line for line in refusals)
