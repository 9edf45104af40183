"""The images start with every option the overlays pass: each container command of the rendered
k8s/ overlays runs here, for real, with only what its image installs importable.

What an image installs is read from its Dockerfile (``pip install ".[extras]"``; the nsys image is
built FROM the agent image). The importable set is the standard library, the repo's packages, and
the distributions perftracker's base dependencies and those extras pull in (their requirements,
followed transitively through the installed metadata); a sitecustomize.py on PYTHONPATH hides
every other top-level module from the import system in the command and its children, as in the
image (find_spec finds nothing, import raises ModuleNotFoundError). Host-specific values are substituted: listen addresses become 127.0.0.1, ports free ones,
the volume paths (/var/run/perftracker, /data) temporary directories, Secret and fieldRef values
test strings; the trainer's torchrun runs one standalone process for 5 iterations. The containers
come from `kubectl kustomize` of the overlays, or from the manifest files where no kubectl >= 1.27
is on PATH. No container engine runs here, so the images themselves are not built."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from tests.system.test_manifests import KUSTOMIZE_MAJOR, render

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = {"perftracker/agent": "agent.Dockerfile", "perftracker/localizer": "localizer.Dockerfile",
               "perftracker/agent-nsys": "agent-nsys.Dockerfile"}
OVERLAYS = ("k8s/overlays/example", "k8s/overlays/example-nsys")
OWN_PACKAGES = {"perftracker", "agent", "localizer", "examples", "tests"}

SITECUSTOMIZE = '''\
import importlib.abc, importlib.machinery, json, os, sys
_ALLOWED = set(json.load(open(os.environ["PERFTRACKER_TEST_ALLOWED_MODULES"])))
class _ImageOnly(importlib.abc.MetaPathFinder):
    """Finds only modules the image has: others are absent (find_spec None, import ModuleNotFoundError)."""
    def __init__(self, inner):
        self.inner = inner
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in _ALLOWED or top in sys.stdlib_module_names or top.startswith("_"):
            return self.inner.find_spec(name, path, target)
        return None
    def invalidate_caches(self):
        getattr(self.inner, "invalidate_caches", lambda: None)()
_KEEP = (importlib.machinery.BuiltinImporter, importlib.machinery.FrozenImporter)
sys.meta_path[:] = [f if f in _KEEP else _ImageOnly(f) for f in sys.meta_path]
'''


# ------------------------------------------------------------------------------------------------
# what an image installs
# ------------------------------------------------------------------------------------------------


def image_extras(dockerfile: str) -> set[str]:
    text = (REPO / "docker" / dockerfile).read_text()
    extras: set[str] = set()
    if re.search(r"^FROM \$\{AGENT_IMAGE\}", text, flags=re.M):
        extras |= image_extras(DOCKERFILES["perftracker/agent"])
    for group in re.findall(r'pip install "\.\[([\w,-]+)\]"', text):
        extras |= set(group.split(","))
    return extras


def image_env(dockerfile: str) -> dict[str, str]:
    """The ENV settings of a Dockerfile (and of the image it is built FROM)."""
    text = (REPO / "docker" / dockerfile).read_text()
    env: dict[str, str] = {}
    if re.search(r"^FROM \$\{AGENT_IMAGE\}", text, flags=re.M):
        env.update(image_env(DOCKERFILES["perftracker/agent"]))
    for block in re.findall(r"^ENV ((?:.*\\\n)*.*)$", text, flags=re.M):
        for key, value in re.findall(r"(\w+)=(\S+)", block.replace("\\\n", " ")):
            env[key] = value
    return env


@cache
def _top_modules() -> dict[str, set[str]]:
    """canonical distribution name -> its top-level modules."""
    from packaging.utils import canonicalize_name

    out: dict[str, set[str]] = {}
    for module, dists in metadata.packages_distributions().items():
        for d in dists:
            out.setdefault(canonicalize_name(d), set()).add(module)
    return out


def allowed_modules(extras: set[str]) -> set[str]:
    """Top-level modules of the distributions perftracker[extras] installs (transitively)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    todo: list[tuple[str, frozenset[str]]] = []
    for req in project["dependencies"]:
        todo.append((req, frozenset()))
    for extra in extras:
        todo += [(req, frozenset()) for req in project["optional-dependencies"][extra]]
    seen: set[str] = set()
    while todo:
        text, _ = todo.pop()
        req = Requirement(text)
        name = canonicalize_name(req.name)
        if name == "perftracker":  # perftracker[a,b] inside the extras table
            todo += [(r, frozenset()) for e in req.extras for r in project["optional-dependencies"][e]]
            continue
        key = name + "[" + ",".join(sorted(req.extras)) + "]"
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = metadata.distribution(req.name).requires or []
        except metadata.PackageNotFoundError:
            continue  # optional on this platform, or not installed here (then not importable anyway)
        for sub in requires:
            r = Requirement(sub)
            envs = [{"extra": e} for e in (req.extras or {""})]
            if r.marker is None or any(r.marker.evaluate(e) for e in envs):
                todo.append((sub, frozenset()))
    modules = set(OWN_PACKAGES)
    for key in seen:
        modules |= _top_modules().get(key.partition("[")[0], set())
    return modules


# ------------------------------------------------------------------------------------------------
# the containers of the rendered overlays
# ------------------------------------------------------------------------------------------------


def containers() -> list[tuple[str, dict[str, Any]]]:
    """(source, container) of the rendered overlays; without a kubectl that can render them, of
    the manifest files themselves (a patch's partial containers, with no command line, left out)."""
    if KUSTOMIZE_MAJOR >= 5:
        docs = [(overlay, d) for overlay in OVERLAYS for d in render(overlay)]
    else:
        import yaml

        docs = [(str(p.relative_to(REPO)), d) for p in sorted((REPO / "k8s").rglob("*.yaml"))
                for d in yaml.safe_load_all(p.read_text()) if isinstance(d, dict)]
    out = []
    for source, d in docs:
        spec = d.get("spec", {}).get("template", {}).get("spec")
        if spec:
            out += [(source, c) for c in spec.get("initContainers", []) + spec.get("containers", [])
                    if c.get("args") or c.get("command")]
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _host_env(c: dict[str, Any], tmp: Path, image: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFTRACKER_")}
    env.update(image_env(DOCKERFILES[image]))
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = str(e["value"])
        elif "secretKeyRef" in e.get("valueFrom", {}):
            env[e["name"]] = "test-token-from-secret"
        else:  # fieldRef: the pod's name, node, namespace, job-name label
            env[e["name"]] = "train"
    return {k: _paths(v, tmp) for k, v in env.items()}


def _paths(text: str, tmp: Path) -> str:
    return text.replace("/var/run/perftracker", str(tmp / "run")).replace("/data/", str(tmp / "data") + "/") \
               .replace("/opt/perftracker/", str(REPO) + "/")


def _launch(argv: list[str], env: dict[str, str], extras: set[str], tmp: Path) -> subprocess.Popen[str]:
    site = tmp / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    allowed = tmp / "allowed.json"
    allowed.write_text(json.dumps(sorted(allowed_modules(extras))))
    env = dict(env, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]), PERFTRACKER_TEST_ALLOWED_MODULES=str(allowed))
    (tmp / "run").mkdir(exist_ok=True)
    (tmp / "data").mkdir(exist_ok=True)
    return subprocess.Popen(argv, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _get(url: str, token: str = "") -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return 0, ""


def _stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    return proc.returncode, proc.stdout.read() if proc.stdout else ""


def _serve_until_ready(argv: list[str], env: dict[str, str], extras: set[str], tmp: Path,
                       ready: Any, timeout_s: float = 60.0) -> str:
    """Start a long-running command; ``ready()`` polls it; it must then stop cleanly on SIGTERM."""
    proc = _launch(argv, env, extras, tmp)
    deadline = time.monotonic() + timeout_s
    ok = False
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if ready():
                ok = True
                break
            time.sleep(0.2)
    finally:
        code, out = _stop(proc)
    assert ok, f"{shlex.join(argv)} did not become ready (exit {code}):\n{out[-3000:]}"
    assert code == 0, f"{shlex.join(argv)}: exit {code} on SIGTERM:\n{out[-3000:]}"
    return out


def run_container(c: dict[str, Any], tmp: Path) -> str:
    """Run one container's command line as the image would (see the module doc)."""
    image = c["image"].rsplit(":", 1)[0]
    extras = image_extras(DOCKERFILES[image])
    env = _host_env(c, tmp, image)
    if c.get("command"):  # the trainer: sh -c "exec torchrun ... script args"
        words = shlex.split(" ".join(c["command"][2:] + c["args"]) if c["command"][:2] == ["sh", "-c"]
                            else " ".join(c["command"] + c.get("args", [])))
        words = [w for w in words if w != "exec"]
        assert words[0] == "torchrun", words
        script_at = next(i for i, w in enumerate(words) if w.endswith(".py"))
        script, script_args = _paths(words[script_at], tmp), words[script_at + 1:]
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", script,
                *script_args, "--iters", "5", "--quiet"]
        proc = _launch(argv, env, extras, tmp)
        try:
            proc.wait(180)
        finally:
            code, out = _stop(proc)
        assert code == 0, f"{shlex.join(argv)}: exit {code}:\n{out[-3000:]}"
        return out
    args = [_paths(str(a), tmp) for a in c["args"]]
    for flag in ("--host", "--metrics-host"):
        if flag in args:
            args[args.index(flag) + 1] = "127.0.0.1"
    ports = {flag: _free_port() for flag in ("--port", "--metrics-port") if flag in args}
    for flag, port in ports.items():
        args[args.index(flag) + 1] = str(port)
    argv = [sys.executable, "-m", "perftracker", *args]
    if args[0] == "agent":
        def ready() -> bool:
            info = tmp / "run" / "agent.json"
            if not info.is_file() or "--metrics-port" not in ports:
                return info.is_file()
            url = json.loads(info.read_text())["metrics_url"]
            health = _get(url.replace("/metrics", "/healthz"))[0]
            status, text = _get(url)
            return health == 200 and status == 200 and "perftracker_workers" in text
        return _serve_until_ready(argv, env, extras, tmp, ready)
    if args[0] == "localizer":
        base = f"http://127.0.0.1:{ports['--port']}"
        token = env["PERFTRACKER_TOKEN"]

        def ready() -> bool:
            status, text = _get(base + "/metrics", token)
            return _get(base + "/v1/healthz")[0] == 200 and status == 200 and "perftracker_localizer" in text
        return _serve_until_ready(argv, env, extras, tmp, ready)
    raise AssertionError(f"no runner for the command {args[0]!r} of container {c['name']}")


# ------------------------------------------------------------------------------------------------
# tests
# ------------------------------------------------------------------------------------------------


def test_dockerfiles_extras_are_read() -> None:
    assert image_extras("agent.Dockerfile") == {"agent", "gpu"}
    assert image_extras("agent-nsys.Dockerfile") == {"agent", "gpu"}
    assert image_extras("localizer.Dockerfile") == {"localizer", "k8s"}
    agent = allowed_modules({"agent", "gpu"})
    # the base install carries the embedded localizer's needs (aiohttp, rich, prometheus_client:
    # docs/compatibility.md); the node agent image has no Kubernetes client, statsmodels or test tools
    assert {"torch", "numpy", "psutil", "prometheus_client", "pynvml", "aiohttp", "rich"} <= agent
    assert not {"statsmodels", "kubernetes", "pytest", "yaml"} & agent
    assert {"aiohttp", "rich", "kubernetes", "multidict", "prometheus_client"} <= allowed_modules({"localizer", "k8s"})


@pytest.mark.timeout(600)
def test_every_container_command_starts_with_its_image_extras(tmp_path: Path) -> None:
    """Each distinct (image, command line) of the overlays starts, serves and stops cleanly."""
    done: set[str] = set()
    for _overlay, c in containers():
        image = c["image"].rsplit(":", 1)[0]
        key = json.dumps([sorted(image_extras(DOCKERFILES[image])), c.get("command"), c.get("args")])
        if key in done:
            continue
        done.add(key)
        tmp = tmp_path / f"{len(done)}-{c['name']}"
        tmp.mkdir()
        run_container(c, tmp)
    assert len(done) == 3  # the agent (example and nsys overlays share it), the localizer, the trainer


def test_the_check_fails_for_an_image_without_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent image whose installed packages lack prometheus_client (as the ".[gpu]" image did
    before it joined the base install) cannot serve the overlay's --metrics-port: the check sees it."""
    agent = next(c for _, c in containers() if c["name"] == "perftracker-agent")
    real = allowed_modules
    monkeypatch.setattr(sys.modules[__name__], "allowed_modules",
                        lambda extras: real(extras) - {"prometheus_client"})
    with pytest.raises(AssertionError, match="prometheus_client"):
        run_container(agent, tmp_path)
