"""`perftracker analyze DIR`: the real command line on the shared dlrm traces and on bad directories."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

from perftracker.model import PatternSet, Report
from tests.conftest import REPO


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "perftracker", "analyze", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_dlrm_report_json_and_progress(dlrm_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    r = analyze(str(dlrm_dir), "--format", "json", "-o", str(out), "-j", "2")
    assert r.returncode == 0, r.stderr
    assert "[8/8] rank" in r.stderr
    report = Report.from_dict(json.loads(out.read_text()))
    assert report.ranks_reported == tuple(range(8)) and report.ranks_missing == ()
    assert report.job == "dlrm_kineto" and report.profile == "gpu"
    assert report.findings or report.top_functions


def test_dlrm_patterns_and_html(dlrm_dir: Path, tmp_path: Path) -> None:
    r = analyze(str(dlrm_dir), "--patterns", "--format", "json", "-j", "2")
    assert r.returncode == 0, r.stderr
    sets = [PatternSet.from_dict(d) for d in json.loads(r.stdout)]
    assert [ps.rank for ps in sets] == list(range(8))
    assert all(ps.world_size == 8 and ps.source == "kineto" for ps in sets)
    html = tmp_path / "r.html"
    r = analyze(str(dlrm_dir), "--format", "html", "-o", str(html), "-j", "2")
    assert r.returncode == 0, r.stderr
    assert "<html" in html.read_text().lower()


def test_bad_and_unrelated_files_are_skipped_with_a_warning_and_strict_fails(dlrm_dir: Path, tmp_path: Path) -> None:
    """One truncated trace and a stray config.json among good traces: a report over the good ones,
    one warning line per skipped file, the truncated file's rank in ranks_missing; --strict fails."""
    for f in sorted(dlrm_dir.glob("*.json.gz"))[:2]:  # ranks 0 and 1
        shutil.copy(f, tmp_path / f.name)
    bad = tmp_path / "worker3_step_12.pt.trace.json.gz"
    bad.write_bytes(gzip.compress(b'{"traceEvents": [')[:-4])
    (tmp_path / "config.json").write_text('{"lr": 0.1}')
    out = tmp_path / "report.json"
    r = analyze(str(tmp_path), "--format", "json", "-o", str(out), "-j", "2")
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("perftracker: warning: [")]
    assert len(warnings) == 2, r.stderr
    assert any(str(bad) in w and "rank 3 missing" in w and "truncated" in w for w in warnings), warnings
    assert any("config.json" in w and "not a Kineto trace" in w for w in warnings), warnings
    report = Report.from_dict(json.loads(out.read_text()))
    assert report.ranks_reported == (0, 1) and 3 in report.ranks_missing
    r = analyze(str(tmp_path), "--strict", "-j", "2")
    assert r.returncode == 1 and not r.stdout
    err = [line for line in r.stderr.splitlines() if line.startswith("perftracker: error")]
    assert len(err) == 1 and "--strict" in err[0], r.stderr
    assert "Traceback" not in r.stderr


def test_recursive_trace_handler_layout_and_single_trace_rank(dlrm_dir: Path, tmp_path: Path) -> None:
    """tensorboard_trace_handler writes <dir>/<run>/<worker>.<ts>.pt.trace.json.gz: found below the
    directory. A single trace without distributedInfo needs --rank, and the error says so."""
    src = sorted(dlrm_dir.glob("*.json.gz"))
    for i, f in enumerate(src[:2]):
        sub = tmp_path / "tb" / f"run{i}"
        sub.mkdir(parents=True)
        shutil.copy(f, sub / f.name)
    (tmp_path / "tb" / "run0" / "notes.json").write_text("{}")  # not *.pt.trace.json below the top: ignored
    r = analyze(str(tmp_path / "tb"), "--patterns", "--format", "json", "-j", "2")
    assert r.returncode == 0, r.stderr
    assert [d["rank"] for d in json.loads(r.stdout)] == [0, 1] and "warning" not in r.stderr
    doc = json.load(gzip.open(src[0]))
    del doc["distributedInfo"]
    single = tmp_path / "trace.json"
    single.write_text(json.dumps(doc))
    r = analyze(str(single))
    assert r.returncode == 1 and "--rank R" in r.stderr, r.stderr
    r = analyze(str(single), "--rank", "5", "--patterns", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert [d["rank"] for d in json.loads(r.stdout)] == [5]
    r = analyze(str(tmp_path / "tb"), "--rank", "0")
    assert r.returncode == 1 and "--rank names the rank of one trace file" in r.stderr


def test_ranks_from_file_names_and_duplicates(dlrm_dir: Path, tmp_path: Path) -> None:
    src = sorted(dlrm_dir.glob("*.json.gz"))[0]
    doc = json.load(gzip.open(src))
    del doc["distributedInfo"]
    for r in (0, 1, 2):
        (tmp_path / f"rank{r}.json").write_text(json.dumps(doc))
    res = analyze(str(tmp_path), "--patterns", "--format", "json")
    assert res.returncode == 0, res.stderr
    assert [d["rank"] for d in json.loads(res.stdout)] == [0, 1, 2]
    assert "rank taken from the file name" in res.stderr
    dup = tmp_path / "dup"
    dup.mkdir()
    shutil.copy(src, dup / "a.json.gz")
    shutil.copy(src, dup / "b.json.gz")
    res = analyze(str(dup))
    assert res.returncode == 1 and "appears twice" in res.stderr
    # with the flag, names win over distributedInfo
    (dup / "a.json.gz").rename(dup / "rank_0.json.gz")
    (dup / "b.json.gz").rename(dup / "rank_1.json.gz")
    res = analyze(str(dup), "--rank-from-filename", "--patterns")
    assert res.returncode == 0, res.stderr
    assert "rank 0" in res.stdout and "rank 1" in res.stdout


def test_empty_dir(tmp_path: Path) -> None:
    r = analyze(str(tmp_path))
    assert r.returncode == 1 and "no Kineto trace files" in r.stderr

