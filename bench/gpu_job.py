"""A CUDA training job under `perftracker run`, end to end: the device check's second half.

    python bench/gpu_job.py [--iters 900] [--fault-at 250] [--device cuda|cpu] [--out DIR]

Two torchrun ranks train an MLP on the GPU (both on GPU 0 on a one-GPU machine; DDP over gloo,
which carries CUDA tensors: NCCL refuses two ranks on one GPU). From iteration ``--fault-at`` on,
rank 1 runs extra matrix products on its GPU (``aten::mm`` kernels, about half its step again).
perftracker's own detector must trigger, every rank must record a window with CUDA activities (its
conversion child forked from a CUDA process), the node agent's samplers must read the GPU each
rank uses through NVML, and the report must name rank 1.

Checked and printed (one JSON object on the last line):
- ``reports``: every session's level, trigger, headline, first finding's ranks and category;
- ``named_rank1``: a report's first finding names rank 1 (and not rank 0);
- ``windows``: per rank, the raw window's CUDA kernel / memcpy / runtime rows, and the sample
  series the agent's samplers wrote (``sm``, ``sm_clock``, ``power`` ... with their source);
- ``gpu_pick``: the samplers' log lines saying which GPU each rank's process was found on;
- ``fork``: the windows' writer lines (a conversion child in a CUDA process);
- ``errors``.
``--device cpu`` runs the same job on CPU (the script's own check, no GPU parts expected).
Exit 0 when the report names rank 1 and (on CUDA) the windows carry kernels and NVML series.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def child(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    from torch import nn

    import perftracker  # noqa: F401  (the only change a user makes)

    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        dev = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    dist.init_process_group("gloo")
    torch.manual_seed(1234)
    hidden = args.hidden
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(hidden, hidden), nn.ReLU()]
    model = nn.Sequential(*layers).to(dev)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(99 + rank)
    data = [torch.randn(args.batch, hidden, generator=gen) for _ in range(8)]
    loader = torch.utils.data.DataLoader(data * (args.iters // 8 + 1), batch_size=None)
    extra_a = torch.randn(args.fault_n, args.fault_n, device=dev)
    t0 = time.monotonic()
    for it, x in enumerate(loader):
        if it >= args.iters:
            break
        x = x.to(dev, non_blocking=True)
        loss = ddp(x).pow(2).mean()
        if rank == 1 and it >= args.fault_at:
            y = extra_a
            for _ in range(args.fault_mm):
                y = torch.mm(y, extra_a) * 1e-3  # the slow rank: extra GPU compute on the critical path
            loss = loss + y.mean() * 0.0
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if dev.type == "cuda" and it % 50 == 0:
            torch.cuda.synchronize(dev)
        if it % 100 == 0 and rank == 0:
            print(f"[gpu_job] rank 0 iteration {it}, {time.monotonic() - t0:.1f} s", flush=True)
    dist.destroy_process_group()
    return 0


def _window_rows(path: Path) -> dict[str, Any]:
    import numpy as np

    from perftracker.model.raw_window import EventKind, RawWindow

    w = RawWindow.load(path)
    kind = w.col("kind")
    vals, counts = np.unique(kind, return_counts=True)
    kinds = {EventKind(int(v)).name.lower(): int(c) for v, c in zip(vals.tolist(), counts.tolist(), strict=True)}
    name_ids = w.col("name_id")[kind == int(EventKind.KERNEL)]
    kernels = sorted({w.names[int(i)][:60] for i in np.unique(name_ids).tolist()})
    return {"rank": w.meta.rank, "rows": int(len(kind)), "kinds": kinds, "kernel_names": kernels[:8],
            "local_world_size": w.meta.local_world_size}


def _samples(path: Path) -> dict[str, Any]:
    from perftracker.model.raw_window import SampleSet

    s = SampleSet.load(path)
    return {k: {"n": int(len(v.t_ns)), "source": v.source,
                "mean": round(float(v.value.mean()), 4) if len(v.t_ns) else None} for k, v in s.series.items()}


def parent(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = out / "runs"
    env = {**os.environ, "PERFTRACKER_WINDOW_BUDGET_INITIAL_S": "72", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "perftracker", "run", "--nproc-per-node", "2", "--data-dir", str(data),
           "--window-s", str(args.window_s), "--keep-windows", "-v", "--",
           str(Path(__file__).resolve()), "--child", "--device", args.device, "--iters", str(args.iters),
           "--fault-at", str(args.fault_at), "--hidden", str(args.hidden), "--layers", str(args.layers),
           "--batch", str(args.batch), "--fault-mm", str(args.fault_mm), "--fault-n", str(args.fault_n)]
    result: dict[str, Any] = {"device": args.device, "errors": []}
    t0 = time.monotonic()
    print("[gpu_job] " + " ".join(cmd), flush=True)
    with open(out / "run.log", "w") as log_fh:
        proc = subprocess.run(cmd, stdout=log_fh, stderr=subprocess.STDOUT, env=env, cwd=str(out),
                              timeout=args.timeout_s)
    result["run_rc"] = proc.returncode
    result["run_s"] = round(time.monotonic() - t0, 1)
    named = False
    reports = []
    for path in sorted((data / "reports").glob("*.json")):
        try:
            r = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            result["errors"].append(f"report {path.name}: {exc}")
            continue
        first = (r.get("findings") or [{}])[0]
        reports.append({"session": r.get("session"), "level": r.get("level"), "status": r.get("status"),
                        "trigger": r.get("trigger_reason"), "window_cost": r.get("window_cost"),
                        "headline": r.get("headline"), "ranks": first.get("ranks"), "category": first.get("category"),
                        "ranks_missing": r.get("ranks_missing")})
        ranks = first.get("ranks") or []
        named = named or (1 in ranks and 0 not in ranks)
    result["reports"] = reports
    text = subprocess.run([sys.executable, "-m", "perftracker", "report", "latest", "--data-dir", str(data)],
                          capture_output=True, text=True, timeout=120)
    (out / "report.txt").write_text(text.stdout + text.stderr)
    print(text.stdout, flush=True)
    result["named_rank1"] = named
    windows: dict[str, Any] = {}
    for p in sorted(data.rglob("*")):
        if not p.is_file():
            continue
        try:
            if p.name.endswith(".npz") and "samples" in p.name:
                windows.setdefault(p.name, {})["samples"] = _samples(p)
            elif p.suffix in (".npz", ".raw") or "raw" in p.name:
                windows.setdefault(p.name, {})["window"] = _window_rows(p)
        except Exception as exc:  # noqa: BLE001 - one unreadable file is reported, the rest go on
            windows.setdefault(p.name, {})["error"] = f"{type(exc).__name__}: {exc}"
    result["windows"] = windows
    logs = "\n".join(p.read_text(errors="replace") for p in [out / "run.log", *data.rglob("*.log")] if p.is_file())
    result["gpu_pick"] = sorted(set(re.findall(r"nvml: GPU for pid \d+: .*", logs)))[:8]
    result["sampler_unavailable"] = sorted(set(re.findall(r"sampler \w+ unavailable: .*", logs)))[:8]
    result["fork"] = sorted(set(re.findall(r".*(?:fork \d|forked|child).*", logs)))[:6]
    if args.device == "cuda":
        has_series = any("sm" in (v.get("samples") or {}) for v in windows.values())
        if not has_series:
            result["errors"].append("no window carries an NVML 'sm' series")
    if not named:
        result["errors"].append("no report's first finding names rank 1 alone")
    result["ok"] = not result["errors"]
    result["wall_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(result, default=str))
    return 0 if result["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--iters", type=int, default=900)
    p.add_argument("--fault-at", type=int, default=250, help="rank 1's extra GPU compute starts here")
    p.add_argument("--fault-mm", type=int, default=12, help="extra matrix products per step on rank 1")
    p.add_argument("--fault-n", type=int, default=4096, help="their size (n x n, float32)")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--window-s", type=float, default=10.0)
    p.add_argument("--timeout-s", type=float, default=300.0)
    p.add_argument("--out", default="gpu-job-out")
    args = p.parse_args(argv)
    return child(args) if args.child else parent(args)


if __name__ == "__main__":
    raise SystemExit(main())
