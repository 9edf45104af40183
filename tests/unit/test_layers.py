"""The layering of perftracker, checked from the source (docs/design.md section 2, issue 29).

Every module of the three folders (perftracker/, agent/, localizer/) is parsed with ``ast`` and named
by its installed name (pyproject's [tool.setuptools.package-dir]: agent/ is ``perftracker.agent``,
localizer/ is ``perftracker.localizer``). All its imports count, those inside functions too, except
the ones under ``if TYPE_CHECKING:``. Only package directories (with an ``__init__.py``) are
scanned: perftracker/examples/ is package data (a user's training script), not part of perftracker.

The layers, bottom to top (``LAYERS`` below; a layer may import itself and the layers it names):

    core.base          perftracker.{errors, clock, role}
    core               perftracker.{config, rundir, warnonce, remote_stacks}, perftracker.model.*,
                       perftracker.wire.*                              -> core.base
    runtime            perftracker (the package: __init__), perftracker.runtime.*   -> core
    agent.kineto       perftracker.agent.kineto (a Kineto trace -> RawWindow)       -> core
    agent.summarize    perftracker.agent.summarize.* (pure)             -> core, agent.kineto
    agent.samplers     perftracker.agent.samplers.*                     -> core
    agent.daemon       perftracker.agent (package), perftracker.agent.daemon.*
                                                                        -> core, agent.*
    localizer.diagnose perftracker.localizer.diagnose.* (pure)          -> core
    localizer.render   perftracker.localizer.render.*                   -> core
    localizer.store    perftracker.localizer.store.*                    -> core, diagnose, render
    localizer.k8s      perftracker.localizer.k8s.*                      -> core, diagnose, render, store
    localizer.service  perftracker.localizer (package), perftracker.localizer.service.*
                                                                        -> core, localizer.*
    cli                perftracker.cli.*, and the `python -m` entry points perftracker.__main__ and
                       perftracker.agent.__main__ (both only call perftracker.cli.main.main;
                       nothing imports a __main__)                      -> everything

runtime, agent.* and localizer.* are three siblings over core: none imports another. The checks:

- an upward (or sideways) import against that table, and a module that no layer holds;
- an import cycle between modules;
- the runtime reaching aiohttp, rich or prometheus_client through any chain of perftracker modules;
- a pure package (model, agent.summarize, localizer.diagnose) reaching an I/O package (``IO``)
  through any chain of perftracker modules. A chain counts the ``__init__`` of every package that an
  import loads, except perftracker's own (it is the runtime's on-import switch, whose lazy imports
  run only in a training process: docs/design.md section 2);
- a package that the install does not serve from its own folder (setup.py installs the packages
  that tools/layout.py finds from pyproject's [tool.setuptools.package-dir]; so does this scan).

The checker itself is tested on a small synthetic tree at the end of this file.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
from layout import find_packages, package_dirs  # noqa: E402  (the mapping, from pyproject.toml)

_CORE = ("core.base", "core")
# layer -> (the modules it holds, the layers it may import besides itself). A name holds that module
# and every module below it; "=name" holds that one module only. The longest match decides.
LAYERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "core.base": (("perftracker.errors", "perftracker.clock", "perftracker.role"), ()),
    "core": (("perftracker.config", "perftracker.rundir", "perftracker.warnonce",
              "perftracker.remote_stacks", "perftracker.model", "perftracker.wire"), ("core.base",)),
    "runtime": (("=perftracker", "perftracker.runtime"), _CORE),
    "agent.kineto": (("perftracker.agent.kineto",), _CORE),
    "agent.summarize": (("perftracker.agent.summarize",), (*_CORE, "agent.kineto")),
    "agent.samplers": (("perftracker.agent.samplers",), _CORE),
    "agent.daemon": (("perftracker.agent", "perftracker.agent.daemon"),
                     (*_CORE, "agent.kineto", "agent.summarize", "agent.samplers")),
    "localizer.diagnose": (("perftracker.localizer.diagnose",), _CORE),
    "localizer.render": (("perftracker.localizer.render",), _CORE),
    "localizer.store": (("perftracker.localizer.store",), (*_CORE, "localizer.diagnose", "localizer.render")),
    "localizer.k8s": (("perftracker.localizer.k8s",),
                      (*_CORE, "localizer.diagnose", "localizer.render", "localizer.store")),
    "localizer.service": (("perftracker.localizer", "perftracker.localizer.service"),
                          (*_CORE, "localizer.diagnose", "localizer.render", "localizer.store",
                           "localizer.k8s")),
    # The top: may import anything. `python -m perftracker` and `python -m perftracker.agent` are
    # command-line entry points (each calls perftracker.cli.main.main), so they sit here.
    "cli": (("perftracker.cli", "=perftracker.__main__", "=perftracker.agent.__main__"), ("*",)),
}

RUNTIME = ("=perftracker", "perftracker.runtime")
RUNTIME_FORBIDDEN = frozenset({"aiohttp", "rich", "prometheus_client"})
PURE = ("perftracker.model", "perftracker.agent.summarize", "perftracker.localizer.diagnose")
IO = frozenset({"socket", "subprocess", "sqlite3", "asyncio", "aiohttp", "urllib", "http", "requests",
                "kubernetes", "rich", "prometheus_client", "threading", "multiprocessing", "signal",
                "shutil"})


# ------------------------------------------------------------------------------------- the checker
@dataclass(frozen=True)
class Import:
    target: str  # a scanned module when the import names one, else the name as written
    line: int


@dataclass
class Graph:
    root: Path
    modules: dict[str, Path] = field(default_factory=dict)  # installed name -> file
    packages: dict[str, Path] = field(default_factory=dict)  # package name -> directory
    imports: dict[str, list[Import]] = field(default_factory=dict)

    def where(self, name: str, line: int) -> str:
        return f"{self.modules[name].relative_to(self.root).as_posix()}:{line}"

    def internal(self, name: str) -> list[Import]:
        """The imports of ``name`` that resolve to a scanned module."""
        return [i for i in self.imports[name] if i.target in self.modules]

    def external_roots(self, name: str) -> list[Import]:
        """The imports of ``name`` outside the scanned modules, by top-level name."""
        roots = {m.partition(".")[0] for m in self.modules}
        return [Import(i.target.partition(".")[0], i.line) for i in self.imports[name]
                if i.target not in self.modules and i.target.partition(".")[0] not in roots]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _raw_imports(tree: ast.AST, name: str, is_package: bool) -> Iterable[tuple[str, str | None, int]]:
    """(module, imported name or None, line) of every import, TYPE_CHECKING blocks left out."""
    package = name if is_package else name.rpartition(".")[0]
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                yield base, alias.name, node.lineno
        todo.extend(ast.iter_child_nodes(node))


def scan(root: Path, package_dir: Mapping[str, str]) -> Graph:
    """Parse every module under the package directories named in ``package_dir`` (name -> folder)."""
    root = root.resolve()
    g = Graph(root)
    for pname, d in find_packages(root, dict(package_dir)).items():  # tools/layout.py, as setup.py
        g.packages[pname] = d
        for f in sorted(d.glob("*.py")):
            g.modules[pname if f.stem == "__init__" else f"{pname}.{f.stem}"] = f
    for name, path in g.modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        out: list[Import] = []
        for module, imported, line in _raw_imports(tree, name, path.name == "__init__.py"):
            candidates = [f"{module}.{imported}", module] if imported and imported != "*" else [module]
            target = next((c for c in candidates if c in g.modules), None)
            if target is None:  # `import a.b.c` of a name below a module: the deepest scanned one
                target = module
                while target and target not in g.modules:
                    target = target.rpartition(".")[0]
                target = target or module
            if target != name:
                out.append(Import(target, line))
        g.imports[name] = sorted(out, key=lambda i: i.line)
    return g


def layer_of(module: str, layers: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]) -> str | None:
    best, best_len = None, -1
    for layer, (held, _) in layers.items():
        for pattern in held:
            exact = pattern.startswith("=")
            p = pattern.lstrip("=")
            if (module == p or (not exact and module.startswith(p + "."))) and len(p) > best_len:
                best, best_len = layer, len(p)
    return best


def upward_imports(g: Graph, layers: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]) -> list[str]:
    """One line per import that its layer may not make, and per module that no layer holds."""
    problems = []
    for name in sorted(g.modules):
        mine = layer_of(name, layers)
        if mine is None:
            problems.append(f"{name}: in no layer (add it to LAYERS)")
            continue
        allowed = layers[mine][1]
        for imp in g.internal(name):
            theirs = layer_of(imp.target, layers)
            if theirs is not None and theirs != mine and "*" not in allowed and theirs not in allowed:
                problems.append(f"{g.where(name, imp.line)}: {name} ({mine}) imports {imp.target} ({theirs})")
    return problems


def cycles(g: Graph) -> list[tuple[frozenset[str], list[str]]]:
    """Each strongly connected component of more than one module, with one cycle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    comps: list[set[str]] = []
    succ = {n: sorted({i.target for i in g.internal(n)}) for n in g.modules}

    def strongconnect(v: str) -> None:  # Tarjan, iterative
        work = [(v, iter(succ[v]))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(succ[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    comps.append(comp)

    for n in sorted(g.modules):
        if n not in index:
            strongconnect(n)
    out = []
    for comp in comps:  # a shortest cycle through the component's first module
        start = min(comp)
        prev: dict[str, str] = {}
        frontier = [start]
        while frontier and start not in prev:
            nxt_frontier = []
            for n in frontier:
                for m in succ[n]:
                    if m in comp and m not in prev:
                        prev[m] = n
                        nxt_frontier.append(m)
            frontier = nxt_frontier
        path = [start]
        while True:
            path.append(prev[path[-1]])
            if path[-1] == start:
                break
        path.reverse()
        out.append((frozenset(comp), path))
    return sorted(out, key=lambda c: c[1])


def cycle_text(comp: frozenset[str], path: list[str]) -> str:
    rest = sorted(comp - set(path))
    return " -> ".join(path) + (f" (the same cycle holds {', '.join(rest)})" if rest else "")


def _loads(g: Graph, module: str, root: str | None) -> list[str]:
    """The scanned modules that importing ``module``'s imports loads: each target and its packages."""
    out = []
    for imp in g.internal(module):
        parts = imp.target.split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            if name in g.modules and name != root and name not in out:
                out.append(name)
    return out


def forbidden_reach(g: Graph, starts: Iterable[str], forbidden: frozenset[str],
                    skip_package: str | None = None) -> list[str]:
    """Chains from a start module, through scanned modules, to an import of a ``forbidden`` package.

    Importing a module also loads the ``__init__`` of each package above it; ``skip_package`` is
    one package whose ``__init__`` does not count that way (only an explicit import of it does).
    """
    problems = []
    for start in sorted(starts):
        prev: dict[str, str | None] = {start: None}
        order = [start]
        for node in order:  # breadth first: the shortest chain to each module
            for m in _loads(g, node, skip_package) + [
                    i.target for i in g.internal(node) if i.target == skip_package]:
                if m not in prev:
                    prev[m] = node
                    order.append(m)
        seen: set[str] = set()
        for node in order:
            for imp in g.external_roots(node):
                if imp.target in forbidden and imp.target not in seen:
                    seen.add(imp.target)
                    chain = [node]
                    while (p := prev[chain[-1]]) is not None:
                        chain.append(p)
                    via = " -> ".join(reversed(chain))
                    problems.append(f"{start}: imports {imp.target} via {via} "
                                    f"({g.where(node, imp.line)})")
    return problems


def install_problems(g: Graph) -> list[str]:
    """Every scanned package imports, as installed, from its own folder (setup.py's list is found by
    tools/layout.py from the same mapping; this checks the install that the tests run against)."""
    problems = []
    for pname, d in sorted(g.packages.items()):
        spec = importlib.util.find_spec(pname)
        origin = Path(spec.origin).resolve().parent if spec and spec.origin else None
        if origin != d:
            problems.append(f"{pname} ({d.relative_to(g.root).as_posix()}) is installed from {origin}")
    return problems


def _matches(module: str, patterns: Iterable[str]) -> bool:
    return any(module == p.lstrip("=") or (not p.startswith("=") and module.startswith(p + "."))
               for p in patterns)


# ------------------------------------------------------------------------------- the real project


@pytest.fixture(scope="module")
def graph() -> Graph:
    return scan(REPO, package_dirs(REPO))


def _report(problems: list[str]) -> str:
    return "\n" + "\n".join(problems)


def test_no_upward_imports(graph: Graph) -> None:
    problems = upward_imports(graph, LAYERS)
    assert not problems, _report(problems)


def test_no_import_cycles(graph: Graph) -> None:
    found = [cycle_text(comp, path) for comp, path in cycles(graph)]
    assert not found, _report(found)


def test_runtime_never_reaches_the_service_packages(graph: Graph) -> None:
    starts = [m for m in graph.modules if _matches(m, RUNTIME)]
    assert starts
    problems = forbidden_reach(graph, starts, RUNTIME_FORBIDDEN)
    assert not problems, _report(problems)


def test_pure_packages_do_no_io(graph: Graph) -> None:
    starts = [m for m in graph.modules if _matches(m, PURE)]
    assert len(starts) > 10
    problems = forbidden_reach(graph, starts, IO, skip_package="perftracker")
    assert not problems, _report(problems)


def test_every_package_is_installed(graph: Graph) -> None:
    problems = install_problems(graph)
    assert not problems, _report(problems)


def test_the_table_holds_every_module_and_names_real_layers(graph: Graph) -> None:
    assert not [m for m in graph.modules if layer_of(m, LAYERS) is None]
    for _, allowed in LAYERS.values():
        assert set(allowed) <= set(LAYERS) | {"*"}
    assert "perftracker.agent.daemon.daemon" in graph.modules  # the mapping was applied
    assert "perftracker.localizer.diagnose.method.rule" in graph.modules


# ---------------------------------------------------------------------- the checker on a toy tree
_TOY_LAYERS = {
    "low": (("toy.low",), ()),
    "high": (("=toy", "toy.high"), ("low",)),
    "side": (("toy.side",), ("low",)),
}


def _toy(tmp_path: Path, files: Mapping[str, str]) -> Graph:
    """A tree like the real one: toy/ plus side/ installed as toy.side."""
    base = {"toy/__init__.py": "", "toy/low/__init__.py": "", "toy/high/__init__.py": "",
            "side/__init__.py": "", "side/inner/__init__.py": ""}
    for rel, text in {**base, **files}.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return scan(tmp_path, {"toy": "toy", "toy.side": "side"})


_CLEAN = {
    "toy/low/a.py": "import json\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                    "    from toy.high import b\n",
    "toy/high/b.py": "from toy.low import a\nfrom ..low.a import x\n\ndef f():\n    import toy.low.a\n",
    "side/inner/c.py": "from toy.low.a import y\nfrom . import d\n",
    "side/inner/d.py": "import math\n",
}


def test_checker_finds_nothing_in_a_clean_tree(tmp_path: Path) -> None:
    g = _toy(tmp_path, _CLEAN)
    assert "toy.side.inner.c" in g.modules and "toy.side" in g.packages
    assert [i.target for i in g.internal("toy.high.b")] == ["toy.low.a", "toy.low.a", "toy.low.a"]
    assert [i.target for i in g.internal("toy.side.inner.c")] == ["toy.low.a", "toy.side.inner.d"]
    assert upward_imports(g, _TOY_LAYERS) == []
    assert cycles(g) == []
    assert forbidden_reach(g, ["toy.low.a", "toy.side.inner.c"], frozenset({"socket"})) == []


def test_checker_finds_an_upward_import_inside_a_function(tmp_path: Path) -> None:
    g = _toy(tmp_path, {**_CLEAN, "toy/low/a.py": "def f():\n    from toy.high import b\n"})
    problems = upward_imports(g, _TOY_LAYERS)
    assert len(problems) == 1 and "toy.low.a (low) imports toy.high.b (high)" in problems[0]
    assert problems == ["toy/low/a.py:2: toy.low.a (low) imports toy.high.b (high)"]


def test_checker_finds_a_sideways_import_and_an_unplaced_module(tmp_path: Path) -> None:
    g = _toy(tmp_path, {**_CLEAN, "side/inner/d.py": "from toy import high\n", "toy/stray.py": ""})
    problems = upward_imports(g, _TOY_LAYERS)
    assert any("toy.side.inner.d (side) imports toy.high (high)" in p for p in problems)
    assert "toy.stray: in no layer (add it to LAYERS)" in problems


def test_checker_finds_a_cycle(tmp_path: Path) -> None:
    g = _toy(tmp_path, {**_CLEAN, "side/inner/d.py": "def g():\n    from toy.side.inner import c\n"})
    assert cycles(g) == [(frozenset({"toy.side.inner.c", "toy.side.inner.d"}),
                          ["toy.side.inner.c", "toy.side.inner.d", "toy.side.inner.c"])]


def test_checker_finds_a_forbidden_import_through_a_chain(tmp_path: Path) -> None:
    # toy.high.b -> toy.low.a (loads toy.low's __init__, which imports socket)
    g = _toy(tmp_path, {**_CLEAN, "toy/low/__init__.py": "import socket.x\n"})
    problems = forbidden_reach(g, ["toy.high.b", "toy.side.inner.d"], frozenset({"socket"}))
    assert len(problems) == 1
    assert problems[0].startswith("toy.high.b: imports socket via toy.high.b -> toy.low ")
    # the root package's own __init__ counts only when imported by name
    g = _toy(tmp_path, {**_CLEAN, "toy/__init__.py": "import socket\n"})
    assert forbidden_reach(g, ["toy.high.b"], frozenset({"socket"}), skip_package="toy") == []
    assert forbidden_reach(g, ["toy.high.b"], frozenset({"socket"}))
