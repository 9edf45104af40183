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


def test_bad_file_is_one_line_error(dlrm_dir: Path, tmp_path: Path) -> None:
    for f in sorted(dlrm_dir.glob("*.json.gz"))[:2]:
        shutil.copy(f, tmp_path / f.name)
    bad = tmp_path / "worker9.json.gz"
    bad.write_bytes(gzip.compress(b'{"traceEvents": [')[:-4])
    r = analyze(str(tmp_path))
    assert r.returncode == 1
    err = [line for line in r.stderr.splitlines() if line.startswith("perftracker: error")]
    assert len(err) == 1 and str(bad) in err[0]


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
