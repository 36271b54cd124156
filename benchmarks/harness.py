"""Shared benchmark plumbing: timing, result rows, and the table and plot
written under benchmarks/results/.

Every workload is timed side by side with its peer in the same process and
reported as a ratio (peer time / recdev time: above 1 means recdev is faster),
next to the target its issue sets."""

from __future__ import annotations

import gc
import os
import statistics
import time
from dataclasses import dataclass

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


@dataclass
class Row:
    workload: str
    recdev_s: float
    peer: str
    peer_s: float
    target: str  # e.g. ">= 0.83" (speed ratio the issue asks for)
    target_ratio: float

    @property
    def ratio(self) -> float:
        return self.peer_s / self.recdev_s

    @property
    def met(self) -> bool:
        return self.ratio >= self.target_ratio

    @property
    def verdict(self) -> str:
        """'-' for a row shown for reference, with no target to meet."""
        return "-" if self.target_ratio == 0 else ("yes" if self.met else "NO")


@dataclass
class Fact:
    """A measured figure that is not a timing race (memory, creation time)."""

    name: str
    value: str
    target: str
    met: bool


@dataclass
class Grid:
    """A measured table (e.g. throughput against table size), rendered as is."""

    title: str
    columns: list[str]
    rows: list[list[str]]


def median_seconds(fn, *, repeat: int, warmup: int = 2) -> float:
    """Median wall time of fn() over `repeat` runs, after `warmup` runs."""
    for _ in range(warmup):
        fn()
    gc.collect()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def compare(fn_recdev, fn_peer, *, repeat: int, rounds: int = 3) -> tuple[float, float]:
    """Times recdev and peer in alternating rounds, so that drift in machine
    load affects both alike; each side's best round counts."""
    recdev, peer = [], []
    for _ in range(rounds):
        recdev.append(median_seconds(fn_recdev, repeat=repeat))
        peer.append(median_seconds(fn_peer, repeat=repeat))
    return min(recdev), min(peer)


def _fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def markdown(title: str, rows: list) -> str:
    races = [r for r in rows if isinstance(r, Row)]
    facts = [r for r in rows if isinstance(r, Fact)]
    grids = [r for r in rows if isinstance(r, Grid)]
    lines = [f"## {title}", ""]
    if races:
        lines += [
            "| workload | recdev | peer | peer time | ratio (peer/recdev) | target | met |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in races:
            lines.append(
                f"| {r.workload} | {_fmt_time(r.recdev_s)} | {r.peer} | {_fmt_time(r.peer_s)} "
                f"| {r.ratio:.2f}× | {r.target} | {r.verdict} |"
            )
        lines.append("")
    if facts:
        lines += ["| measure | value | target | met |", "|---|---|---|---|"]
        for f in facts:
            lines.append(f"| {f.name} | {f.value} | {f.target} | {'yes' if f.met else 'NO'} |")
        lines.append("")
    for g in grids:
        lines += [f"**{g.title}**", "", "| " + " | ".join(g.columns) + " |", "|" + "---|" * len(g.columns)]
        lines += ["| " + " | ".join(row) + " |" for row in g.rows]
        lines.append("")
    return "\n".join(lines)


def plot(path: str, sections: dict[str, list[Row]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for section in sections.values() for r in section if isinstance(r, Row)]
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(rows) + 1.5))
    labels = [r.workload for r in rows]
    ratios = [r.ratio for r in rows]
    colors = [{"yes": "tab:green", "NO": "tab:red", "-": "tab:gray"}[r.verdict] for r in rows]
    ax.barh(labels, ratios, color=colors)
    for i, r in enumerate(rows):
        ax.plot([r.target_ratio, r.target_ratio], [i - 0.4, i + 0.4], color="black")
    ax.axvline(1.0, color="grey", linestyle=":")
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("speed ratio, peer time / recdev time (log; black tick = target)")
    ax.set_title("torch_recdev benchmarks")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cache_sizes(cache_dir: str = "/sys/devices/system/cpu/cpu0/cache") -> list[str]:
    """cpu0's caches as 'L1d 48K', 'L2 2048K', ... (an L3 is shared by the cores it lists)."""
    if not os.path.isdir(cache_dir):
        return []
    caches = []
    for index in sorted(name for name in os.listdir(cache_dir) if name.startswith("index")):
        field = {}
        for key in ("level", "type", "size"):
            with open(os.path.join(cache_dir, index, key)) as f:
                field[key] = f.read().strip()
        kind = {"Data": "d", "Instruction": "i"}.get(field["type"], "")
        caches.append(f"L{field['level']}{kind} {field['size']}")
    return caches


def host_description() -> str:
    """The CPU model, its caches and the vector and checksum instructions the store's kernels choose
    among: ratios from hosts that differ here are not one figure."""
    model, flags = "unknown CPU", set()
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown CPU":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    isa = [flag for flag in ("sse4_2", "pclmulqdq", "avx2", "avx512f", "vpclmulqdq") if flag in flags]
    return f"{model}; caches {', '.join(_cache_sizes()) or 'unknown'}; {' '.join(isa) or 'no SIMD flags'}"


def write(name: str, sections: dict[str, list], preamble: str = "", out_dir: str = RESULTS_DIR) -> str:
    os.makedirs(out_dir, exist_ok=True)
    body = preamble + f"Host: {host_description()}.\n\n" + "\n".join(markdown(title, rows) for title, rows in sections.items())
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(body)
    plot(os.path.join(out_dir, f"{name}.png"), sections)
    return body
