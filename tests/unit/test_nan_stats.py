"""Row means and column medians over finite values, without numpy's empty-slice warnings (a
RuntimeWarning printed under `perftracker analyze` on a trace where a late rank has no step)."""

from __future__ import annotations

import warnings

import numpy as np
from perftracker.localizer.diagnose.method.arrays import nan_col_medians, nan_row_means


def test_row_means_skip_nan_and_give_nan_for_an_empty_row_without_a_warning() -> None:
    a = np.array([[1.0, np.nan, 3.0], [np.nan, np.nan, np.nan], [np.inf, 2.0, np.nan]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = nan_row_means(a)
    assert got[0] == 2.0 and np.isnan(got[1]) and got[2] == 2.0


def test_column_medians_skip_nan_and_give_nan_for_an_empty_column_without_a_warning() -> None:
    a = np.array([[1.0, np.nan, 5.0], [3.0, np.nan, np.nan], [2.0, np.nan, 7.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = nan_col_medians(a)
    assert got[0] == 2.0 and np.isnan(got[1]) and got[2] == 6.0
