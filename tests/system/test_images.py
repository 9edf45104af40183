"""The images start with every option the overlays pass: each container command of the rendered
k8s/ overlays runs here, for real, with only what its image installs importable.

What an image installs is read from its Dockerfile's ``pip install`` commands: the project with its
base dependencies and extras (``".[gpu]"``), or without them (``--no-deps .``) and requirements
named one by one; the nsys image is built FROM the agent image. The importable set is the standard
library, the repo's packages, and the distributions those requirements pull in (followed
transitively through the installed metadata); a sitecustomize.py on PYTHONPATH hides
every other top-level module from the import system in the command and its children, as in the
image (find_spec finds nothing, import raises ModuleNotFoundError). Host-specific values are substituted: listen addresses become 127.0.0.1, ports free ones,
the volume paths (/var/run/perftracker, /data) temporary directories, Secret and fieldRef values
test strings; the trainer's torchrun runs one standalone process for 5 iterations; a perftracker
command runs as the image's ``perftracker`` console script does (its program name is its role). The containers
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
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from tests.component.test_manifests import KUSTOMIZE_MAJOR, render

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = {"perftracker/agent": "agent.Dockerfile", "perftracker/localizer": "localizer.Dockerfile",
               "perftracker/agent-nsys": "agent-nsys.Dockerfile"}
OVERLAYS = ("k8s/overlays/example", "k8s/overlays/example-nsys")
OWN_PACKAGES = {"perftracker", "tests"}  # the repo's agent/ and localizer/ install as perftracker.agent, .localizer
# The image's ENTRYPOINT, the `perftracker` console script: its program name makes it perftracker's own
# process (perftracker/role.py), where `python -m perftracker` would be a training process.
CONSOLE_SCRIPT = "import sys; sys.argv[0] = 'perftracker'; from perftracker.cli.main import main; sys.exit(main())"

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


@dataclass(frozen=True)
class ImageInstall:
    """What a Dockerfile's ``pip install`` commands put into the image."""

    project: bool = False  # the perftracker project itself
    with_deps: bool = False  # ... with its base dependencies and ``extras`` (not --no-deps)
    extras: frozenset[str] = frozenset()
    requirements: tuple[str, ...] = ()  # requirements named one by one ("numpy>=1.24")

    def __or__(self, other: ImageInstall) -> ImageInstall:
        return ImageInstall(self.project or other.project, self.with_deps or other.with_deps,
                            self.extras | other.extras, self.requirements + other.requirements)

    def requirement_strings(self) -> list[str]:
        """Every requirement the image installs (the project's own, then those named)."""
        project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
        reqs = list(project["dependencies"]) if self.with_deps else []
        for extra in sorted(self.extras) if self.with_deps else ():
            reqs += project["optional-dependencies"][extra]
        return reqs + list(self.requirements)


def image_install(dockerfile: str) -> ImageInstall:
    text = (REPO / "docker" / dockerfile).read_text()
    out = ImageInstall()
    if re.search(r"^FROM \$\{AGENT_IMAGE\}", text, flags=re.M):
        out |= image_install(DOCKERFILES["perftracker/agent"])
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", text, flags=re.M))
    text = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), text.replace("\\\n", " "))
    for run in re.findall(r"^RUN (.*)$", text, flags=re.M):
        for command in run.split("&&"):
            if not command.strip().startswith("pip install "):
                continue
            words = shlex.split(command)
            no_deps = "--no-deps" in words
            skip = False
            for word in words[2:]:
                if skip or word.startswith("-"):  # an option, or the value of --index-url
                    skip = word in ("--index-url", "-i", "--extra-index-url")
                    continue
                m = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", word)
                if m:
                    out |= ImageInstall(True, not no_deps, frozenset(m.group(1).split(",") if m.group(1) else ()))
                else:
                    out |= ImageInstall(requirements=(word,))
    return out


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


def allowed_modules(install: ImageInstall) -> set[str]:
    """Top-level modules of the distributions an image installs (transitively)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    todo: list[tuple[str, frozenset[str]]] = [(req, frozenset()) for req in install.requirement_strings()]
    seen: set[str] = set()
    while todo:
        text, _ = todo.pop()
        req = Requirement(text)
        name = canonicalize_name(req.name)
        if name == canonicalize_name(project["name"]):  # perftracker-ml[a,b] inside the extras table
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
               .replace("/opt/perftracker/", str(REPO) + "/").replace("/etc/perftracker/", str(tmp / "etc") + "/")


def _launch(argv: list[str], env: dict[str, str], install: ImageInstall, tmp: Path) -> subprocess.Popen[str]:
    site = tmp / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    allowed = tmp / "allowed.json"
    allowed.write_text(json.dumps(sorted(allowed_modules(install))))
    env = dict(env, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]), PERFTRACKER_TEST_ALLOWED_MODULES=str(allowed))
    (tmp / "run").mkdir(exist_ok=True)
    (tmp / "data").mkdir(exist_ok=True)
    tokens = tmp / "etc" / "job-tokens" / "job-tokens.json"  # the Secret the example overlay mounts
    tokens.parent.mkdir(parents=True, exist_ok=True)
    tokens.write_text(json.dumps({"job-token-of-the-train-job-0123": ["train"]}))
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


def _serve_until_ready(argv: list[str], env: dict[str, str], install: ImageInstall, tmp: Path,
                       ready: Any, timeout_s: float = 60.0) -> str:
    """Start a long-running command; ``ready()`` polls it; it must then stop cleanly on SIGTERM."""
    proc = _launch(argv, env, install, tmp)
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


def _not_training(out: str) -> str:
    """perftracker's own process never turned detection on (which, in the localizer image, would
    fail on the missing torch: logged, not fatal, so the service alone would not show it)."""
    assert "perftracker: activation failed" not in out and "No module named" not in out, out[-3000:]
    return out


def run_container(c: dict[str, Any], tmp: Path) -> str:
    """Run one container's command line as the image would (see the module doc)."""
    image = c["image"].rsplit(":", 1)[0]
    install = image_install(DOCKERFILES[image])
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
        proc = _launch(argv, env, install, tmp)
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
    argv = [sys.executable, "-c", CONSOLE_SCRIPT, *args]
    if args[0] == "agent":
        def ready() -> bool:
            info = tmp / "run" / "agent.json"
            if not info.is_file() or "--metrics-port" not in ports:
                return info.is_file()
            url = json.loads(info.read_text())["metrics_url"]
            health = _get(url.replace("/metrics", "/healthz"))[0]
            status, text = _get(url)
            return health == 200 and status == 200 and "perftracker_workers" in text
        return _not_training(_serve_until_ready(argv, env, install, tmp, ready))
    if args[0] == "localizer":
        base = f"http://127.0.0.1:{ports['--port']}"
        token = env["PERFTRACKER_TOKEN"]

        def ready() -> bool:
            status, text = _get(base + "/metrics", token)
            return _get(base + "/v1/healthz")[0] == 200 and status == 200 and "perftracker_localizer" in text
        return _not_training(_serve_until_ready(argv, env, install, tmp, ready))
    raise AssertionError(f"no runner for the command {args[0]!r} of container {c['name']}")


# ------------------------------------------------------------------------------------------------
# tests
# ------------------------------------------------------------------------------------------------


def test_what_the_dockerfiles_install_is_read() -> None:
    agent = image_install("agent.Dockerfile")
    assert agent.project and agent.with_deps and agent.extras == {"gpu"}
    assert [r.split("=")[0] for r in agent.requirements] == ["torch"]  # the CPU build, first
    assert image_install("agent-nsys.Dockerfile") == agent
    modules = allowed_modules(agent)
    # the base install carries the embedded localizer's needs (aiohttp, rich, prometheus_client:
    # docs/compatibility.md); the node agent image has no Kubernetes client, statsmodels or test tools
    assert {"torch", "numpy", "psutil", "prometheus_client", "pynvml", "aiohttp", "rich"} <= modules
    assert not {"statsmodels", "kubernetes", "pytest", "yaml"} & modules


def test_the_localizer_image_has_no_torch_and_pyprojects_bounds() -> None:
    """The localizer never imports torch: its image installs the project without its dependencies and
    then the localizer's own, each with the version bounds pyproject.toml gives it."""
    from packaging.requirements import Requirement

    loc = image_install("localizer.Dockerfile")
    assert loc.project and not loc.with_deps
    names = {Requirement(r).name for r in loc.requirements}
    assert names == {"numpy", "aiohttp", "prometheus_client", "rich", "kubernetes"}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = set(project["dependencies"]).union(*project["optional-dependencies"].values())
    assert set(loc.requirements) <= declared, set(loc.requirements) - declared
    modules = allowed_modules(loc)
    assert {"aiohttp", "rich", "kubernetes", "multidict", "prometheus_client", "numpy"} <= modules
    assert not {"torch", "nvtx", "psutil", "pynvml"} & modules
    # it only ever runs the localizer, which never trains: no switch turns detection off
    # (perftracker/runtime/activation.py; tests/component/test_runtime_import.py)
    env = image_env("localizer.Dockerfile")
    assert "PERFTRACKER_ROLE" not in env
    assert all("PERFTRACKER_DISABLE" not in image_env(f) for f in DOCKERFILES.values())


@pytest.mark.timeout(600)
def test_every_container_command_starts_with_its_image_extras(tmp_path: Path) -> None:
    """Each distinct (image, command line) of the overlays starts, serves and stops cleanly."""
    done: set[str] = set()
    for _overlay, c in containers():
        image = c["image"].rsplit(":", 1)[0]
        key = json.dumps([repr(image_install(DOCKERFILES[image])), c.get("command"), c.get("args")])
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
                        lambda install: real(install) - {"prometheus_client"})
    with pytest.raises(AssertionError, match="prometheus_client"):
        run_container(agent, tmp_path)
