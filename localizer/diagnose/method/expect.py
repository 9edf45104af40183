"""Expected ranges R_f per function, looked up by category and name pattern from a TOML file.

The built-in file ``localizer/diagnose/method/expected.toml`` holds two profiles, "gpu" and "cpu"; a user file given
with ``--expect FILE`` uses the same format (see the comments at the top of the built-in file).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perftracker.errors import ConfigError
from perftracker.model import Box, Category, Triple

try:  # Python 3.11+
    import tomllib
except ImportError:  # pragma: no cover - Python 3.10
    tomllib = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

BUILTIN_PATH = Path(__file__).with_name("expected.toml")
BUILTIN_PROFILES = ("gpu", "cpu")
OPEN_BOX = Box(Triple(0.0, 0.0, 0.0), Triple(1.0, 1.0, 1.0))
_ENTRY_KEYS = {"category", "pattern", "match", "beta", "mu", "sigma", "hint", "waits_for_peers"}
MATCH_MODES = ("key", "function")
# a Python frame as the summarizer labels it: "/path/to/file.py(123): name"
_FRAME_PREFIX = re.compile(r"^.*?\(\d+\): ")


@dataclass(frozen=True)
class RangeRule:
    """One entry: functions of ``category`` whose key or label matches ``pattern`` ("" = any).

    ``match = "function"`` searches only the function's own name (the label without a Python
    frame's "file(line): " prefix): a Python function's key is its whole call stack, and a pattern
    about what the function *does* (I/O, collection) must not match its callers or its file. The
    DataLoader's own ``fetch.py(49): fetch`` frame is on the stack of every dataset
    ``__getitem__``, which is per-sample Python work, not I/O.

    ``waits_for_peers = true`` marks a function that is time spent waiting for other workers (the
    late-peer part of a collective wait): a worker that holds it *longer* than the others is waiting
    for them, a victim, so the differential test only reports workers that hold it less (the late
    ones). The expectation test is unchanged.
    """

    category: Category
    box: Box
    pattern: str = ""
    hint: str = ""
    match: str = "key"  # "key": the key (whole stack for Python) or the label; "function": the name only
    waits_for_peers: bool = False

    def matches(self, key: str, label: str, category: Category) -> bool:
        if category is not self.category:
            return False
        if not self.pattern:
            return True
        rx = _compiled(self.pattern)
        if self.match == "function":
            return bool(rx.search(function_name(label or key.rsplit(";", 1)[-1])))
        return bool(rx.search(key) or (label and rx.search(label)))


def function_name(label: str) -> str:
    """The function's own name: "/a/socket.py(700): recv_into" -> "recv_into"; other labels unchanged."""
    return _FRAME_PREFIX.sub("", label, count=1)


@dataclass(frozen=True)
class Expectations:
    """An ordered list of range rules; the first that matches a function wins."""

    profile: str  # "gpu" | "cpu" | the profile name in a user file
    source: str  # "built-in" or the file path
    rules: tuple[RangeRule, ...]
    description: str = ""

    def lookup(self, key: str, label: str, category: Category) -> tuple[Box, str]:
        """The expected box and the cause hint ("" if none) for one function."""
        rule = self.rule_for(key, label, category)
        return (rule.box, rule.hint) if rule is not None else (OPEN_BOX, "")

    def rule_for(self, key: str, label: str, category: Category) -> RangeRule | None:
        """The first rule that matches one function, or None."""
        for rule in self.rules:
            if rule.matches(key, label, category):
                return rule
        return None

    @property
    def name(self) -> str:
        """What a report shows as its profile: "gpu", or "FILE:profile" for a user file."""
        return self.profile if self.source == "built-in" else f"{self.source}:{self.profile}"


_RX_CACHE: dict[str, re.Pattern[str]] = {}


def _compiled(pattern: str) -> re.Pattern[str]:
    rx = _RX_CACHE.get(pattern)
    if rx is None:
        rx = _RX_CACHE[pattern] = re.compile(pattern)
    return rx


def load_expectations(path: str | Path | None, profile: str) -> Expectations:
    """Load profile ``profile`` from ``path`` (None: the built-in file).

    Raises ConfigError naming the file and the field for a missing file, bad TOML, an unknown
    profile, an unknown key, a bad category, a bad regex or a range outside [0, 1].
    """
    source = "built-in" if path is None else str(path)
    file_path = BUILTIN_PATH if path is None else Path(path)
    if tomllib is None:  # pragma: no cover
        raise ConfigError("reading expected ranges needs Python 3.11+ (tomllib)")
    try:
        with open(file_path, "rb") as fh:
            doc = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{source}: expected-ranges file not found") from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read expected-ranges file: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    return parse_expectations(doc, profile, source)


def parse_expectations(doc: Mapping[str, Any], profile: str, source: str = "<dict>") -> Expectations:
    """Validate a parsed TOML document and return one of its profiles."""
    profiles = doc.get("profiles")
    unknown_top = set(doc) - {"profiles"}
    if unknown_top:
        raise ConfigError(f"{source}: unknown top-level key(s) {sorted(unknown_top)} (expected [profiles.NAME])")
    if not isinstance(profiles, Mapping) or not profiles:
        raise ConfigError(f"{source}: no [profiles.NAME] table")
    if profile not in profiles:
        if len(profiles) == 1:  # a user file with a single profile applies whatever the job is
            only = next(iter(profiles))
            log.info("%s: profile %r not defined, using its only profile %r", source, profile, only)
            profile = only
        else:
            raise ConfigError(f"{source}: no profile {profile!r} (has {sorted(profiles)})")
    table = profiles[profile]
    where = f"{source}: profiles.{profile}"
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: expected a table")
    unknown = set(table) - {"description", "range"}
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)} (expected description, range)")
    entries = table.get("range", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{where}.range: expected an array of tables ([[profiles.{profile}.range]])")
    rules = tuple(_parse_entry(e, f"{where}.range[{i}]") for i, e in enumerate(entries))
    description = table.get("description", "")
    if not isinstance(description, str):
        raise ConfigError(f"{where}.description: expected a string")
    return Expectations(profile=profile, source=source, rules=rules, description=description)


def _parse_entry(entry: Any, where: str) -> RangeRule:
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: expected a table")
    unknown = set(entry) - _ENTRY_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)} (allowed: {sorted(_ENTRY_KEYS)})")
    if "category" not in entry:
        raise ConfigError(f"{where}: missing 'category'")
    try:
        category = Category(entry["category"])
    except ValueError:
        allowed = [c.value for c in Category]
        raise ConfigError(f"{where}.category: unknown category {entry['category']!r} (allowed: {allowed})") from None
    pattern = entry.get("pattern", "")
    if not isinstance(pattern, str):
        raise ConfigError(f"{where}.pattern: expected a string")
    if pattern:
        try:
            _compiled(pattern)
        except re.error as exc:
            raise ConfigError(f"{where}.pattern: bad regular expression {pattern!r}: {exc}") from None
    hint = entry.get("hint", "")
    if not isinstance(hint, str):
        raise ConfigError(f"{where}.hint: expected a string")
    match = entry.get("match", "key")
    if match not in MATCH_MODES:
        raise ConfigError(f"{where}.match: expected one of {list(MATCH_MODES)}, got {match!r}")
    waits = entry.get("waits_for_peers", False)
    if not isinstance(waits, bool):
        raise ConfigError(f"{where}.waits_for_peers: expected true or false")
    lo, hi = [], []
    for dim in ("beta", "mu", "sigma"):
        a, b = _parse_interval(entry.get(dim, [0.0, 1.0]), f"{where}.{dim}")
        lo.append(a)
        hi.append(b)
    return RangeRule(category, Box(Triple(*lo), Triple(*hi)), pattern, hint, match, waits)


def _parse_interval(value: Any, where: str) -> tuple[float, float]:
    if not isinstance(value, list) or len(value) != 2:
        raise ConfigError(f"{where}: expected [lo, hi], got {value!r}")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"{where}: expected numbers, got {v!r}")
        out.append(float(v))
    lo, hi = out
    if not (0.0 <= lo <= hi <= 1.0):
        raise ConfigError(f"{where}: need 0 <= lo <= hi <= 1, got [{lo}, {hi}]")
    return lo, hi
