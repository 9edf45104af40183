"""JSON renderer: ``Report.to_dict()`` as indented JSON, documented by ``report.schema.json``."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any, TextIO

from perftracker.model import Report

SCHEMA_FILE = "report.schema.json"


def render(report: Report, file: TextIO) -> None:
    """Write ``report`` to ``file`` as JSON (the schema in ``report.schema.json``)."""
    json.dump(report.to_dict(), file, indent=2, ensure_ascii=False)
    file.write("\n")


def load_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) that every rendered report validates against."""
    text = resources.files("perftracker.localizer.render").joinpath(SCHEMA_FILE).read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema
