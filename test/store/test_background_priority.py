"""Version files are written at background priority (csrc/store/background_priority.h,
docs/online.md): the thread that writes a version's file runs at nice 19, or at
RECDEV_BACKGROUND_NICE, while the caller's thread keeps its own priority. Each case runs in a process
of its own, since the niceness is read once per process, and watches the process's threads in /proc
while a checkpoint of a table of a few hundred MB is written."""

import os
import subprocess
import sys
import textwrap

import pytest

WATCH = textwrap.dedent("""
    import os, sys, tempfile, threading, torch
    import torch_recdev
    from torch_recdev import ops

    def nices():
        found = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):  # a thread that ended meanwhile
                continue
            found[int(tid)] = int(fields[16])  # field 19 of proc(5), counted after the name
        return found

    torch_recdev.connect(None)
    rows = 150_000
    table = ops.init_embedding_table("priority", rows, 64, optimizer=("adagrad", {"lr": 0.1}), reset=True)
    ops.emb_update(table, torch.arange(rows), torch.ones(rows, 64))
    directory = tempfile.mkdtemp()
    caller = {}
    done = threading.Event()

    def checkpoint():
        caller["tid"] = threading.get_native_id()
        ops.checkpoint(directory)
        caller["nice"] = os.getpriority(os.PRIO_PROCESS, caller["tid"])
        done.set()

    worker = threading.Thread(target=checkpoint)
    worker.start()
    seen = set()
    while not done.is_set():
        seen.update(nice for tid, nice in nices().items() if tid != caller.get("tid"))
    worker.join()
    print(max(seen), caller["nice"], os.getpriority(os.PRIO_PROCESS, 0))
""")


@pytest.mark.parametrize("setting,expected", [(None, 19), ("5", 5), ("0", 0)], ids=["default", "nice-5", "off"])
def test_version_file_written_at_background_priority(setting, expected):
    env = dict(os.environ)
    env.pop("RECDEV_BACKGROUND_NICE", None)
    if setting is not None:
        env["RECDEV_BACKGROUND_NICE"] = setting
    done = subprocess.run([sys.executable, "-c", WATCH], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    highest, caller, main = map(int, done.stdout.split())
    assert highest == expected, f"the writing thread ran at nice {highest}, not {expected}"
    assert caller == 0 and main == 0, "the caller's and the main thread's priority must stay as they were"
