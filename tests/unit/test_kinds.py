"""The model's str-valued enums (perftracker/model/kinds.py, issue 48): each member is the very
string it names (JSON, formatting, hashing unchanged), and the report's JSON schema lists exactly
their values."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path

import pytest

from perftracker.model.kinds import RankStateName, ReportKind, SessionState, Spread, Test

SCHEMA = Path(__file__).resolve().parents[2] / "localizer" / "render" / "report.schema.json"


@pytest.mark.parametrize("enum", [ReportKind, Spread, Test, RankStateName, SessionState])
def test_every_member_is_its_string(enum: type[StrEnum]) -> None:
    for m in enum:
        assert m == m.value and hash(m) == hash(m.value) and f"{m}" == str(m) == m.value
        assert json.dumps({m: [m]}) == json.dumps({m.value: [m.value]})


def test_the_report_schema_lists_the_enums_values() -> None:
    s = json.loads(SCHEMA.read_text())
    finding = s["$defs"]["finding"]["properties"]
    assert set(s["properties"]["kind"]["enum"]) == {m.value for m in ReportKind}
    assert set(finding["kind"]["enum"]) == set(finding["spread"]["enum"]) == {m.value for m in Spread}
    assert set(finding["tests"]["items"]["enum"]) == {m.value for m in Test}
    assert set(s["$defs"]["rank_state"]["properties"]["state"]["enum"]) == {m.value for m in RankStateName}
