"""Fault-injection benchmark with ground truth: precision and recall of detection and localization.

    python bench/faults.py --scenario bench/scenarios/*.toml [--workers N] [--quick] [--single-host]

For each scenario it starts an N-worker job of perftracker/examples/train.py (gloo), one torchrun per emulated
host (a network namespace on a bridge, rendezvous on the bridge addresses), a node agent per host
and one localizer service in the root namespace. It injects the scenario's faults, lets
perftracker work as a user would (the detector triggers, or `perftracker trigger` at the given
iteration), waits for the report and scores it (bench/faultkit/scoring.py). When the detector
fires before a fault's onset (on host noise), the harness waits on for a session at or after the
onset and scores the findings of every report the run produced.

Without network namespaces (not root, no iproute2) it says so, runs in single-host mode on
loopback, and skips the network scenarios, listing them as skipped.

Progress goes to stderr; the last stdout line is one JSON object:
{"scenarios": int, "precision": float, "recall": float, "headline_correct": float, "clean_false_findings": int,
 "max_detection_delay_iters": int, "max_report_s": float, ...}
With crash scenarios (category "crash") also "crash_scenarios" and "crash_first_rank_named" (how many
of them have the expected first failing rank as their report's culprit). ``--category crash`` (or
hang) runs only the scenarios that expect that category.
("onsets_missed": detector scenarios with no trigger at or after the fault's onset; "skipped", "mode";
"max_hang_report_after_fault_s": hang scenarios, from the fault applied to the hang report stored.)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.faultkit.hosts import EmulatedHosts, cleanup_stale, namespaces_available  # noqa: E402
from bench.faultkit.job import JobRun, RunResult  # noqa: E402
from bench.faultkit.scenario import Scenario, load_scenario  # noqa: E402
from bench.faultkit.scoring import Score, headline_correct, score  # noqa: E402

log = logging.getLogger("bench.faults")
QUICK = ("clean-s0.toml", "slow-compute-rank.toml", "slow-dataloader-all.toml")


@dataclass
class Outcome:
    scenario: Scenario
    result: RunResult | None
    score: Score | None
    skipped: str = ""
    error: str = ""
    extra: dict[str, object] = field(default_factory=dict)


def _run_one(sc: Scenario, args: argparse.Namespace, netns: bool, workdir: Path) -> Outcome:
    if sc.network and not netns:
        return Outcome(sc, None, None, skipped="needs network namespaces (single-host mode)")
    token = secrets.token_hex(16)
    job = f"{sc.name}-{secrets.token_hex(3)}"
    run_dir = workdir / job
    run_dir.mkdir(parents=True)
    hosts_cm = EmulatedHosts(sc.workers) if netns else None
    try:
        hosts = hosts_cm.__enter__().hosts if hosts_cm else None
        with JobRun(sc, job, token, run_dir, hosts, iters_cap=args.iterations_cap, zero_setup=args.zero_setup) as run:
            result = run.execute(timeout_s=args.timeout_s)
        return Outcome(sc, result, score(sc, list(result.reports)))
    except Exception as exc:  # noqa: BLE001 - one scenario's failure is reported, the suite goes on
        log.exception("scenario %s failed", sc.name)
        return Outcome(sc, None, score(sc, None), error=f"{type(exc).__name__}: {exc}")
    finally:
        if hosts_cm:
            hosts_cm.cleanup()


def _watches_onset(sc: Scenario) -> bool:
    """The detector has to catch this scenario's fault (its onset counts the detection delay)."""
    return sc.trigger == "detector" and sc.onset_iter is not None


def _iteration_ms(o: Outcome) -> float | None:
    """Median iteration time in the profile window, over the ranks the report kept."""
    rep = o.result.report if o.result else None
    values = [v for series in (rep.iteration_ms.values() if rep else ()) for v in series]
    return float(statistics.median(values)) if values else None


def _table(outcomes: list[Outcome]) -> str:
    """One row per scenario. ``iter_ms``: median iteration in the window; ``slower``: that against
    the clean scenarios of the same run (the fault's size, to check the 10-50% calibration)."""
    clean = [ms for o in outcomes if not o.skipped and not o.scenario.expect and (ms := _iteration_ms(o))]
    base = statistics.median(clean) if clean else None
    head = (f"{'scenario':24} {'P':>5} {'R':>5} {'TP':>3} {'FP':>3} {'head':>4} {'delay':>6} {'report_s':>8} "
            f"{'iter_ms':>7} {'slower':>6}  headline / note")
    lines = [head, "-" * len(head)]
    for o in outcomes:
        if o.skipped:
            lines.append(f"{o.scenario.name:24} {'-':>5} {'-':>5} {'-':>3} {'-':>3} {'-':>4} {'-':>6} {'-':>8} {'-':>7} {'-':>6}  "
                         f"SKIPPED: {o.skipped}")
            continue
        ms = _iteration_ms(o)
        it = "-" if ms is None else f"{ms:.1f}"
        slower = "-" if ms is None or not base else f"{ms / base - 1:+.0%}"
        s = o.score
        assert s is not None
        r = o.result
        delay = "-" if r is None or r.detection_delay_iters is None else str(r.detection_delay_iters)
        if r is not None and r.detection_delay_iters is None and _watches_onset(o.scenario):
            delay = "missed"
        rep_s = "-" if r is None or r.report_s is None else f"{r.report_s:.1f}"
        note = o.error or ((r.report.top_line if r.report is not None else r.summary) if r else "")
        if r is not None and len(r.sessions) > 1:  # the others are scored too; name them
            note = f"[{len(r.sessions)} sessions: {'; '.join(x[:40] for x in r.sessions)}] {note}"
        hc = headline_correct(o.scenario, list(r.reports) if r else None)
        hc_text = "-" if hc is None else ("yes" if hc else "NO")
        lines.append(
            f"{o.scenario.name:24} {s.precision:5.2f} {s.recall:5.2f} {len(s.tp):3d} {len(s.fp):3d} {hc_text:>4} {delay:>6} "
            f"{rep_s:>8} {it:>7} {slower:>6}  {note[:110]}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", nargs="+", default=None, help="scenario TOML files (default: all in bench/scenarios)")
    p.add_argument("--quick", action="store_true", help=f"run only {', '.join(QUICK)}")
    p.add_argument("--category", default=None,
                   help="run only the scenarios that expect this category (e.g. crash, hang)")
    p.add_argument("--workers", type=int, default=None, help="override each scenario's worker count")
    p.add_argument("--single-host", action="store_true", help="do not use network namespaces")
    p.add_argument("--timeout-s", type=float, default=240.0, help="per-scenario time limit")
    p.add_argument("--iterations-cap", type=int, default=None, help="cap each scenario's iterations")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--zero-setup", action="store_true",
                   help="start no localizer or agent and pass no URL: each emulated host's workers start their own "
                        "agent and the job finds its one localizer through its rendezvous store (issue 42)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)

    scen_dir = REPO / "bench" / "scenarios"
    files = [Path(f) for f in args.scenario] if args.scenario else sorted(scen_dir.glob("*.toml"))
    if args.quick:
        files = [scen_dir / q for q in QUICK] if not args.scenario else [f for f in files if f.name in QUICK]
    scenarios = [load_scenario(f, args.workers) for f in files]
    if args.category:
        scenarios = [sc for sc in scenarios if any(m.category == args.category for m in sc.expect)]

    netns = False
    if not args.single_host:
        netns, why = namespaces_available()
        if not netns:
            log.warning("network namespaces unavailable (%s): single-host mode on loopback; network scenarios are skipped", why)
    if not netns:
        sys.stderr.write("MODE: single-host (loopback); network scenarios will be SKIPPED, not passed\n")
    else:
        sys.stderr.write("MODE: emulated hosts (one network namespace per worker)\n")
        stale = cleanup_stale()
        if stale:
            log.info("removed stale namespaces/bridges: %s", stale)

    def _sigterm(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _sigterm)
    workdir = Path(tempfile.mkdtemp(prefix="perftracker-faults-"))
    outcomes: list[Outcome] = []
    try:
        for i, sc in enumerate(scenarios, 1):
            sys.stderr.write(f"[{i}/{len(scenarios)}] {sc.name}: {sc.workers} workers, trigger={sc.trigger}\n")
            t0 = time.monotonic()
            outcomes.append(_run_one(sc, args, netns, workdir))
            sys.stderr.write(f"[{i}/{len(scenarios)}] {sc.name}: done in {time.monotonic() - t0:.0f} s\n")
    except KeyboardInterrupt:
        sys.stderr.write("interrupted: cleaned up; partial results follow\n")
    finally:
        if netns:
            cleanup_stale()
        if not args.keep:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)

    sys.stderr.write(_table(outcomes) + "\n")
    ran = [o for o in outcomes if not o.skipped and o.score is not None]
    tp = sum(len(o.score.tp) for o in ran if o.score)
    fp = sum(len(o.score.fp) for o in ran if o.score)
    expected = sum(len(o.score.expected) for o in ran if o.score)
    found = sum(len(o.score.found) for o in ran if o.score)
    clean_fp = sum(len(o.score.fp) for o in ran if o.score and not o.scenario.expect)
    delays = [o.result.detection_delay_iters for o in ran if o.result and o.result.detection_delay_iters is not None]
    missed = sum(1 for o in ran if _watches_onset(o.scenario) and (o.result is None or o.result.detection_delay_iters is None))
    report_s = [o.result.report_s for o in ran if o.result and o.result.report_s is not None]
    hang_s = [o.result.fault_to_report_s for o in ran if o.result and o.result.fault_to_report_s is not None
              and any(m.category == "hang" for m in o.scenario.expect)]
    heads = [headline_correct(o.scenario, list(o.result.reports) if o.result else None) for o in ran]
    heads = [h for h in heads if h is not None]
    # every report's headline (issue 32: at most 120 characters), the longest
    headline_chars = [len(rep.top_line) for o in ran if o.result for rep in o.result.reports]
    summary = {
        "scenarios": len(ran),
        "skipped": len(outcomes) - len(ran),
        "mode": "netns" if netns else "single-host",
        "localizer": "zero-setup" if args.zero_setup else "explicit-url",
        "precision": round(tp / (tp + fp), 4) if tp + fp else 1.0,
        "recall": round(found / expected, 4) if expected else 1.0,
        "headline_correct": round(sum(heads) / len(heads), 4) if heads else 1.0,
        "clean_false_findings": clean_fp,
        "max_detection_delay_iters": max(delays) if delays else -1,
        "onsets_missed": missed,  # detector scenarios with no trigger at or after the fault's onset
        "max_report_s": round(max(report_s), 2) if report_s else -1.0,
        # hang scenarios: the fault (a SIGSTOP, ...) applied -> the hang report stored
        "max_hang_report_after_fault_s": round(max(hang_s), 2) if hang_s else -1.0,
        "max_headline_chars": max(headline_chars, default=0),
    }
    crashes = [o for o in ran if any(m.category == "crash" for m in o.scenario.expect)]
    if crashes:  # the crash scenarios' headline: the first failing rank named (issue 22)
        named = [headline_correct(o.scenario, list(o.result.reports) if o.result else None) for o in crashes]
        summary["crash_scenarios"] = len(crashes)
        summary["crash_first_rank_named"] = sum(1 for n in named if n)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
