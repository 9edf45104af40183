"""`--expect FILE`: expected ranges from a user TOML file, for `perftracker localizer` and for the
embedded localizer; a bad file is refused at startup with an error naming the file and field."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from perftracker.agent.daemon.localizer_client import Uplink
from perftracker.localizer.service.embedded import discover, start_embedded
from perftracker.localizer.service.http_service import ServiceOptions
from perftracker.localizer.service.session.manager import SessionOptions
from perftracker.localizer.service.validate import validate_expect_file

from perftracker.errors import ConfigError
from tests.service_helpers import REPO, TOKEN, LocalizerProcess, make_pattern_set, workers

# every kernel of make_pattern_set holds 1-5 % of the window: above this budget on every rank
STRICT = """
[profiles.strict]
description = "a budget no compute kernel meets"

[[profiles.strict.range]]
category = "compute"
pattern = "^aten::kernel_"
beta = [0.0, 0.001]
hint = "kernel over its budget"
"""


def _strict(tmp_path: Path) -> Path:
    path = tmp_path / "strict.toml"
    path.write_text(STRICT)
    return path


def _run_session(url: str, token: str, job: str) -> dict:
    up = Uplink(url, token)
    up.register(job, "agent-0", "node0", workers(range(2), 2))
    session, _ = up.create_trigger(job, "cli", window_s=0.5)
    for rank in range(2):
        up.upload_patterns(make_pattern_set(job, session, rank, 2))
    end = time.monotonic() + 30
    while up.get_session(session)["state"] not in ("done", "failed"):
        assert time.monotonic() < end, up.get_session(session)
        time.sleep(0.1)
    s = up.get_session(session)
    assert s["state"] == "done", s["error"]
    report = up.get_report(session)
    assert report is not None
    return {"report": report, "session": session}


def _assert_strict_report(report: object, path: Path) -> None:
    assert report.profile == f"{path}:strict"  # type: ignore[attr-defined]
    kernels = [f for f in report.findings if f.key.startswith("aten::kernel_")]  # type: ignore[attr-defined]
    assert kernels and all(f.ranks == (0, 1) and "expectation" in f.tests for f in kernels)
    assert all(f.expected.hi.beta == 0.001 for f in kernels)
    assert any("kernel over its budget" in f.sentence for f in kernels)


def test_validate_expect_file_names_file_profile_and_field(tmp_path: Path) -> None:
    good = _strict(tmp_path)
    assert validate_expect_file(good) == {"gpu": "strict", "cpu": "strict"}  # one profile serves both
    bad = tmp_path / "bad.toml"
    bad.write_text(STRICT.replace("[0.0, 0.001]", "[0.5, 0.1]"))
    with pytest.raises(ConfigError, match=r"bad\.toml: profiles\.strict\.range\[0\]\.beta: need 0 <= lo <= hi <= 1"):
        validate_expect_file(bad)
    two = tmp_path / "two.toml"
    two.write_text(STRICT + STRICT.replace("strict", "gpu"))
    with pytest.raises(ConfigError, match=r"two\.toml: no profile 'cpu' \(has \['gpu', 'strict'\]\)"):
        validate_expect_file(two)
    # an unused profile with a typo is refused too
    typo = tmp_path / "typo.toml"
    typo.write_text(STRICT.replace("strict", "gpu") + STRICT.replace("strict", "cpu")
                    + STRICT.replace("strict", "spare").replace("hint =", "hnt ="))
    with pytest.raises(ConfigError, match=r"typo\.toml: profiles\.spare\.range\[0\]: unknown key\(s\) \['hnt'\]"):
        validate_expect_file(typo)
    with pytest.raises(ConfigError, match="missing.toml: expected-ranges file not found"):
        validate_expect_file(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        (tmp_path / "junk.toml").write_text("[profiles.x\n")
        validate_expect_file(tmp_path / "junk.toml")


def test_localizer_cli_localizes_with_the_expect_file(tmp_path: Path) -> None:
    path = _strict(tmp_path)
    proc = LocalizerProcess(tmp_path, tmp_path / "store.sqlite", extra=["--expect", str(path)])
    proc.start()
    try:
        _assert_strict_report(_run_session(proc.url, TOKEN, "job-x")["report"], path)
    finally:
        proc.stop()
    # the same uploads with the built-in profiles: compute is never unexpected
    proc = LocalizerProcess(tmp_path, tmp_path / "store2.sqlite")
    proc.start()
    try:
        report = _run_session(proc.url, TOKEN, "job-y")["report"]
        assert report.profile == "cpu" and not [f for f in report.findings if f.key.startswith("aten::kernel_")]
    finally:
        proc.stop()


def test_localizer_cli_refuses_a_bad_expect_file_at_startup(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(STRICT.replace('category = "compute"', 'category = "gpu"'))
    env = dict(os.environ, PERFTRACKER_TOKEN=TOKEN, PYTHONPATH=str(REPO), PERFTRACKER_DISABLE="1")
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "perftracker", "localizer", "--port", "0", "--store",
                          str(tmp_path / "s.sqlite"), "--expect", str(bad)],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 1 and time.monotonic() - t0 < 60
    assert f"perftracker: error: {bad}: profiles.strict.range[0].category: unknown category 'gpu'" in out.stderr
    assert not (tmp_path / "s.sqlite").exists()  # refused before anything started


def test_embedded_localizer_uses_the_expect_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _strict(tmp_path)
    opts = ServiceOptions(sessions=SessionOptions(default_window_s=0.2, collect_grace_s=5.0))
    runs = tmp_path / "runs"
    bad = tmp_path / "bad.toml"
    bad.write_text("[profiles]\n")
    with pytest.raises(ConfigError, match=r"bad\.toml: no \[profiles\.NAME\] table"):
        start_embedded(runs, options=opts, expect_path=bad)
    assert discover(runs) is None  # nothing started, and the runs dir is free for the next start
    with start_embedded(runs, options=opts, expect_path=path) as emb:
        _assert_strict_report(_run_session(emb.url, emb.token, "job-e")["report"], path)
    # the environment's PERFTRACKER_EXPECT serves `perftracker run` and the plain-import path
    monkeypatch.setenv("PERFTRACKER_EXPECT", str(path))
    with start_embedded(tmp_path / "runs2", options=opts) as emb:
        _assert_strict_report(_run_session(emb.url, emb.token, "job-f")["report"], path)
    monkeypatch.setenv("PERFTRACKER_EXPECT", str(bad))
    with pytest.raises(ConfigError, match="bad.toml"):
        start_embedded(tmp_path / "runs3", options=opts)
