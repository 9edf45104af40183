"""bench/onset_bound.py on synthetic iteration-time files (the real ones come from a kept fault run)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench import onset_bound


def _write_times(d: Path, ranks: int, n: int, sigma: float, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for r in range(ranks):
        dur = (30e6 * np.exp(rng.normal(0, sigma, n))).astype(np.int64)
        t = np.cumsum(dur) + 10**12
        np.savetxt(d / f"rank{r}.times", np.c_[np.arange(n), t], fmt="%d")


def test_bound_and_delay_on_quiet_series(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_times(tmp_path, 2, 700, sigma=0.03)
    assert onset_bound.main([str(tmp_path), "--steps", "0.2", "--every", "100"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["clean_fires"] == 0 and out["false_per_10k"] == 0.0
    assert out["noise_sigma"] == pytest.approx(0.03, abs=0.008)
    row = out["steps"]["0.2"]
    # +20% at 3% noise is ~6 sigmas: Lorden's bound is well under one iteration, the rule takes a few
    assert row["missed"] == 0 and 1 <= row["delay_max_found"] <= 6 and row["bound_arl10k_median"] < 1.0
    assert out["delay_over_bound"]["0.2"] == row["delay_over_bound"] and row["onsets"] == 2 * 4
    assert [r["series"] for r in out["by_series"]] == [f"{tmp_path.name}/rank0", f"{tmp_path.name}/rank1"]


def test_a_step_near_the_noise_is_slower_but_found_against_its_bound(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """+10% at 20% noise is half a sigma: the bound is ~74 iterations; the rule is found near it
    (Gaussian noise: the CUSUM grid holds the 10% size), never before the onset."""
    _write_times(tmp_path, 2, 1500, sigma=0.2, seed=3)
    assert onset_bound.main([str(tmp_path), "--steps", "0.1", "--every", "150"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    row = out["steps"]["0.1"]
    assert 60 < row["bound_arl10k_median"] < 95
    assert row["missed"] == 0 and 0.5 < row["delay_over_bound"] < 1.15


def test_missing_or_short_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no rank\\*.times"):
        onset_bound.main([str(tmp_path)])
    _write_times(tmp_path, 1, 100, sigma=0.03)
    with pytest.raises(SystemExit, match="need at least 200"):
        onset_bound.main([str(tmp_path)])
