"""Kubernetes integration of the localizer (the `kubernetes` client; imported only in a cluster).

- ``KubernetesClient.job_topology(job)`` lists the job's pods and gives the expected workers and
  the rank -> pod -> node mapping. A pod of an indexed Job carries its completion index (the
  annotation, or on Kubernetes >= 1.28 also the label, ``batch.kubernetes.io/job-completion-index``)
  and the pod template's annotation ``perftracker.io/nproc-per-node``; torchrun with
  ``--node_rank=$JOB_COMPLETION_INDEX`` then gives pod i the ranks ``i*n .. i*n+n-1``.
- ``from_environment()`` gives the in-cluster client, or None outside a cluster.
- ``KubernetesClient.post_report_events(report, topology)`` posts one Warning Event on each pod
  whose rank has a finding (or, for a hang, whose rank is the culprit or silent), so that
  ``kubectl describe pod`` and ``kubectl get events`` show perftracker's sentence.

Tested against recorded API responses (tests/fixtures/k8s/) served over a real local socket to
the real client; not verified on a cluster. The RBAC this needs is k8s/base/rbac.yaml.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perftracker.errors import PerftrackerError
from perftracker.model import Report, compress_ranks

log = logging.getLogger(__name__)

INDEX_KEY = "batch.kubernetes.io/job-completion-index"
NPROC_ANNOTATION = "perftracker.io/nproc-per-node"
SERVICEACCOUNT_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
EVENT_MESSAGE_MAX = 1024  # the API server truncates longer Event messages
_TERMINAL = ("Succeeded", "Failed")


class K8sError(PerftrackerError):
    """A Kubernetes API call failed, or the job's pods do not describe a rank layout."""


@dataclass(frozen=True)
class K8sOptions:
    namespace: str
    job_label: str = "job-name"  # the label the Job controller puts on its pods (value: the Job's name)
    index_key: str = INDEX_KEY
    nproc_annotation: str = NPROC_ANNOTATION
    component: str = "perftracker-localizer"  # Event source / reportingComponent
    instance: str = ""  # reportingInstance: this localizer's pod name, if known
    page_size: int = 500
    timeout_s: float = 10.0


@dataclass(frozen=True)
class WorkerPod:
    """Where one rank runs."""

    rank: int
    local_rank: int
    pod: str
    uid: str
    node: str
    pod_ip: str
    phase: str
    index: int


@dataclass(frozen=True)
class JobTopology:
    job: str
    namespace: str
    nproc_per_node: int
    workers: tuple[WorkerPod, ...]  # one per rank, sorted by rank

    @property
    def expected_ranks(self) -> tuple[int, ...]:
        return tuple(w.rank for w in self.workers)

    @property
    def world_size(self) -> int:
        return len(self.workers)

    def pod_for_rank(self, rank: int) -> WorkerPod | None:
        for w in self.workers:
            if w.rank == rank:
                return w
        return None


def namespace_from_environment(environ: Mapping[str, str] | None = None,
                               sa_file: Path = SERVICEACCOUNT_NAMESPACE_FILE) -> str:
    """PERFTRACKER_K8S_NAMESPACE, else the service account's namespace file, else ''."""
    env = os.environ if environ is None else environ
    ns = env.get("PERFTRACKER_K8S_NAMESPACE", "").strip()
    if ns:
        return ns
    try:
        return sa_file.read_text().strip()
    except OSError:
        return ""


def in_cluster(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return bool(env.get("KUBERNETES_SERVICE_HOST")) and SERVICEACCOUNT_NAMESPACE_FILE.parent.is_dir()


def from_environment(environ: Mapping[str, str] | None = None) -> KubernetesClient | None:
    """The in-cluster client when this process runs in a pod (KUBERNETES_SERVICE_HOST set and a
    namespace known), else None. Errors are logged, never raised: Kubernetes is optional."""
    env = os.environ if environ is None else environ
    if not env.get("KUBERNETES_SERVICE_HOST"):
        return None
    ns = namespace_from_environment(env)
    if not ns:
        log.warning("in a Kubernetes pod but the namespace is unknown: set PERFTRACKER_K8S_NAMESPACE")
        return None
    try:
        return KubernetesClient.from_cluster(K8sOptions(namespace=ns, instance=env.get("HOSTNAME", "")))
    except (K8sError, ImportError) as exc:
        log.warning("Kubernetes integration off: %s", exc)
        return None


class KubernetesClient:
    """Reads a job's pods and posts Events, through ``kubernetes.client.CoreV1Api``."""

    def __init__(self, api: Any, options: K8sOptions) -> None:
        self.api = api
        self.options = options

    @classmethod
    def from_cluster(cls, options: K8sOptions | None = None) -> KubernetesClient:
        """A client with the pod's service-account credentials (in-cluster config)."""
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException as exc:
            raise K8sError(f"not running in a Kubernetes pod with a service account: {exc}") from None
        if options is None:
            ns = namespace_from_environment()
            if not ns:
                raise K8sError("cannot tell this pod's namespace: set PERFTRACKER_K8S_NAMESPACE")
            options = K8sOptions(namespace=ns, instance=os.environ.get("HOSTNAME", ""))
        return cls(client.CoreV1Api(), options)

    @classmethod
    def for_host(cls, host: str, options: K8sOptions, token: str = "") -> KubernetesClient:
        """A client for an explicit API server URL (tests, or a kubeconfig-less admin tool)."""
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = host
        if token:
            cfg.api_key = {"authorization": token}
            cfg.api_key_prefix = {"authorization": "Bearer"}
        return cls(client.CoreV1Api(client.ApiClient(cfg)), options)

    # ------------------------------------------------------------------------------------ pods

    def list_job_pods(self, job: str) -> list[Any]:
        """Every pod labelled with the job's name, across pages."""
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError

        o = self.options
        pods: list[Any] = []
        token: str | None = None
        while True:
            try:
                page = self.api.list_namespaced_pod(
                    o.namespace, label_selector=f"{o.job_label}={job}", limit=o.page_size,
                    _continue=token, _request_timeout=o.timeout_s,
                )
            except ApiException as exc:
                raise K8sError(f"list pods of job {job!r} in namespace {o.namespace!r}: {_api_reason(exc)}") from None
            except (OSError, HTTPError) as exc:
                raise K8sError(f"list pods of job {job!r}: cannot reach the API server ({exc})") from None
            pods.extend(page.items or [])
            token = page.metadata._continue if page.metadata is not None else None
            if not token:
                return pods

    def job_topology(self, job: str) -> JobTopology:
        """Expected workers and rank -> pod -> node of ``job``'s current pods."""
        pods = self.list_job_pods(job)
        if not pods:
            raise K8sError(f"no pods with label {self.options.job_label}={job} in namespace {self.options.namespace!r}")
        by_index: dict[int, Any] = {}
        nprocs: set[int] = set()
        for pod in pods:
            meta = pod.metadata
            index = _pod_index(meta, self.options.index_key)
            if index is None:
                raise K8sError(
                    f"pod {meta.name}: no {self.options.index_key} annotation or label "
                    "(perftracker maps ranks for indexed Jobs: completionMode: Indexed)"
                )
            nprocs.add(_nproc(meta, self.options.nproc_annotation))
            current = by_index.get(index)
            if current is None or _newer(pod, current):
                by_index[index] = pod
        if len(nprocs) != 1:
            raise K8sError(f"job {job!r}: pods disagree on {self.options.nproc_annotation}: {sorted(nprocs)}")
        nproc = nprocs.pop()
        workers = []
        for index in sorted(by_index):
            pod = by_index[index]
            for local in range(nproc):
                workers.append(WorkerPod(
                    rank=index * nproc + local, local_rank=local, pod=pod.metadata.name, uid=pod.metadata.uid or "",
                    node=(pod.spec.node_name if pod.spec else None) or "",
                    pod_ip=(pod.status.pod_ip if pod.status else None) or "",
                    phase=(pod.status.phase if pod.status else None) or "Unknown", index=index,
                ))
        missing = sorted(set(range(max(by_index) + 1)) - set(by_index))
        if missing:
            log.warning("job %s: no pod for completion index %s yet", job, compress_ranks(missing))
        return JobTopology(job=job, namespace=self.options.namespace, nproc_per_node=nproc, workers=tuple(workers))

    # ------------------------------------------------------------------------------------ events

    def post_report_events(self, report: Report, topology: JobTopology, now: _dt.datetime | None = None) -> list[str]:
        """One Warning Event per (pod, finding) on the pods whose ranks the report names.

        Returns the created Events' names. A failed post is logged and skipped: Events are a
        convenience, never a reason to lose the report."""
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError

        created: list[str] = []
        for pod, reason, message in _event_targets(report, topology):
            body = self._event_body(pod, reason, message, now or _dt.datetime.now(_dt.timezone.utc))  # noqa: UP017
            try:
                ev = self.api.create_namespaced_event(self.options.namespace, body, _request_timeout=self.options.timeout_s)
            except ApiException as exc:
                log.warning("event on pod %s not posted: %s", pod.pod, _api_reason(exc))
                continue
            except (OSError, HTTPError) as exc:
                log.warning("event on pod %s not posted: cannot reach the API server (%s)", pod.pod, exc)
                continue
            created.append(ev.metadata.name if ev.metadata is not None else "")
        return created

    def _event_body(self, pod: WorkerPod, reason: str, message: str, now: _dt.datetime) -> Any:
        from kubernetes import client

        o = self.options
        return client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{pod.pod}.perftracker-", namespace=o.namespace,
                                         labels={"app.kubernetes.io/name": "perftracker"}),
            involved_object=client.V1ObjectReference(api_version="v1", kind="Pod", name=pod.pod,
                                                     namespace=o.namespace, uid=pod.uid or None),
            reason=reason,
            message=message[:EVENT_MESSAGE_MAX],
            type="Warning",
            count=1,
            first_timestamp=now,
            last_timestamp=now,
            source=client.V1EventSource(component=o.component, host=pod.node or None),
            reporting_component=o.component,
            reporting_instance=o.instance or o.component,
            action="Diagnosed",
        )


def _event_targets(report: Report, topology: JobTopology) -> list[tuple[WorkerPod, str, str]]:
    """(pod, reason, message) for each pod that hosts a rank the report names."""
    out: list[tuple[WorkerPod, str, str]] = []
    groups: list[tuple[tuple[int, ...], str, str]] = []
    for f in report.findings:
        groups.append((f.ranks, "PerftrackerFinding", f"perftracker session {report.session}: {f.sentence}"))
    for s in report.hang_states:
        if s.state in ("culprit", "silent"):
            detail = f" ({s.detail})" if s.detail else ""
            groups.append(((s.rank,), "PerftrackerHang",
                           f"perftracker session {report.session}: rank {s.rank} {s.state}: {s.where}{detail}"))
    for ranks, reason, message in groups:
        pods: dict[str, tuple[WorkerPod, list[int]]] = {}
        for r in ranks:
            w = topology.pod_for_rank(r)
            if w is None:
                log.warning("rank %d of session %s has no pod in job %s", r, report.session, topology.job)
                continue
            pods.setdefault(w.pod, (w, []))[1].append(r)
        for w, rs in pods.values():
            out.append((w, reason, f"{message} [ranks on this pod: {compress_ranks(rs)}]"))
    return out


def _pod_index(meta: Any, key: str) -> int | None:
    for source in (meta.annotations or {}, meta.labels or {}):
        raw = source.get(key)
        if raw is not None:
            try:
                return int(raw)
            except ValueError:
                raise K8sError(f"pod {meta.name}: {key}={raw!r} is not an integer") from None
    return None


def _nproc(meta: Any, key: str) -> int:
    raw = (meta.annotations or {}).get(key, "1")
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise K8sError(f"pod {meta.name}: {key}={raw!r} must be a positive integer")
    return n


def _newer(pod: Any, other: Any) -> bool:
    """Prefer a live pod over a terminated one, then the newer one (a replacement after a failure)."""
    live, other_live = (p.status is None or p.status.phase not in _TERMINAL for p in (pod, other))
    if live != other_live:
        return live
    t1, t2 = pod.metadata.creation_timestamp, other.metadata.creation_timestamp
    return t1 is not None and (t2 is None or t1 > t2)


def _api_reason(exc: Any) -> str:
    """The API server's Status message, e.g. 'pods is forbidden: User ... cannot list ...'."""
    import json

    try:
        body = json.loads(exc.body or "{}")
        msg = body.get("message") or exc.reason
    except (ValueError, TypeError, AttributeError):
        msg = getattr(exc, "reason", str(exc))
    return f"HTTP {getattr(exc, 'status', '?')}: {msg}"


def rank_labels(topology: JobTopology, ranks: Sequence[int]) -> dict[int, str]:
    """rank -> "pod@node" for display next to a report."""
    out = {}
    for r in ranks:
        w = topology.pod_for_rank(r)
        if w is not None:
            out[r] = f"{w.pod}@{w.node}" if w.node else w.pod
    return out
