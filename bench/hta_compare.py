"""perftracker analyze and HTA (HolisticTraceAnalysis) side by side on trace sets.

    python bench/hta_compare.py DIR [DIR ...] [--scenario FILE ...]

For each trace directory (and, with --scenario, the mutated trace set of each GPU scenario), it
prints HTA's straggler candidates (``get_potential_stragglers``), HTA's temporal breakdown per
rank (idle / compute / non-compute share of GPU time, ``get_temporal_breakdown``), each rank's
step time, and perftracker analyze's findings (the same code path as the command). The last line
is one JSON object per set: {"sets": [{"name", "hta_stragglers", "perftracker_ranks", "headline"}]}.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.gpu_faults import analyze, headline  # noqa: E402
from bench.tracefault.mutate import mutate_dir  # noqa: E402
from bench.tracefault.scenario import load_gpu_scenario  # noqa: E402


def hta_view(directory: Path) -> tuple[list[int], str]:
    """HTA's straggler candidates and its temporal breakdown as a text table."""
    from hta.trace_analysis import TraceAnalysis

    quiet = io.StringIO()
    with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        ta = TraceAnalysis(trace_dir=str(directory))
        stragglers = [int(r) for r in ta.get_potential_stragglers(num_candidates=2)]
        tb = ta.get_temporal_breakdown(visualize=False)
    cols = [c for c in ("idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg") if c in tb.columns]
    lines = ["  rank " + " ".join(f"{c:>22}" for c in cols)]
    for _, row in tb.sort_values("rank").iterrows():
        lines.append(f"  {int(row['rank']):4d} " + " ".join(f"{float(row[c]):22.1f}" for c in cols))
    return sorted(stragglers), "\n".join(lines)


def one(name: str, directory: Path) -> dict[str, object]:
    stragglers, breakdown = hta_view(directory)
    report = analyze(directory, 0)
    print(f"=== {name} ({directory})")
    print(f"HTA potential stragglers: {stragglers}")
    print("HTA temporal breakdown (share of each rank's GPU time):")
    print(breakdown)
    print(f"perftracker analyze: {len(report.findings)} findings; headline: {headline(report)}")
    for f in report.findings[:8]:
        ranks = ",".join(map(str, f.ranks)) if len(f.ranks) < 8 else "all"
        print(f"  {f.category.value:10} {f.kind:8} r{ranks:8} {f.sentence[:110]}")
    flagged = sorted({r for f in report.findings if f.kind != "common" for r in f.ranks})
    return {"name": name, "hta_stragglers": stragglers, "perftracker_ranks": flagged, "headline": headline(report)[:160]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="*", type=Path, metavar="DIR", help="per-rank Kineto trace directories, as recorded")
    p.add_argument("--scenario", nargs="*", default=[], metavar="FILE", help="GPU scenarios: compare on their mutated sets")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    rows = [one(d.name, d) for d in args.dirs]
    work = Path(tempfile.mkdtemp(prefix="perftracker-hta-"))
    try:
        for f in args.scenario:
            sc = load_gpu_scenario(f)
            out = work / sc.name
            mutate_dir(sc.traces, out, sc.faults, sc.steps, sc.seed)
            rows.append(one(f"scenario {sc.name}", out))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"sets": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
