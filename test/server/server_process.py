"""The server tests' ServerProcess (torch_recdev.local_shards' with a protocol connection of
test/server/wire.py), and a checksum of every table a connection can see. A module of its own, not
conftest.py, so that test files can import it by a name no other test directory uses."""

import hashlib

import numpy as np

import wire
from torch_recdev import local_shards


class ServerProcess(local_shards.ServerProcess):
    def connect(self, **kwargs):
        return wire.Connection(self.port, **kwargs)

    def rss_bytes(self):
        """The server process's resident memory now (VmRSS)."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError(f"no VmRSS for pid {self.proc.pid}")


def checksum(conn, tables=None):
    """A digest of every table the connection can see (or of those of `tables`, by id): description
    (with optimizer step) and rows."""
    h = hashlib.sha256()
    for table_id, name, route_key in sorted(conn.list()):
        if tables is not None and table_id not in tables:
            continue
        info = conn.info(table_id)
        h.update(repr((table_id, name, route_key, info["table"])).encode())
        ids, records, _ = conn.dump_all(table_id)
        order = np.argsort(ids)
        h.update(ids[order].tobytes())
        h.update(records[order].tobytes())
    return h.hexdigest()
