"""`import perftracker` in a real process: it activates from the environment unless disabled, and
never in perftracker's own processes, which say their role in PERFTRACKER_ROLE (perftracker/role.py)
(the Runtime contract in this process: tests/unit/test_runtime.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def _import_in_subprocess(env: dict[str, str]) -> dict[str, object]:
    code = "import json, perftracker; print(json.dumps(perftracker.status()))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return {"status": json.loads(out.stdout.strip().splitlines()[-1]), "stderr": out.stderr}


def test_import_activates_from_env_unless_disabled(clean_env: dict[str, str]) -> None:
    on = _import_in_subprocess(dict(clean_env, PERFTRACKER_DETECTOR_MODE="paper"))
    assert on["status"]["active"] is True and on["status"]["mode"] == "paper"  # type: ignore[index]
    off = _import_in_subprocess(dict(clean_env, PERFTRACKER_DISABLE="1"))
    assert off["status"]["active"] is False  # type: ignore[index]
    bad = _import_in_subprocess(dict(clean_env, PERFTRACKER_BLOCKED_FACTOR="lots"))
    assert bad["status"]["active"] is False  # type: ignore[index]
    assert "PERFTRACKER_BLOCKED_FACTOR" in str(bad["stderr"])


def test_perftrackers_own_processes_do_not_activate() -> None:
    """perftracker's own processes (the node agent and its sampler and summarizer processes, the
    localizer, the console script) import perftracker but never train: no detection, no agent. Each
    says its role in PERFTRACKER_ROLE, set by whoever starts it; the console script is known by its
    program name; any other process is a training process."""
    code = "import perftracker.runtime.runtime as r; print(r.get_runtime() is None)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFTRACKER_")}
    for role in ("agent", "sampler", "localizer"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=dict(env, PERFTRACKER_ROLE=role), timeout=120)
        assert out.stdout.strip() == "True", (role, out.stderr[-500:])
    console = f"import sys; sys.argv[0] = '/usr/local/bin/perftracker'; {code}"
    out = subprocess.run([sys.executable, "-c", console], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip() == "True", out.stderr[-500:]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip() == "False", out.stderr[-500:]  # a plain script does activate


# The state that arming or starting would change, as a JSON line: threads, excepthooks, torch's
# global optimizer hook dicts, the DataLoader iterator's __next__, the import finders.
_STATE = """
def state():
    import json, sys, threading
    out = {"threads": sorted(t.name for t in threading.enumerate()),
           "sys_excepthook": sys.excepthook is sys.__excepthook__,
           "threading_excepthook": threading.excepthook is threading.__excepthook__,
           "meta_path": [type(f).__name__ for f in sys.meta_path], "torch": "torch" in sys.modules}
    if "torch" in sys.modules:
        import torch.optim.optimizer as o
        from torch.utils.data.dataloader import _BaseDataLoaderIter as It
        out["pre_hooks"] = len(o._global_optimizer_pre_hooks)
        out["post_hooks"] = len(o._global_optimizer_post_hooks)
        out["next_wrapped"] = hasattr(It.__dict__.get("__next__"), "__perftracker_original__")
    return out
"""

_TRAIN = """
import torch
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
"""


def _states(code: str, env: dict[str, str]) -> list[dict[str, object]]:
    out = subprocess.run([sys.executable, "-c", _STATE + code], env=env, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_importing_the_renderer_with_torch_loaded_installs_nothing_and_starts_nothing(
        clean_env: dict[str, str]) -> None:
    """A notebook that renders a report: torch loaded, role training, nothing disabled. No hook,
    no thread, no excepthook, no finder, and the runtime is off."""
    code = ("import json, torch\nbefore = state()\nimport perftracker.localizer.render\n"
            "import perftracker\nafter = state()\nafter['active'] = perftracker.status()['active']\n"
            "print(json.dumps(before)); print(json.dumps(after))\n")
    before, after = _states(code, clean_env)
    assert after.pop("active") is False
    assert before == after, (before, after)
    assert after["threads"] == ["MainThread"] and after["sys_excepthook"] and after["threading_excepthook"]
    assert after["pre_hooks"] == after["post_hooks"] == 0 and after["next_wrapped"] is False


def test_import_arms_the_hooks_and_a_tiny_training_loop_starts_the_rest(clean_env: dict[str, str]) -> None:
    """The must-find twin: after `import perftracker` (before or after torch) the hooks are there
    and nothing else; the first batch of a real training loop starts the channel thread and chains
    the excepthooks."""
    env = dict(clean_env, PERFTRACKER_AUTOSTART_AGENT="0")
    for first in ("import perftracker\nimport torch\n", "import torch\nimport perftracker\n"):
        code = ("import json\nimport perftracker\nimported = state()\n" + first + "armed = state()\n" + _TRAIN
                + "trained = state()\ntrained['iteration'] = perftracker.status()['iteration']\n"
                "for s in (imported, armed, trained): print(json.dumps(s))\n")
        imported, armed, trained = _states(code, env)
        if first.startswith("import perftracker"):  # torch not loaded yet: a finder waits for it
            assert imported["torch"] is False and "_TorchWatch" in imported["meta_path"], imported
        assert "_TorchWatch" not in armed["meta_path"], armed
        assert armed["pre_hooks"] == armed["post_hooks"] == 1 and armed["next_wrapped"] is True, armed
        assert armed["threads"] == ["MainThread"] and armed["sys_excepthook"] and armed["threading_excepthook"]
        assert "perftracker-channel" in trained["threads"], trained
        assert not trained["sys_excepthook"] and not trained["threading_excepthook"], trained  # chained
        assert trained["iteration"] == 4, trained
