"""The localizer service's Kubernetes side (``perftracker.localizer.k8s.client`` calls, on a thread of their own).

When the service runs in a pod, a new session also expects the ranks of its job's pods (merged
with the registrations), and a stored report becomes Warning Events on the pods of the ranks it
names. Both are blocking HTTP calls: they run on a one-thread "k8s" executor, never on the event
loop. A failed pod listing is logged and the session keeps the registrations' ranks; a failed
Event is logged and skipped. Tested against recorded API responses; not verified on a cluster.
"""

from __future__ import annotations

import concurrent.futures
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from perftracker.localizer.k8s.client import JobTopology, KubernetesClient
from perftracker.localizer.store.sqlite_store import SessionRecord, Store
from perftracker.localizer.store.writer import GroupCommit
from perftracker.model import Report

log = logging.getLogger(__name__)


class ClusterLink:
    """Pods' ranks for new sessions and Events for stored reports, through one client."""

    def __init__(self, client: KubernetesClient, store: Store, writer: GroupCommit) -> None:
        self.client = client
        self.store = store
        self.writer = writer  # every store write goes through the service's writer thread
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="k8s")
        self._topologies: dict[str, JobTopology] = {}  # job -> its pods at its latest lookup (k8s thread only)
        self._sessions: set[str] = set()  # sessions whose pods were looked up (event loop only)
        log.info("Kubernetes integration on: namespace %s", client.options.namespace)

    def close(self) -> None:
        """Wait for the calls in progress (before the writer closes: lookups write through it)."""
        self._executor.shutdown(wait=True)

    def _submit(self, fn: Any, *args: Any) -> concurrent.futures.Future[Any] | None:
        try:
            return self._executor.submit(fn, *args)
        except RuntimeError:  # shutting down
            return None

    def expect_pods(self, s: SessionRecord) -> concurrent.futures.Future[Any] | None:
        """Once per session: list the job's pods and let the session expect their ranks too. The
        future gives the session after the merge, or None."""
        if s.session in self._sessions:
            return None
        self._sessions.add(s.session)
        return self._submit(self.merge_topology, s.session, s.job)

    def merge_topology(self, session: str, job: str) -> SessionRecord | None:
        """k8s thread: expected ranks = registrations + the job's pods. On any error the session keeps
        the registrations' ranks."""
        try:
            topology = self.client.job_topology(job)
        except Exception as exc:  # noqa: BLE001 - K8sError, or anything else the client raises
            log.warning("session %s: expected ranks from the registrations only (pods of job %s not listed: %s)",
                        session, job, exc)
            return None
        self._topologies[job] = topology
        try:
            merged = self.writer.call(lambda: self.store.expect_ranks(session, topology.expected_ranks))
        except Exception:  # noqa: BLE001 - the store failed; the session keeps its ranks
            log.exception("session %s: could not store the pods' ranks", session)
            return None
        if merged is None:  # closed meanwhile
            return None
        s, added = merged
        log.info("session %s: job %s has %d pod rank(s) (nproc-per-node %d); %s", session, job,
                 topology.world_size, topology.nproc_per_node,
                 f"now expects {len(s.expected)} rank(s), {len(added)} not registered yet" if added
                 else "all registered")
        return s

    def post_events(self, report: Report) -> None:
        """Post the report's Events on the k8s thread (returns at once)."""
        self._submit(self._post_events, report)

    def _post_events(self, report: Report) -> None:
        if not report.findings and not any(h.state in ("culprit", "silent") for h in report.hang_states):
            return
        topology = self._topologies.get(report.job)
        try:
            if topology is None:  # e.g. the session was opened before a restart
                topology = self._topologies[report.job] = self.client.job_topology(report.job)
            names = self.client.post_report_events(report, topology)
        except Exception as exc:  # noqa: BLE001 - Events are a convenience; the report is stored
            log.warning("session %s: no Kubernetes Events posted: %s", report.session, exc)
            return
        log.info("session %s: posted %d Kubernetes Event(s)", report.session, len(names))
