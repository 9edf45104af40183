"""The agent's HTTP client for the localizer (stdlib urllib; blocking, call it from a thread).

Every call sends ``Authorization: Bearer <token>`` and JSON, retries connection errors, 5xx and
429 with exponential backoff and jitter, and never retries a 4xx (that is a bug in the request:
it raises ``UplinkError`` with the service's message and the status). The agent must not import
``localizer``; this module speaks the wire format only.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import random
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perftracker.errors import ConfigError, TransportError
from perftracker.model import HangSnapshot, PatternSet, Report
from perftracker.wire.patterns import COLUMNS_CONTENT_TYPE, encode_sets

log = logging.getLogger(__name__)

PATTERNS_ZLIB = "application/x-perftracker-patterns+zlib"
TOKEN_FILE_NAME = "token"
LOCALIZER_FILE_NAME = "localizer.json"
AGENT_KEY_HEADER = "X-Perftracker-Agent-Key"  # the agent's key for its ranks (perftracker.localizer.service.ownership)
# Agent -> localizer traffic stays inside the cluster or the node: ignore http_proxy settings.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class UplinkError(TransportError):
    """The localizer answered with an error, or could not be reached after the retries.

    ``status`` is the HTTP status (0 when no answer came).
    """

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class TriggerNotice:
    """A session an agent must act on (the answer to a long poll)."""

    session: str
    window_s: float
    reason: str
    kind: str = "slowdown"  # "slowdown": profile a window; "hang": take hang snapshots


def resolve_token(token: str | None = None, token_file: str | Path | None = None,
                  run_dir: str | Path | None = None, *, strict: bool = False) -> str:
    """The bearer token: an explicit value, else PERFTRACKER_TOKEN, else a token file
    (``token_file``, PERFTRACKER_TOKEN_FILE, or ``<run_dir>/token``). Empty if none is found.

    ``strict``: a named token file (``token_file`` or PERFTRACKER_TOKEN_FILE) that cannot be read
    raises ConfigError instead of being passed over."""
    if token:
        return token.strip()
    env = os.environ.get("PERFTRACKER_TOKEN", "").strip()
    if env:
        return env
    candidates = [token_file, os.environ.get("PERFTRACKER_TOKEN_FILE") or None]
    if strict:
        for c in candidates:
            if c:
                try:
                    return Path(c).read_text().strip()
                except OSError as exc:
                    raise ConfigError(f"token file {c}: cannot read ({exc.strerror})") from None
    if run_dir is not None:
        candidates.append(Path(run_dir) / TOKEN_FILE_NAME)
    for c in candidates:
        if c and Path(c).is_file():
            return Path(c).read_text().strip()
    return ""


class Uplink:
    """A client for one localizer at ``url`` (e.g. ``http://127.0.0.1:8765``)."""

    def __init__(self, url: str, token: str, *, timeout_s: float = 10.0, retries: int = 5,
                 backoff_s: float = 0.2, max_backoff_s: float = 5.0, ca_file: str | None = None) -> None:
        """``ca_file``: CA certificate(s) that verify an ``https://`` localizer (default: the system's;
        PERFTRACKER_CA_FILE). The certificate's host name is always checked."""
        if not url.startswith(("http://", "https://")):
            raise UplinkError(f"localizer url {url!r} must start with http:// or https://")
        self.url = url.rstrip("/")
        self._opener = _OPENER
        # agent keys the localizer issued at registration (perftracker.localizer.service.ownership), and who owns a rank
        self._keys: dict[tuple[str, str], str] = {}
        self._rank_agent: dict[tuple[str, int], str] = {}
        ca_file = ca_file or os.environ.get("PERFTRACKER_CA_FILE") or None
        if url.startswith("https://"):
            try:
                ctx = ssl.create_default_context(cafile=ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"CA file {ca_file}: cannot load it ({exc})") from None
            self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                                       urllib.request.HTTPSHandler(context=ctx))
        self.token = token
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s

    # ---------------------------------------------------------------- transport
    def request(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
                content_type: str = "application/json", timeout_s: float | None = None,
                retries: int | None = None, agent_key: str | None = None) -> tuple[int, Any]:
        """One API call with retries. Returns (status, decoded JSON or None)."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if agent_key:
            headers[AGENT_KEY_HEADER] = agent_key
        if data is not None:
            headers["Content-Type"] = content_type
        attempts = 1 + (self.retries if retries is None else retries)
        delay = self.backoff_s
        last = ""
        for attempt in range(attempts):
            req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
            try:
                with self._opener.open(req, timeout=timeout_s or self.timeout_s) as resp:
                    return resp.status, _decode(resp.read())
            except urllib.error.HTTPError as exc:
                payload = _decode(exc.read())
                message = payload.get("error") if isinstance(payload, dict) else None
                message = message or f"HTTP {exc.code} {exc.reason}"
                if exc.code < 500 and exc.code != 429:
                    raise UplinkError(f"{method} {path}: {exc.code}: {message}", exc.code) from None
                last = f"{exc.code}: {message}"
            except (OSError, http.client.HTTPException) as exc:  # URLError, timeouts, resets
                reason = getattr(exc, "reason", exc)
                last = f"{type(reason).__name__}: {reason}"
            if attempt + 1 < attempts:
                sleep_s = min(self.max_backoff_s, delay) * (0.5 + random.random() / 2)
                log.debug("%s %s failed (%s); retry %d in %.2f s", method, path, last, attempt + 1, sleep_s)
                time.sleep(sleep_s)
                delay *= 2
        raise UplinkError(f"{method} {self.url}{path}: localizer unreachable after {attempts} attempt(s): {last}")

    # ---------------------------------------------------------------- API
    def healthz(self) -> dict[str, Any]:
        return self.request("GET", "/v1/healthz", retries=0)[1]

    def register(self, job: str, agent_id: str, host: str, workers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """workers: [{rank, local_rank, world_size, pid, tid, host}]."""
        body = self.request("POST", "/v1/agents/register",
                            {"job": job, "agent_id": agent_id, "host": host, "workers": [dict(w) for w in workers]},
                            agent_key=self._keys.get((job, agent_id)))[1]
        if isinstance(body, dict) and isinstance(body.get("agent_key"), str):
            self._keys[(job, agent_id)] = body["agent_key"]
        for w in workers:
            self._rank_agent[(job, int(w["rank"]))] = agent_id
        return body

    def adopt_keys(self, other: object) -> None:
        """Take the agent keys ``other`` (an Uplink to the same store, at another URL) was issued: a
        job localizer that restarted on the same node keeps its store and its registrations."""
        keys, ranks = getattr(other, "_keys", None), getattr(other, "_rank_agent", None)
        if isinstance(keys, dict) and isinstance(ranks, dict):
            self._keys.update(keys)
            self._rank_agent.update(ranks)

    def agent_key(self, job: str, rank: int) -> str | None:
        """The key of the agent that registered ``rank`` of ``job`` through this uplink, if any."""
        agent_id = self._rank_agent.get((job, rank))
        return self._keys.get((job, agent_id)) if agent_id is not None else None

    def heartbeat(self, job: str, agent_id: str, ranks: Sequence[Mapping[str, Any]]) -> None:
        """ranks: [{rank, iteration, phase, last_event_age_s, alive, iteration_ms}]."""
        self.request("POST", "/v1/heartbeat", {"job": job, "agent_id": agent_id, "ranks": [dict(r) for r in ranks]},
                     retries=1, agent_key=self._keys.get((job, agent_id)))

    def poll_trigger(self, job: str, after: str | None = None, timeout_s: float = 30.0) -> TriggerNotice | None:
        """Long poll: the next open session after ``after``, or None when ``timeout_s`` passes."""
        q = {"timeout_s": f"{timeout_s:g}"}
        if after:
            q["after"] = after
        path = f"/v1/jobs/{urllib.parse.quote(job, safe='')}/triggers?{urllib.parse.urlencode(q)}"
        status, body = self.request("GET", path, timeout_s=timeout_s + self.timeout_s)
        if status == 204 or not body:
            return None
        return TriggerNotice(str(body["session"]), float(body["window_s"]), str(body.get("reason", "")),
                             str(body.get("kind", "slowdown")))

    def upload_patterns(self, ps: PatternSet, compressed: bool = True) -> dict[str, Any]:
        path = f"/v1/sessions/{urllib.parse.quote(ps.session, safe='')}/patterns"
        key = self.agent_key(ps.job, ps.rank)
        if compressed:
            return self.request("POST", path, raw=ps.to_bytes(), content_type=PATTERNS_ZLIB, agent_key=key)[1]
        return self.request("POST", path, ps.to_dict(), agent_key=key)[1]

    def upload_pattern_batch(self, sets: Sequence[PatternSet]) -> dict[str, Any]:
        """One node's PatternSets of one session in one request (the columnar wire form). A
        localizer that does not read it (415, or 400 from one that predates it) gets them one by one."""
        if not sets:
            return {"ok": True, "ranks": []}
        ps = sets[0]
        path = f"/v1/sessions/{urllib.parse.quote(ps.session, safe='')}/patterns"
        try:
            return self.request("POST", path, raw=encode_sets(sets), content_type=COLUMNS_CONTENT_TYPE,
                                agent_key=self.agent_key(ps.job, ps.rank))[1]
        except UplinkError as exc:
            if exc.status not in (400, 415):
                raise
            log.info("the localizer does not take columnar uploads (%s); uploading %d rank(s) one by one",
                     exc, len(sets))
        acks = [self.upload_patterns(p) for p in sets]
        return {**acks[-1], "ranks": [p.rank for p in sets]}

    def upload_hang_snapshot(self, snap: HangSnapshot) -> dict[str, Any]:
        return self.request("POST", "/v1/hang-snapshots", snap.to_dict(),
                            agent_key=self.agent_key(snap.job, snap.rank))[1]

    def create_trigger(self, job: str, reason: str = "on-demand", window_s: float | None = None,
                       detection: Mapping[str, Any] | None = None) -> tuple[str, bool]:
        """Open (or join) a session for the job. Returns (session, joined). ``detection``: a worker's
        typed detection (``Detection.to_dict``), kept with the session."""
        body: dict[str, Any] = {"reason": reason}
        if window_s is not None:
            body["window_s"] = window_s
        if detection is not None:
            body["detection"] = dict(detection)
        _, d = self.request("POST", f"/v1/jobs/{urllib.parse.quote(job, safe='')}/triggers", body)
        return str(d["session"]), bool(d["joined"])

    def jobs(self) -> list[str]:
        return list(self.request("GET", "/v1/jobs")[1]["jobs"])

    def list_sessions(self, job: str | None = None) -> list[dict[str, Any]]:
        """Every session (oldest first), read a page at a time."""
        out: list[dict[str, Any]] = []
        after: Any = None
        while True:
            q = {k: v for k, v in (("job", job), ("after", after)) if v is not None}
            body = self.request("GET", "/v1/sessions" + (f"?{urllib.parse.urlencode(q)}" if q else ""))[1]
            out.extend(body["sessions"])
            after = body.get("next")
            if after is None or not body["sessions"]:
                return out

    def latest_session(self, job: str | None = None, state: str = "done") -> dict[str, Any] | None:
        """The newest session in ``state`` (of ``job``), or None."""
        q = {"order": "desc", "limit": "1", "state": state, **({"job": job} if job else {})}
        sessions = self.request("GET", f"/v1/sessions?{urllib.parse.urlencode(q)}")[1]["sessions"]
        return sessions[0] if sessions else None

    def get_session(self, session: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/sessions/{urllib.parse.quote(session, safe='')}")[1]

    def get_report(self, session: str) -> Report | None:
        """The stored report, or None while the session is still collecting or localizing."""
        status, body = self.request("GET", f"/v1/sessions/{urllib.parse.quote(session, safe='')}/report")
        if status == 202:
            return None
        return Report.from_dict(body)


def _decode(data: bytes) -> Any:
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return {"error": data[:200].decode("utf-8", "replace")}
