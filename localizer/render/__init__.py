"""Renderers: take a Report, write it. They compute nothing, and never reorder findings.

The report formats are one static table, ``REGISTRY`` (issue 48 item 5): each format's name, the
file suffixes that imply it, a line of help and its render function. ``write(report, fmt, file)``
renders through it; the CLI's ``--format`` choices and the format an ``-o`` suffix implies come
from it (``perftracker.cli.formats``). Adding a format: a module here with ``render(report, file)``
and one row below. Each render function imports its module when called, so that the table stays
light to import (the CLI reads it for ``--help``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from perftracker.localizer.render.names import mu_names, short_frame

from perftracker.errors import PerftrackerError
from perftracker.model import Report

__all__ = ["FORMATS", "REGISTRY", "ReportFormat", "format_of_path", "mu_names", "short_frame", "write"]


def _text(report: Report, file: TextIO, **options: Any) -> None:
    from perftracker.localizer.render import text

    text.render(report, file, **options)


def _json(report: Report, file: TextIO, **options: Any) -> None:
    from perftracker.localizer.render import json

    json.render(report, file, **options)


def _html(report: Report, file: TextIO, **options: Any) -> None:
    from perftracker.localizer.render import html

    html.render(report, file, **options)


@dataclass(frozen=True)
class ReportFormat:
    """One report format: its name (``--format NAME``), the ``-o`` suffixes that imply it, its help."""

    name: str
    suffixes: tuple[str, ...]
    help: str
    render: Callable[..., None]


REGISTRY: dict[str, ReportFormat] = {f.name: f for f in (
    ReportFormat("text", (".txt",), "the terminal report (rich text)", _text),
    ReportFormat("json", (".json",), "the report as JSON (report.schema.json)", _json),
    ReportFormat("html", (".html", ".htm"), "one self-contained HTML page", _html),
)}
FORMATS = tuple(REGISTRY)


def format_of_path(path: str) -> str | None:
    """The format a file name's suffix implies ("report.html" -> "html"); None for another suffix."""
    lower = path.lower()
    return next((f.name for f in REGISTRY.values() if lower.endswith(f.suffixes)), None)
def write(report: Report, fmt: str, file: TextIO, **options: object) -> None:
    """Render ``report`` in format ``fmt`` ("text", "json" or "html") to ``file``."""
    if fmt not in REGISTRY:
        raise PerftrackerError(f"unknown report format {fmt!r} (choose from {', '.join(FORMATS)})")
    REGISTRY[fmt].render(report, file, **options)
