"""The localizer's integer-set helpers and the fast paths of issue 45 give what the plain code gives."""

from __future__ import annotations

import numpy as np
import pytest
from perftracker.localizer.diagnose.evidence.host_bound import beta_sum
from perftracker.localizer.diagnose.method.intsets import columns_of, setdiff_ints, unique_ints
from perftracker.localizer.diagnose.verdict import shares

from perftracker.model import Wait
from perftracker.model.report import compress_ranks


@pytest.mark.parametrize("n", [0, 1, 2, 7, 5000, 60_000])
def test_unique_and_setdiff_equal_numpy(n: int) -> None:
    rng = np.random.default_rng(n)
    for dtype in (np.int64, np.int32):
        a = rng.integers(-40, 40 if n < 1000 else 10**6, n).astype(dtype)
        b = rng.integers(-40, 10**6, n // 2 + 1).astype(dtype)
        for x in (a, np.unique(a)):  # unsorted with repeats, and already sorted and distinct
            got, want = unique_ints(x), np.unique(x)
            assert np.array_equal(got, want) and got.dtype == want.dtype
            assert np.array_equal(setdiff_ints(x, b), np.setdiff1d(x, b))
            assert np.array_equal(setdiff_ints(x, []), np.setdiff1d(x, []))


def test_columns_of_equals_the_dict_lookup() -> None:
    rng = np.random.default_rng(5)
    for _ in range(30):
        ranks = rng.permutation(rng.choice(100_000, int(rng.integers(1, 3000)), replace=False))
        column = {int(r): w for w, r in enumerate(ranks.tolist())}
        wanted = rng.integers(0, 100_000, int(rng.integers(0, 500))).tolist() + ranks[:20].tolist() * 2
        assert columns_of(ranks, tuple(wanted)).tolist() == [column[r] for r in wanted if r in column]
    assert columns_of(np.arange(3), ()).size == 0


def _plain_runs(ranks: list[int]) -> str:
    rs = sorted(set(ranks))
    parts, i = [], 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(parts)


def test_compress_ranks_of_many_ranks_equals_the_plain_runs() -> None:
    rng = np.random.default_rng(3)
    cases = [list(range(10_000)), rng.integers(0, 20_000, 9000).tolist(), list(range(6000))[::-1],
             [3] * 5000 + [1, 2], list(range(5000)) + [7000, 7001, 9000], [-5, *range(4100)]]
    for ranks in cases:
        assert compress_ranks(ranks) == _plain_runs(ranks)
        assert compress_ranks(tuple(ranks)) == _plain_runs(ranks)


def test_wait_shares_of_many_ranks_equal_the_plain_loops() -> None:
    """The same floats: each rank's shares added in the same order."""
    rng = np.random.default_rng(11)
    for _ in range(15):
        waits = [Wait(f"f{i}", tuple(sorted(set(rng.integers(0, 30_000, int(rng.integers(1, 9000))).tolist()))),
                      float(rng.normal(0.05, 0.1))) for i in range(int(rng.integers(1, 6)))]
        total: dict[int, float] = {}
        for w in waits:
            for r in w.ranks:
                total[r] = total.get(r, 0.0) + max(0.0, w.share)
        assert shares.per_rank_wait(waits) == min(1.0, max(total.values()))
        culprits = set(rng.integers(0, 30_000, int(rng.integers(1, 60))).tolist())
        want = []
        for w in waits:
            kept = tuple(r for r in w.ranks if r not in culprits)
            if kept:
                want.append(w if len(kept) == len(w.ranks) else Wait(w.function, kept, w.share))
        assert shares.without_culprits(waits, culprits) == tuple(want)


def test_beta_sum_equals_numpy_sum_bit_for_bit() -> None:
    values = np.random.default_rng(0).random((12, 3, 10_001)) ** 3
    rows = [0, 2, 3, 5, 8, 11]
    assert np.array_equal(beta_sum(values, rows), values[rows, 0, :].sum(axis=0))
    assert np.array_equal(beta_sum(values, []), np.zeros(10_001))
