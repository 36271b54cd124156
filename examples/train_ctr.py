"""The main job: a DLRM-style click-through-rate model whose embedding tables
live on recdev, trained with a fused store-side optimizer.

The data is a synthetic click log drawn from a planted ground-truth model, so
the best achievable AUC and log loss are known and the job reports how close
training gets. Ids are Zipf-distributed over large id spaces; some tables have
10^9 rows, created at once and holding only the rows the log touches.

    python examples/train_ctr.py                  # the make demo run (embedded store)
    python examples/train_ctr.py --checkpoint DIR # save after each epoch; resume from DIR if present
    python examples/train_ctr.py --servers tcp://127.0.0.1:7070,tcp://127.0.0.1:7071
                                                  # the tables on recdev-server shards (docs/server.md)
    torchrun --nproc-per-node 2 examples/train_ctr.py --servers tcp://127.0.0.1:7070,tcp://127.0.0.1:7071
                                                  # a fleet: each rank its slice of the log, the MLP in
                                                  # DistributedDataParallel, the tables shared (docs/fleet.md)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

import torch_recdev
from torch_recdev import ops


@dataclass(frozen=True)
class Feature:
    name: str
    num_rows: int  # the table's id space
    vocab: int  # distinct ids that occur (Zipf ranks)
    zipf: float  # Zipf exponent of the id distribution
    effect_std: float  # spread of the planted per-id effect on the logit


FEATURES = [
    Feature("user_id", 10**9, 20_000, 1.10, 0.9),
    Feature("item_id", 10**9, 20_000, 1.10, 0.8),
    Feature("ad_id", 10**8, 5_000, 1.10, 0.6),
    Feature("advertiser", 10**6, 1_000, 1.20, 0.5),
    Feature("category", 10_000, 200, 1.00, 0.5),
    Feature("site", 100_000, 2_000, 1.20, 0.4),
    Feature("hour", 24, 24, 0.00, 0.3),
    Feature("device", 16, 8, 0.80, 0.3),
]
NUM_DENSE = 4
EMBEDDING_DIM = 16


# --- the planted ground truth ------------------------------------------------------------------


class ClickLog:
    """Samples (sparse ids, dense features, clicks) from the planted model:
    logit = bias + sum_f effect_f(id_f) + w . dense, click ~ Bernoulli(sigmoid(logit))."""

    def __init__(self, seed: int):
        rng = np.random.default_rng(seed)
        self.rng = rng
        self.bias = -1.2
        self.dense_weights = rng.normal(0, 0.5, NUM_DENSE)
        # Zipf rank -> id: spread the ranks over the whole id space, and plant one effect per rank.
        self.ids = [rng.choice(f.num_rows, size=f.vocab, replace=False) if f.num_rows < 10**7
                    else rng.integers(0, f.num_rows, size=f.vocab) for f in FEATURES]
        self.effects = [rng.normal(0, f.effect_std, f.vocab) for f in FEATURES]
        self.rank_probs = []
        for f in FEATURES:
            p = 1.0 / np.arange(1, f.vocab + 1) ** f.zipf
            self.rank_probs.append(p / p.sum())

    def sample(self, n: int):
        ranks = [self.rng.choice(f.vocab, size=n, p=p) for f, p in zip(FEATURES, self.rank_probs)]
        sparse = np.stack([ids[r] for ids, r in zip(self.ids, ranks)], axis=1).astype(np.int64)
        dense = self.rng.normal(0, 1, (n, NUM_DENSE)).astype(np.float32)
        logit = self.bias + sum(e[r] for e, r in zip(self.effects, ranks)) + dense @ self.dense_weights
        prob = 1 / (1 + np.exp(-logit))
        clicks = (self.rng.random(n) < prob).astype(np.float32)
        return sparse, dense, clicks, prob


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U, ties averaged)."""
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    positives = labels.sum()
    negatives = len(labels) - positives
    return float((ranks[labels == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def log_loss(prob: np.ndarray, labels: np.ndarray) -> float:
    prob = np.clip(prob, 1e-7, 1 - 1e-7)
    return float(-np.mean(labels * np.log(prob) + (1 - labels) * np.log(1 - prob)))


# --- the model ----------------------------------------------------------------------------------


class CTRModel(nn.Module):
    """Sparse features -> recdev embedding tables (pooled per feature) -> MLP on CPU."""

    def __init__(self, tables: list[torch.Tensor]):
        super().__init__()
        self.tables = tables  # named store tables, trained by their fused optimizer
        width = len(tables) * EMBEDDING_DIM + NUM_DENSE
        self.mlp = nn.Sequential(nn.Linear(width, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1))
        # What training runs the features through: the MLP itself, or its DistributedDataParallel wrapper.
        self.head = self.mlp

    def features(self, sparse: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        # F.embedding of every table in one call: on shards, one round trip for all of them.
        embedded = torch_recdev.embeddings([sparse[:, i] for i in range(len(self.tables))], self.tables)
        return torch.cat([e.cpu() for e in embedded] + [dense], dim=1)

    def forward(self, sparse: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(sparse, dense)).squeeze(1)

    def predict(self, sparse: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        """Logits without the DDP wrapper: one rank evaluates while the others train."""
        return self.mlp(self.features(sparse, dense)).squeeze(1)


@contextlib.contextmanager
def autocast_regions(enabled: bool):
    """bfloat16 autocast on both devices a step runs on: recdev for the lookups (they pass through,
    so the tables' rows come back in their own dtype) and the CPU for the MLP."""
    with torch.autocast("recdev", dtype=torch.bfloat16, enabled=enabled), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
        yield


def make_tables(lr: float, dtype: str) -> list[torch.Tensor]:
    # Declared, not reset: every rank of a fleet runs this, the first creates each table, the others
    # (and a run resumed from a checkpoint) open it with its rows.
    extra = {} if dtype == "float32" else {"dtype": getattr(torch, dtype)}
    tables = []
    for f in FEATURES:
        table = ops.init_embedding_table(
            f"ctr.{f.name}", f.num_rows, EMBEDDING_DIM,
            init=torch_recdev.Normal(0.0, 0.01),
            optimizer=("rowwise_adagrad", {"lr": lr}),
            **extra,
        )
        table.requires_grad_(True)
        tables.append(table)
    return tables


def write_version(directory: str, model: CTRModel) -> int:
    """A version of the tables (ops.checkpoint) and the MLP of the same step beside it, as
    mlp-vNNNNNNNN.pt (renamed into place right after the version: a serving process waits for it)."""
    os.makedirs(directory, exist_ok=True)
    staged = os.path.join(directory, "mlp-next.pt.tmp")
    torch.save(model.mlp.state_dict(), staged)
    version = ops.checkpoint(directory)
    os.replace(staged, mlp_path(directory, version))
    return version


def mlp_path(directory: str, version: int) -> str:
    return os.path.join(directory, f"mlp-v{version:08d}.pt")


def evaluate(model: CTRModel, data, batch: int = 1024) -> tuple[float, float]:
    # Training-sized batches: a lookup is a touch, and one batch's distinct ids must fit --max-rows.
    sparse, dense, clicks = data[:3]
    scores = []
    with torch.no_grad():
        for start in range(0, len(clicks), batch):
            s = torch.from_numpy(sparse[start : start + batch])
            d = torch.from_numpy(dense[start : start + batch])
            scores.append(torch.sigmoid(model.predict(s, d)).numpy())
    prob = np.concatenate(scores)
    return auc(prob, clicks), log_loss(prob, clicks)


def plot_curves(history: list[dict], optimum: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = [h["samples"] for h in history]
    fig, (ax_auc, ax_loss) = plt.subplots(1, 2, figsize=(10, 4))
    ax_auc.plot(samples, [h["auc"] for h in history], marker=".", label="held-out AUC (subsample)")
    ax_auc.axhline(optimum["auc"], color="green", linestyle="--", label="planted optimum")
    ax_auc.set_xlabel("training samples (all trainers)")
    ax_auc.set_ylabel("AUC")
    ax_auc.legend()
    ax_loss.plot(samples, [h["log_loss"] for h in history], marker=".", label="held-out log loss (subsample)")
    ax_loss.plot(samples, [h["train_loss"] for h in history], marker=".", label="train loss (batches since last point)")
    ax_loss.axhline(optimum["log_loss"], color="green", linestyle="--", label="planted optimum")
    ax_loss.set_xlabel("training samples (all trainers)")
    ax_loss.set_ylabel("log loss")
    ax_loss.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def start_fleet() -> tuple[int, int]:
    """(rank, world size): under torchrun, the default process group on gloo; else (0, 1)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def at_least_one(text: str) -> int:
    """argparse type of the counts: a whole number of 1 or more, or the user is told what was wrong."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-samples", type=at_least_one, default=1_000_000, help="in all, split over the ranks")
    parser.add_argument("--test-samples", type=at_least_one, default=50_000)
    parser.add_argument("--epochs", type=at_least_one, default=2)
    parser.add_argument("--batch-size", type=at_least_one, default=1024, help="per rank")
    parser.add_argument("--lr", type=float, default=0.03, help="learning rate of the fused RowWiseAdagrad")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                        help="the tables' element type")
    parser.add_argument("--autocast", choices=["bf16"],
                        help="the MLP in bfloat16 under torch.autocast (the tables stay in --dtype)")
    parser.add_argument("--sync", action="store_true",
                        help="under torchrun: synchronous table updates (every rank's step combined, docs/fleet.md)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=at_least_one, default=100,
                        help="steps between held-out evaluations on a fixed subsample (the learning curve); more "
                        "steps than a run has evaluates at each epoch's end only")
    parser.add_argument("--eval-samples", type=at_least_one, default=10_000, help="the subsample those evaluations use")
    parser.add_argument("--checkpoint", help="directory: save after each epoch, resume from it when present")
    parser.add_argument("--checkpoint-every-steps", type=at_least_one, metavar="K",
                        help="write a version of the tables (ops.checkpoint: a base, then deltas) and the MLP every K "
                        "steps into --checkpoint-dir, for serving shards to follow (examples/serve_ctr.py)")
    parser.add_argument("--checkpoint-dir", help="where --checkpoint-every-steps writes its versions")
    parser.add_argument("--plot", default="ctr_learning_curves.png", help="where to write the learning-curve PNG")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--servers", help="recdev-server shards (tcp://host:port,...); default: the embedded store "
                        "(or $RECDEV_SERVERS); under torchrun, naming them on rank 0 is enough")
    parser.add_argument("--max-rows", type=int, help="budget of rows per table, evicting least recently used rows "
                        "(docs/budgets.md); default: unbounded")
    parser.add_argument("--admit-after", type=int, default=1, help="store a row only from its k-th lookup on")
    parser.add_argument("--spill", action="store_true",
                        help="with --max-rows: evicted rows go to disk and come back on their next lookup "
                        "(docs/disk_tier.md); the disk directory is $RECDEV_DISK_DIR, else a temporary one")
    args = parser.parse_args(argv)
    if args.spill and args.max_rows is None:
        parser.error("--spill keeps the rows --max-rows evicts on disk: give --max-rows too")
    if (args.checkpoint_every_steps is None) != (args.checkpoint_dir is None):
        parser.error("--checkpoint-every-steps and --checkpoint-dir go together")
    rank, world = start_fleet()
    lead = rank == 0  # prints, evaluates, saves

    def say(*text):
        if lead:
            print(*text, flush=True)

    if args.servers:
        # backward returns once the updates are sent: the shards apply them while this process runs
        # the dense optimizer and draws the next batch (docs/remote.md, "Overlapping updates").
        torch_recdev.connect(args.servers, overlap_updates=True)
    info = torch_recdev.fleet_store()  # the other ranks take rank 0's store
    say(f"store: {info}")
    if world > 1:
        say(f"fleet: {world} trainers (torchrun), the MLP in DistributedDataParallel over gloo, table updates "
            f"{'synchronous' if args.sync else 'asynchronous'}")
        if info["kind"] == "embedded" and not args.sync:
            say("note: on the embedded store each rank trains its own copy of the tables; name servers to share "
                "them, or pass --sync to keep the copies identical")

    torch.manual_seed(args.seed)
    log = ClickLog(args.seed)
    train = log.sample(args.train_samples)
    test = log.sample(args.test_samples)
    probe = tuple(a[: args.eval_samples] for a in test)  # the fixed subsample of the learning curve
    optimum = {"auc": auc(test[3], test[2]), "log_loss": log_loss(test[3], test[2])}
    baseline = {"auc": 0.5, "log_loss": log_loss(np.full(len(test[2]), train[2].mean()), test[2])}
    probe_optimum = {"auc": auc(probe[3], probe[2]), "log_loss": log_loss(probe[3], probe[2])}

    resume = bool(args.checkpoint) and os.path.exists(os.path.join(args.checkpoint, "dense.pt"))
    if resume and (lead or info["kind"] == "embedded"):
        # Loaded before the tables are declared: the declarations keep the loaded rows. Shards are
        # loaded once, by rank 0; an embedded store is each rank's own.
        ops.load(os.path.join(args.checkpoint, "tables.recdev"))
    barrier(world)
    tables = make_tables(args.lr, args.dtype)
    if args.spill and info["kind"] == "embedded" and not os.environ.get("RECDEV_DISK_DIR"):
        torch_recdev.set_disk_dir(tempfile.mkdtemp(prefix="recdev-demo-disk-"))
    if args.max_rows is not None or args.admit_after != 1:
        for table in tables:
            torch_recdev.set_table_policy(table, max_rows=args.max_rows, evict="lru" if args.max_rows else None,
                                          admit_after=args.admit_after, spill=args.spill)
    model = CTRModel(tables)
    dense_opt = torch.optim.Adam(model.mlp.parameters(), lr=3e-3)
    # The tables' optimizer is fused into backward; with --sync its step() is where the ranks' rows meet.
    table_opt = torch_recdev.optim.RowWiseAdagrad(tables, lr=args.lr, sync=True) if args.sync else None
    start_epoch = 0
    if resume:
        saved = torch.load(os.path.join(args.checkpoint, "dense.pt"))
        model.mlp.load_state_dict(saved["mlp"])
        dense_opt.load_state_dict(saved["optimizer"])
        start_epoch = saved["epoch"]
        say(f"resumed from {args.checkpoint} after epoch {start_epoch}")
    if world > 1:
        model.head = DistributedDataParallel(model.mlp)

    say(f"{len(FEATURES)} sparse features on recdev ({args.dtype}): "
        + ", ".join(f"{f.name} ({f.num_rows:.0e} rows)" for f in FEATURES))
    say(f"train {args.train_samples} / held-out {args.test_samples} samples, click rate {train[2].mean():.3f}")
    say(f"planted optimum on held-out: AUC {optimum['auc']:.4f}, log loss {optimum['log_loss']:.4f}")

    # Each rank its own slice of the log, all slices the same length (DDP steps in lockstep).
    per_rank = len(train[2]) // world
    sparse, dense, clicks = (a[rank * per_rank : (rank + 1) * per_rank] for a in train[:3])
    steps_per_epoch = math.ceil(per_rank / args.batch_size)
    history, step, seen = [], start_epoch * steps_per_epoch, 0
    autocast = functools.partial(autocast_regions, args.autocast == "bf16")
    eval_seconds, started = 0.0, time.perf_counter()
    for epoch in range(start_epoch, args.epochs):
        order = np.random.default_rng(args.seed + epoch).permutation(per_rank)
        losses, recent = [], []
        bar = tqdm(range(steps_per_epoch), desc=f"epoch {epoch + 1}/{args.epochs}", disable=args.quiet or not lead,
                   unit="batch")
        for b in bar:
            idx = order[b * args.batch_size : (b + 1) * args.batch_size]
            s, d, y = (torch.from_numpy(a[idx]) for a in (sparse, dense, clicks))
            with autocast():
                loss = nn.functional.binary_cross_entropy_with_logits(model(s, d), y)
            dense_opt.zero_grad()
            loss.backward()  # the tables' rows are updated in the store here
            dense_opt.step()
            if table_opt is not None:
                table_opt.step()
            losses.append(loss.item())
            recent.append(losses[-1])
            step += 1
            seen += len(idx)
            if b % 50 == 0:
                bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}")
            if args.checkpoint_every_steps and step % args.checkpoint_every_steps == 0:
                barrier(world)  # every rank's updates are in the store before the version is cut
                if lead:
                    write_version(args.checkpoint_dir, model)
                barrier(world)
            if lead and (step % args.eval_every == 0 or b == steps_per_epoch - 1):
                tick = time.perf_counter()
                probe_auc, probe_loss = evaluate(model, probe)
                eval_seconds += time.perf_counter() - tick
                history.append({"step": step, "samples": step * args.batch_size * world, "auc": probe_auc,
                                "log_loss": probe_loss, "train_loss": float(np.mean(recent))})
                recent = []
        if lead:
            tick = time.perf_counter()
            held_auc, held_loss = evaluate(model, test)
            eval_seconds += time.perf_counter() - tick
            say(f"epoch {epoch + 1}: train loss {np.mean(losses):.4f}  held-out AUC {held_auc:.4f} "
                f"(optimum {optimum['auc']:.4f}, gap {optimum['auc'] - held_auc:.4f})  log loss {held_loss:.4f} "
                f"(optimum {optimum['log_loss']:.4f})")
        if args.checkpoint:
            barrier(world)  # every rank's updates are in the store before it is saved
            if lead:
                os.makedirs(args.checkpoint, exist_ok=True)
                ops.save(os.path.join(args.checkpoint, "tables.recdev"))
                torch.save({"mlp": model.mlp.state_dict(), "optimizer": dense_opt.state_dict(), "epoch": epoch + 1},
                           os.path.join(args.checkpoint, "dense.pt"))
            barrier(world)
    barrier(world)
    elapsed = time.perf_counter() - started - eval_seconds

    if not lead:
        dist.destroy_process_group()
        return {}
    print("\nsummary")
    total_rows = total_bytes = evicted = on_disk = disk_bytes = 0
    for f, table in zip(FEATURES, tables):
        stats = torch_recdev.table_stats(table)
        total_rows += stats["rows"]
        total_bytes += stats["bytes"]
        evicted += stats["evicted"]
        on_disk += stats["rows_on_disk"]
        disk_bytes += stats["disk_bytes"]
        print(f"  {f.name:<11} {f.num_rows:>14,} rows in the table, {stats['rows']:>8,} materialized, "
              f"{stats['bytes'] / 2**20:8.1f} MiB held")
    dense_bytes = sum(f.num_rows for f in FEATURES) * EMBEDDING_DIM * 4
    print(f"  tables ({args.dtype}) hold {total_bytes / 2**20:.1f} MiB for {total_rows:,} rows; dense float32 tables "
          f"would need {dense_bytes / 2**30:,.0f} GiB")
    if args.max_rows is not None or args.admit_after != 1:
        print(f"  budget: max_rows {args.max_rows} per table, admit_after {args.admit_after}: {evicted:,} rows evicted")
    if args.spill:
        print(f"  disk tier: {total_rows - on_disk:,} rows in memory, {on_disk:,} on disk "
              f"({disk_bytes / 2**20:.1f} MiB of files)")
    if seen:
        print(f"  throughput {seen * world / elapsed:,.0f} samples/s in all ({world} trainer{'s' * (world > 1)}) over "
              f"{step} steps ({elapsed:.1f} s, held-out evaluations excluded)")
    final = evaluate(model, test)
    final = {"auc": final[0], "log_loss": final[1]}
    print(f"  held-out AUC {final['auc']:.4f} vs planted optimum {optimum['auc']:.4f} (gap "
          f"{optimum['auc'] - final['auc']:.4f}); majority-class baseline AUC 0.5, log loss {baseline['log_loss']:.4f}")
    if history and args.plot:
        where = f"{info['shards']} shard{'s' * (info['shards'] != 1)}" if info["kind"] == "remote" else "embedded store"
        title = f"CTR model on recdev tables: {world} trainer{'s' * (world > 1)}, {where}"
        plot_curves(history, probe_optimum, args.plot, title)
        print(f"  learning curves: {args.plot} ({len(history)} evaluations)")
    if world > 1:
        dist.destroy_process_group()
    return {"auc": final["auc"], "optimum": optimum, "baseline": baseline, "history": history,
            "evicted": evicted, "rows": total_rows, "bytes": total_bytes, "rows_on_disk": on_disk}


if __name__ == "__main__":
    main()
