"""1,000 malformed requests against a real localizer process: each gets a 4xx, and the service
stays healthy and accepts the next valid upload."""

from __future__ import annotations

import http.client
import json
import random
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perftracker.agent.daemon.localizer_client import Uplink

from tests.service_helpers import TOKEN, LocalizerProcess, make_pattern_set, workers

N_REQUESTS = 1000
MAX_BODY = 64 * 1024
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Client:
    """Keep-alive HTTP with reconnect (the server may close after an oversized body)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def send(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> int:
        for attempt in range(2):
            try:
                self.conn.request(method, path, body=body, headers=headers)
                resp = self.conn.getresponse()
                resp.read()
                if resp.getheader("Connection", "").lower() == "close":
                    self.conn.close()
                return resp.status
            except (ConnectionError, http.client.HTTPException, BrokenPipeError):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                if attempt:
                    raise
        raise AssertionError("unreachable")


def _mutations(base: dict[str, Any]) -> list[Callable[[random.Random], Any]]:
    def drop_key(rng: random.Random) -> Any:
        d = json.loads(json.dumps(base))
        del d[rng.choice(["job", "session", "rank", "world_size", "host", "patterns", "window_start_ns",
                          "window_end_ns", "schema_version"])]
        return d

    def wrong_type(rng: random.Random) -> Any:
        d = json.loads(json.dumps(base))
        key = rng.choice(["job", "session", "rank", "world_size", "host", "patterns", "window_start_ns"])
        d[key] = rng.choice([[1, 2], {"a": 1}, True]) if key not in ("patterns",) else "not a list"
        return d

    def bad_row(rng: random.Random) -> Any:
        d = json.loads(json.dumps(base))
        i = rng.randrange(len(d["patterns"]))
        row = d["patterns"][i]
        choice = rng.randrange(6)
        if choice == 0:
            row[2] = rng.choice([1.5, -0.3, 1e300])  # beta outside [0, 1]
        elif choice == 1:
            row[1] = "bogus-category"
        elif choice == 2:
            d["patterns"][i] = row[:rng.randrange(9)]
        elif choice == 3:
            row[0] = [10_000]  # frame index out of range
        elif choice == 4:
            row[0] = ""
        else:
            row[6] = "many"
        return d

    def wrong_version(rng: random.Random) -> Any:
        d = json.loads(json.dumps(base))
        d["schema_version"] = rng.choice([0, 2, 99, "1", None])
        return d

    def not_object(rng: random.Random) -> Any:
        return rng.choice([[], [base], 42, "patterns", None, 3.5])

    return [drop_key, wrong_type, bad_row, wrong_version, not_object]


def test_thousand_malformed_uploads_each_get_4xx_and_service_stays_healthy(tmp_path: Path) -> None:
    proc = LocalizerProcess(tmp_path, tmp_path / "store.sqlite", max_body_bytes=MAX_BODY)
    proc.start()
    try:
        up = Uplink(proc.url, TOKEN)
        up.register("fuzz", "agent-0", "node0", workers(range(2), 2))
        session, _ = up.create_trigger("fuzz", "fuzz", window_s=600)
        base = make_pattern_set("fuzz", session, 0, 2).to_dict()
        good_json = json.dumps(base).encode()
        rng = random.Random(1234)
        muts = _mutations(base)
        client = Client(proc.port)
        patterns_path = f"/v1/sessions/{session}/patterns"
        json_h = {**AUTH, "Content-Type": "application/json"}

        def case(i: int) -> tuple[str, str, str, bytes | None, dict[str, str]]:
            kind = i % 14
            if kind == 0:
                return "random-bytes", "POST", patterns_path, rng.randbytes(rng.randrange(1, 4000)), json_h
            if kind == 1:
                cut = rng.randrange(1, len(good_json) - 1)
                return "truncated-json", "POST", patterns_path, good_json[:cut], json_h
            if kind in (2, 3, 4):
                return "mutated-patternset", "POST", patterns_path, json.dumps(rng.choice(muts)(rng)).encode(), json_h
            if kind == 5:
                d = dict(base, schema_version=rng.choice([2, 7, 1000]))
                return "wrong-schema-version", "POST", patterns_path, json.dumps(d).encode(), json_h
            if kind == 6:
                return "oversized", "POST", patterns_path, b"{" + b" " * (MAX_BODY + rng.randrange(1, 100_000)), json_h
            if kind == 7:
                token = rng.choice(["", "Bearer", "Bearer x", f"Bearer {TOKEN}x", f"bearer  {TOKEN[:-1]}", TOKEN])
                h = {"Content-Type": "application/json", **({"Authorization": token} if token else {})}
                return "bad-token", "POST", patterns_path, good_json, h
            if kind == 8:
                other = rng.choice(["nope", "20260101-000000-abcdef", "x" * 150])
                d = dict(base, session=other)
                return "unknown-session", "POST", f"/v1/sessions/{other}/patterns", json.dumps(d).encode(), json_h
            if kind == 9:
                body = zlib.compress(rng.randbytes(200)) if rng.random() < 0.5 else rng.randbytes(300)
                return "bad-zlib", "POST", patterns_path, body, {**AUTH, "Content-Type":
                                                                   "application/x-perftracker-patterns+zlib"}
            if kind == 10:
                body = rng.choice([{"job": "a b"}, {"job": "j", "agent_id": "a", "workers": [{"rank": -1}]},
                                   {"job": "j", "agent_id": "a", "workers": [{"rank": 3, "world_size": 2}]},
                                   {"job": "j", "agent_id": "", "workers": []}, [1]])
                return "bad-register", "POST", "/v1/agents/register", json.dumps(body).encode(), json_h
            if kind == 11:
                body = rng.choice([{"job": "fuzz", "agent_id": "a", "ranks": [{"rank": "0"}]},
                                   {"job": "fuzz", "agent_id": "a", "ranks": [{"rank": 0, "alive": "yes"}]},
                                   {"job": "fuzz", "ranks": []}, {"job": "fuzz", "agent_id": "a", "ranks": 5}])
                return "bad-heartbeat", "POST", "/v1/heartbeat", json.dumps(body).encode(), json_h
            if kind == 12:
                snap = rng.choice([{"schema_version": 1, "job": "fuzz"}, {"schema_version": 3},
                                   {"schema_version": 1, "job": "fuzz", "rank": 0, "world_size": 2, "host": "h",
                                    "pid": 1, "taken_ns": 1, "last_iteration": 1, "idle_s": 1.0,
                                    "stack": [["f.py", "x", "g"]]},
                                   {"schema_version": 1, "job": "fuzz", "rank": 9, "world_size": 2, "host": "h",
                                    "pid": 1, "taken_ns": 1, "last_iteration": 1, "idle_s": 1.0, "stack": [],
                                    "session": session}])
                return "bad-hang-snapshot", "POST", "/v1/hang-snapshots", json.dumps(snap).encode(), json_h
            body = rng.choice([b'{"window_s": 0}', b'{"window_s": "long"}', b'{"window_s": 1e9}', b"[]"])
            return "bad-trigger", "POST", "/v1/jobs/fuzz/triggers", body, json_h

        statuses: Counter[tuple[str, int]] = Counter()
        for i in range(N_REQUESTS):
            name, method, path, body, headers = case(i)
            status = client.send(method, path, body, headers)
            statuses[(name, status)] += 1
            assert 400 <= status < 500, f"request {i} ({name}) got {status}"
            if i % 100 == 99:  # healthy throughout
                assert client.send("GET", "/v1/healthz", None, {}) == 200
        print(sorted(statuses.items()))
        assert sum(statuses.values()) == N_REQUESTS
        by_kind = {name: status for (name, status) in statuses}
        assert by_kind["bad-token"] == 401 and by_kind["oversized"] == 413 and by_kind["unknown-session"] == 404
        assert {s for (n, s) in statuses if n == "wrong-schema-version"} == {422}

        # nothing malformed was stored, and the next valid request is answered
        s = up.get_session(session)
        assert s["uploaded"] == [] and s["state"] == "open"
        assert up.healthz()["ok"] is True
        ack = up.upload_patterns(make_pattern_set("fuzz", session, 0, 2))
        assert ack["stored"] and up.get_session(session)["uploaded"] == [0]
        assert proc.proc is not None and proc.proc.poll() is None
    finally:
        proc.stop()
