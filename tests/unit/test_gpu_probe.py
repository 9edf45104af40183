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


class _StaleGpm:
    """GPM as NVML documents it: two samples closer than 100 ms read stale (0 here); apart, the load's 80 %.
    nvidia-ml-py's own metrics structure. NOT VERIFIED ON HARDWARE: the probe exists to measure this."""

    def __init__(self) -> None:
        import pynvml

        self.c_nvmlGpmMetricsGet_t = pynvml.c_nvmlGpmMetricsGet_t
        self.sample_t = pynvml.c_nvmlGpmSample_t

    def nvmlGpmSampleAlloc(self) -> object:
        return self.sample_t()

    def nvmlGpmSampleGet(self, h: str, s: object) -> object:
        return s

    def nvmlGpmSampleFree(self, s: object) -> None:
        pass

    def nvmlGpmMetricsGet(self, mg: object) -> object:
        for i in range(mg.numMetrics):  # type: ignore[attr-defined]
            mg.metrics[i].nvmlReturn = 0  # type: ignore[attr-defined]
            mg.metrics[i].value = 80.0 if self.gap_s >= 0.1 else 0.0  # type: ignore[attr-defined]
        return mg

    gap_s = 0.0  # the probe's interval, set by the test


@pytest.mark.parametrize("interval_ms", [20, 200])
def test_the_gpm_probe_reports_shares_of_zero(interval_ms: int) -> None:
    pytest.importorskip("pynvml")
    from bench.gpu_probe import _gpm_at

    nv = _StaleGpm()
    nv.gap_s = interval_ms / 1000
    got = _gpm_at(nv, "gpu0", interval_ms, 0.5)
    sm = got["2"]
    assert sm["n"] >= 2 and sm["nan"] == 0.0 and sm["over_100"] == 0.0
    assert sm["zero"] == (1.0 if interval_ms < 100 else 0.0) and sm["median"] == (0.0 if interval_ms < 100 else 80.0)
