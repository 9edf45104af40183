"""One default and one range check for a profile window's length (issue 48): the worker's
PERFTRACKER_WINDOW_S, the agent's check of a TRIGGER message, the localizer's trigger request and its
--window-s all use perftracker/model/window_length.py, so they agree at the edges."""

from __future__ import annotations

from typing import Any

import pytest
from perftracker.agent.daemon.workers import BadWorkerMessage, check_worker_message
from perftracker.localizer.service.session.options import SessionOptions
from perftracker.localizer.service.validate import RequestError, parse_trigger

from perftracker.config import Config
from perftracker.errors import ConfigError
from perftracker.model.window_length import (
    DEFAULT_WINDOW_S,
    MAX_WINDOW_S,
    MIN_WINDOW_S,
    window_s_error,
)

OK = (MIN_WINDOW_S, DEFAULT_WINDOW_S, MAX_WINDOW_S)
BAD: tuple[Any, ...] = (MIN_WINDOW_S * 0.99, MAX_WINDOW_S + 0.01, 0, -5, float("nan"), float("inf"), True, "20")


def test_one_default_everywhere() -> None:
    assert Config().window_s == SessionOptions().default_window_s == DEFAULT_WINDOW_S == 20.0


@pytest.mark.parametrize("value", OK)
def test_the_edges_are_accepted_by_every_reader(value: float) -> None:
    assert window_s_error(value) == ""
    assert Config(window_s=value).window_s == value
    assert SessionOptions(default_window_s=value).default_window_s == value
    assert parse_trigger({"reason": "r", "window_s": value}).window_s == value
    check_worker_message({"type": "trigger", "reason": "slowdown", "detail": {}, "window_s": value})


@pytest.mark.parametrize("value", BAD)
def test_past_the_edges_every_reader_refuses_with_the_same_words(value: Any) -> None:
    why = window_s_error(value)
    assert why
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        with pytest.raises(ConfigError, match="PERFTRACKER_WINDOW_S"):
            Config(window_s=value)
        with pytest.raises(ConfigError, match="--window-s"):
            SessionOptions(default_window_s=value)
    with pytest.raises(RequestError) as e:
        parse_trigger({"reason": "r", "window_s": value})
    assert why in str(e.value)
    with pytest.raises(BadWorkerMessage) as w:
        check_worker_message({"type": "trigger", "reason": "slowdown", "detail": {}, "window_s": value})
    assert why in str(w.value)


def test_no_window_length_means_the_default() -> None:
    assert parse_trigger({"reason": "r"}).window_s is None  # the service's default_window_s
    check_worker_message({"type": "trigger", "reason": "slowdown", "detail": {}})
