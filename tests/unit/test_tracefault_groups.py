"""The trace mutator keeps the process groups the traces name (issue 28): a kernel's own group
fields, and point-to-point transfers keyed by Src Rank / Dst Rank (paired in order per channel:
test_tracefault_pipeline.py)."""

from __future__ import annotations

from bench.tracefault.build import Event, _p2p_peer


def _event(args: dict[str, object]) -> Event:
    return Event(0, {"name": "ncclDevKernel_SendRecv", "args": args}, 0.0, 1.0, True, True, 0, (0, 7))


def test_a_send_and_its_recv_share_one_key() -> None:
    send = _p2p_peer(_event({"Src Rank": 0, "Dst Rank": 1, "Seq": 8}), "3")
    recv = _p2p_peer(_event({"Src Rank": 0, "Dst Rank": 1, "Seq": 8}), "3")
    assert send == recv == ("3", 0, 1, 8)
    assert _p2p_peer(_event({"Src Rank": 1, "Dst Rank": 0, "Seq": 8}), "3") != send


def test_no_peer_fields_no_pairing_by_them() -> None:
    assert _p2p_peer(_event({}), "3") is None
    assert _p2p_peer(_event({"Src Rank": 0, "Dst Rank": "1", "Seq": 8}), "3") is None
