"""The device check's summary (bench/gpu_probe.py, issue 43): every check counted, a stage that
printed nothing (killed by its timeout, crashed) is a FAIL, a SKIP says why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu_probe import summarize


def test_summary_counts_checks_and_fails_a_silent_stage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    facts = tmp_path / "facts.jsonl"
    facts.write_text("\n".join([json.dumps({"check": "torch", "status": "VALUE", "version": "2.3.1"}),
                                json.dumps({"check": "nvml", "status": "SKIP", "reason": "no CUDA GPU"}),
                                "a stray log line"]) + "\n")
    capture = tmp_path / "capture.jsonl"
    capture.write_text("")  # timed out before its first line
    ok = tmp_path / "window_tests.jsonl"
    ok.write_text(json.dumps({"check": "window_tests", "status": "PASS"}) + "\n")
    assert summarize([str(facts), str(ok)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == ["VALUE torch", "SKIP  nvml (no CUDA GPU)", "PASS  window_tests"]
    assert json.loads(out[-1]) == {"summary": {"PASS": 1, "FAIL": 0, "VALUE": 1, "SKIP": 1}, "fail": [], "skip": ["nvml"]}
    assert summarize([str(facts), str(capture), str(tmp_path / "missing.jsonl")]) == 1
    last = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert last["fail"] == ["capture", "missing"] and last["summary"]["FAIL"] == 2
