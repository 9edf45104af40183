"""Scoring a report against a scenario's ground truth. Pure: no I/O.

A finding is a (function, rank) pair the report flags; for hang reports, each rank the report
names as culprit or silent is a finding of category "hang"; for crash reports, of category "crash". Precision and recall are counted over
(rank, category) pairs:

- a pair is a true positive if some flagged (function, rank) with that category matches an [[expect]];
- it is neutral if it matches no [[expect]] but an [[allow]];
- otherwise it is a false positive.
- recall = expected (rank, category) pairs found / expected pairs.

A run can produce several reports (a detector that fired on host noise before the fault began,
then again at the onset); a user reads them all, so their findings are scored together: a false
finding in any of them counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.faultkit.scenario import Match, Scenario
from perftracker.model import Report


@dataclass(frozen=True)
class Flag:
    rank: int
    category: str
    kind: str
    name: str


@dataclass(frozen=True)
class Score:
    tp: frozenset[tuple[int, str]]
    fp: frozenset[tuple[int, str]]
    neutral: frozenset[tuple[int, str]]
    expected: frozenset[tuple[int, str]]
    found: frozenset[tuple[int, str]]

    @property
    def precision(self) -> float:
        n = len(self.tp) + len(self.fp)
        return len(self.tp) / n if n else 1.0

    @property
    def recall(self) -> float:
        return len(self.found) / len(self.expected) if self.expected else 1.0


def flags_of(report: Report | None) -> list[Flag]:
    if report is None:
        return []
    flags = [
        Flag(r, f.category.value, f.kind, f"{f.key} {f.label}") for f in report.findings for r in f.ranks
    ]
    category = "crash" if report.kind == "crash" else "hang"
    for s in report.hang_states:
        if s.state in ("culprit", "silent"):
            flags.append(Flag(s.rank, category, "specific", f"{s.where} {s.detail}"))
    return flags


def _matches(m: Match, flag: Flag) -> bool:
    if m.ranks is not None and flag.rank not in m.ranks:
        return False
    if m.category != flag.category:
        return False
    if m.kind and m.kind != flag.kind:
        return False
    return not (m.name and m.name.lower() not in flag.name.lower())


def score(scenario: Scenario, report: Report | Sequence[Report] | None) -> Score:
    reports = report if isinstance(report, Sequence) else [report]
    flags = [fl for r in reports for fl in flags_of(r)]
    expected = {
        (r, m.category)
        for m in scenario.expect
        for r in (m.ranks if m.ranks is not None else range(scenario.workers))
    }
    tp, fp, neutral, found = set(), set(), set(), set()
    for fl in flags:
        pair = (fl.rank, fl.category)
        hits = [m for m in scenario.expect if _matches(m, fl)]
        if hits:
            tp.add(pair)
            if pair in expected:
                found.add(pair)
        elif any(_matches(m, fl) for m in scenario.allow):
            neutral.add(pair)
        else:
            fp.add(pair)
    # a pair that matched an expect through one function is not also a false positive through another
    fp -= tp
    neutral -= tp
    return Score(frozenset(tp), frozenset(fp), frozenset(neutral), frozenset(expected), frozenset(found))


def headline_flags(report: Report | None) -> list[Flag]:
    """What the report's headline names: the ranks of its first finding (the summary), or for a
    hang the culprit and silent ranks."""
    if report is None:
        return []
    if report.findings:
        f = report.findings[0]
        return [Flag(r, f.category.value, f.kind, f"{f.key} {f.label}") for r in f.ranks]
    return [fl for fl in flags_of(report) if fl.category in ("hang", "crash")]


def headline_correct(scenario: Scenario, report: Report | Sequence[Report] | None) -> bool | None:
    """Whether the headline a user reads first names a true culprit with an expected category: the
    first finding of the run's last report (the one that answers the fault) matches an [[expect]].
    None for a scenario without faults (nothing to name)."""
    if not scenario.expect:
        return None
    reports = [r for r in (report if isinstance(report, Sequence) else [report]) if r is not None]
    if not reports:
        return False
    flags = headline_flags(reports[-1])
    return bool(flags) and any(_matches(m, fl) for fl in flags for m in scenario.expect)
