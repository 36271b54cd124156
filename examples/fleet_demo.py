"""`make fleet-demo`: the CTR job as a fleet on this machine.

Starts two recdev-server shards on 127.0.0.1, runs examples/train_ctr.py under torchrun with two
trainers (the shards named on rank 0 only, through RECDEV_SERVERS), and stops the shards whatever
happens. Arguments after `--` go to train_ctr.py.

    python examples/fleet_demo.py [--trainers 2] [--shards 2] [-- --epochs 1 ...]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile

from torch_recdev import local_shards

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trainers", type=int, default=2)
    parser.add_argument("--shards", type=int, default=2)
    args = parser.parse_args(own)
    with tempfile.TemporaryDirectory(prefix="recdev-fleet-demo-") as logs:
        servers = local_shards.start_shards(args.shards, log_dir=logs)
        try:
            server_list = local_shards.server_list(servers)
            print(f"started {args.shards} recdev-server shards: {server_list}", flush=True)
            # The servers are named on rank 0 only: torchrun's rendezvous store carries them to the others.
            launcher = os.path.join(HERE, "fleet_rank0_servers.py")
            command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.trainers),
                       "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                       launcher, server_list, *extra]
            return subprocess.run(command).returncode
        finally:
            for server in servers:
                server.stop()
            print(f"stopped the {args.shards} shards", flush=True)


if __name__ == "__main__":
    sys.exit(main())
