"""The worker <-> agent wire without sockets: framing, validation, the size limit (over real sockets:
tests/component/test_wire_sockets.py)."""

from __future__ import annotations

import json
import struct

import pytest

from perftracker.wire import framing as wire
from perftracker.wire.framing import FrameDecoder, MessageType, WireError


def test_decoder_handles_split_and_coalesced_frames() -> None:
    frames = b"".join(wire.encode(wire.make_message(MessageType.HEARTBEAT, iteration=i, phase="p")) for i in range(5))
    dec = FrameDecoder()
    out = []
    for i in range(0, len(frames), 3):  # byte-by-3 delivery
        out.extend(dec.feed(frames[i:i + 3]))
    assert [m["iteration"] for m in out] == [0, 1, 2, 3, 4]
    assert dec.pending_bytes == 0


@pytest.mark.parametrize(
    "msg, needle",
    [
        ([1, 2], "JSON object"),
        ({"type": "nope"}, "unknown type"),
        ({"type": "register", "rank": 1}, "missing field"),
        ({"type": "heartbeat", "iteration": "x", "phase": "p"}, "heartbeat.iteration"),
        ({"type": "heartbeat", "iteration": True, "phase": "p"}, "bool"),
        ({"type": "start_window", "session": "s"}, "window_s"),
    ],
)
def test_validation_names_the_problem(msg: object, needle: str) -> None:
    body = json.dumps(msg).encode()
    with pytest.raises(WireError, match=needle):
        list(FrameDecoder().feed(struct.pack(">I", len(body)) + body))


def test_not_json_and_no_pickle() -> None:
    import pickle

    body = pickle.dumps({"type": "heartbeat", "iteration": 1, "phase": "p"})
    with pytest.raises(WireError, match="not valid JSON"):
        list(FrameDecoder().feed(struct.pack(">I", len(body)) + body))


def test_frame_size_limit_both_directions() -> None:
    big = {"type": "trigger", "reason": "x", "detail": {"blob": "a" * (wire.MAX_FRAME_BYTES + 1)}}
    with pytest.raises(WireError, match="exceeds"):
        wire.encode(big)
    # a hostile header is rejected before any body is buffered (on a live socket:
    # tests/component/test_wire_sockets.py)
    with pytest.raises(WireError, match="exceeds"):
        list(FrameDecoder().feed(struct.pack(">I", wire.MAX_FRAME_BYTES + 1)))

def test_nan_is_refused() -> None:
    with pytest.raises(WireError):
        wire.make_message(MessageType.START_WINDOW, session="s", window_s=float("nan"))
    with pytest.raises(WireError):
        wire.encode({"type": "trigger", "reason": "r", "detail": {"x": float("inf")}})

