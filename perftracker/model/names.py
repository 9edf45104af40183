"""Names and text that come from outside: the one pattern for ids, and the one escape for display.

``NAME_RE`` is what every job, agent, host and session id must fully match wherever it crosses a
process or network boundary: the localizer's request validation (``localizer/service/validate.py``),
the agent and the command line before a session id becomes a file name (``reports/<session>.json``,
the agent's session directories). 1-200 characters of ``A-Z a-z 0-9 _ . : @ + = -`` and never
``.`` or ``..``: no ``/``, so a valid name is always one path component inside its directory. Use
it with ``fullmatch`` only (``is_name``): ``re.match`` with ``$`` accepted a trailing newline.

``safe_text`` makes data safe to print: control characters (C0 but for tab and newline where kept,
DEL, C1) and the bidirectional overrides and isolates (U+202A-U+202E, U+2066-U+2069) become visible
escapes (``\\x1b``, ``\\u202e``), so a function name or a trigger reason cannot move the cursor,
set the window title, write the clipboard (``ESC ] 52``) or reorder what is shown. Every text
renderer and the command line's output go through it; the HTML renderer too, before its HTML escape.
"""

from __future__ import annotations

import re
from typing import TypeGuard

from perftracker.errors import SchemaError

MAX_NAME_CHARS = 200
NAME_CHARS = "A-Z a-z 0-9 _ . : @ + = -"
NAME_RE = re.compile(rf"(?!\.\.?\Z)[A-Za-z0-9_.:@+=-]{{1,{MAX_NAME_CHARS}}}")

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_UNSAFE_ONE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def is_name(value: object) -> TypeGuard[str]:
    """Whether ``value`` is a str that fully matches ``NAME_RE``."""
    return isinstance(value, str) and NAME_RE.fullmatch(value) is not None


def check_name(value: object, what: str) -> str:
    """``value`` when it is a valid name (``is_name``), else SchemaError naming ``what``."""
    if is_name(value):
        return value
    shown = repr(value[:80]) if isinstance(value, str) else f"of type {type(value).__name__}"
    raise SchemaError(f"{what} {shown} is not a valid name "
                      f"(1-{MAX_NAME_CHARS} characters of {NAME_CHARS}, not . or ..)")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def safe_text(text: str, *, newlines: bool = False) -> str:
    """``text`` with control characters and bidi overrides shown as escapes (``\\x1b``,
    ``\\u202e``). Tab and newline are escaped too unless ``newlines`` (then both are kept)."""
    pattern = _UNSAFE if newlines else _UNSAFE_ONE_LINE
    return pattern.sub(_escape, text) if pattern.search(text) else text
