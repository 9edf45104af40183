"""Issue 46 (third red-team round), items 1-3: the attacks as the issue describes them, scaled down,
each with what must be refused (at and past the limit) and what must still pass (just below it).

1. a cut process-group list with a huge ``Group size``: bounded by the trace's world, kept as a
   ``range`` (O(1) memory through the reader, the PatternSet bytes and a saved raw window);
2. a deflated ``.npy`` member declaring a huge shape: refused from its header, before inflating;
3. the window cost ledger: never written through a planted or unsafe run dir, created private.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import stat
import subprocess
import sys
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from perftracker.agent.kineto import process_groups, read_kineto_trace

from bench.hardening_third import group_bomb_traces, npz_bomb, plain_traces
from perftracker.errors import TraceError
from perftracker.model import PatternSet, ProcessGroup
from perftracker.model.npz_bounds import MAX_INFLATE_RATIO, SMALL_BYTES
from perftracker.model.patterns import RANGE_MIN
from perftracker.model.raw_window import MAX_SERIES_SAMPLES, RawWindow, SampleSet, UtilSeries
from perftracker.rundir import RunDirError, write_in_run_dir
from perftracker.runtime.window.cost import WindowCostMeter, ledger_path

CUT = "[" + ", ".join(str(r) for r in range(30)) + ", ...]"


def _doc(size: object, world: int | None, ranks: object = CUT) -> dict:  # type: ignore[type-arg]
    ev = {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 7, "tid": 7, "ts": 10.0, "dur": 1.0,
          "args": {"Process Group Name": "0", "Process Group Ranks": ranks, "Group size": size, "Seq": 0}}
    doc: dict = {"traceEvents": [ev]}  # type: ignore[type-arg]
    if world is not None:
        doc["distributedInfo"] = {"rank": 0, "world_size": world}
    return doc


def _peak_bytes(fn):  # type: ignore[no-untyped-def]
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# ---------------------------------------------------------------- item 1
def test_cut_group_list_is_bounded_by_the_traces_world() -> None:
    """The issue's trace: world 4, a cut list with Group size 9,999,999: members unknown, at once."""
    (groups, _), peak = _peak_bytes(lambda: process_groups(_doc(9_999_999, 4)))
    assert groups[0][2] == () and peak < 1 << 20
    # at the world's edge: 30 listed + continued to 64 members, ranks 0..63 in a world of 64: kept
    assert tuple(process_groups(_doc(64, 64))[0][0][2]) == tuple(range(64))
    assert process_groups(_doc(65, 64))[0][0][2] == ()  # rank 64 is past a world of 64
    # no world named: bounded by the rank cap only (and kept as a range, below)
    assert len(process_groups(_doc(64, None))[0][0][2]) == 64


def test_a_huge_group_the_world_allows_is_a_range_of_constant_size() -> None:
    (groups, _), peak = _peak_bytes(lambda: process_groups(_doc(9_999_999, 10_000_000)))
    members = groups[0][2]
    assert isinstance(members, range) and len(members) == 9_999_999 and members[-1] == 9_999_998
    assert peak < 1 << 20  # a tuple of 9,999,999 ints is about 360 MB
    # the boundary between the two forms: RANGE_MIN members a tuple, one more a range
    assert isinstance(process_groups(_doc(RANGE_MIN, 10**6))[0][0][2], tuple)
    assert isinstance(process_groups(_doc(RANGE_MIN + 1, 10**6))[0][0][2], range)


def test_a_range_group_stays_small_in_pattern_set_bytes_and_a_saved_window(tmp_path: Path) -> None:
    big = range(0, 9_999_999)
    ps = PatternSet(job="j", session="s", rank=0, world_size=10_000_000, host="h", window_start_ns=0,
                    window_end_ns=10, patterns=(), groups=(ProcessGroup("0", "", big),))
    data, peak = _peak_bytes(ps.to_bytes)
    assert len(data) < 10_000 and peak < 1 << 20
    back, peak = _peak_bytes(lambda: PatternSet.from_bytes(data))
    assert back.groups[0].ranks == big and peak < 1 << 20
    # a small group reads back as the tuple it was
    small = dataclasses.replace(ps, groups=(ProcessGroup("1", "", tuple(range(0, 64, 2))),))
    assert PatternSet.from_bytes(small.to_bytes()).groups == small.groups
    d = group_bomb_traces(tmp_path / "t", files=1, groups=2, world=10_000_000)
    raw = read_kineto_trace(d / "rank0.json")
    assert [type(g[2]) for g in raw.meta.process_groups] == [range, range]
    saved = RawWindow.load(raw.save(tmp_path / "w.npz"))
    assert saved.meta.process_groups == raw.meta.process_groups


def _analyze(d: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], float]:
    code = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True);"
            "sys.stdout.write(r.stdout); sys.stderr.write(r.stderr);"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(r.returncode)")
    done = subprocess.run([sys.executable, "-c", code, sys.executable, "-m", "perftracker", "analyze", str(d),
                           "--format", "json", *extra], capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, PERFTRACKER_DISABLE="1"))
    return done, int(done.stderr.strip().splitlines()[-1]) / 1024


def test_analyze_of_group_bombs_stays_small(tmp_path: Path) -> None:
    """Four ~12 KB traces with eight groups of 9,999,999 members each, in a world that allows
    them (the worst case after the world bound): before, gigabytes; now a range end to end."""
    d = group_bomb_traces(tmp_path / "t", files=4, groups=8, world=10_000_000)
    done, rss_mb = _analyze(d, "-j", "2")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["ranks_reported"] == [0, 1, 2, 3]
    assert rss_mb < 600, rss_mb  # one tuple of those members alone is about 360 MB


# ---------------------------------------------------------------- item 2
def test_a_deflated_samples_bomb_is_refused_before_it_is_inflated(tmp_path: Path) -> None:
    """The issue's file held 100,000,000 zeros per member (778 KB); 10,000,000 here (5x the limit)."""
    bomb = npz_bomb(tmp_path / "rank1.samples.npz", elements=10_000_000)
    assert bomb.stat().st_size < 300_000
    said, peak = _peak_bytes(lambda: _load_error(bomb))
    assert "declares shape" in said and peak < 4 << 20  # the headers only, not 800 MB
    # within the shape limit but inflating more than MAX_INFLATE_RATIO: refused by the ratio
    ratio = npz_bomb(tmp_path / "ratio.npz", elements=MAX_SERIES_SAMPLES)
    with pytest.raises(TraceError, match=f"more than {MAX_INFLATE_RATIO}x"):
        SampleSet.load(ratio)
    # a deflated member of at most SMALL_BYTES may inflate as it likes (zeros at 1 kHz are fine)
    small = npz_bomb(tmp_path / "small.npz", elements=SMALL_BYTES // 8)
    assert len(SampleSet.load(small).series["cpu"].t_ns) == SMALL_BYTES // 8


def _load_error(path: Path) -> str:
    try:
        SampleSet.load(path)
    except TraceError as exc:
        return str(exc)
    raise AssertionError(f"{path} loaded")


def test_sample_and_window_shapes_at_and_past_their_limits(tmp_path: Path) -> None:
    n = MAX_SERIES_SAMPLES
    t = np.arange(n, dtype=np.int64)
    ok = SampleSet({"cpu": UtilSeries("cpu", t, np.zeros(n, np.float32), 1000)}).save(tmp_path / "ok.npz")
    assert len(SampleSet.load(ok).series["cpu"].t_ns) == n  # at the limit, stored as perftracker writes it
    over = SampleSet({"cpu": UtilSeries("cpu", np.arange(n + 1, dtype=np.int64), np.zeros(n + 1, np.float32),
                                        1000)}).save(tmp_path / "over.npz")
    with pytest.raises(TraceError, match="declares shape"):
        SampleSet.load(over)
    # a two-dimensional member, an unexpected member, an object array: refused
    for name, arr in (("t_cpu", np.zeros((2, 2), np.int64)), ("x_extra", np.zeros(2)),):
        with zipfile.ZipFile(tmp_path / "odd.npz", "w") as zf, zf.open(name + ".npy", "w") as fh:
            np.lib.format.write_array(fh, arr)
        with pytest.raises(TraceError):
            SampleSet.load(tmp_path / "odd.npz")
    # a raw window whose column declares 10**9 rows, deflated: refused before reading
    raw = read_kineto_trace(plain_traces(tmp_path / "tr", ranks=1) / "rank0.json")
    good = raw.save(tmp_path / "raw.npz")
    assert len(RawWindow.load(good)) == len(raw)
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(tmp_path / "rawbomb.npz", "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if info.filename == "col_start_ns.npy":
                with dst.open(info.filename, "w", force_zip64=True) as fh:
                    np.lib.format.write_array_header_1_0(fh, {"descr": "<i8", "fortran_order": False,
                                                              "shape": (10**9,)})
                    fh.write(b"\0" * (1 << 20))  # the rest never needs to exist: it is not read
            else:
                dst.writestr(info.filename, src.read(info))
    with pytest.raises(TraceError, match="declares shape"):
        RawWindow.load(tmp_path / "rawbomb.npz")


def test_analyze_warns_about_the_bomb_and_reports_every_rank(tmp_path: Path) -> None:
    d = plain_traces(tmp_path / "t")
    npz_bomb(d / "rank1.samples.npz", elements=20_000_000)
    done, rss_mb = _analyze(d, "-j", "1")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["ranks_reported"] == [0, 1]
    assert "samples not read" in done.stderr and "declares shape" in done.stderr
    assert rss_mb < 400, rss_mb


# ---------------------------------------------------------------- item 3
class _Runtime:
    iteration = 0

    def recent_iteration_ms(self) -> list[float]:
        return [10.0] * 5


def _plant(run_dir: Path, victim: Path, pids: range) -> None:
    (run_dir / "budget").mkdir(parents=True)
    for pid in pids:
        (run_dir / "budget" / f"j-rank0.json.{pid}.tmp").symlink_to(victim)
    for p in (run_dir, run_dir / "budget"):
        os.chmod(p, 0o1777)
        if os.geteuid() == 0:
            os.chown(p, 10001, 10001)


def test_the_ledger_is_not_written_through_a_planted_run_dir(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                                             ) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    run_dir = tmp_path / "perftracker-run"
    _plant(run_dir, victim, range(os.getpid(), os.getpid() + 1))
    meter = WindowCostMeter(_Runtime(), ledger_path(run_dir, "j", 0))
    with caplog.at_level(logging.WARNING, logger="perftracker.runtime.window.cost"):
        meter._write()
        meter._write()
    assert victim.read_text() == "precious\n"
    assert not (run_dir / "budget" / "j-rank0.json").exists()
    said = [r.getMessage() for r in caplog.records if "ledger not written" in r.getMessage()]
    assert len(said) == 1 and ("owned by" in said[0] or "writable" in said[0])  # once, with why


def test_the_ledger_and_its_folders_are_private_and_a_shared_run_dir_keeps_its_mode(tmp_path: Path) -> None:
    fresh = tmp_path / "a" / "perftracker-run"
    WindowCostMeter(_Runtime(), ledger_path(fresh, "j", 0))._write()
    ledger = fresh / "budget" / "j-rank0.json"
    assert json.loads(ledger.read_text())["windows"] == []
    assert [stat.S_IMODE(p.stat().st_mode) for p in (fresh, fresh / "budget", ledger)] == [0o700, 0o700, 0o600]
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o750)
    os.chmod(shared, 0o750)
    WindowCostMeter(_Runtime(), ledger_path(shared, "j", 1))._write()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o750 and (shared / "budget" / "j-rank1.json").exists()


def test_write_in_run_dir_refuses_symlinks_and_replaces_a_planted_file_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (run / "budget").symlink_to(elsewhere)
    with pytest.raises(RunDirError, match="symlink"):
        write_in_run_dir(run, run / "budget" / "x.json", "{}")
    assert not list(elsewhere.iterdir())
    link_run = tmp_path / "link-run"
    link_run.symlink_to(run)
    with pytest.raises(RunDirError, match="symlink"):
        write_in_run_dir(link_run, link_run / "x.json", "{}")
    (run / "y.json").symlink_to(victim)  # a link at the file's own name is replaced, not followed
    write_in_run_dir(run, run / "y.json", "{}")
    assert victim.read_text() == "precious\n" and (run / "y.json").read_text() == "{}"
    assert not (run / "y.json").is_symlink()



# ---------------------------------------------------------------- lows: analyze's directory walk and warnings
def test_a_directory_1500_levels_deep_is_walked_without_recursion(tmp_path: Path) -> None:
    from perftracker.cli.analyze import trace_files

    deep = tmp_path / "t"
    deep.mkdir()
    for _ in range(1500):  # one level at a time (Path.mkdir(parents=True) itself recurses)
        deep = deep / "d"
        os.mkdir(deep)
    top = plain_traces(tmp_path / "t", ranks=1)
    (deep / "rank1.pt.trace.json").write_text((top / "rank0.json").read_text())
    (tmp_path / "t" / "d" / "loop").symlink_to(tmp_path / "t")  # a link back up is not followed
    try:
        files = trace_files(tmp_path / "t")
        assert sorted(f.name for f in files) == ["rank0.json", "rank1.pt.trace.json"]
    finally:  # bottom up: shutil.rmtree (pytest's cleanup) recurses too
        (deep / "rank1.pt.trace.json").unlink()
        while deep != tmp_path / "t":
            for extra in deep.iterdir():
                extra.unlink()
            deep.rmdir()
            deep = deep.parent


def test_many_unreadable_files_give_a_bounded_number_of_warning_lines(tmp_path: Path) -> None:
    """The review's 20,000 empty JSON files printed 20,000 warnings; 120 here, with two ranks."""
    from perftracker.cli.analyze import MAX_SKIP_WARNINGS

    d = plain_traces(tmp_path / "t")
    for i in range(120):
        (d / f"empty{i:03d}.json").write_text("")
    done = subprocess.run([sys.executable, "-m", "perftracker", "analyze", str(d), "--format", "json", "-j", "2"],
                          capture_output=True, text=True, timeout=240, env=dict(os.environ, PERFTRACKER_DISABLE="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["ranks_reported"] == [0, 1]
    per_file = [ln for ln in done.stderr.splitlines() if "] skipped" in ln]
    assert len(per_file) == MAX_SKIP_WARNINGS
    assert f"{120 - MAX_SKIP_WARNINGS} more file(s) skipped" in done.stderr and "120 of 122 file(s) skipped" in done.stderr


def test_a_report_file_with_a_huge_integer_is_one_error_line(tmp_path: Path) -> None:
    """A 4,000-digit `window_s` passed JSON (under Python's 4,300-digit limit) and broke the renderers
    with an OverflowError traceback; integers of more than 20 digits are refused when read."""
    from report_samples import slow_compute_report

    good = slow_compute_report().to_dict()
    cases = {"ok": good, "21 digits": {**good, "created_ns": 10**20}, "4,001 digits": {**good, "window_s": 10**4000}}
    out = {}
    for label, doc in cases.items():
        path = tmp_path / f"{len(out)}.json"
        path.write_text(json.dumps(doc))
        done = subprocess.run([sys.executable, "-m", "perftracker", "report", "--file", str(path), "--format", "text"],
                              capture_output=True, text=True, timeout=120, env=dict(os.environ, PERFTRACKER_DISABLE="1"))
        out[label] = (done.returncode, "Traceback" in done.stderr, done.stderr.strip().splitlines()[-1:] if done.stderr else [])
    assert out["ok"][:2] == (0, False)
    for label in ("21 digits", "4,001 digits"):
        rc, traceback, last = out[label]
        assert rc == 1 and not traceback and "digits" in last[0], (label, out[label])
