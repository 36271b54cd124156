"""Online learning end to end: the CTR demo trains and writes a version every K steps; a read-only
serving shard follows the versions; this process scores the held-out set through the serving shard
with every new version it sees, while training goes on, and prints the AUC per version (it rises as
the model learns).

    python examples/serve_ctr.py                       # trains too (examples/train_ctr.py)
    python examples/serve_ctr.py --checkpoint-dir D --no-train   # follows a demo someone else runs

The serving shard is `recdev-server --serve D`; the model is the demo's own code, whose table
declarations open the served tables by name on a read-only connection (`connect(..., read_only=True)`),
run in eval() under no_grad() (docs/online.md).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import torch

import torch_recdev
from torch_recdev import local_shards

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_ctr  # noqa: E402  (the demo: its data, model and tables)


def held_out(args) -> tuple:
    """The demo's held-out set: the same log, sampled after its training samples."""
    log = train_ctr.ClickLog(args.seed)
    log.sample(args.train_samples)
    return log.sample(args.test_samples)


def mlp_of(directory: str, version: int, timeout: float = 30.0) -> dict:
    path = train_ctr.mlp_path(directory, version)
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):  # renamed into place right after its version
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout} s of version {version}")
        time.sleep(0.05)
    return torch.load(path)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint-dir", help="the demo's versions (default: a temporary directory)")
    parser.add_argument("--no-train", action="store_true", help="do not start the demo; follow its directory")
    parser.add_argument("--checkpoint-every-steps", type=int, default=100)
    parser.add_argument("--train-samples", type=int, default=500_000)
    parser.add_argument("--test-samples", type=int, default=20_000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    directory = args.checkpoint_dir or tempfile.mkdtemp(prefix="recdev-serve-ctr-")
    os.makedirs(directory, exist_ok=True)
    sparse, dense, clicks, _ = held_out(args)

    server = local_shards.Server(0, 1, "--serve", directory)  # before the first version: it sees them all
    trainer = None
    if not args.no_train:
        demo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_ctr.py")
        trainer = subprocess.Popen(
            [sys.executable, demo, "--quiet", "--plot", "", "--seed", str(args.seed), "--epochs", str(args.epochs),
             "--train-samples", str(args.train_samples), "--test-samples", str(args.test_samples),
             "--checkpoint-every-steps", str(args.checkpoint_every_steps), "--checkpoint-dir", directory],
            stdout=subprocess.DEVNULL)
    results = []
    try:
        torch_recdev.connect(local_shards.server_list([server]), read_only=True)
        model, served = None, 0
        while True:
            stats = torch_recdev.server_stats(server.address)
            version = stats["serving_version"]
            if version > served:
                if model is None:
                    # The demo's own model code: its declarations open the served tables by name.
                    model = train_ctr.CTRModel(train_ctr.make_tables(lr=0.03, dtype="float32"))
                model.mlp.load_state_dict(mlp_of(directory, version))
                model.eval()
                with torch.no_grad():
                    score, loss = train_ctr.evaluate(model, (sparse, dense, clicks))
                results.append({"version": version, "auc": score, "log_loss": loss,
                                "age_seconds": stats["serving_age_seconds"]})
                print(f"version {version:3d} (written {stats['serving_age_seconds']:5.2f} s ago): held-out AUC "
                      f"{score:.4f}, log loss {loss:.4f}", flush=True)
                served = version
                continue
            if trainer is None or trainer.poll() is not None:
                # The trainer is done: its last version is served once the shard has seen it.
                if trainer is not None and trainer.returncode != 0:
                    raise RuntimeError(f"the demo failed with exit code {trainer.returncode}")
                last = max(torch_recdev.ops.versions(directory), default=0)
                if served >= last:
                    break
            time.sleep(0.1)
    finally:
        torch_recdev.connect(None)
        server.stop()
        if trainer is not None and trainer.poll() is None:
            trainer.kill()
    if len(results) >= 2:
        print(f"AUC from version {results[0]['version']} to {results[-1]['version']}: "
              f"{results[0]['auc']:.4f} -> {results[-1]['auc']:.4f}")
    return results


if __name__ == "__main__":
    main()
