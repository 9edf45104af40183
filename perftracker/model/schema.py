"""What the data-model modules share: the schema version and field validation.

``require`` / ``optional`` read one field of a decoded JSON object and raise SchemaError naming the
field (``where.key``) on a missing field or a wrong type. No I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from perftracker.errors import SchemaError

SCHEMA_VERSION = 1


def require(d: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``d[key]``, checked to be a ``kind`` (an int is accepted as a float; a bool is never a number)."""
    if not isinstance(d, Mapping):
        raise SchemaError(f"{where}: expected an object, got {type(d).__name__}")
    if key not in d:
        raise SchemaError(f"{where}: missing field {key!r}")
    value = d[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, float)):
        raise SchemaError(f"{where}.{key}: expected {getattr(kind, '__name__', kind)}, got {value!r:.80}")
    if isinstance(value, float) and not math.isfinite(value):
        raise SchemaError(f"{where}.{key}: not a finite number: {value!r}")
    return value


def optional(d: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, default: Any) -> Any:
    """``d[key]`` checked like ``require``, or ``default`` when the field is absent or null."""
    if d.get(key) is None:
        return default
    return require(d, key, kind, where)


def int_items(values: Sequence[Any], where: str) -> tuple[int, ...]:
    """``values`` (a decoded JSON list) as ints; SchemaError naming the first that is not one."""
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int):
            raise SchemaError(f"{where}[{i}]: expected an integer, got {v!r:.80}")
    return tuple(values)


def float_items(values: Sequence[Any], where: str, first: int = 0) -> tuple[float, ...]:
    """``values`` (a decoded JSON list) as finite floats; SchemaError naming the first that is not one
    (counted from ``first``)."""
    for i, v in enumerate(values, first):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise SchemaError(f"{where}[{i}]: expected a finite number, got {v!r:.80}")
    return tuple(float(v) for v in values)


def check_schema_version(d: Mapping[str, Any], where: str, readable: tuple[int, ...] = (SCHEMA_VERSION,)) -> int:
    """The document's schema version, checked to be one of ``readable`` (the newest last)."""
    if not isinstance(d, Mapping):
        raise SchemaError(f"{where}: expected an object, got {type(d).__name__}")
    version = d.get("schema_version")
    if version is None:
        raise SchemaError(f"{where}: missing schema_version (expected {readable[-1]})")
    if isinstance(version, bool) or version not in readable:
        reads = " or ".join(str(v) for v in readable)
        raise SchemaError(f"{where}: unsupported schema_version {version!r} (this perftracker reads {reads})")
    return int(version)



def rounded(x: float) -> float:
    """Round for storage: 6 significant decimals is far below measurement noise."""
    return round(float(x), 6)
