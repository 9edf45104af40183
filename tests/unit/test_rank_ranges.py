"""RankRanges (issue 33): a session's expected ranks as ranges, checked against Python sets."""

from __future__ import annotations

import random

from perftracker.localizer.store.rank_ranges import RankRanges
from perftracker.localizer.store.records import SessionRecord


def test_rank_ranges_behave_as_sets_of_ranks() -> None:
    rng = random.Random(1)
    for _ in range(1000):
        base = {rng.randrange(60) for _ in range(rng.randrange(40))}
        rr = RankRanges.of(base)
        cut = [rng.randrange(-5, 70) for _ in range(rng.randrange(30))]
        want = base - set(cut)
        got = rr.without(cut)
        assert list(got) == sorted(want) and len(got) == len(want) and got == RankRanges.of(want)
        assert all((r in rr) == (r in base) for r in range(-3, 65))
        other = {rng.randrange(60) for _ in range(rng.randrange(10))}
        assert list(rr | other) == sorted(base | other)
        assert rr.count_in(set(cut)) == len(base & set(cut))
        assert RankRanges.from_json(rr.to_json()) == rr and RankRanges.from_json(sorted(base)) == rr  # old stores
        assert rr.end == (max(base) + 1 if base else 0) and rr.head(3) == sorted(base)[:3]


def test_a_claimed_world_is_one_range_and_a_session_summary_stays_small() -> None:
    big = RankRanges.span(1_000_000) | [2_000_000]
    assert big.to_json() == [[0, 1_000_000], [2_000_000, 2_000_001]] and len(big) == 1_000_001
    assert 999_999 in big and 1_000_000 not in big and -1 not in big and "x" not in big
    s = SessionRecord(1, "s", "j", "slowdown", "r", 20.0, "open", 0, 0, expected=big, uploaded=tuple(range(0, 1000, 2)))
    d = s.summary_dict()
    assert d["n_expected"] == 1_000_001 and d["n_uploaded"] == 500 and d["n_missing"] == 1_000_001 - 500
    assert len(d["missing_ranges"]) == 16 and d["missing_more"] and "expected" not in d
    assert SessionRecord(1, "s", "j", "slowdown", "r", 1.0, "open", 0, 0, expected=(3, 1, 2)).expected == [1, 2, 3]
