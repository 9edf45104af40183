"""Issue 46 (third red-team round), items 6 and 7 and a low one, on the real service and store:
retention and quotas are per tenant.

6. one tenant's large sessions must not evict another tenant's reports (size bound per tenant);
7. hang snapshots that open sessions count against the token's triggers per minute;
low: two tokens with the same scope globs have a quota each.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from perftracker.agent.daemon.localizer_client import Uplink, UplinkError
from perftracker.localizer.service.http_io import token_id
from perftracker.localizer.service.http_service import ServiceOptions, tenant_of_job
from perftracker.localizer.service.retention import Retention, RetentionOptions
from perftracker.localizer.service.session.manager import SessionOptions
from perftracker.localizer.store.rank_ranges import RankRanges
from perftracker.localizer.store.sqlite_store import SessionRecord, Store
from service_helpers import TOKEN, ServiceThread, workers

from perftracker.model import HangSnapshot, Report

TOKEN_A = "tenant-a-token-0123456789abcdef"
TOKEN_B = "tenant-b-token-0123456789abcdef"


def _post(url: str, path: str, body: Any, token: str) -> tuple[int, Any]:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _seed(store: Store, rows: list[tuple[str, str, float, int]], now: int) -> None:
    """(session, job, age s, report bytes) closed sessions with a report each."""
    for name, job, age_s, nbytes in rows:
        t = now - int(age_s * 1e9)
        store.insert_session(SessionRecord(0, name, job, "slowdown", "r", 20.0, "done", t, t, closed_ns=t,
                                           expected=RankRanges.span(2)))
        store.events.put_report(Report(job=job, session=name, kind="slowdown", created_ns=t, trigger_reason="r",
                                       window_s=20.0, ranks_reported=(0, 1), summary="x" * nbytes))


# ---------------------------------------------------------------- item 6
def test_a_tenants_large_sessions_do_not_evict_another_tenants_reports(tmp_path: Path) -> None:
    """Tenant B's three small reports are the oldest; tenant A then stores ten large ones, past
    the bound. Before, the oldest went first (B's reports 404); now A's oldest go until it fits."""
    now = time.time_ns()
    store = Store(tmp_path / "s.sqlite")
    _seed(store, [(f"b-{i}", "b-job", 3600.0 - i, 5_000) for i in range(3)], now)
    _seed(store, [(f"a-{i}", "a-job", 600.0 - i, 50_000) for i in range(10)], now)
    tenants = tenant_of_job({TOKEN_A: ("a-*",), TOKEN_B: ("b-*",)})
    assert tenants("a-job") == token_id(TOKEN_A) != tenants("b-job") and tenants("other") == "main"
    sizes = {s: n for s, _, _, n, _ in store.session_sizes()}
    bound = sum(sizes.values()) - 3 * sizes["a-0"] + 1  # just above what dropping three of A's leaves
    plan = Retention(store, None, RetentionOptions(max_age_s=0, max_bytes=bound), tenant_of=tenants).sweep(now)
    assert plan.evicted == ("a-0", "a-1", "a-2") and plan.kept_bytes <= bound  # A's oldest, only as many as needed
    assert all(store.events.get_report(f"b-{i}") is not None for i in range(3))
    # the same store as one tenant (no job tokens): the oldest go first, B's included (the old rule)
    _seed(store, [(f"a-{i}", "a-job", 600.0 - i, 50_000) for i in range(3)], now)
    one = Retention(store, None, RetentionOptions(max_age_s=0, max_bytes=bound)).plan(now)
    assert one.evicted[:3] == ("b-0", "b-1", "b-2")
    # a tenant is evicted once it holds the most: B grows past A, and B's oldest goes first
    _seed(store, [(f"b-big-{i}", "b-job", 500.0 - i, 200_000) for i in range(3)], now)
    grown = Retention(store, None, RetentionOptions(max_age_s=0, max_bytes=bound), tenant_of=tenants).plan(now)
    assert grown.evicted[0] == "b-0"
    store.close()


def test_the_service_sweeps_per_job_token(tmp_path: Path) -> None:
    opts = ServiceOptions(job_tokens={TOKEN_A: ("a-*",)})
    with ServiceThread(tmp_path / "s.sqlite", opts) as svc:
        assert svc.service.retention.tenant_of("a-1") == token_id(TOKEN_A)
        assert svc.service.retention.tenant_of("z") == "main"
        svc.service.grant_job(TOKEN_B, "b-1")  # a job granted later has its tenant from then on
        assert svc.service.retention.tenant_of("b-1") == token_id(TOKEN_B)


# ---------------------------------------------------------------- item 7 and the low one
def _snapshot(job: str) -> HangSnapshot:
    return HangSnapshot(job=job, rank=0, world_size=1, host="n", pid=1, taken_ns=time.time_ns(), last_iteration=5,
                        idle_s=30.0, stack=())


def _status(fn: Any) -> int:
    try:
        fn()
    except UplinkError as exc:  # the client retries a 429 and then says so with status 0
        return exc.status or (429 if ": 429: too many triggers" in str(exc) and "triggers-per-minute" in str(exc)
                              else 0)
    return 200


def test_hang_snapshots_count_against_the_tokens_quota(tmp_path: Path) -> None:
    """One token opened 30 hang sessions in 0.1 s (counted per job): now its triggers per minute."""
    opts = ServiceOptions(job_tokens={TOKEN_A: ("h-*",)},
                          sessions=SessionOptions(join_slack_s=0.0, max_open_sessions_per_job=0, triggers_per_minute=3,
                                                  hang_collect_s=30.0))
    with ServiceThread(tmp_path / "s.sqlite", opts) as svc:
        tenant, admin = Uplink(svc.url, TOKEN_A, retries=0), Uplink(svc.url, TOKEN, retries=0)
        for i in range(8):
            tenant.register(f"h-{i}", "agent-a", "n", workers([0], 1))
        codes = [_status(lambda i=i: tenant.upload_hang_snapshot(_snapshot(f"h-{i}"))) for i in range(8)]
        assert codes == [200] * 3 + [429] * 5  # up to the limit, then the fourth and far past it
        assert len(svc.store.sessions()) == 3
        assert _status(lambda: tenant.upload_hang_snapshot(_snapshot("h-0"))) == 200  # joins its open session: free
        admin.register("m-0", "agent-m", "n", workers([0], 1))
        assert _status(lambda: admin.upload_hang_snapshot(_snapshot("m-0"))) == 200  # the main token: per job


def test_two_tokens_with_the_same_globs_have_a_quota_each(tmp_path: Path) -> None:
    opts = ServiceOptions(job_tokens={TOKEN_A: ("q-*",), TOKEN_B: ("q-*",)},
                          sessions=SessionOptions(join_slack_s=0.0, max_open_sessions_per_job=0, triggers_per_minute=2))
    with ServiceThread(tmp_path / "s.sqlite", opts) as svc:
        admin = Uplink(svc.url, TOKEN, retries=0)
        for i in range(4):
            admin.register(f"q-{i}", f"agent-{i}", "n", workers([0], 1))
        a = [_post(svc.url, f"/v1/jobs/q-{i}/triggers", {"reason": "t"}, TOKEN_A)[0] for i in range(3)]
        assert a == [201, 201, 429]  # created, created, refused
        status, answer = _post(svc.url, "/v1/jobs/q-3/triggers", {"reason": "t"}, TOKEN_B)
        assert status == 201 and not answer["joined"]  # B's own quota, though its globs are A's
        assert TOKEN_A not in json.dumps(answer)


def test_a_job_scoped_token_does_not_read_the_cluster_wide_metrics(tmp_path: Path) -> None:
    opts = ServiceOptions(job_tokens={TOKEN_A: ("a-*",)})
    with ServiceThread(tmp_path / "s.sqlite", opts) as svc:
        def get(token: str) -> int:
            req = urllib.request.Request(svc.url + "/metrics", headers={"Authorization": f"Bearer {token}"})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    return r.status
            except urllib.error.HTTPError as exc:
                return exc.code

        assert get(TOKEN_A) == 403
        assert get(TOKEN) == 200
