"""Strict JSON in and out of the localizer.

In: ``loads`` refuses what Python's json accepts but other parsers do not, or what breaks later:
``NaN``/``Infinity`` (and numbers that overflow to them, ``1e400``), nesting deeper than
``MAX_DEPTH``, and lone UTF-16 surrogates (``"\\ud800"``, which no UTF-8 store or client can
take). Each raises ``ValueError`` with the reason, which the service answers with a 400.

Out: ``dumps`` never writes ``NaN`` or ``Infinity``: a non-finite float becomes ``null`` (logged
once), so every response, stored report and report file parses with a strict parser.
"""

from __future__ import annotations

import json
import logging
import math
import re
from typing import Any

log = logging.getLogger(__name__)

MAX_DEPTH = 64  # a PatternSet or request is < 6 levels deep
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_warned: list[bool] = []


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _check_surrogates(value: Any) -> None:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("a string holds a lone UTF-16 surrogate") from None
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def loads(raw: bytes | str) -> Any:
    """Parse strict JSON; ValueError names what is wrong."""
    data = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
    try:
        value = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 ({exc.reason})") from None
    _check_depth(value)
    if _SURROGATE_ESCAPE.search(data):
        _check_surrogates(value)
    return value


_INF = float("inf")


def _check_depth(value: Any) -> None:
    """Nesting depth and overflowed numbers (``1e400`` parses as inf), iteratively."""
    if type(value) is float and (value == _INF or value == -_INF):
        raise ValueError("a number overflows a float")
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        v, d = stack.pop()
        if d > MAX_DEPTH:
            raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
        for x in (v.values() if type(v) is dict else v):
            t = type(x)
            if t is list or t is dict:
                stack.append((x, d + 1))
            elif t is float and (x == _INF or x == -_INF):
                raise ValueError("a number overflows a float")


def _finite_copy(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_copy(v) for v in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """JSON text with no NaN/Infinity: non-finite floats become null (logged once)."""
    try:
        return json.dumps(value, allow_nan=False, **kwargs)
    except ValueError as exc:
        if "Out of range float" not in str(exc):
            raise
    if not _warned:
        _warned.append(True)
        log.warning("non-finite numbers in JSON output were written as null")
    return json.dumps(_finite_copy(value), allow_nan=False, **kwargs)
