"""Draw one step of a GPU fault scenario: the culprit rank and a waiting peer, before (unmutated
re-timing) and after the mutation, one above the other.

    python bench/plot_gpu_fault.py [--scenario bench/gpu_scenarios/slow-gpu-r2.toml] [--peer 0]
                                   [--step 2] [-o docs/img/gpu-fault-slow-gpu.png]

Lanes per rank: host (the main thread's and autograd thread's ops), GPU compute stream(s), GPU
NCCL stream. Bench-only (matplotlib, in the `bench` extra).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.tracefault.build import JobGraph  # noqa: E402
from bench.tracefault.faults import apply_faults  # noqa: E402
from bench.tracefault.graph import solve, topological_order  # noqa: E402
from bench.tracefault.scenario import load_gpu_scenario  # noqa: E402
from bench.tracefault.traces import read_trace_dir, tile  # noqa: E402

COLORS = {"compute": "#1f77b4", "nccl": "#d62728", "memcpy": "#2ca02c", "host": "#9e9e9e", "sync": "#ff7f0e"}


def _lane_and_color(jg: JobGraph, i: int) -> tuple[str, str] | None:
    e = jg.events[i]
    if e.gpu:
        if e.nccl:
            return "GPU NCCL", COLORS["nccl"]
        return "GPU compute", COLORS["memcpy"] if e.cat != "kernel" else COLORS["compute"]
    if e.cat in ("cuda_runtime", "cuda_driver"):
        if "Synchronize" in e.name or e.name.startswith("cudaMemcpy"):
            return "host", COLORS["sync"]
        return None
    if e.cat == "cpu_op":
        return "host", COLORS["host"]
    return None


def draw(ax: object, jg: JobGraph, t: np.ndarray, ranks: list[tuple[int, str]], step: int, t0: float) -> None:
    ylabels, y = [], 0
    for rank, role in ranks:
        for lane in ("host", "GPU compute", "GPU NCCL"):
            bars: dict[str, list[tuple[float, float]]] = {}
            for i, e in enumerate(jg.events):
                if e.rank != rank or e.tile != step:
                    continue
                lc = _lane_and_color(jg, i)
                if lc is None or lc[0] != lane:
                    continue
                s, d = (t[2 * i] - t0) / 1000, (t[2 * i + 1] - t[2 * i]) / 1000
                bars.setdefault(lc[1], []).append((s, max(d, 0.004)))
            for color, b in bars.items():
                ax.broken_barh(b, (y - 0.35, 0.7), facecolors=color, linewidth=0)  # type: ignore[attr-defined]
            ylabels.append(f"rank {rank} ({role})\n{lane}")
            y -= 1
        y -= 0.5
    ys = []
    y = 0
    for _ in ranks:
        ys += [y, y - 1, y - 2]
        y -= 3.5
    ax.set_yticks(ys)  # type: ignore[attr-defined]
    ax.set_yticklabels(ylabels, fontsize=8)  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", type=Path, default=REPO / "bench" / "gpu_scenarios" / "slow-gpu-r2.toml")
    p.add_argument("--peer", type=int, default=0, help="the waiting peer to draw (default 0)")
    p.add_argument("--step", type=int, default=2, help="which copy of the step to draw (default 2: steady state)")
    p.add_argument("-o", "--output", type=Path, default=REPO / "docs" / "img" / "gpu-fault-slow-gpu.png")
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    sc = load_gpu_scenario(args.scenario)
    culprit = sc.faults[0].ranks[0]
    ranks = read_trace_dir(sc.traces)
    tile(ranks, sc.steps)
    from bench.tracefault.build import build

    jg = build(ranks)
    order = topological_order(jg.graph)
    resid = (jg.residual_us, jg.has_in)
    before = solve(jg.graph, jg.graph.w0_us, order, resid)
    after = solve(jg.graph, apply_faults(jg, sc.faults, sc.seed), order, resid)
    sel = [i for i, e in enumerate(jg.events) if e.tile == args.step and e.rank in (culprit, args.peer)]
    t0 = min(before[2 * i] for i in sel)
    t0_after = min(after[2 * i] for i in sel)
    span = max(max(after[2 * i + 1] - t0_after for i in sel), max(before[2 * i + 1] - t0 for i in sel)) / 1000
    fig, axes = plt.subplots(2, 1, figsize=(13, 7.5), sharex=True)
    who = [(culprit, "culprit"), (args.peer, "waits")]
    fault = sc.faults[0]
    params = ", ".join(f"{k}={v}" for k, v in fault.params.items())
    for ax, t, start, title in ((axes[0], before, t0, "before: dlrm re-timed without faults (a steady-state copy of the recorded step)"),
                                (axes[1], after, t0_after, f"after: {fault.kind}({params}) on rank {culprit}")):
        draw(ax, jg, t, who, args.step, start)
        ends = [t[2 * i + 1] for i in sel]
        ax.set_title(f"{title}  —  {(max(ends) - start) / 1000:.1f} ms from the first to the last event of this step on the two ranks", fontsize=10, loc="left")
        ax.set_xlim(0, span * 1.02)
        ax.grid(axis="x", alpha=0.3)
    axes[1].set_xlabel(f"ms from the start of step {args.step} (of {sc.steps}) on these two ranks")
    legend = [Patch(color=COLORS["host"], label="host op (cpu_op)"), Patch(color=COLORS["sync"], label="host sync / blocking copy"),
              Patch(color=COLORS["compute"], label="compute kernel"), Patch(color=COLORS["memcpy"], label="GPU copy"),
              Patch(color=COLORS["nccl"], label="NCCL kernel (incl. waiting)")]
    fig.legend(handles=legend, loc="upper center", ncol=5, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.output, dpi=110)
    print(args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
