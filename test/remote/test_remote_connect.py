"""torch_recdev.connect(): server lists, tokens, store_info, errors that name the server, tables
that keep their store, RECDEV_SERVERS."""

import os
import socket
import struct
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from torch_recdev import local_shards
import torch_recdev
from torch_recdev import _testing, ops


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_store_info_describes_the_current_store(start_shards):
    servers = start_shards(2)
    info = torch_recdev.connect(local_shards.server_list(servers), timeout=7.5)
    assert info == {"kind": "remote", "servers": [s.url for s in servers], "shards": 2, "timeout": 7.5,
                    "overlap_updates": False}
    assert torch_recdev.store_info() == info
    assert torch_recdev.connect(None)["kind"] == "embedded"


@pytest.mark.parametrize(
    "servers, match",
    [
        ("", "empty entry"),
        ("tcp://127.0.0.1:7070,", "empty entry"),
        ("http://127.0.0.1:7070", "only tcp://"),
        ("tcp://127.0.0.1", "HOST:PORT"),
        ("tcp://127.0.0.1:99999", "HOST:PORT|port"),
        ("tcp://127.0.0.1:7070,tcp://127.0.0.1:7070", "twice"),
    ],
)
def test_bad_server_lists_are_refused(servers, match):
    with pytest.raises(ValueError, match=match):
        torch_recdev.connect(servers)
    assert torch_recdev.store_info()["kind"] == "embedded"


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="servers must be a string"):
        torch_recdev.connect(["tcp://127.0.0.1:7070"])
    with pytest.raises(ValueError, match="timeout must be a positive"):
        torch_recdev.connect("tcp://127.0.0.1:7070", timeout=0)


def test_nothing_listening_names_the_server_at_once():
    port = free_port()
    start = time.monotonic()
    with pytest.raises(ConnectionError, match=rf"recdev-server 127.0.0.1:{port} \(shard 0 of 1\).*cannot connect"):
        torch_recdev.connect(f"tcp://127.0.0.1:{port}", timeout=5)
    assert time.monotonic() - start < 5
    assert torch_recdev.store_info()["kind"] == "embedded"


def test_a_silent_listener_times_out_naming_the_server():
    # Accepts connections (the kernel does, from the backlog) but never answers HELLO.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        start = time.monotonic()
        with pytest.raises(ConnectionError, match=rf"127.0.0.1:{port}.*HELLO.*no answer within 1 s"):
            torch_recdev.connect(f"tcp://127.0.0.1:{port}", timeout=1.0)
        assert 0.9 < time.monotonic() - start < 10


def test_servers_in_the_wrong_order_are_refused(start_shards):
    servers = start_shards(2)
    with pytest.raises(ValueError, match="serves shard 1 of 2.*shard order"):
        torch_recdev.connect(f"{servers[1].url},{servers[0].url}")
    with pytest.raises(ValueError, match="serves shard 0 of 2"):
        torch_recdev.connect(servers[0].url)


def test_token(start_shards, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    servers = start_shards(2, "--token-file", str(token_file))
    addresses = local_shards.server_list(servers)
    with pytest.raises(PermissionError, match=r"recdev-server 127.0.0.1:\d+ \(shard 0 of 2\), HELLO: .*token"):
        torch_recdev.connect(addresses)
    with pytest.raises(PermissionError, match="token"):
        torch_recdev.connect(addresses, token="wrong")
    assert torch_recdev.connect(addresses, token="s3cret")["shards"] == 2
    t = ops.init_embedding_table("guarded", 100, 4)
    ops.emb_write(t, torch.tensor([1, 2]), torch.ones(2, 4))
    assert ops.emb_read(t, torch.tensor([1, 2])).sum().item() == 8


def test_tables_keep_the_store_they_live_in(start_shards):
    servers = start_shards(2)
    addresses = local_shards.server_list(servers)
    embedded = ops.init_embedding_table("where", 50, 4, init=torch_recdev.Constant(1.0))
    torch_recdev.connect(addresses)
    remote = ops.init_embedding_table("where", 50, 4, init=torch_recdev.Constant(2.0))
    with torch_recdev.placement("table"):
        anonymous = torch.zeros(64, 4, device="recdev")
    torch_recdev.connect(None)
    keys = torch.arange(50)
    assert torch.equal(ops.emb_read(embedded, keys).cpu(), torch.ones(50, 4))
    assert torch.equal(ops.emb_read(remote, keys).cpu(), torch.full((50, 4), 2.0))
    anonymous[3] = 5.0
    assert anonymous.sum().item() == 20.0
    # The named table of the current (embedded) store is the embedded one.
    assert torch.equal(ops.emb_read(ops.init_embedding_table("where", 50, 4), keys).cpu(), torch.ones(50, 4))


def server_tables(server):
    return torch_recdev.server_stats(server.address)["tables"]


def test_anonymous_tables_are_freed_with_their_storage(start_shards):
    servers = start_shards(2)
    torch_recdev.connect(local_shards.server_list(servers))
    before = [server_tables(s) for s in servers]
    with torch_recdev.placement("table"):
        w = torch.ones(1000, 8, device="recdev")
    assert [server_tables(s) for s in servers] == [n + 1 for n in before]
    torch_recdev.connect(None)  # the table still lives, and is freed, in the remote store
    assert w[10].sum().item() == 8
    del w
    assert [server_tables(s) for s in servers] == before


def test_errors_name_the_server_and_the_operation(start_shards):
    servers = start_shards(2)
    torch_recdev.connect(local_shards.server_list(servers))
    t = ops.init_embedding_table("named_errors", 100, 4)
    with pytest.raises(ValueError, match=r"shard 0 of 2.*table 'named_errors' already exists and differs from its declaration in shape: the table is 100 x 4, declared 100 x 8"):
        ops.init_embedding_table("named_errors", 100, 8)
    with pytest.raises(IndexError, match="out of range"):
        ops.emb_read(t, torch.tensor([100]))
    ops.emb_write(t, torch.tensor([0]), torch.ones(1, 4))
    servers[0].stop()
    servers[1].stop()
    with pytest.raises(ConnectionError, match=r"recdev-server 127.0.0.1:\d+ \(shard [01] of 2\)(, [A-Z_]+)?: .*(closed|cannot connect)"):
        ops.emb_read(t, torch.arange(10))


def test_recdev_servers_makes_the_store_remote(start_shards):
    servers = start_shards(2)
    addresses = local_shards.server_list(servers)
    code = textwrap.dedent(
        """
        import torch, torch_recdev
        info = torch_recdev.store_info()
        assert info["kind"] == "remote" and info["shards"] == 2, info
        t = torch_recdev.ops.init_embedding_table("from_env", 10, 2)
        torch_recdev.ops.emb_write(t, torch.tensor([3]), torch.tensor([[4.0, 5.0]]))
        """
    )
    env = dict(os.environ, RECDEV_SERVERS=addresses)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    torch_recdev.connect(addresses)
    t = ops.init_embedding_table("from_env", 10, 2)
    assert ops.emb_read(t, torch.tensor([3])).cpu().tolist() == [[4.0, 5.0]]



def test_a_forked_child_talks_on_its_own_connections(remote_shards):
    torch_recdev.connect(remote_shards)
    t = ops.init_embedding_table("forked", 100, 4, init=torch_recdev.Constant(3.0))
    keys = torch.arange(100)
    assert ops.emb_read(t, keys).sum().item() == 1200  # the pools now hold open connections
    pid = os.fork()
    if pid == 0:  # a DataLoader worker, say
        code = 1
        try:
            for _ in range(30):
                assert ops.emb_read(t, keys).sum().item() == 1200
            code = 0
        finally:
            os._exit(code)
    for _ in range(30):
        assert ops.emb_read(t, keys).sum().item() == 1200
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_an_idle_client_keeps_its_session_past_the_lease(start_shards):
    servers = start_shards(2, "--lease-seconds", "1")
    torch_recdev.connect(local_shards.server_list(servers))
    with torch_recdev.placement("table"):
        w = torch.full((100, 4), 2.0, device="recdev")
    time.sleep(3)  # three leases with no request: open connections and the heartbeat keep the session
    assert w.sum().item() == 800


def test_an_idle_connection_closed_by_the_server_is_replaced(start_shards):
    servers = start_shards(2, "--idle-timeout", "1")
    torch_recdev.connect(local_shards.server_list(servers))
    with torch_recdev.placement("table"):
        w = torch.full((100, 4), 2.0, device="recdev")
    assert w.sum().item() == 800
    time.sleep(3)  # past the idle timeout: the servers closed the pooled connections
    assert w.sum().item() == 800
    w.add_(1.0)
    assert w.sum().item() == 1200


def hello_frame(request_id=1):
    payload = b"RECDEVNP" + struct.pack("<HI", _testing._server.PROTOCOL_VERSION, 0) + struct.pack("<Q", 0)
    return struct.pack("<IBBHQ", len(payload), 1, 0, 0, request_id) + payload


def test_a_refused_connection_raises_the_servers_reason(start_shards):
    (server,) = start_shards(1, "--max-connections", "1")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as holder:
        holder.sendall(hello_frame())
        assert len(holder.recv(64)) > 16  # WELCOME: the one slot is taken
        with pytest.raises(ConnectionError, match=rf"recdev-server 127.0.0.1:{server.port} .*HELLO: "
                                                  r"too many connections \(--max-connections 1\)"):
            torch_recdev.connect(server.url, timeout=1.5)
    assert torch_recdev.store_info()["kind"] == "embedded"
    # The slot is free again: the client that was refused gets in.
    assert torch_recdev.connect(server.url, timeout=10)["kind"] == "remote"
