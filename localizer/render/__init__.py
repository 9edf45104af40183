"""Renderers: take a Report, write it. They compute nothing.

``write(report, fmt, file)`` picks one by name; ``perftracker report`` and ``perftracker analyze``
both go through it.
"""

from __future__ import annotations

import importlib
import re
from typing import TextIO

from perftracker.errors import PerftrackerError
from perftracker.model import LINK_KEY, Finding, Report

FORMATS = ("text", "json", "html")
_DIRS = re.compile(r"(?:[^\s;:()<>]*/)+(?=[^/\s;()]+\(\d+\))")


def short_frame(text: str) -> str:
    """Display form of a frame or stack: directories dropped from "path/file.py(123): fn" frames."""
    return _DIRS.sub("", text)


def mu_names(f: Finding) -> tuple[str, str]:
    """(μ row label, σ row label) of a finding: utilization, or the link pattern's retransmitted share."""
    if f.key == LINK_KEY:
        return "\u03bc retransmitted share", "\u03c3 (unused)"
    return "\u03bc utilization", "\u03c3 utilization std"


def write(report: Report, fmt: str, file: TextIO, **options: object) -> None:
    """Render ``report`` in format ``fmt`` ("text", "json" or "html") to ``file``."""
    if fmt not in FORMATS:
        raise PerftrackerError(f"unknown report format {fmt!r} (choose from {', '.join(FORMATS)})")
    module = importlib.import_module(f"perftracker.localizer.render.{fmt}")
    module.render(report, file, **options)
