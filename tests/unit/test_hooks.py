"""The torch hooks in real (single-process) training loops: install/uninstall, orders, failures."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
import torch
from torch.optim import optimizer as optim_mod
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

import perftracker
from perftracker.config import Config
from perftracker.runtime import hooks, runtime


def _torch_state() -> tuple[object, list[object], list[object]]:
    return (
        _BaseDataLoaderIter.__dict__.get("__next__"),
        list(optim_mod._global_optimizer_pre_hooks.values()),
        list(optim_mod._global_optimizer_post_hooks.values()),
    )


@pytest.fixture
def pristine(clean_env: dict[str, str]) -> Iterator[tuple[object, list[object], list[object]]]:
    """torch as it was before perftracker (the import may have activated it already)."""
    perftracker.deactivate()
    before = _torch_state()
    assert not hasattr(before[0], "__perftracker_original__")
    yield before
    perftracker.deactivate()


def _loop(
    pattern: str, iters: int, num_workers: int = 0, optimizers: int = 1, loaders: int = 1
) -> None:
    """A real training loop whose hook events follow ``pattern`` per iteration (D/O letters)."""
    data = TensorDataset(torch.randn(4096, 8), torch.randn(4096, 1))
    dls = [iter(DataLoader(data, batch_size=4, num_workers=num_workers)) for _ in range(loaders)]
    model = torch.nn.Linear(8, 1)
    opts = [torch.optim.SGD(model.parameters(), lr=1e-3) for _ in range(optimizers)]
    for _ in range(iters):
        d = o = 0
        for ch in pattern:
            if ch == "D":
                x, y = next(dls[d % loaders])
                torch.nn.functional.mse_loss(model(x), y).backward()
                d += 1
            else:
                opts[o % optimizers].step()
                opts[o % optimizers].zero_grad()
                o += 1


def test_activate_twice_installs_once_and_deactivate_restores_torch(pristine) -> None:  # type: ignore[no-untyped-def]
    before = pristine
    perftracker.activate(Config())
    perftracker.activate(Config())  # replaces the runtime, not the hooks
    during = _torch_state()
    assert during[0].__perftracker_original__ is before[0]
    assert len(during[1]) == len(before[1]) + 1 and len(during[2]) == len(before[2]) + 1
    hooks.install(runtime.get_runtime())  # type: ignore[arg-type]
    assert len(_torch_state()[2]) == len(during[2])
    perftracker.deactivate()
    after = _torch_state()
    assert after[0] is before[0]
    assert after[1] == before[1] and after[2] == before[2]
    perftracker.deactivate()  # a second deactivate is harmless
    assert _torch_state()[0] is before[0]


@pytest.mark.parametrize(
    ("pattern", "num_workers", "optimizers", "loaders", "expected"),
    [
        ("DO", 0, 1, 1, ["dataloader.next", "optimizer.step"]),
        ("DO", 2, 1, 1, ["dataloader.next", "optimizer.step"]),
        ("DDDO", 0, 1, 1, ["dataloader.next"] * 3 + ["optimizer.step"]),
        ("DOO", 0, 2, 1, ["dataloader.next", "optimizer.step", "optimizer.step"]),
        ("DDO", 0, 1, 2, ["dataloader.next", "dataloader.next", "optimizer.step"]),
    ],
    ids=["plain", "workers2", "grad-accum", "pipeline-two-optimizers", "two-loaders"],
)
def test_real_loops_learn_their_sequence(pristine, pattern, num_workers, optimizers, loaders, expected) -> None:  # type: ignore[no-untyped-def]
    rt = perftracker.activate(Config())
    _loop(pattern, 30, num_workers=num_workers, optimizers=optimizers, loaders=loaders)
    st = perftracker.status()
    assert st["phase"] == "tracking"
    assert st["sequence"] == expected
    # learned after the 11th iteration's first event; then one count per iteration. Before
    # that, every optimizer step counted as one.
    steps_per_iter = pattern.count("O")
    assert rt.iteration == 10 * steps_per_iter + 20
    assert st["recent_mean_ms"] is not None and st["recent_mean_ms"] > 0


def test_deactivated_hooks_see_nothing(pristine) -> None:  # type: ignore[no-untyped-def]
    rt = perftracker.activate(Config())
    perftracker.deactivate()
    _loop("DO", 5)
    assert rt.iteration == 0 and rt.last_event() is None


class _BreakingClock:
    """The real clock until its ``fail_at``-th read, which raises (a fault inside a hook)."""

    def __init__(self, fail_at: int) -> None:
        self.fail_at = fail_at
        self.calls = 0

    def now_ns(self) -> int:
        self.calls += 1
        if self.calls == self.fail_at:
            raise ZeroDivisionError("boom in the hook")
        return time.monotonic_ns()


@pytest.mark.parametrize("where", ["dataloader", "optimizer", "detector"])
def test_failure_inside_a_hook_disables_perftracker_but_not_training(
    pristine, caplog: pytest.LogCaptureFixture, where: str
) -> None:  # type: ignore[no-untyped-def]
    # the hooks read the clock at DataLoader next (1), its return (2), step pre (3), step post (4):
    # the 13th read is the 4th iteration's DataLoader next, the 16th its step post
    clock = _BreakingClock({"dataloader": 13, "optimizer": 16, "detector": 0}[where])
    rt = runtime.activate(Config(), clock=clock)
    calls = {"n": 0}
    if where == "detector":  # the detector's third pass over the event log raises
        real_feed = rt.detector.feed

        def broken_feed(events: list[int]) -> bool:
            calls["n"] += 1
            if calls["n"] == 3:
                raise ZeroDivisionError("boom in the detector")
            return real_feed(events)

        rt.detector.feed = broken_feed  # type: ignore[method-assign]
        rt.add_boundary_listener(lambda t_ns, iteration: None)  # every event is fed at once
    xs = torch.randn(400, 8)
    data = TensorDataset(xs, xs.sum(dim=1, keepdim=True) * 0.5)  # learnable: the loss must fall
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    with caplog.at_level(logging.ERROR, logger="perftracker"):
        for x, y in DataLoader(data, batch_size=4):  # 100 iterations, all of them must run
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert len(losses) == 100 and sum(losses[-10:]) < 0.1 * sum(losses[:10])
    # disabled at once: the hooks never ran again
    if where == "detector":
        assert calls["n"] == 3
    else:
        assert clock.calls == clock.fail_at
    assert not rt.active and runtime.get_runtime() is None
    st = perftracker.status()
    assert st["phase"] == "failed" and "ZeroDivisionError" in str(st["error"])
    errors = [r for r in caplog.records if "disabled in this process" in r.getMessage()]
    assert len(errors) == 1
    if where == "dataloader":  # torch restored at once where that is safe
        assert not hasattr(_BaseDataLoaderIter.__dict__["__next__"], "__perftracker_original__")
