"""Bearer tokens of the localizer: the strength check at start, and job-scoped tokens.

``check_token`` refuses tokens an attacker could guess: shorter than ``MIN_TOKEN_CHARS``, one
repeated character, or a placeholder from an example (``REPLACE-ME...``, ``changeme``).

Job-scoped tokens (``--job-tokens FILE``, a JSON object ``{"<token>": ["<job or glob>", ...]}``)
may only write to, and read, the jobs they name; the main token may do everything. See
docs/security.md.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from perftracker.errors import ConfigError

MIN_TOKEN_CHARS = 16
_PLACEHOLDERS = ("replace-me", "replace_me", "replaceme", "changeme", "change-me", "change_me", "placeholder",
                 "your-token", "<token>")


def check_token(token: str, what: str = "the bearer token") -> str:
    """The token, or ConfigError when it is short or a placeholder."""
    t = token.strip()
    low = t.lower()
    if len(t) < MIN_TOKEN_CHARS:
        raise ConfigError(f"{what} has {len(t)} characters; use at least {MIN_TOKEN_CHARS} random ones "
                          f"(e.g. `head -c 32 /dev/urandom | base64`)")
    if any(p in low for p in _PLACEHOLDERS) or len(set(t)) < 4:
        raise ConfigError(f"{what} is a placeholder ({t[:12]}...); generate a random one "
                          f"(e.g. `head -c 32 /dev/urandom | base64`)")
    return t


def load_job_tokens(path: str | Path) -> dict[str, tuple[str, ...]]:
    """``{"<token>": ["<job glob>", ...]}`` from a JSON file; ConfigError names the problem."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--job-tokens {path}: cannot read it as JSON ({exc})") from None
    return parse_job_tokens(doc, str(path))


def parse_job_tokens(doc: object, where: str = "job tokens") -> dict[str, tuple[str, ...]]:
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{where}: expected an object {{token: [job, ...]}}")
    out: dict[str, tuple[str, ...]] = {}
    for token, jobs in doc.items():
        check_token(str(token), f"{where}: a job token")
        if isinstance(jobs, str):
            jobs = [jobs]
        if not isinstance(jobs, Sequence) or not jobs or not all(isinstance(j, str) and j for j in jobs):
            raise ConfigError(f"{where}: the jobs of a token must be a non-empty list of names or globs")
        out[str(token).strip()] = tuple(jobs)
    return out


def job_allowed(scope: tuple[str, ...] | None, job: str) -> bool:
    """Whether a request with this scope (None: the main token) may touch ``job``."""
    return scope is None or any(fnmatch.fnmatchcase(job, pattern) for pattern in scope)
