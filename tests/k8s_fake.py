"""A fake Kubernetes API server for the k8s tests: the two core/v1 calls the localizer makes.

It answers over a real local HTTP socket, so the real `kubernetes` client talks to it, with the
recorded API-format JSON of tests/fixtures/k8s/ (job "train" in namespace "perftracker": pods train-0
and train-1, 2 ranks each, over two pages). It records every request. Options a test sets on it:
`forbid` (pod listings answer the 403 Status), `delay_s` (a slow pod listing), `fail_events_for`
(Event creation on those pods answers 403), `fixtures` (another folder of fixture files).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures" / "k8s"
PODS_PATH = "/api/v1/namespaces/perftracker/pods"
EVENTS_PATH = "/api/v1/namespaces/perftracker/events"
JOB_SELECTOR = "job-name=train"
# the fields of a posted Event that the API server's answer echoes
_ECHOED = ("involvedObject", "reason", "message", "type", "source", "count", "firstTimestamp", "lastTimestamp")


def load_fixture(name: str, fixtures: Path = FIXTURES) -> dict[str, Any]:
    return json.loads((fixtures / name).read_text())


def failure_status(code: int, reason: str, message: str) -> dict[str, Any]:
    """A core/v1 Status object as the API server answers a failed request."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


class FakeApiServer:
    """Pod listing and Event creation from the fixture files; records (method, path, query, auth or body).

    A GET records its Authorization header, a POST its JSON body. Use as a context manager.
    """

    def __init__(self, token: str, fixtures: Path = FIXTURES) -> None:
        self.token = token
        self.fixtures = fixtures
        self.requests: list[tuple[str, str, dict[str, list[str]], Any]] = []
        self.forbid = False
        self.delay_s = 0.0
        self.fail_events_for: set[str] = set()
        self._lock = threading.Lock()
        self._created = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                url = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(url.query)
                outer._record("GET", url.path, query, self.headers.get("Authorization"))
                time.sleep(outer.delay_s)
                code, body = outer.answer_get(url.path, query, self.headers.get("Authorization"))
                self._send(code, body)

            def do_POST(self) -> None:  # noqa: N802
                url = urllib.parse.urlsplit(self.path)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer._record("POST", url.path, {}, body)
                self._send(*outer.answer_post(url.path, body))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeApiServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _record(self, method: str, path: str, query: dict[str, list[str]], extra: Any) -> None:
        with self._lock:
            self.requests.append((method, path, query, extra))

    def fixture(self, name: str) -> dict[str, Any]:
        return load_fixture(name, self.fixtures)

    def answer_get(self, path: str, query: dict[str, list[str]], auth: str | None) -> tuple[int, dict[str, Any]]:
        if auth != f"Bearer {self.token}":
            return 401, failure_status(401, "Unauthorized", "Unauthorized")
        if self.forbid:
            return 403, self.fixture("status_forbidden.json")
        if path != PODS_PATH:
            return 404, failure_status(404, "NotFound", "the server could not find the requested resource")
        if query.get("labelSelector") != [JOB_SELECTOR]:
            return 200, self.fixture("pods_empty.json")
        page1 = self.fixture("pods_train_page1.json")
        if query.get("continue") == [page1["metadata"]["continue"]]:
            return 200, self.fixture("pods_train_page2.json")
        return 200, page1

    def answer_post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if path != EVENTS_PATH:
            return 404, failure_status(404, "NotFound", "the server could not find the requested resource")
        if body["involvedObject"]["name"] in self.fail_events_for:
            return 403, {**self.fixture("status_forbidden.json"), "message": "events is forbidden"}
        with self._lock:
            self._created += 1
            n = self._created
        created = self.fixture("event_created.json")
        created["metadata"]["generateName"] = body["metadata"]["generateName"]
        created["metadata"]["name"] = body["metadata"]["generateName"] + f"{n:05x}"
        for k in _ECHOED:
            if k in body:
                created[k] = body[k]
        return 201, created

    def posted_events(self) -> list[dict[str, Any]]:
        """The bodies of all Event creations, in order (also those answered 403)."""
        with self._lock:
            return [b for m, _, _, b in self.requests if m == "POST"]

    def pod_listings(self) -> list[dict[str, list[str]]]:
        """The query of every pod listing, in order."""
        with self._lock:
            return [q for m, p, q, _ in self.requests if m == "GET" and p.endswith("/pods")]
