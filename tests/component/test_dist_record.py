"""perftracker/runtime/dist_record.py on a real gloo process group (world size 1, FileStore): the
process groups as torch describes them, each collective call's group, the wrappers removed after
the window, and the user's own errors untouched (issue 28)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from perftracker.runtime import dist_record


@pytest.fixture
def gloo(tmp_path: Path) -> Iterator[None]:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_nothing_is_recorded_without_torch_distributed() -> None:
    assert not dist.is_initialized()
    assert dist_record.process_groups() == ()
    rec = dist_record.CollectiveRecorder()
    assert not rec.install()
    assert not getattr(dist.all_reduce, "_perftracker_wrapped", False)


def test_groups_and_calls_of_a_window(gloo: None) -> None:
    original = dist.all_reduce
    sub = dist.new_group([0], group_desc="DATA_PARALLEL_GROUP")
    dist_record.window_started("w1")
    assert getattr(dist.all_reduce, "_perftracker_wrapped", False)
    t = torch.ones(4)
    dist.all_reduce(t, group=sub)
    dist.all_reduce(t)
    dist.barrier()
    dist_record.window_ended("w1")
    assert dist.all_reduce is original  # the wrappers are gone
    got = dist_record.recorded("w1")
    assert got is not None
    groups, calls = got
    names = {desc: name for name, desc, _ in groups}
    assert set(names) >= {"default_pg", "DATA_PARALLEL_GROUP"}
    assert all(ranks == (0,) for _, _, ranks in groups)
    assert [(c.kind, c.group) for c in calls] == [("allreduce", names["DATA_PARALLEL_GROUP"]),
                                                  ("allreduce", names["default_pg"]),
                                                  ("barrier", names["default_pg"])]
    assert all(c.start_ns <= c.end_ns for c in calls)
    dist.all_reduce(t)  # after the window: nothing more is recorded
    assert dist_record.recorded("w1") == got


def test_the_users_error_is_raised_unchanged(gloo: None) -> None:
    rec = dist_record.CollectiveRecorder()
    assert rec.install()
    try:
        with pytest.raises(TypeError) as wrapped:
            dist.all_reduce("not a tensor")  # type: ignore[arg-type]
    finally:
        rec.remove()
    with pytest.raises(TypeError) as plain:
        dist.all_reduce("not a tensor")  # type: ignore[arg-type]
    assert str(wrapped.value) == str(plain.value)
    assert rec.calls == []  # a call that failed is not recorded


def test_a_function_replaced_during_the_window_is_left_alone(gloo: None) -> None:
    rec = dist_record.CollectiveRecorder()
    assert rec.install()

    def users_own(*args: object, **kwargs: object) -> None:
        return None

    saved = dist.broadcast
    dist.broadcast = users_own  # type: ignore[assignment]
    try:
        rec.remove()
        assert dist.broadcast is users_own
    finally:
        dist.broadcast = getattr(saved, "__wrapped__", saved)


def test_recording_can_be_turned_off(gloo: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dist_record.RECORD_ENV, "0")
    rec = dist_record.CollectiveRecorder()
    assert not rec.install()
    assert not getattr(dist.all_reduce, "_perftracker_wrapped", False)
    assert dist_record.process_groups()  # the groups are still read
