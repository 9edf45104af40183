"""The report-format options of the commands that write a report (``analyze``, ``report``): one
``--format``, whose choices are the renderers' registry (``perftracker.localizer.render.REGISTRY``),
``-o FILE``, and ``--brief``; and the one rule that makes them agree (issue 47):

- without ``--format``, the format is the one ``-o``'s suffix implies (``.json``, ``.html``,
  ``.txt``), else text;
- ``--format`` and a suffix that implies another format are refused with one line (exit 2);
- ``--brief`` prints text (the headline and each finding's title): with ``--format json`` or
  ``html``, or an ``-o`` of that suffix, it is refused with one line.
"""

from __future__ import annotations

import argparse

from perftracker.errors import UsageError
from perftracker.localizer.render import FORMATS, REGISTRY, format_of_path


def add_format_options(parser: argparse.ArgumentParser, brief: bool = True) -> None:
    """``--format``, ``-o/--output`` and (``brief``) ``--brief``."""
    names = ", ".join(f"{f.name} ({f.help})" for f in REGISTRY.values())
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help=f"output format: {names} (default: the one -o's suffix implies, else text)")
    parser.add_argument("-o", "--output", metavar="FILE", default=None,
                        help="write to FILE (default: stdout); its suffix (.json, .html, .txt) sets the format")
    if brief:
        parser.add_argument("--brief", action="store_true",
                            help="print only the headline and each finding's title (text)")


def resolve_format(args: argparse.Namespace) -> str:
    """The format the options ask for (see the module's rules); ``args.format`` is set to it.
    UsageError (one line, exit 2) where they disagree."""
    out = getattr(args, "output", None)
    implied = format_of_path(out) if out else None
    fmt = args.format
    if fmt is not None and implied is not None and implied != fmt:
        raise UsageError(f"--format {fmt} and -o {out} disagree (its suffix means {implied}): "
                         f"leave out --format, or name a .{fmt} file")
    fmt = fmt or implied or "text"
    if getattr(args, "brief", False) and fmt != "text":
        why = f"--format {fmt}" if args.format else f"-o {out}"
        raise UsageError(f"--brief prints text (the headline and each finding's title); it cannot be {fmt} "
                         f"({why}): leave out one of them")
    args.format = fmt
    return fmt
