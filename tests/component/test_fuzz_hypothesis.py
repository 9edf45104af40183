"""Property-based fuzzing (Hypothesis; derandomized, a bounded number of examples, seconds).

- HTTP API: arbitrary JSON values, valid bodies with one field replaced by an arbitrary value,
  raw bytes and odd query strings against every write route of a real LocalizerService. Property:
  never a 5xx, always a JSON answer a strict parser accepts, and the service still accepts a valid
  upload afterwards.
- Worker wire: arbitrary messages (every type, arbitrary fields) through the wire decoder and the
  agent's checks (only WireError/BadWorkerMessage may come out), then as frames into a real agent
  process, which must keep serving and log no traceback.

``PERFTRACKER_FUZZ_EXAMPLES`` sets the examples per property (default 150). Each property prints
its example count and time (``pytest -s``).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import struct
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import AgentProc, WireWorker, cleanup, short_run_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from perftracker.agent.daemon.localizer_client import Uplink
from perftracker.agent.daemon.workers import BadWorkerMessage, check_worker_message
from service_helpers import TOKEN, ServiceThread, make_pattern_set, workers

from perftracker.wire import framing as wire
from perftracker.wire.framing import MessageType

N = int(os.environ.get("PERFTRACKER_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=N, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
AUTH = {"Authorization": f"Bearer {TOKEN}"}

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=40)
           | st.sampled_from(["", "x" * 900, "\ud800", "a/b", "..", "nan", "Infinity", "1e400"]))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)


def _encode(value: Any) -> bytes:
    """JSON text as a sloppy client writes it: NaN/Infinity and lone surrogates pass through."""
    return json.dumps(value, allow_nan=True, ensure_ascii=True).encode()


def _strict(data: bytes) -> Any:
    def bad(name: str) -> Any:
        raise AssertionError(f"{name} in a response")

    return json.loads(data, parse_constant=bad)


class Client:
    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def send(self, method: str, path: str, body: bytes | None, ctype: str = "application/json") -> tuple[int, bytes]:
        for _ in range(2):
            try:
                self.conn.request(method, path, body=body, headers={**AUTH, "Content-Type": ctype})
                resp = self.conn.getresponse()
                data = resp.read()
                if resp.getheader("Connection", "").lower() == "close":
                    self.conn.close()
                return resp.status, data
            except (ConnectionError, http.client.HTTPException):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        raise AssertionError("the service stopped answering")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("fuzz")
    with ServiceThread(tmp / "s.sqlite") as svc:
        up = Uplink(svc.url, TOKEN, retries=0)
        up.register("fz", "agent-fz", "n", workers([0, 1], 2))
        session, _ = up.create_trigger("fz", "fuzz", window_s=600)
        yield svc, up, session


def _routes(session: str) -> list[tuple[str, dict[str, Any]]]:
    good_ps = make_pattern_set("fz", session, 1, 2, seed=3).to_dict()
    return [
        ("/v1/agents/register", {"job": "fz", "agent_id": "agent-x", "host": "n", "workers": workers([5], 8)}),
        ("/v1/heartbeat", {"job": "fz", "agent_id": "agent-fz", "ranks": [
            {"rank": 0, "iteration": 3, "phase": "watching", "last_event_age_s": 0.1, "alive": True, "iteration_ms": 9.5}]}),
        ("/v1/jobs/fz/triggers", {"reason": "r", "window_s": 5}),
        (f"/v1/sessions/{session}/patterns", good_ps),
        ("/v1/hang-snapshots", {"job": "fz", "rank": 0, "session": session}),
    ]


def _mutate(body: dict[str, Any], path: list[Any], value: Any) -> Any:
    """``body`` with the field at the (clipped) ``path`` replaced by ``value``."""
    out = json.loads(json.dumps(body))
    node: Any = out
    for step in path:
        if isinstance(node, dict) and node:
            key = sorted(node)[step % len(node)]
            if not isinstance(node[key], (dict, list)):
                node[key] = value
                return out
            node = node[key]
        elif isinstance(node, list) and node:
            i = step % len(node)
            if not isinstance(node[i], (dict, list)):
                node[i] = value
                return out
            node = node[i]
        else:
            break
    return value if node is out else out


def test_http_api_never_answers_5xx(service: Any) -> None:
    svc, up, session = service
    client = Client(svc.port)
    routes = _routes(session)
    seen: list[int] = []
    t0 = time.monotonic()

    @FUZZ
    @given(route=st.integers(0, len(routes) - 1), how=st.integers(0, 3),
           path=st.lists(st.integers(0, 50), min_size=1, max_size=5), value=json_values,
           raw=st.binary(max_size=200), query=st.text(max_size=30))
    def one(route: int, how: int, path: list[int], value: Any, raw: bytes, query: str) -> None:
        url, body = routes[route]
        if how == 0:
            data = _encode(_mutate(body, path, value))
        elif how == 1:
            data = _encode(value)
        else:
            data = raw if how == 2 else _encode(body)[: len(raw)]
        status, answer = client.send("POST", url, data)
        assert status < 500, (url, data[:300], answer[:300])
        _strict(answer)
        q = urllib.parse.quote(query)
        status, answer = client.send("GET", f"/v1/sessions?limit={q}&after={q}&order={q}&state={q}", None)
        assert status < 500 and _strict(answer) is not None
        seen.append(status)

    one()
    took = time.monotonic() - t0
    print(f"\nfuzz http: {len(seen)} examples in {took:.1f} s")
    assert len(seen) >= min(N, 50)
    up.upload_patterns(make_pattern_set("fz", session, 0, 2, seed=0))  # still accepts a valid upload


def test_worker_wire_checks_raise_only_their_own_errors() -> None:
    seen: list[str] = []
    t0 = time.monotonic()
    types = [t.value for t in MessageType]

    @FUZZ
    @given(kind=st.sampled_from(types), fields=st.dictionaries(
        st.sampled_from(["job", "rank", "world_size", "local_rank", "pid", "training_tid", "host", "protocol",
                         "iteration", "phase", "idle_s", "recent_ms", "mean_ms", "min_ms", "reason", "detail",
                         "window_s", "snapshot", "session", "raw_path", "samples_path", "start_ns", "end_ns", "error",
                         "ok"]), json_values, max_size=10))
    def one(kind: str, fields: dict[str, Any]) -> None:
        body = _encode({"type": kind, **fields})
        try:
            msg = wire.decode_body(body)
            check_worker_message(msg)
            seen.append("ok")
        except (wire.WireError, BadWorkerMessage):
            seen.append("refused")

    one()
    print(f"\nfuzz wire checks: {len(seen)} examples in {time.monotonic() - t0:.1f} s "
          f"({seen.count('ok')} accepted)")
    assert "refused" in seen and len(seen) >= min(N, 50)


def test_a_real_agent_survives_fuzzed_worker_frames(tmp_path: Path) -> None:
    run_dir = short_run_dir("fz")
    agent = AgentProc(run_dir, tmp_path / "runs", "--no-samplers", "--poll-timeout-s", "5")
    sent: list[int] = []
    try:
        agent.wait_ready()
        w = WireWorker(run_dir, 0, 1, job="fzjob")
        t0 = time.monotonic()

        @FUZZ
        @given(kind=st.sampled_from([t.value for t in MessageType]),
               fields=st.dictionaries(st.sampled_from(["iteration", "phase", "idle_s", "recent_ms", "mean_ms",
                                                       "reason", "detail", "window_s", "snapshot", "session",
                                                       "raw_path", "start_ns", "end_ns", "error", "min_ms"]),
                                      json_values, max_size=8))
        def one(kind: str, fields: dict[str, Any]) -> None:
            nonlocal w
            body = _encode({"type": kind, **fields})
            try:
                w.sock.sendall(struct.pack(">I", len(body)) + body)
            except OSError:  # the agent dropped a connection after a frame the wire refuses: reconnect
                w.close()
                w = WireWorker(run_dir, 0, 1, job="fzjob")
            sent.append(len(body))

        one()
        took = time.monotonic() - t0
        time.sleep(0.5)
        w.close()
        again = WireWorker(run_dir, 1, 2, job="fzjob2")  # the agent still serves
        assert again.ack["ok"] is True
        again.close()
        assert agent.proc.poll() is None
        log = agent.log_path.read_text()
        assert "Traceback" not in log, log[log.find("Traceback") - 500:][:3000]
        print(f"\nfuzz agent frames: {len(sent)} examples in {took:.1f} s")
        assert len(sent) >= min(N, 50)
    finally:
        agent.kill()
        cleanup(run_dir)


def test_frames_are_length_prefixed() -> None:  # what the agent fuzz writes by hand
    sock_a, sock_b = socket.socketpair()
    try:
        wire.send_message(sock_a, {"type": "ack", "ok": True})
        (n,) = struct.unpack(">I", sock_b.recv(4))
        assert json.loads(sock_b.recv(n)) == {"type": "ack", "ok": True}
    finally:
        sock_a.close()
        sock_b.close()


EXTREME_INTS = (st.sampled_from([0, 1, -1, 2, 3, 7, 8, 2**31 - 1, 2**31, 2**53, 2**53 + 1, 2**62, 2**62 + 1, 2**63 - 1,
                                 2**63, 2**64, 2**70, 2**40, -(2**63), -(2**70), 10**7, 10**7 + 1, 20_000_000, 10**12])
                | st.integers(min_value=-(2**80), max_value=2**80))
UPLOAD_INTS = ["world_size", "rank", "window_start_ns", "window_end_ns", "local_rank", "pid", "coords.dp",
               "patterns.executions", "patterns.critical_ns"]
SNAPSHOT_INTS = ["rank", "world_size", "pid", "taken_ns", "last_iteration", "exit_code", "failed_ns", "stack.line"]


def test_uploads_and_snapshots_with_extreme_integers_never_answer_5xx(tmp_path: Path) -> None:
    """Issue 33: every integer of an upload (JSON, zlib JSON and columnar) and of a hang snapshot,
    set to an extreme value: never a 5xx, never stored when out of range, and the session still
    takes a valid upload afterwards (its memory is not sized by what was claimed)."""
    from perftracker.model import Frame, HangSnapshot, PatternSet
    from perftracker.wire.patterns import COLUMNS_CONTENT_TYPE, encode_sets

    with ServiceThread(tmp_path / "s.sqlite") as svc:
        up = Uplink(svc.url, TOKEN, retries=0)
        up.register("xi", "agent-xi", "n", workers(range(8), 8))  # 4, 5 and 6 are never drawn: it stays open
        session, _ = up.create_trigger("xi", "extreme", window_s=600)
        key = up.agent_key("xi", 1)
        client = Client(svc.port)
        base = make_pattern_set("xi", session, 1, 8, seed=5).to_dict()
        snap = HangSnapshot("xi", 1, 8, "n", 100, time.time_ns(), 41, 30.0, (Frame("dist.py", 10, "all_reduce"),),
                            session=session).to_dict()
        counts = {"accepted": 0, "refused": 0}
        t0 = time.monotonic()

        def send(path: str, data: bytes, ctype: str) -> int:
            client.conn.request("POST", path, body=data, headers={**AUTH, "Content-Type": ctype,
                                                                   "X-Perftracker-Agent-Key": key or ""})
            resp = client.conn.getresponse()
            answer = resp.read()
            assert resp.status < 500, (path, data[:300], answer[:300])
            _strict(answer)
            counts["accepted" if resp.status < 300 else "refused"] += 1
            return resp.status

        @FUZZ
        @given(field=st.sampled_from(UPLOAD_INTS + [f"snap.{f}" for f in SNAPSHOT_INTS]), value=EXTREME_INTS,
               form=st.sampled_from(["json", "zlib", "columns"]))
        def one(field: str, value: int, form: str) -> None:
            if field.startswith("snap."):
                body = json.loads(json.dumps(snap))
                name = field[5:]
                if name == "stack.line":
                    body["stack"][0][1] = value  # a frame: [file, line, function]
                else:
                    body[name] = value
                send("/v1/hang-snapshots", _encode(body), "application/json")
                return
            body = json.loads(json.dumps(base))
            if field.startswith("patterns."):
                body["patterns"][0][6 if field.endswith("executions") else 7] = value  # a row: [..., executions, critical_ns, resource]
            elif field == "coords.dp":
                body["coords"] = {"dp": value}
            else:
                body[field] = value
            path = f"/v1/sessions/{session}/patterns"
            if form == "json":
                send(path, _encode(body), "application/json")
            elif form == "zlib":
                import zlib

                send(path, zlib.compress(_encode(body)), "application/x-perftracker-patterns+zlib")
            else:
                try:
                    raw = encode_sets([PatternSet.from_dict(body)])
                except (ValueError, TypeError, OverflowError):  # the encoder refuses it itself (int64 columns)
                    return
                send(path, raw, COLUMNS_CONTENT_TYPE)

        one()
        print(f"\nfuzz extreme integers: {sum(counts.values())} requests in {time.monotonic() - t0:.1f} s "
              f"({counts['accepted']} accepted, {counts['refused']} refused, no 5xx)")
        assert counts["refused"] > counts["accepted"] and sum(counts.values()) >= min(N, 50)
        for ps in svc.store.pattern_sets(session):  # what was kept is in range
            assert ps.world_size == 8 and 0 <= ps.rank < 8 and 0 <= ps.window_start_ns <= ps.window_end_ns < 2**62
            assert all(0 <= p.executions <= 2**53 and 0 <= p.critical_ns <= 2**53 for p in ps.patterns)
        assert up.upload_patterns(make_pattern_set("xi", session, 5, 8, seed=0))["stored"]
        assert up.request("GET", "/v1/healthz")[0] == 200
