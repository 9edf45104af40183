"""`python -m perftracker.agent.daemon.summarize_one` as a real subprocess: a raw window and samples
in, a pattern set out; a bad file is one line on stderr (the summarizer itself:
tests/unit/test_patterns.py)."""

from __future__ import annotations

import pytest

from perftracker.model import PatternSet
from perftracker.model.raw_window import EventKind as K
from tests.rawbuild import TRAIN_TID as T
from tests.rawbuild import by_key, raw_window, samples


def test_command_line_entry_point(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json
    import subprocess
    import sys

    from tests.conftest import REPO

    raw = raw_window([(K.PYTHON, "f", T, 0, 40), (K.PYTHON, "g", T, 40, 100)], window=(0, 100))
    raw_path = raw.save(tmp_path / "w.npz")
    samples("cpu", 10, [1.0] * 10).save(tmp_path / "s.npz")
    out = tmp_path / "p.bin"
    cmd = [sys.executable, "-m", "perftracker.agent.daemon.summarize_one", str(raw_path), "--samples", str(tmp_path / "s.npz"),
           "--out", str(out)]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    p = by_key(PatternSet.from_bytes(out.read_bytes()))
    assert p["g"].beta == pytest.approx(0.6) and p["g"].mu == pytest.approx(1.0)
    r = subprocess.run(cmd[:-1] + [str(tmp_path / "p.json")], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and PatternSet.from_dict(json.loads((tmp_path / "p.json").read_text())).rank == 0
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    r = subprocess.run(cmd[:3] + [str(tmp_path / "bad.npz"), "--out", str(out)], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "bad.npz" in r.stderr and len(r.stderr.strip().splitlines()) == 1
