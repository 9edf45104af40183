"""The issue-17, issue-33 and issue-46 reviews' attacks, replayed against a perftracker tree: one line per item
with what was observed. Run it against an older checkout to see the "before" column:

    python bench/hardening.py [--tree /path/to/checkout] [--only 1,33.3,...]   # default: this checkout

Only public interfaces are used (the CLI, HTTP, the Unix socket, the Store and SessionManager
classes; item 33.6 also the CLI's ``write_file``), so the same script runs against trees from before
the fixes. A tree whose agent/ and localizer/ folders install as perftracker.agent and
perftracker.localizer must be laid out under those names first (perftracker/agent, perftracker/
localizer; tests/ beside them). Needs root for the cross-uid cases (skipped otherwise). The last
stdout line is one JSON object: item -> result.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))
from bench.hardening_third import ITEMS as THIRD_ITEMS  # noqa: E402

TOKEN = "probe-token-0123456789abcdef"


def log(msg: str) -> None:
    sys.stderr.write(f"[hardening] {msg}\n")
    sys.stderr.flush()


class Localizer:
    def __init__(self, tree: Path, tmp: Path, extra: list[str] | None = None, nofile: int | None = None,
                 token: str | None = TOKEN) -> None:
        self.tmp = tmp
        ready = tmp / f"ready-{time.monotonic_ns()}.json"
        env = dict(os.environ, PYTHONPATH=str(tree), PERFTRACKER_DISABLE="1")
        env.pop("PERFTRACKER_TOKEN", None)
        if token is not None:
            env["PERFTRACKER_TOKEN"] = token

        def limit() -> None:
            import resource

            if nofile:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.log_path = tmp / "localizer.log"
        self.proc = subprocess.Popen([sys.executable, "-m", "perftracker", "localizer", "--port", "0", "--store",
                                      str(tmp / "store" / "s.sqlite"), "--ready-file", str(ready), *(extra or [])],
                                     env=env, stdout=open(self.log_path, "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115
                                     preexec_fn=limit, cwd=str(tree))
        end = time.monotonic() + 60
        while not ready.exists():
            if self.proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"localizer did not start: {self.log_path.read_text()[-800:]}")
            time.sleep(0.05)
        self.port = int(json.loads(ready.read_text())["url"].rsplit(":", 1)[1])

    def request(self, method: str, path: str, body: Any = None, raw: bytes | None = None,
                headers: dict[str, str] | None = None, timeout: float = 20) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
            conn.request(method, path, body=data, headers={"Authorization": f"Bearer {TOKEN}",
                                                           "Content-Type": "application/json", **(headers or {})})
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _ps(tree: Path, job: str, session: str, rank: int, world: int, **extra: Any) -> dict[str, Any]:
    code = ("import json,sys; sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + '/tests');"
            "from service_helpers import make_pattern_set as m;"
            "print(json.dumps(m(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])).to_dict()))")
    out = subprocess.run([sys.executable, "-c", code, str(tree), job, session, str(rank), str(world)],
                         capture_output=True, text=True, check=True, env=dict(os.environ, PERFTRACKER_DISABLE="1"))
    return {**json.loads(out.stdout), **extra}


def _workers(ranks: list[int], world: int) -> list[dict[str, Any]]:
    return [{"rank": r, "local_rank": r, "world_size": world, "pid": 100 + r, "tid": 100 + r, "host": "n"} for r in ranks]


# ---------------------------------------------------------------- items
def item_run_dir(tree: Path, tmp: Path) -> str:
    if os.geteuid() != 0:
        return "skipped (needs root)"
    d = Path(tempfile.mkdtemp(prefix="pt-probe-", dir="/tmp")) / "rd"
    d.mkdir(mode=0o777)
    os.chmod(d, 0o777)
    os.chown(d, 10001, 10001)
    victim = tmp / "victim"
    victim.write_text("precious")
    (d / "agent.tmp").symlink_to(victim)
    (d / "agent.json.tmp").symlink_to(victim)
    env = dict(os.environ, PYTHONPATH=str(tree), PERFTRACKER_DISABLE="1")
    proc = subprocess.Popen([sys.executable, "-m", "perftracker", "agent", "--run-dir", str(d), "--runs-dir",
                             str(tmp / "runs"), "--embedded-localizer", "--no-samplers"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 20
    while time.monotonic() < end and proc.poll() is None and not (d / "agent.sock").exists():
        time.sleep(0.1)
    time.sleep(0.5)
    started = (d / "agent.sock").exists()
    proc.terminate()
    try:
        _, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    refused = next((ln for ln in err.splitlines() if "refusing" in ln), "")
    return (f"agent in a 0777 dir of uid 10001: {'listened' if started else 'refused'}"
            f"{': ' + refused[:90] if refused else ''}; planted symlink target "
            f"{'overwritten' if victim.read_text() != 'precious' else 'untouched'}")


def item_slow_clients(tree: Path, tmp: Path) -> str:
    (tmp / "slow").mkdir()
    loc = Localizer(tree, tmp / "slow", nofile=1024)
    try:
        s = socket.create_connection(("127.0.0.1", loc.port))
        s.sendall(b"GET /v1/healthz HTTP/1.1\r\nHost: x\r\n")
        s.settimeout(15)
        t0 = time.monotonic()
        try:
            closed = s.recv(10) == b""
        except TimeoutError:
            closed = False
        held = time.monotonic() - t0
        s.close()
        idle = []
        for _ in range(1100):
            try:
                idle.append(socket.create_connection(("127.0.0.1", loc.port), timeout=5))
            except OSError:
                break
        time.sleep(0.5)
        t0 = time.monotonic()
        try:
            status, _ = loc.request("GET", "/v1/healthz", timeout=10)
        except (OSError, http.client.HTTPException) as exc:
            status = type(exc).__name__
        took = time.monotonic() - t0
        for c in idle:
            c.close()
        emfile = loc.log_path.read_text().count("Too many open files")
        return (f"unfinished headers {f'closed after {held:.1f} s' if closed else f'still open after {held:.0f} s'}; "
                f"ulimit 1024 + 1100 idle sockets: healthz {status} in {took:.1f} s, {emfile} EMFILE log lines")
    finally:
        loc.stop()


def item_sessions_1000(tree: Path, tmp: Path) -> str:
    (tmp / "s1000" / "store").mkdir(parents=True)
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]);"
            "from perftracker.localizer.store.sqlite_store import Store, SessionRecord; s = Store(sys.argv[2]); now = time.time_ns();"
            "[s.insert_session(SessionRecord(seq=0, session=f's{i:05d}', job='j', kind='slowdown', reason='r',"
            " window_s=1.0, state='done', opened_ns=now, deadline_ns=now, expected=(0,))) for i in range(1002)]")
    subprocess.run([sys.executable, "-c", code, str(tree), str(tmp / "s1000" / "store" / "s.sqlite")], check=True,
                   env=dict(os.environ, PERFTRACKER_DISABLE="1"))
    loc = Localizer(tree, tmp / "s1000")
    try:
        names: list[str] = []
        after = None
        for _ in range(10):  # follow the pages (an older localizer has no cursor: one page)
            _, body = loc.request("GET", "/v1/sessions" + (f"?after={after}" if after else ""))
            d = json.loads(body)
            names += [s["session"] for s in d["sessions"]]
            after = d.get("next")
            if not after:
                break
        _, body = loc.request("GET", "/v1/sessions?order=desc&limit=1&state=done")
        latest = json.loads(body)["sessions"][0]["session"]
        return (f"1002 sessions: {len(set(names))} listed over the pages, newest s01001 "
                f"{'present' if 's01001' in names else 'missing'}; 'latest' query answers {latest}")
    finally:
        loc.stop()


def item_write_scope(tree: Path, tmp: Path) -> str:
    (tmp / "scope").mkdir()
    loc = Localizer(tree, tmp / "scope", extra=["--window-s", "60"])
    try:
        st, b = loc.request("POST", "/v1/agents/register", {"job": "victim", "agent_id": "a", "host": "n",
                                                             "workers": _workers([0, 1], 2)})
        key = json.loads(b).get("agent_key", "")
        _, b = loc.request("POST", "/v1/jobs/victim/triggers", {"reason": "t"})
        session = json.loads(b)["session"]
        mine = _ps(tree, "victim", session, 0, 2)
        st_up, _ = loc.request("POST", f"/v1/sessions/{session}/patterns", mine, headers={"X-Perftracker-Agent-Key": key})
        st_reg, _ = loc.request("POST", "/v1/agents/register", {"job": "victim", "agent_id": "evil", "host": "x",
                                                                 "workers": _workers([0], 2)})
        theirs = _ps(tree, "victim", session, 0, 2, host="evil-host")
        st_rep, _ = loc.request("POST", f"/v1/sessions/{session}/patterns", theirs)
        return f"owner upload {st_up}; other agent re-registers rank 0: {st_reg}; replaces its upload: {st_rep}"
    finally:
        loc.stop()


_BIG = r"""
import json, sys, zlib
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/tests")
from service_helpers import make_pattern_set
ps = make_pattern_set("big", sys.argv[2], int(sys.argv[3]), 64, n_python=30000, n_kernels=10000, seed=int(sys.argv[3]))
sys.stdout.buffer.write(zlib.compress(json.dumps(ps.to_dict()).encode(), 6))
"""


def item_memory(tree: Path, tmp: Path) -> str:
    import psutil

    (tmp / "mem").mkdir()
    loc = Localizer(tree, tmp / "mem", extra=["--window-s", "300"])
    try:
        _, b = loc.request("POST", "/v1/agents/register", {"job": "big", "agent_id": "a", "host": "n",
                                                           "workers": _workers(list(range(64)), 64)})
        key = json.loads(b).get("agent_key", "")
        _, b = loc.request("POST", "/v1/jobs/big/triggers", {"reason": "t"})
        session = json.loads(b)["session"]
        proc = psutil.Process(loc.proc.pid)
        rss0 = proc.memory_info().rss
        inflated = 0
        statuses = []
        for rank in range(16):
            body = subprocess.run([sys.executable, "-c", _BIG, str(tree), session, str(rank)], capture_output=True,
                                  check=True, env=dict(os.environ, PERFTRACKER_DISABLE="1")).stdout
            inflated += len(zlib.decompress(body))
            st, _ = loc.request("POST", f"/v1/sessions/{session}/patterns", raw=body,
                                headers={"Content-Type": "application/x-perftracker-patterns+zlib",
                                         "X-Perftracker-Agent-Key": key}, timeout=120)
            statuses.append(st)
        rss1 = proc.memory_info().rss
        return (f"16 uploads of {inflated / 16 / 2**20:.1f} MiB JSON ({set(statuses)}), session open: RSS "
                f"{rss0 / 2**20:.0f} -> {rss1 / 2**20:.0f} MB")
    finally:
        loc.stop()


def item_tokens(tree: Path, tmp: Path) -> str:
    tokens = []
    for i in range(2):
        (tmp / f"tok{i}").mkdir(exist_ok=True)
        d = tmp / "tokstore"
        env = dict(os.environ, PYTHONPATH=str(tree), PERFTRACKER_DISABLE="1")
        env.pop("PERFTRACKER_TOKEN", None)
        ready = tmp / f"tok{i}" / "ready.json"
        p = subprocess.Popen([sys.executable, "-m", "perftracker", "localizer", "--port", "0", "--store",
                              str(d / "s.sqlite"), "--ready-file", str(ready)], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        end = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < end:
            time.sleep(0.05)
        tokens.append((d / "token").read_text().strip() if (d / "token").exists() else "")
        p.terminate()
        p.wait(15)
    weak = {}
    for t in ("x", "REPLACE-ME-with-a-random-token"):
        env = dict(os.environ, PYTHONPATH=str(tree), PERFTRACKER_DISABLE="1", PERFTRACKER_TOKEN=t)
        ready = tmp / f"weak-{len(weak)}.json"
        p = subprocess.Popen([sys.executable, "-m", "perftracker", "localizer", "--port", "0", "--store",
                              str(tmp / f"weak{len(weak)}" / "s.sqlite"), "--ready-file", str(ready)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.monotonic() + 30
        while not ready.exists() and p.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
        weak[t[:10]] = "refused" if p.poll() not in (None, 0) else "accepted"
        p.terminate()
        p.wait(15)
    return f"token kept across a restart: {tokens[0] == tokens[1] and bool(tokens[0])}; weak tokens: {weak}"


def item_bad_input(tree: Path, tmp: Path) -> str:
    (tmp / "bad").mkdir()
    loc = Localizer(tree, tmp / "bad", extra=["--window-s", "60"])
    try:
        _, b = loc.request("POST", "/v1/agents/register", {"job": "jb", "agent_id": "a", "host": "n",
                                                           "workers": _workers([0, 1], 2)})
        key = json.loads(b).get("agent_key", "")
        _, b = loc.request("POST", "/v1/jobs/jb/triggers", {"reason": "t"})
        session = json.loads(b)["session"]
        good = _ps(tree, "jb", session, 0, 2)
        h = {"X-Perftracker-Agent-Key": key}
        reg = json.dumps({"job": "jb", "agent_id": "b", "host": "n", "workers": _workers([1], 2)})
        cases = {
            "deep": ("/v1/agents/register", b"[" * 100_000 + b"]" * 100_000),
            "Infinity": (f"/v1/sessions/{session}/patterns", json.dumps({**good, "coords": {"dp": 1}}).replace(
                '"dp": 1', '"dp": Infinity').encode()),
            "surrogate": ("/v1/agents/register", reg.replace('"host": "n"', '"host": "\\ud800"', 1).encode()),
            "nan_str": (f"/v1/sessions/{session}/patterns", json.dumps({**good, "iteration_ms": ["nan"]}).encode()),
        }
        out = {name: loc.request("POST", path, raw=body, headers=h)[0] for name, (path, body) in cases.items()}
        tb = loc.log_path.read_text().count("Traceback")
        return f"statuses {out}; tracebacks in the log: {tb}"
    finally:
        loc.stop()


_FULL = r"""
import json, resource, signal, sys
sys.path.insert(0, sys.argv[2]); sys.path.insert(0, sys.argv[2] + "/tests")
from pathlib import Path
from perftracker.localizer.service.session.manager import SessionManager
from perftracker.localizer.store.sqlite_store import Store
from perftracker.localizer.service.validate import parse_registration
from service_helpers import make_pattern_set, workers
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
path = Path(sys.argv[1]); store = Store(path); mgr = SessionManager(store)
mgr.register(parse_registration({"job": "j", "agent_id": "a", "workers": workers(range(400), 400)}))
s, _ = mgr.trigger("j", "t")
wal = Path(str(path) + "-wal"); soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (max(path.stat().st_size, wal.stat().st_size) + 400_000, hard))
ok = 0
for r in range(400):
    try:
        mgr.accept_patterns(make_pattern_set("j", s.session, r, 400, seed=r)); ok += 1
    except Exception:
        pass
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
print(json.dumps({"counted": len(mgr.view(s.session).uploaded), "stored": len(Store(path).uploaded_ranks(s.session))}))
"""


def item_counts(tree: Path, tmp: Path) -> str:
    out = subprocess.run([sys.executable, "-c", _FULL, str(tmp / "full.sqlite"), str(tree)], capture_output=True,
                         text=True, env=dict(os.environ, PERFTRACKER_DISABLE="1"), timeout=300)
    if out.returncode:
        return f"error: {out.stderr[-200:]}"
    d = json.loads(out.stdout.strip().splitlines()[-1])
    return f"disk full part way: {d['counted']} counted in memory vs {d['stored']} in the store"


def item_agent_inputs(tree: Path, tmp: Path) -> str:
    d = Path(tempfile.mkdtemp(prefix="pt-probe-", dir="/tmp"))
    env = dict(os.environ, PYTHONPATH=str(tree), PERFTRACKER_DISABLE="1")
    proc = subprocess.Popen([sys.executable, "-m", "perftracker", "agent", "--run-dir", str(d), "--runs-dir",
                             str(tmp / "runs-agent"), "--embedded-localizer", "--no-samplers"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 30
        while not (d / "agent.sock").exists() and time.monotonic() < end:
            time.sleep(0.1)
        time.sleep(0.5)
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(d / "agent.sock"))

        def send(msg: dict[str, Any]) -> None:
            b = json.dumps(msg).encode()
            s.sendall(struct.pack(">I", len(b)) + b)

        send({"type": "register", "protocol": 1, "job": "jv", "rank": 0, "world_size": 1, "local_rank": 0,
              "pid": os.getpid(), "training_tid": os.getpid(), "host": "h"})
        s.settimeout(10)
        (n,) = struct.unpack(">I", s.recv(4))
        s.recv(n)
        victim = tmp / "victim.npz"
        victim.write_text("keep")
        send({"type": "window_done", "session": "nosuch", "raw_path": str(victim), "start_ns": 1, "end_ns": 2,
              "error": ""})
        send({"type": "iter_stats", "iteration": 3, "recent_ms": [1.0], "mean_ms": "fast"})
        time.sleep(3)
        s.settimeout(1)
        try:
            alive = s.recv(1) != b""
        except TimeoutError:
            alive = True
        s.close()
        return (f"wrong-type field: connection {'kept' if alive else 'dropped'}; raw_path outside the run dir: "
                f"{'kept' if victim.exists() else 'deleted'}")
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def item_modes(tree: Path, tmp: Path) -> str:
    (tmp / "modes").mkdir()
    loc = Localizer(tree, tmp / "modes")
    loc.stop()
    store = tmp / "modes" / "store"
    return (f"store dir {stat.S_IMODE(store.stat().st_mode):04o}, store file "
            f"{stat.S_IMODE((store / 's.sqlite').stat().st_mode):04o}")


# ---------------------------------------------------------------- issue 33
OSC52 = "\x1b]52;c;cm0gLXJmIH4=\x07"  # write to the clipboard
TITLE = "\x1b]0;PWNED\x07"  # set the window title
RLO = "\u202e"


def _env(tree: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFTRACKER_")}
    return {**env, "PYTHONPATH": str(tree), "PERFTRACKER_DISABLE": "1", "COLUMNS": "200", **extra}


def _cli(tree: Path, *args: str, cwd: Path, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "perftracker", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=_env(tree, **extra))


def _outcome(done: subprocess.CompletedProcess[str]) -> str:
    if "Traceback" in done.stderr:
        last = done.stderr.strip().splitlines()[-1]
        return f"rc {done.returncode}, traceback ({last.split(':')[0]})"
    lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
    return f"rc {done.returncode}" + (f", {len(lines)} error line(s)" if done.returncode else "")


class JsonServer:
    """An HTTP server on a thread: answers ``routes`` (path -> JSON) and every POST with ``post``;
    counts the requests (``hits``). A stand-in localizer for the hardening rows and their tests."""

    def __init__(self, routes: dict[str, Any], post: Any = None) -> None:
        import http.server
        import threading
        from urllib.parse import unquote

        self.hits: list[str] = []
        hits = self.hits

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                path = unquote(self.path.split("?")[0])
                hits.append(f"{self.command} {path}")
                body = post if self.command == "POST" and post is not None else routes.get(path)
                data = json.dumps(body if body is not None else {"error": "no such thing"}).encode()
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._answer()

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self._answer()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _report_dict(tree: Path, **changes: Any) -> dict[str, Any]:
    code = ("import json, sys; sys.path.insert(0, sys.argv[1] + '/tests');"
            "from report_samples import slow_compute_report; print(json.dumps(slow_compute_report().to_dict()))")
    out = subprocess.run([sys.executable, "-c", code, str(tree)], capture_output=True, text=True, check=True,
                         env=_env(tree))
    return {**json.loads(out.stdout), **changes}


def _hostile_report(tree: Path, path: Path) -> Path:
    d = _report_dict(tree, trigger_reason=f"loss spiked [/x] {OSC52} {RLO}evil")
    d["findings"][0]["label"] = d["findings"][0]["key"] = f"model.forward[/layer]{TITLE}"
    path.write_text(json.dumps(d))
    return path


def _agent_until(tree: Path, args: list[str], cwd: Path, ready: Path, timeout: float = 25,
                 probe: Any = None) -> tuple[str, str, Any]:
    """Start `perftracker agent`; wait until ``ready`` exists or it exits; call ``probe()`` while
    it runs. (started|exited, its stderr, what probe returned)."""
    proc = subprocess.Popen([sys.executable, "-m", "perftracker", "agent", *args], cwd=cwd, env=_env(tree),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None and not ready.exists():
        time.sleep(0.1)
    state = "exited" if proc.poll() is not None else "started"
    time.sleep(0.5)
    seen = probe() if probe is not None and state == "started" else None
    proc.terminate()
    try:
        _, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return state, err, seen


def item_planted_runs_dir(tree: Path, tmp: Path) -> str:
    if os.geteuid() != 0:
        return "skipped (needs root)"
    import fcntl

    shared = Path(tempfile.mkdtemp(prefix="pt-probe-", dir="/tmp"))
    os.chmod(shared, 0o1777)
    planted = shared / "perftracker-runs"
    planted.mkdir(mode=0o777)
    os.chmod(planted, 0o777)
    theirs = JsonServer({"/v1/healthz": {"ok": True}, "/v1/jobs": {"jobs": []}})
    try:
        (planted / "localizer.json").write_text(json.dumps({"url": theirs.url, "pid": 1}))
        (planted / "token").write_text("attacker-token-0123456789\n")
        (planted / "localizer.lock").touch()
        for p in (planted, *planted.iterdir()):
            os.chown(p, 10001, 10001)
        with open(planted / "localizer.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # "their" localizer holds the lock
            rd = shared / "rd"
            state, err, _ = _agent_until(tree, ["--run-dir", str(rd), "--embedded-localizer", "--no-samplers"],
                                         shared, rd / "agent.json")
        redirected = "already running at " + theirs.url in err
        said = "refused (owned by uid 10001)" if "owned by uid 10001" in err and "refusing" in err else state
        planted_dir = (f"agent in a 0777 runs dir of uid 10001: {'redirected to their server' if redirected else said}"
                       f", {len(theirs.hits)} request(s) to it")
        # only a token planted in a runs dir of ours
        mine = tmp / "own"
        (mine / "perftracker-runs").mkdir(parents=True)
        token = mine / "perftracker-runs" / "token"
        token.write_text("attacker-token-0123456789\n")
        os.chown(token, 10001, 10001)
        info = mine / "perftracker-runs" / "localizer.json"

        def their_token_works() -> bool:
            url = json.loads(info.read_text())["url"]
            req = urllib.request.Request(url + "/v1/jobs", headers={"Authorization": "Bearer attacker-token-0123456789"})
            try:
                with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=5) as r:
                    return r.status == 200
            except OSError:
                return False

        state2, err2, works = _agent_until(tree, ["--run-dir", str(tmp / "rd2"), "--embedded-localizer",
                                                  "--no-samplers"], mine, info, probe=their_token_works)
        planted_token = ("adopted (their token is the localizer's)" if works else
                         "refused" if "token file" in err2 and "refusing" in err2 else state2)
        # agent.log planted as a symlink
        victim = tmp / "victim.log"
        victim.write_text("precious\n")
        (mine / "run3" / "perftracker-runs").mkdir(parents=True)
        (mine / "run3" / "perftracker-runs" / "agent.log").symlink_to(victim)
        _cli(tree, "run", "--wait-s", "1", "--", sys.executable, "-c", "pass", cwd=mine / "run3", timeout=120)
        log_link = "written through" if victim.read_text() != "precious\n" else "untouched"
        return f"{planted_dir}; a planted token file (uid 10001): {planted_token}; agent.log symlink target {log_link}"
    finally:
        theirs.close()
        shutil.rmtree(shared, ignore_errors=True)


def _synthetic_traces(d: Path, name: str, ranks: int = 2) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        events = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 7, "tid": 7,
                   "ts": 1000.0 + i * 1000, "dur": 990.0} for i in range(3)]
        events += [{"ph": "X", "cat": "cpu_op", "name": name, "pid": 7, "tid": 7, "ts": 1010.0 + i * 1000,
                    "dur": 900.0} for i in range(3)]
        events += [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 7, "ts": 1920.0 + i * 1000,
                    "dur": 50.0} for i in range(3)]
        (d / f"rank{r}.json").write_text(json.dumps({"traceEvents": events,
                                                     "distributedInfo": {"rank": r, "world_size": ranks}}))
    return d


def item_escapes(tree: Path, tmp: Path) -> str:
    src = _hostile_report(tree, tmp / "r.json")
    counts = {}
    shown = {}
    rep = _cli(tree, "report", "--file", str(src), cwd=tmp)
    counts["report"] = rep.stdout.count("\x1b]") + rep.stdout.count(RLO)
    shown["report"] = rep.stdout.count("\\x1b]")
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]);"
            "from perftracker.localizer.store.sqlite_store import Store, SessionRecord; s = Store(sys.argv[2]);"
            "s.insert_session(SessionRecord(seq=0, session='s1', job='j', kind='slowdown', reason=sys.argv[3],"
            " window_s=1.0, state='open', opened_ns=time.time_ns(), deadline_ns=time.time_ns(), expected=(0,)))")
    subprocess.run([sys.executable, "-c", code, str(tree), str(tmp / "s.sqlite"), f"spike {OSC52}{RLO}"], check=True,
                   env=_env(tree))
    ses = _cli(tree, "sessions", "--store", str(tmp / "s.sqlite"), cwd=tmp)
    counts["sessions"] = ses.stdout.count("\x1b]") + ses.stdout.count(RLO)
    shown["sessions"] = ses.stdout.count("\\x1b]")
    traces = _synthetic_traces(tmp / "traces", "model.step\x1b[2J\x1b[H")  # clear the screen
    ana = _cli(tree, "analyze", str(traces), "--patterns", cwd=tmp)
    counts["analyze"] = ana.stdout.count("\x1b[2J")
    shown["analyze"] = ana.stdout.count("\\x1b[2J")
    return f"raw OSC 52 / OSC 0 / CSI 2J / U+202E sequences printed: {counts}; shown escaped: {shown}"


def item_markup(tree: Path, tmp: Path) -> str:
    src = _hostile_report(tree, tmp / "r.json")
    rep = _cli(tree, "report", "--file", str(src), "-o", str(tmp / "r.txt"), cwd=tmp)
    traces = _synthetic_traces(tmp / "traces", "model.forward[/layer]")
    ana = _cli(tree, "analyze", str(traces), "-o", str(tmp / "a.txt"), cwd=tmp)
    return (f"report -o r.txt: {_outcome(rep)}, file {'written' if (tmp / 'r.txt').exists() else 'missing'}; "
            f"analyze -o a.txt: {_outcome(ana)}, file {'written' if (tmp / 'a.txt').exists() else 'missing'}")


_WRITE = r"""
import sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from perftracker.cli import output
planted = Path(sys.argv[2])
output._tmp_name = lambda out: planted  # the attacker guessed the temporary file's name
try:
    output.write_file(sys.argv[3], lambda fh: fh.write("the report\n"))
    print("written")
except Exception as exc:
    print(f"refused ({str(exc).split('(')[-1].rstrip(')')})")
"""


def item_o_symlink(tree: Path, tmp: Path) -> str:
    shared = Path(tempfile.mkdtemp(prefix="pt-probe-", dir="/tmp"))
    try:
        os.chmod(shared, 0o1777)
        victim = tmp / "victim.txt"
        victim.write_text("precious")
        planted = shared / ".r.txt.1234.tmp"
        planted.symlink_to(victim)
        if os.geteuid() == 0:
            os.chown(planted, 10001, 10001, follow_symlinks=False)
        out = subprocess.run([sys.executable, "-c", _WRITE, str(tree), str(planted), str(shared / "r.txt")],
                             capture_output=True, text=True, env=_env(tree), timeout=60)
        names = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]);"
                                "from pathlib import Path; from perftracker.cli.output import _tmp_name as t;"
                                "print(t(Path('r.txt')) == t(Path('r.txt')))", str(tree)],
                               capture_output=True, text=True, env=_env(tree)).stdout.strip()
        return (f"-o through a symlink planted at its temporary name: {out.stdout.strip() or out.stderr[-80:]}, "
                f"target {'overwritten' if victim.read_text() != 'precious' else 'untouched'}; "
                f"temporary name predictable: {names == 'True'}")
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def item_trigger_path(tree: Path, tmp: Path) -> str:
    sid = "../../pwn/planted-by-localizer"
    report = _report_dict(tree, session=sid)
    fake = JsonServer({"/v1/jobs": {"jobs": ["j"]},
                    f"/v1/sessions/{sid}": {"session": sid, "state": "done", "deadline_ns": time.time_ns(),
                                            "uploaded": [0], "expected": [0], "window_s": 1.0, "error": "",
                                            "report_path": ""},
                    f"/v1/sessions/{sid}/report": report}, post={"session": sid, "joined": False})
    try:
        work = tmp / "a" / "b"
        work.mkdir(parents=True)
        done = _cli(tree, "trigger", "--url", fake.url, "--token", TOKEN, cwd=work)
    finally:
        fake.close()
    outside = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("planted-by-localizer*"))
    return f"session id {sid!r} from the localizer: {_outcome(done)}; files written outside reports/: {outside}"


def item_gzip_bomb(tree: Path, tmp: Path) -> str:
    import gzip

    traces = _synthetic_traces(tmp / "traces", "aten::addmm")
    bomb = traces / "rank2.json.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as fh:
        chunk = b" " * 2**20
        for _ in range(600):
            fh.write(chunk)
    code = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True);"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); print(r.returncode);"
            "print(r.stderr)")
    out = subprocess.run([sys.executable, "-c", code, sys.executable, "-m", "perftracker", "analyze", str(traces),
                          "-j", "1"], capture_output=True, text=True, env=_env(tree), timeout=300, cwd=tmp)
    lines = out.stdout.splitlines()
    rss_mb, rc = int(lines[0]) / 1024, lines[1]
    skipped = "skipped" in out.stdout and "rank2.json.gz" in out.stdout
    return (f"{bomb.stat().st_size / 1e6:.1f} MB .json.gz of 600 MiB whitespace: analyze rc {rc}, peak RSS "
            f"{rss_mb:.0f} MB, bomb {'skipped with a warning' if skipped else 'read'}")


def item_trace_numbers(tree: Path, tmp: Path) -> str:
    """Run without orjson (an optional package) as the review did: json reads NaN."""
    shim = tmp / "no-orjson"
    shim.mkdir()
    (shim / "orjson.py").write_text("raise ImportError('not installed')\n")
    results = {}
    cases = {"ts 1e300 in one event of rank 1": ("ts", 1e300), "ProfilerStep dur NaN in rank 1": ("dur", "nan"),
             "distributedInfo.rank 10**12": ("rank", 10**12)}
    for label, (what, value) in cases.items():
        traces = _synthetic_traces(tmp / f"t-{what}", "aten::addmm")
        doc = json.loads((traces / "rank1.json").read_text())
        if what == "ts":
            doc["traceEvents"][4]["ts"] = value
        elif what == "dur":
            doc["traceEvents"][0]["dur"] = float(value)
        else:
            doc["distributedInfo"]["rank"] = value
        (traces / "rank1.json").write_text(json.dumps(doc))
        env = {"PYTHONPATH": f"{shim}{os.pathsep}{tree}"}
        done = _cli(tree, "analyze", str(traces), "--format", "json", cwd=tmp, timeout=180, **env)
        if done.returncode or "Traceback" in done.stderr:
            results[label] = _outcome(done)
            continue
        report = json.loads(done.stdout)
        text = f"ranks reported {report['ranks_reported']}, missing {report['ranks_missing']}"
        pats = _cli(tree, "analyze", str(traces), "--patterns", "--format", "json", cwd=tmp, timeout=180, **env)
        sets = {ps["rank"]: ps for ps in json.loads(pats.stdout)} if pats.returncode == 0 else {}
        odd = [r for r in sets if r != 0]
        if odd:
            ps = sets[odd[0]]
            window_ms = (ps["window_end_ns"] - ps["window_start_ns"]) / 1e6
            text += f" (rank {odd[0]}: {window_ms:.3g} ms window, {len(ps['patterns'])} functions)"
        elif "skipped" in done.stderr:
            text += " (rank1.json skipped with a warning)"
        results[label] = text
    return "; ".join(f"{k}: {v}" for k, v in results.items())


def item_name_newline(tree: Path, tmp: Path) -> str:
    (tmp / "nl").mkdir()
    loc = Localizer(tree, tmp / "nl")
    try:
        out = {}
        for job in ("teama-x\n", "teama-x"):
            st, _ = loc.request("POST", "/v1/agents/register", {"job": job, "agent_id": "a" + str(len(out)),
                                                                 "host": "n", "workers": _workers([0], 1)})
            out[job] = st
        _, body = loc.request("GET", "/v1/jobs")
        return f"register 'teama-x\\n': {out['teama-x' + chr(10)]}, 'teama-x': {out['teama-x']}; jobs {json.loads(body)['jobs']}"
    finally:
        loc.stop()


def item_report_file(tree: Path, tmp: Path) -> str:
    res = {}
    for label, change in (("ranks_reported ['x']", {"ranks_reported": ["x"]}),
                          ("iteration_ms NaN", {"iteration_ms": {"0": [float("nan")]}})):
        path = tmp / f"bad{len(res)}.json"
        path.write_text(json.dumps(_report_dict(tree, **change)))
        res[label] = _outcome(_cli(tree, "report", "--file", str(path), cwd=tmp))
    html = _cli(tree, "report", "--file", str(_hostile_report(tree, tmp / "r.json")), "--format", "html", "-o",
                str(tmp / "r.html"), cwd=tmp)
    raw = (tmp / "r.html").read_text().count(RLO) if (tmp / "r.html").exists() else -1
    return "; ".join(f"report --file with {k}: {v}" for k, v in res.items()) + \
        f"; U+202E in HTML output: {raw} raw ({_outcome(html)})"


# ---------------------------------------------------------------- issue 33, items 1 and 2: sizes from tenants
def _hwm_mb(pid: int, key: str = "VmHWM") -> float:
    """The process's peak (VmHWM) or current (VmRSS) resident size, MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def _wait_report(loc: Localizer, session: str, timeout: float = 120) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        st, body = loc.request("GET", f"/v1/sessions/{session}/report", timeout=60)
        if st == 200:
            return str(json.loads(body).get("status"))
        if st not in (202,):
            try:
                return f"{st} {json.loads(body).get('error', '')[:100]}"
            except ValueError:
                return str(st)
        time.sleep(0.2)
    return f"no report after {timeout:.0f} s"


def item_world_upload(tree: Path, tmp: Path) -> str:
    """Register two ranks, upload rank 0 with world_size 20,000,000 (then rank 1): the peak RSS;
    then window_end_ns, executions and a hang snapshot's taken_ns of 2**70."""
    (tmp / "store").mkdir()
    loc = Localizer(tree, tmp, extra=["--window-s", "300"])
    try:
        out = []
        _, b = loc.request("POST", "/v1/agents/register", {"job": "w", "agent_id": "a", "host": "n",
                                                           "workers": _workers([0, 1], 2)})
        key = {"X-Perftracker-Agent-Key": json.loads(b).get("agent_key", "")}
        _, b = loc.request("POST", "/v1/jobs/w/triggers", {"reason": "t"})
        session = json.loads(b)["session"]
        peak0 = _hwm_mb(loc.proc.pid)
        st0, _ = loc.request("POST", f"/v1/sessions/{session}/patterns", _ps(tree, "w", session, 0, 20_000_000),
                             headers=key)
        if st0 != 200:  # refused: rank 0 uploads its real patterns, so that the session completes
            loc.request("POST", f"/v1/sessions/{session}/patterns", _ps(tree, "w", session, 0, 2), headers=key)
        st1, _ = loc.request("POST", f"/v1/sessions/{session}/patterns", _ps(tree, "w", session, 1, 2), headers=key)
        status = _wait_report(loc, session)
        out.append(f"upload world_size 20,000,000: {st0}; rank 1: {st1}; report {status}; peak RSS "
                   f"{peak0:.0f} -> {_hwm_mb(loc.proc.pid):.0f} MB")
        _, b = loc.request("POST", "/v1/agents/register", {"job": "x", "agent_id": "b", "host": "n",
                                                           "workers": _workers([0, 1], 2)})
        key = {"X-Perftracker-Agent-Key": json.loads(b).get("agent_key", "")}
        _, b = loc.request("POST", "/v1/jobs/x/triggers", {"reason": "t", "window_s": 0.5})
        s2 = json.loads(b)["session"]
        ps = _ps(tree, "x", s2, 0, 2)
        ps["patterns"][0][6] = 2**70  # a row: [..., executions, critical_ns, resource]
        st_ex, _ = loc.request("POST", f"/v1/sessions/{s2}/patterns", ps, headers=key)
        st_end, _ = loc.request("POST", f"/v1/sessions/{s2}/patterns", _ps(tree, "x", s2, 1, 2, window_end_ns=2**70),
                                headers=key)
        snap = {"schema_version": 1, "job": "x", "rank": 0, "world_size": 2, "host": "n", "pid": 1, "taken_ns": 2**70,
                "last_iteration": 1, "idle_s": 30.0, "stack": [["dist.py", 10, "all_reduce"]], "session": s2}
        st_snap, _ = loc.request("POST", "/v1/hang-snapshots", snap, headers=key)
        st_ok, _ = loc.request("POST", f"/v1/sessions/{s2}/patterns", _ps(tree, "x", s2, 1, 2), headers=key)
        out.append(f"executions 2**70: {st_ex}; window_end_ns 2**70: {st_end}; hang taken_ns 2**70: {st_snap}; "
                   f"then a valid upload: {st_ok}, report {_wait_report(loc, s2)}")
        tb = loc.log_path.read_text().count("Traceback")
        return "; ".join(out) + f"; {tb} traceback(s) in the log"
    finally:
        loc.stop()


def item_huge_registration(tree: Path, tmp: Path) -> str:
    """One rank registered with world_size 10,000,000, 5 sessions triggered: RSS, idle CPU,
    GET /v1/sessions (size, time) and healthz meanwhile, report files."""
    import threading

    import psutil

    (tmp / "store").mkdir()
    loc = Localizer(tree, tmp, extra=["--collect-grace-s", "20"])
    try:
        proc = psutil.Process(loc.proc.pid)
        rss0 = _hwm_mb(loc.proc.pid, "VmRSS")
        loc.request("POST", "/v1/agents/register", {"job": "huge", "agent_id": "a", "host": "n",
                                                    "workers": _workers([0], 10_000_000)})
        statuses = []
        for i in range(5):
            st, b = loc.request("POST", "/v1/jobs/huge/triggers", {"reason": f"t{i}", "window_s": 0.1}, timeout=120)
            statuses.append(st)
            time.sleep(2.3)  # past the window and the join slack: the next opens a session
        rss1 = _hwm_mb(loc.proc.pid, "VmRSS")
        cpu0 = sum(proc.cpu_times()[:2])
        time.sleep(4)  # the sessions are open, nothing arrives
        idle_cpu = (sum(proc.cpu_times()[:2]) - cpu0) / 4 * 100
        got: dict[str, Any] = {}

        def listing() -> None:
            t0 = time.monotonic()
            st, body = loc.request("GET", "/v1/sessions", timeout=120)
            got.update(status=st, size=len(body), took=time.monotonic() - t0)

        th = threading.Thread(target=listing)
        th.start()
        worst = 0.0
        while th.is_alive():
            t0 = time.monotonic()
            conn = http.client.HTTPConnection("127.0.0.1", loc.port, timeout=60)
            conn.request("GET", "/v1/healthz")
            conn.getresponse().read()
            conn.close()
            worst = max(worst, time.monotonic() - t0)
            time.sleep(0.02)
        th.join()
        end = time.monotonic() + 120
        reports = tmp / "store" / "reports"
        while time.monotonic() < end:
            _, body = loc.request("GET", "/v1/sessions?state=open,localizing", timeout=120)
            if not json.loads(body)["sessions"]:
                break
            time.sleep(0.5)
        files = sorted(reports.glob("*.json")) if reports.exists() else []
        size = max((f.stat().st_size for f in files), default=0)
        return (f"5 triggers: {statuses}; RSS {rss0:.0f} -> {rss1:.0f} MB (peak {_hwm_mb(loc.proc.pid):.0f}), "
                f"{idle_cpu:.0f}% CPU idle; GET /v1/sessions {got.get('status')}: {_size(got.get('size', 0))} in "
                f"{got.get('took', 0):.2f} s, healthz meanwhile at most {worst:.2f} s; {len(files)} report file(s) of "
                f"up to {size / 1e6:.1f} MB")
    finally:
        loc.stop()


ITEMS = {"1 run dir": item_run_dir, "2 slow clients": item_slow_clients, "3 sessions > 1000": item_sessions_1000,
         "4 write scope": item_write_scope, "5 memory": item_memory, "6 tokens": item_tokens, "7/8 bad input": item_bad_input,
         "9 counts": item_counts, "10 agent inputs": item_agent_inputs, "11 modes": item_modes,
         # issue 33
         "33.1 upload world_size": item_world_upload, "33.2 huge registration": item_huge_registration,
         "33.3 planted runs dir": item_planted_runs_dir, "33.4 terminal escapes": item_escapes,
         "33.5 markup": item_markup, "33.6 -o symlink": item_o_symlink, "33.7 trigger path": item_trigger_path,
         "33.8 gzip bomb": item_gzip_bomb, "33.9 trace numbers": item_trace_numbers,
         "33.10 name newline": item_name_newline, "33.m report file, bidi": item_report_file,
         # issue 46 (bench/hardening_third.py)
         **THIRD_ITEMS}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", default=str(HERE), help="the perftracker checkout to attack (default: this one)")
    ap.add_argument("--only", default="", help="comma-separated item numbers")
    args = ap.parse_args()
    tree = Path(args.tree).resolve()
    results: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="pt-hardening-") as t:
        for name, fn in ITEMS.items():
            if args.only and name.split()[0] not in args.only.split(","):
                continue
            sub = Path(t) / name.split()[0].replace("/", "_")
            sub.mkdir()
            t0 = time.monotonic()
            try:
                results[name] = fn(tree, sub)
            except Exception as exc:  # noqa: BLE001 - reported as the observation
                results[name] = f"error: {type(exc).__name__}: {exc}"[:300]
            log(f"{name}: {results[name]} ({time.monotonic() - t0:.1f} s)")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
