"""What `make fleet-demo` runs on each rank: examples/train_ctr.py with RECDEV_SERVERS set on rank 0
only (the first argument), to show that the other ranks get the store through the process group.

    torchrun --nproc-per-node 2 examples/fleet_rank0_servers.py tcp://h:7070,tcp://h:7071 [train_ctr args]
"""

import os
import runpy
import sys

if __name__ == "__main__":
    servers = sys.argv[1]
    if os.environ.get("RANK") == "0":
        os.environ["RECDEV_SERVERS"] = servers  # before torch is imported: read at import
        os.environ["RECDEV_OVERLAP_UPDATES"] = "1"  # as train_ctr.py --servers connects
    sys.argv = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_ctr.py"), *sys.argv[2:]]
    runpy.run_path(sys.argv[0], run_name="__main__")
