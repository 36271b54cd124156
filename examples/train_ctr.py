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
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
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

    def forward(self, sparse: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        embedded = [nn.functional.embedding(sparse[:, i], table) for i, table in enumerate(self.tables)]
        x = torch.cat([e.cpu() for e in embedded] + [dense], dim=1)
        return self.mlp(x).squeeze(1)


def make_tables(lr: float) -> list[torch.Tensor]:
    tables = []
    for f in FEATURES:
        table = ops.init_embedding_table(
            f"ctr.{f.name}", f.num_rows, EMBEDDING_DIM,
            init=torch_recdev.Normal(0.0, 0.01),
            optimizer=("rowwise_adagrad", {"lr": lr}),
        )
        table.requires_grad_(True)
        tables.append(table)
    return tables


def evaluate(model: CTRModel, data, batch: int = 8192) -> tuple[float, float]:
    sparse, dense, clicks, _ = data
    scores = []
    with torch.no_grad():
        for start in range(0, len(clicks), batch):
            s = torch.from_numpy(sparse[start : start + batch])
            d = torch.from_numpy(dense[start : start + batch])
            scores.append(torch.sigmoid(model(s, d)).numpy())
    prob = np.concatenate(scores)
    return auc(prob, clicks), log_loss(prob, clicks)


def plot_curves(history: list[dict], optimum: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    fig, (ax_auc, ax_loss) = plt.subplots(1, 2, figsize=(10, 4))
    ax_auc.plot(steps, [h["auc"] for h in history], marker="o", label="held-out AUC")
    ax_auc.axhline(optimum["auc"], color="green", linestyle="--", label="planted optimum")
    ax_auc.set_xlabel("training step")
    ax_auc.set_ylabel("AUC")
    ax_auc.legend()
    ax_loss.plot(steps, [h["log_loss"] for h in history], marker="o", label="held-out log loss")
    ax_loss.plot(steps, [h["train_loss"] for h in history], marker=".", label="train loss (last epoch batches)")
    ax_loss.axhline(optimum["log_loss"], color="green", linestyle="--", label="planted optimum")
    ax_loss.set_xlabel("training step")
    ax_loss.set_ylabel("log loss")
    ax_loss.legend()
    fig.suptitle("CTR model on recdev tables")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-samples", type=int, default=1_000_000)
    parser.add_argument("--test-samples", type=int, default=50_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=0.03, help="learning rate of the fused RowWiseAdagrad")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", help="directory: save after each epoch, resume from it when present")
    parser.add_argument("--plot", default="ctr_learning_curves.png", help="where to write the learning-curve PNG")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--servers", help="recdev-server shards (tcp://host:port,...); default: the embedded store "
                        "(or $RECDEV_SERVERS)")
    parser.add_argument("--max-rows", type=int, help="budget of rows per table, evicting least recently used rows "
                        "(docs/budgets.md); default: unbounded")
    parser.add_argument("--admit-after", type=int, default=1, help="store a row only from its k-th lookup on")
    args = parser.parse_args(argv)
    if args.servers:
        torch_recdev.connect(args.servers)
    print(f"store: {torch_recdev.store_info()}")

    torch.manual_seed(args.seed)
    log = ClickLog(args.seed)
    train = log.sample(args.train_samples)
    test = log.sample(args.test_samples)
    optimum = {"auc": auc(test[3], test[2]), "log_loss": log_loss(test[3], test[2])}
    baseline = {"auc": 0.5, "log_loss": log_loss(np.full(len(test[2]), train[2].mean()), test[2])}

    tables = make_tables(args.lr)
    if args.max_rows is not None or args.admit_after != 1:
        for table in tables:
            torch_recdev.set_table_policy(table, max_rows=args.max_rows, evict="lru" if args.max_rows else None,
                                          admit_after=args.admit_after)
    model = CTRModel(tables)
    dense_opt = torch.optim.Adam(model.mlp.parameters(), lr=3e-3)
    start_epoch = 0
    if args.checkpoint and os.path.exists(os.path.join(args.checkpoint, "dense.pt")):
        ops.load(os.path.join(args.checkpoint, "tables.recdev"))
        saved = torch.load(os.path.join(args.checkpoint, "dense.pt"))
        model.mlp.load_state_dict(saved["mlp"])
        dense_opt.load_state_dict(saved["optimizer"])
        start_epoch = saved["epoch"]
        print(f"resumed from {args.checkpoint} after epoch {start_epoch}")

    print(f"{len(FEATURES)} sparse features on recdev: " + ", ".join(f"{f.name} ({f.num_rows:.0e} rows)" for f in FEATURES))
    print(f"train {args.train_samples} / held-out {args.test_samples} samples, click rate {train[2].mean():.3f}")
    print(f"planted optimum on held-out: AUC {optimum['auc']:.4f}, log loss {optimum['log_loss']:.4f}")

    sparse, dense, clicks, _ = train
    steps_per_epoch = math.ceil(len(clicks) / args.batch_size)
    history, step, started = [], start_epoch * steps_per_epoch, time.perf_counter()
    seen = 0
    for epoch in range(start_epoch, args.epochs):
        order = np.random.default_rng(args.seed + epoch).permutation(len(clicks))
        losses = []
        bar = tqdm(range(steps_per_epoch), desc=f"epoch {epoch + 1}/{args.epochs}", disable=args.quiet, unit="batch")
        for b in bar:
            idx = order[b * args.batch_size : (b + 1) * args.batch_size]
            s, d, y = (torch.from_numpy(a[idx]) for a in (sparse, dense, clicks))
            loss = nn.functional.binary_cross_entropy_with_logits(model(s, d), y)
            dense_opt.zero_grad()
            loss.backward()  # the tables' rows are updated in the store here
            dense_opt.step()
            losses.append(loss.item())
            step += 1
            seen += len(idx)
            if b % 50 == 0:
                bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}")
        held_auc, held_loss = evaluate(model, test)
        history.append({"step": step, "auc": held_auc, "log_loss": held_loss, "train_loss": float(np.mean(losses))})
        print(f"epoch {epoch + 1}: train loss {np.mean(losses):.4f}  held-out AUC {held_auc:.4f} "
              f"(optimum {optimum['auc']:.4f}, gap {optimum['auc'] - held_auc:.4f})  log loss {held_loss:.4f} "
              f"(optimum {optimum['log_loss']:.4f})")
        if args.checkpoint:
            os.makedirs(args.checkpoint, exist_ok=True)
            ops.save(os.path.join(args.checkpoint, "tables.recdev"))
            torch.save({"mlp": model.mlp.state_dict(), "optimizer": dense_opt.state_dict(), "epoch": epoch + 1},
                       os.path.join(args.checkpoint, "dense.pt"))
    elapsed = time.perf_counter() - started

    print("\nsummary")
    total_rows = total_bytes = evicted = 0
    for f, table in zip(FEATURES, tables):
        stats = torch_recdev.table_stats(table)
        total_rows += stats["rows"]
        total_bytes += stats["bytes"]
        evicted += stats["evicted"]
        print(f"  {f.name:<11} {f.num_rows:>14,} rows in the table, {stats['rows']:>8,} materialized, "
              f"{stats['bytes'] / 2**20:8.1f} MiB held")
    dense_bytes = sum(f.num_rows for f in FEATURES) * EMBEDDING_DIM * 4
    print(f"  tables hold {total_bytes / 2**20:.1f} MiB for {total_rows:,} rows; dense tables would need "
          f"{dense_bytes / 2**30:,.0f} GiB")
    if args.max_rows is not None or args.admit_after != 1:
        print(f"  budget: max_rows {args.max_rows} per table, admit_after {args.admit_after}: {evicted:,} rows evicted")
    if seen:
        print(f"  throughput {seen / elapsed:,.0f} samples/s over {step} steps ({elapsed:.1f} s)")
    final = history[-1] if history else {"auc": evaluate(model, test)[0], "log_loss": evaluate(model, test)[1]}
    print(f"  held-out AUC {final['auc']:.4f} vs planted optimum {optimum['auc']:.4f} (gap "
          f"{optimum['auc'] - final['auc']:.4f}); majority-class baseline AUC 0.5, log loss {baseline['log_loss']:.4f}")
    if history and args.plot:
        plot_curves(history, optimum, args.plot)
        print(f"  learning curves: {args.plot}")
    return {"auc": final["auc"], "optimum": optimum, "baseline": baseline, "history": history, "evicted": evicted,
            "rows": total_rows, "bytes": total_bytes}


if __name__ == "__main__":
    main()
