"""Write scope per job: the first agent that registers a rank owns it until it is declared dead.

An agent's first registration gets a random *agent key* (answered once, stored as its sha256).
Afterwards the agent presents it (header ``X-Perftracker-Agent-Key``, sent by ``perftracker.agent.daemon.localizer_client``)
when it registers again, sends heartbeats, or uploads patterns or hang snapshots for its ranks.

- Registering a rank that another agent owns gets 409 while that agent is alive (seen within
  ``agent_dead_s``) and the rank is not known dead (a heartbeat said its process is gone).
- Re-registering an existing agent id without its key gets 409 while that agent is alive.
- An upload or hang snapshot for a registered rank without its owner's key gets 409; heartbeats
  for ranks another live agent owns are dropped.

So any holder of the shared token can no longer take over another job's rank or replace its
acknowledged upload; a restarted agent (a new id) takes its ranks over once the old one is dead.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Callable, Sequence

from perftracker.localizer.service.validate import RequestError
from perftracker.localizer.store.sqlite_store import Store

log = logging.getLogger(__name__)

AGENT_KEY_HEADER = "X-Perftracker-Agent-Key"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "replace")).hexdigest()


class Ownership:
    """The ownership checks over a Store. ``dead_ranks(job)``: ranks whose process is known dead."""

    def __init__(self, store: Store, agent_dead_s: float, dead_ranks: Callable[[str], set[int]]) -> None:
        self.store = store
        self.agent_dead_ns = int(agent_dead_s * 1e9)
        self.dead_ranks = dead_ranks

    def _alive(self, job: str, agent_id: str, now_ns: int) -> bool:
        a = self.store.agent(job, agent_id)
        return a is not None and now_ns - a[0] < self.agent_dead_ns

    @staticmethod
    def _key_ok(key_hash: str, key: str | None) -> bool:
        return bool(key_hash) and key is not None and hmac.compare_digest(key_hash, hash_key(key))

    def check_register(self, job: str, agent_id: str, ranks: Sequence[int], key: str | None,
                       now_ns: int) -> str | None:
        """RequestError 409 unless ``agent_id`` may register ``ranks``. Returns a new agent key to
        hand out (first registration, or a takeover of a dead agent's id), else None."""
        me = self.store.agent(job, agent_id)
        new_key = None
        if me is None or not me[1]:
            new_key = secrets.token_urlsafe(24)
        elif not self._key_ok(me[1], key):
            if now_ns - me[0] < self.agent_dead_ns:
                raise RequestError(f"agent {agent_id!r} of job {job!r} is registered and alive; its registration "
                                   f"needs its agent key ({AGENT_KEY_HEADER})", status=409)
            new_key = secrets.token_urlsafe(24)
        owners = self.store.rank_owners(job, ranks)
        taken = sorted(r for r, a in owners.items() if a != agent_id)
        if taken:
            dead = self.dead_ranks(job)
            for r in taken:
                owner = owners[r]
                if r not in dead and self._alive(job, owner, now_ns):
                    raise RequestError(f"rank {r} of job {job!r} belongs to agent {owner!r} until that agent or "
                                       f"the rank's process is declared dead", status=409)
            log.info("job %s: agent %s takes over rank(s) %s from dead agents or processes", job, agent_id, taken)
        return new_key

    def check_agent(self, job: str, agent_id: str, key: str | None) -> None:
        """409 unless ``key`` is the agent's (an agent that never registered has none to check)."""
        me = self.store.agent(job, agent_id)
        if me is not None and me[1] and not self._key_ok(me[1], key):
            raise RequestError(f"agent {agent_id!r} of job {job!r}: missing or wrong agent key "
                               f"({AGENT_KEY_HEADER})", status=409)

    def owned_ranks(self, job: str, agent_id: str, ranks: Sequence[int], now_ns: int) -> set[int]:
        """The ranks this agent may report on: its own and the unowned ones (or a dead owner's)."""
        owners = self.store.rank_owners(job, ranks)
        return {r for r in ranks if owners.get(r, agent_id) == agent_id
                or not self._alive(job, owners[r], now_ns)}

    def check_ranks_writer(self, job: str, ranks: Sequence[int], key: str | None) -> None:
        """``check_rank_writer`` for several ranks (one upload of a node): one owners query."""
        owners = self.store.rank_owners(job, ranks)
        checked: dict[str, bool] = {}
        for rank in ranks:
            owner = owners.get(rank)
            if owner is None:
                continue
            ok = checked.get(owner)
            if ok is None:
                a = self.store.agent(job, owner)
                ok = checked[owner] = not (a is not None and a[1] and not self._key_ok(a[1], key))
            if not ok:
                raise RequestError(f"rank {rank} of job {job!r} belongs to agent {owner!r}; this upload does not "
                                   f"carry its agent key ({AGENT_KEY_HEADER})", status=409)

    def check_rank_writer(self, job: str, rank: int, key: str | None) -> None:
        """409 unless ``key`` belongs to the agent that owns ``rank`` (an unregistered rank has no owner)."""
        owner = self.store.rank_owners(job, [rank]).get(rank)
        if owner is None:
            return
        a = self.store.agent(job, owner)
        if a is not None and a[1] and not self._key_ok(a[1], key):
            raise RequestError(f"rank {rank} of job {job!r} belongs to agent {owner!r}; this upload does not carry "
                               f"its agent key ({AGENT_KEY_HEADER})", status=409)
