"""k8s/: every kustomization renders with `kubectl kustomize`, every rendered object validates
against the Kubernetes schema of a pinned version (kubernetes-validate, strict: unknown fields
fail), and the objects fit together (labels, selectors, names, volumes, RBAC)."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the dev extra")

REPO = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.30.0"  # pinned: native sidecars (initContainers restartPolicy) need >= 1.28 schemas
KUSTOMIZATIONS = ["k8s/base", "k8s/overlays/example", "k8s/overlays/example-nsys"]
RUN_DIR = "/var/run/perftracker"


def _kustomize_major(kubectl: str | None) -> int:
    """The major version of kubectl's built-in kustomize; 0 when kubectl is absent or does not say
    (kubectl <= 1.20, e.g. Debian 12's kubernetes-client, whose kustomize v2 fails on these
    manifests with 'unknown field "labels"')."""
    if kubectl is None:
        return 0
    try:
        out = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    m = re.search(r"Kustomize Version: v(\d+)", out)
    return int(m.group(1)) if m else 0


KUBECTL = shutil.which("kubectl")
KUSTOMIZE_MAJOR = _kustomize_major(KUBECTL)
needs_kubectl = pytest.mark.skipif(
    KUSTOMIZE_MAJOR < 5,
    reason="needs kubectl >= 1.27 (kustomize v5: labels, patches); "
           + ("no kubectl on PATH" if KUBECTL is None else f"{KUBECTL} has an older kustomize"))

_cache: dict[str, list[dict[str, Any]]] = {}


def _tree() -> Path:
    """A copy of k8s/ with the token file an operator creates before the first apply (not in git)."""
    if "tree" not in _trees:
        import secrets
        import tempfile

        root = Path(tempfile.mkdtemp(prefix="pt-k8s-"))
        shutil.copytree(REPO / "k8s", root / "k8s")
        (root / "k8s" / "base" / "token").write_text(secrets.token_urlsafe(32))
        job_token = secrets.token_urlsafe(32)  # the example job's own token (k8s/overlays/example)
        (root / "k8s" / "overlays" / "example" / "train-token").write_text(job_token)
        (root / "k8s" / "overlays" / "example" / "job-tokens.json").write_text(json.dumps({job_token: ["train"]}))
        _trees["tree"] = root
    return _trees["tree"]


_trees: dict[str, Path] = {}


def render(path: str) -> list[dict[str, Any]]:
    if path not in _cache:
        proc = subprocess.run([str(KUBECTL), "kustomize", str(_tree() / path)], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, f"kubectl kustomize {path} failed:\n{proc.stderr}"
        _cache[path] = [d for d in yaml.safe_load_all(proc.stdout) if d]
    return _cache[path]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _pod(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["template"]["spec"]


@needs_kubectl
@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_renders_and_validates_against_pinned_schema(path: str) -> None:
    docs = render(path)
    assert docs
    for d in docs:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)


@needs_kubectl
def test_validation_is_strict_and_pinned() -> None:
    """The check can fail: a misspelled field, and the sidecar field on a schema that predates it."""
    job = one(render("k8s/overlays/example"), "Job")
    typo = copy.deepcopy(job)
    _pod(typo)["shareProcessNamespce"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, K8S_VERSION, strict=True)
    with pytest.raises(kubernetes_validate.ValidationError, match="restartPolicy"):
        kubernetes_validate.validate(job, "1.27.0", strict=True)


@needs_kubectl
def test_agent_is_a_native_sidecar_sharing_pid_namespace_and_run_dir() -> None:
    job = one(render("k8s/overlays/example"), "Job")
    pod = _pod(job)
    assert pod["shareProcessNamespace"] is True
    agent = next(c for c in pod["initContainers"] if c["name"] == "perftracker-agent")
    assert agent["restartPolicy"] == "Always"
    assert agent["args"][0] == "agent"
    assert not agent.get("securityContext", {}).get("privileged", False)
    assert agent["securityContext"]["capabilities"]["drop"] == ["ALL"]
    (trainer,) = pod["containers"]
    run_vols = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    for c in (agent, trainer):
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert mounts[RUN_DIR] in run_vols, c["name"]
        env = {e["name"]: e for e in c["env"]}
        assert env["PERFTRACKER_RUN_DIR"]["value"] == RUN_DIR
    assert {m["name"] for m in agent["volumeMounts"] if m["mountPath"] == RUN_DIR} == {
        m["name"] for m in trainer["volumeMounts"] if m["mountPath"] == RUN_DIR
    }
    env = {e["name"]: e for e in agent["env"]}
    # the trainer shares the agent's process namespace and uid: the agent holds a job-scoped token
    assert env["PERFTRACKER_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "perftracker-job-token-train"
    assert env["PERFTRACKER_LOCALIZER_URL"]["value"].startswith("http://perftracker-localizer:")
    assert "startupProbe" not in agent  # training never waits for perftracker


@needs_kubectl
def test_training_job_is_indexed_torchrun_behind_headless_service() -> None:
    docs = render("k8s/overlays/example")
    job = one(docs, "Job")
    svc = one(docs, "Service", "train")
    pod = _pod(job)
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert pod["subdomain"] == svc["metadata"]["name"]
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    cmd = " ".join(pod["containers"][0]["command"] + pod["containers"][0]["args"])
    assert "torchrun" in cmd and "--nnodes=2" in cmd and "JOB_COMPLETION_INDEX" in cmd
    assert f"--master_addr={job['metadata']['name']}-0.{svc['metadata']['name']}" in cmd
    nproc = job["spec"]["template"]["metadata"]["annotations"]["perftracker.io/nproc-per-node"]
    assert f"--nproc_per_node={nproc}" in cmd


@needs_kubectl
def test_localizer_deployment_service_pvc_secret() -> None:
    docs = render("k8s/overlays/example")
    dep = one(docs, "Deployment", "perftracker-localizer")
    svc = one(docs, "Service", "perftracker-localizer")
    pvc = one(docs, "PersistentVolumeClaim")
    secret = one(docs, "Secret", "perftracker-token")
    assert all(d["metadata"].get("namespace") == "perftracker" for d in docs if d["kind"] != "Namespace")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    pod = dep["spec"]["template"]["spec"]
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    claim = next(v for v in pod["volumes"] if "persistentVolumeClaim" in v)
    assert claim["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    (c,) = pod["containers"]
    store_mount = next(m for m in c["volumeMounts"] if m["name"] == claim["name"])
    assert c["args"][0] == "localizer" and c["args"][c["args"].index("--store") + 1].startswith(store_mount["mountPath"] + "/")
    env = {e["name"]: e for e in c["env"]}
    assert env["PERFTRACKER_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": secret["metadata"]["name"], "key": "token"}
    assert "token" in secret["data"]  # from the operator's file (secretGenerator), never a literal
    assert pod["serviceAccountName"] == "perftracker-localizer"
    port = c["ports"][0]["containerPort"]
    assert f":{port}" in next(
        e["value"] for e in _pod(one(docs, "Job"))["initContainers"][0]["env"] if e["name"] == "PERFTRACKER_LOCALIZER_URL"
    )


@needs_kubectl
def test_the_token_secret_is_generated_from_a_file_never_a_literal(tmp_path: Path) -> None:
    import base64

    text = "\n".join(p.read_text() for p in (REPO / "k8s").rglob("*.yaml"))
    assert "stringData" not in text and "REPLACE-ME" not in text
    secret = one(render("k8s/overlays/example"), "Secret", "perftracker-token")
    assert base64.b64decode(secret["data"]["token"]).decode() == (_tree() / "k8s/base/token").read_text()
    shutil.copytree(REPO / "k8s", tmp_path / "k8s")  # no token file: the render fails, naming it
    (tmp_path / "k8s/base/token").unlink(missing_ok=True)
    proc = subprocess.run([str(KUBECTL), "kustomize", str(tmp_path / "k8s/base")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and "token" in proc.stderr


@needs_kubectl
def test_rbac_reads_pods_and_creates_events_only() -> None:
    docs = render("k8s/overlays/example")
    role = one(docs, "Role")
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    grants = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    allowed = {("", "pods", v) for v in ("get", "list", "watch")} | {("", "events", "create"), ("events.k8s.io", "events", "create")}
    assert grants <= allowed and ("", "pods", "list") in grants and ("", "events", "create") in grants
    rb = one(docs, "RoleBinding")
    assert rb["roleRef"]["name"] == role["metadata"]["name"]
    assert rb["subjects"] == [{"kind": "ServiceAccount", "name": "perftracker-localizer", "namespace": "perftracker"}]


@needs_kubectl
def test_network_policy_admits_only_agent_pods() -> None:
    docs = render("k8s/overlays/example")
    np_ = one(docs, "NetworkPolicy", "perftracker-localizer")
    dep = one(docs, "Deployment", "perftracker-localizer")
    assert np_["spec"]["podSelector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert np_["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = np_["spec"]["ingress"]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}
    job_labels = one(docs, "Job")["spec"]["template"]["metadata"]["labels"]
    assert peer["podSelector"]["matchLabels"].items() <= job_labels.items()
    assert [p["port"] for p in rule["ports"]] == [dep["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]]


@needs_kubectl
def test_the_example_jobs_agent_holds_a_job_scoped_token_the_localizer_reads() -> None:
    """Issue 46: the trainer can read the agent's environment (shared process namespace, same
    uid), so the agent's token is one the localizer scopes to the job, from its own Secret."""
    import base64

    docs = render("k8s/overlays/example")
    job = one(docs, "Job")
    agent = next(c for c in _pod(job)["initContainers"] if c["name"] == "perftracker-agent")
    ref = {e["name"]: e for e in agent["env"]}["PERFTRACKER_TOKEN"]["valueFrom"]["secretKeyRef"]
    job_token = base64.b64decode(one(docs, "Secret", ref["name"])["data"][ref["key"]]).decode()
    main = base64.b64decode(one(docs, "Secret", "perftracker-token")["data"]["token"]).decode()
    dep = one(docs, "Deployment", "perftracker-localizer")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    path = {e["name"]: e.get("value") for e in c["env"]}["PERFTRACKER_JOB_TOKENS"]
    mount = next(m for m in c["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    vol = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    table = json.loads(base64.b64decode(one(docs, "Secret", vol["secret"]["secretName"])["data"][Path(path).name]))
    assert job_token != main and table == {job_token: [job["metadata"]["name"]]}
    for d in docs:  # nothing but the localizer holds the main token
        for ctr in d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []) + \
                d.get("spec", {}).get("template", {}).get("spec", {}).get("initContainers", []):
            for e in ctr.get("env", []):
                if e.get("valueFrom", {}).get("secretKeyRef", {}).get("name") == "perftracker-token":
                    assert d["kind"] == "Deployment" and d["metadata"]["name"] == "perftracker-localizer"


@needs_kubectl
def test_the_training_pods_metrics_port_is_open_to_prometheus_only() -> None:
    docs = render("k8s/overlays/example")
    job = one(docs, "Job")
    labels = job["spec"]["template"]["metadata"]["labels"]
    pol = one(docs, "NetworkPolicy", "train")
    assert pol["spec"]["podSelector"]["matchLabels"].items() <= labels.items() and pol["spec"]["policyTypes"] == ["Ingress"]
    own, prom = pol["spec"]["ingress"]
    assert own == {"from": [{"podSelector": {"matchLabels": pol["spec"]["podSelector"]["matchLabels"]}}]}
    assert prom["ports"] == [{"protocol": "TCP", "port": 9464}]
    assert prom["from"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"}


@needs_kubectl
def test_nsys_sampler_is_off_by_default_and_privileged_only_in_its_overlay() -> None:
    default = render("k8s/overlays/example")
    for d in default:
        text = yaml.safe_dump(d)
        assert "privileged: true" not in text and "agent-nsys" not in text
    job = one(render("k8s/overlays/example-nsys"), "Job")
    agent = next(c for c in _pod(job)["initContainers"] if c["name"] == "perftracker-agent")
    assert agent["image"].startswith("perftracker/agent-nsys:")
    sc = agent["securityContext"]
    assert not sc.get("privileged", False) and sc["allowPrivilegeEscalation"] is False  # issue 46: least privilege
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN", "SYS_PTRACE", "CHOWN"]}
    assert agent["restartPolicy"] == "Always"  # the patch kept the sidecar a sidecar
    # root agent, uid 10001 trainer: the socket's group is the trainer's (tests/system/test_hardening_rundir.py)
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["PERFTRACKER_SOCKET_GROUP"] == str(_pod(job)["securityContext"]["runAsGroup"])
    # the rest of the job is unchanged but for the GPUs the trainer requests (and the toleration)
    base_job = one(default, "Job")
    (trainer,), (base_trainer,) = copy.deepcopy(_pod(job)["containers"]), _pod(base_job)["containers"]
    assert trainer["resources"]["limits"].pop("nvidia.com/gpu") == 2
    assert trainer == base_trainer


@needs_kubectl
def test_nsys_overlay_states_its_resource_needs() -> None:
    """GPU nodes: the trainer requests one GPU per torchrun process; the privileged sidecar sees the
    pod's GPUs without taking one, and requests more memory than the plain agent."""
    job = one(render("k8s/overlays/example-nsys"), "Job")
    pod = _pod(job)
    nproc = int(job["spec"]["template"]["metadata"]["annotations"]["perftracker.io/nproc-per-node"])
    (trainer,) = pod["containers"]
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == nproc
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    agent = next(c for c in pod["initContainers"] if c["name"] == "perftracker-agent")
    assert "nvidia.com/gpu" not in agent["resources"].get("limits", {})
    assert {e["name"]: e.get("value") for e in agent["env"]}["NVIDIA_VISIBLE_DEVICES"] == "all"
    plain = next(c for c in _pod(one(render("k8s/overlays/example"), "Job"))["initContainers"]
                 if c["name"] == "perftracker-agent")
    gib = {"Mi": 1 / 1024, "Gi": 1}
    mem = {name: float(c["resources"]["requests"]["memory"][:-2]) * gib[c["resources"]["requests"]["memory"][-2:]]
           for name, c in (("nsys", agent), ("plain", plain))}
    assert mem["nsys"] > mem["plain"]


# ------------------------------------------------------------------------------------------------
# conventions: no deprecated kustomize fields, recommended labels, probes
# ------------------------------------------------------------------------------------------------

ALL_KUSTOMIZATIONS = [*KUSTOMIZATIONS, "k8s/monitoring"]
RECOMMENDED = ("name", "instance", "version", "component", "part-of", "managed-by")
DEPRECATED_FIELDS = ("bases", "patchesStrategicMerge", "patchesJson6902", "commonLabels", "vars", "imageTags")


@needs_kubectl
@pytest.mark.parametrize("path", ALL_KUSTOMIZATIONS)
def test_kustomize_renders_without_warnings_or_deprecated_fields(path: str) -> None:
    kust = yaml.safe_load((REPO / path / "kustomization.yaml").read_text())
    assert not set(kust) & set(DEPRECATED_FIELDS), f"{path}: deprecated {set(kust) & set(DEPRECATED_FIELDS)}"
    proc = subprocess.run([str(KUBECTL), "kustomize", str(_tree() / path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


@needs_kubectl
@pytest.mark.parametrize("path", ALL_KUSTOMIZATIONS)
def test_every_object_and_pod_has_the_recommended_labels(path: str) -> None:
    import perftracker

    for d in render(path):
        where = f"{path}: {d['kind']} {d['metadata']['name']}"
        labelled = [("", d["metadata"].get("labels", {}))]
        template = d.get("spec", {}).get("template", {}).get("metadata")
        if template is not None:
            labelled.append((" pod template", template.get("labels", {})))
        for what, labels in labelled:
            want = [k for k in RECOMMENDED if not (d["kind"] == "Namespace" and k == "component")]
            missing = [k for k in want if f"app.kubernetes.io/{k}" not in labels]
            assert not missing, f"{where}{what}: no app.kubernetes.io/{missing}"
            assert labels["app.kubernetes.io/part-of"] == "perftracker"
            assert labels["app.kubernetes.io/version"] == perftracker.__version__, where
        for c in (d.get("spec", {}).get("template", {}).get("spec", {}) or {}).get("containers", []):
            if c["image"].startswith("perftracker/"):
                assert c["image"].endswith(":" + perftracker.__version__), where
        selector = d.get("spec", {}).get("selector", {})
        selector = selector.get("matchLabels", selector) if isinstance(selector, dict) else {}
        assert "app.kubernetes.io/version" not in selector, f"{where}: a version in a selector"


@needs_kubectl
def test_agent_sidecar_has_a_liveness_probe_on_its_metrics_port() -> None:
    job = one(render("k8s/overlays/example"), "Job")
    agent = next(c for c in _pod(job)["initContainers"] if c["name"] == "perftracker-agent")
    probe = agent["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz" and probe["port"] == "metrics"
    assert any(p["name"] == "metrics" for p in agent["ports"])
    port = next(p["containerPort"] for p in agent["ports"] if p["name"] == "metrics")
    assert agent["args"][agent["args"].index("--metrics-port") + 1] == str(port)


@needs_kubectl
def test_monitoring_podmonitors_match_the_pods_and_ports() -> None:
    mon = render("k8s/monitoring")
    example = render("k8s/overlays/example")
    job_pod = one(example, "Job")["spec"]["template"]
    dep_pod = one(example, "Deployment")["spec"]["template"]
    agent_pm = one(mon, "PodMonitor", "perftracker-agent")
    loc_pm = one(mon, "PodMonitor", "perftracker-localizer")
    for pm, pod in ((agent_pm, job_pod), (loc_pm, dep_pod)):
        assert pm["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        ports = {p["name"] for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]
                 for p in c.get("ports", [])}
        for ep in pm["spec"]["podMetricsEndpoints"]:
            assert ep["port"] in ports and ep["path"] == "/metrics"
    creds = loc_pm["spec"]["podMetricsEndpoints"][0]["authorization"]["credentials"]
    assert creds == {"name": "perftracker-token", "key": "token"}  # /metrics needs the bearer token
    cm = one(mon, "ConfigMap", "perftracker-grafana-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["perftracker.json"])["uid"] == "perftracker"
    np_ = one(mon, "NetworkPolicy")
    assert [p["port"] for p in np_["spec"]["ingress"][0]["ports"]] == [dep_pod["spec"]["containers"][0]["ports"][0]["containerPort"]]


# ------------------------------------------------------------------------------------------------
# manifests <-> code: the commands, flags and variables the manifests use exist
# ------------------------------------------------------------------------------------------------


def _all_containers(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for d in docs:
        spec = d.get("spec", {}).get("template", {}).get("spec")
        if spec:
            out += spec.get("initContainers", []) + spec.get("containers", [])
    return out


@needs_kubectl
def test_container_commands_parse_with_the_real_cli() -> None:
    from perftracker.cli.main import build_parser

    for path in ("k8s/overlays/example", "k8s/overlays/example-nsys"):
        for c in _all_containers(render(path)):
            if c.get("command"):  # the trainer runs torchrun through sh
                continue
            argv = [str(a) for a in c["args"]]
            args = build_parser(argv).parse_args(argv)  # SystemExit on an unknown flag
            assert args.command == argv[0], c["name"]


@needs_kubectl
def test_environment_variables_are_ones_perftracker_reads() -> None:
    import dataclasses

    from perftracker.config import Config

    known = {"PERFTRACKER_" + f.name.upper() for f in dataclasses.fields(Config)}
    known |= {"PERFTRACKER_K8S_NAMESPACE", "PERFTRACKER_TOKEN_FILE"}  # localizer/k8s/client.py, agent/daemon/localizer_client.py
    known |= {"PERFTRACKER_JOB_TOKENS"}  # perftracker/cli/localizer.py (--job-tokens)
    used = {e["name"] for c in _all_containers(render("k8s/overlays/example")) for e in c.get("env", [])}
    ours = {n for n in used if n.startswith("PERFTRACKER_")}
    assert ours and ours <= known, ours - known


def test_dockerfiles_copy_existing_paths_and_match_manifest_images() -> None:
    import re

    images = {"agent.Dockerfile": "perftracker/agent", "localizer.Dockerfile": "perftracker/localizer",
              "agent-nsys.Dockerfile": "perftracker/agent-nsys"}
    manifests = "\n".join(p.read_text() for p in (REPO / "k8s").rglob("*.yaml"))
    for name, image in images.items():
        text = (REPO / "docker" / name).read_text()
        assert f"-t {image}:" in text, name  # the build command in its header
        assert re.search(rf"image: {re.escape(image)}:", manifests), image
        if name == "agent-nsys.Dockerfile":
            continue  # built from docker/ with a user-supplied .deb
        for src in re.findall(r"^COPY (\S+)", text, flags=re.M):
            assert (REPO / src).exists(), f"{name}: COPY {src} does not exist"
    train = (REPO / "k8s/overlays/example/train-job.yaml").read_text()
    script = re.search(r"/opt/perftracker/(\S+\.py)", train)
    assert script and (REPO / script.group(1)).is_file(), "the example Job runs a script the image does not have"
