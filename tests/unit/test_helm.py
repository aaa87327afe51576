"""The helm chart (helm/kubetf) and the plain-kubectl install path rendered from it (manifests/rbac, operator).

Tests that render the chart need the `helm` binary: $HELM, else `helm` on PATH, else the one tests/cluster
installs under ~/.cache/kubetf/. Without it they fail (they do not skip): the chart is part of the product.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "kubetf"
SOURCE_CRD = REPO / "operator" / "kubetf" / "crd" / "trainingjobs.kubetf.io.yaml"
MANIFESTS = REPO / "manifests"
RELEASE, NAMESPACE = "kubetf", "kubetf-system"

Obj = dict[str, Any]

# Least privilege: exactly these (apiGroup, resource, verb) in every namespace the operator serves.
OPERATOR_PERMISSIONS = {
    *(("kubetf.io", "trainingjobs", verb) for verb in ("get", "list", "watch", "patch", "delete")),
    *(("kubetf.io", "trainingjobs/status", verb) for verb in ("get", "patch", "update")),
    ("kubetf.io", "trainingjobs/finalizers", "update"),
    *(("", "pods", verb) for verb in ("get", "list", "watch", "create", "delete")),
    ("", "pods", "patch"),  # Kueue's pod-integration finalizer off a deleted pod that runs nothing (docs/kueue.md)
    ("", "pods/log", "get"),  # TensorFlow's "SIGTERM caught at" line: the program ignores the SIGTERM
    *(("", "services", verb) for verb in ("get", "list", "create")),
    *(("", "persistentvolumeclaims", verb) for verb in ("get", "list", "create")),
    ("", "events", "create"),  # the operator's own (kopf posts none: it would write outside the lease)
    # Kueue: LocalQueues watched; a job's Workload made, watched and written (never deleted: the garbage collector
    # takes it with its job); a queued job's place read from the visibility API
    *(("kueue.x-k8s.io", "localqueues", verb) for verb in ("get", "list", "watch")),
    *(("kueue.x-k8s.io", "workloads", verb) for verb in ("get", "list", "watch", "create", "patch")),
    ("kueue.x-k8s.io", "workloads/status", "patch"),
    # A gang's PodGroups: made, watched, an older generation's deleted (kubetf.core.gang); Kubernetes' Workload of the
    # job: made (read when its name is taken), never deleted
    *(
        (group, "podgroups", verb)
        for group in ("scheduling.k8s.io", "scheduling.volcano.sh")
        for verb in ("get", "list", "watch", "create", "delete")
    ),
    *(("scheduling.k8s.io", "workloads", verb) for verb in ("get", "list", "watch", "create")),
    ("visibility.kueue.x-k8s.io", "localqueues/pendingworkloads", "get"),
}
CLUSTER_QUEUES = {("visibility.kueue.x-k8s.io", "clusterqueues/pendingworkloads", "get")}  # cluster-wide only
# kopf's own, cluster-wide: it watches CRDs, and with explicit namespaces also Namespace objects.
KOPF_CRDS = {("apiextensions.k8s.io", "customresourcedefinitions", verb) for verb in ("list", "watch")}
KOPF_NAMESPACES = {("", "namespaces", verb) for verb in ("list", "watch")}
NODES = {("", "nodes", "get")}  # one node at a time: has a lost node's pod to be force-deleted?
# Cluster-scoped, one at a time: a new Workload's priority class, an admission's ResourceFlavors.
KUEUE_CLASSES = {
    ("kueue.x-k8s.io", "workloadpriorityclasses", "get"),
    ("kueue.x-k8s.io", "resourceflavors", "get"),
    ("scheduling.k8s.io", "priorityclasses", "get"),
}
# What the chart lets Kueue's controller do with TrainingJobs (an external framework of Kueue's); on a MultiKueue
# manager (kueue.multiKueue) also write their status.
KUEUE_READS_JOBS = {("kubetf.io", "trainingjobs", verb) for verb in ("get", "list", "watch")}
MULTIKUEUE_WRITES_STATUS = {("kubetf.io", "trainingjobs/status", verb) for verb in ("get", "patch", "update")}
TOKEN_REVIEWS = {("authentication.k8s.io", "tokenreviews", "create")}  # which pod sent a progress report
LEASE = {("coordination.k8s.io", "leases", verb) for verb in ("create", "get", "update")}
LEASE_ROLE = "kubetf-operator-leader-election"

FORBIDDEN_RESOURCES = {"secrets", "pods/exec", "pods/attach", "pods/portforward", "pods/proxy", "nodes/proxy"}
FORBIDDEN_VERBS = {"escalate", "bind", "impersonate", "deletecollection"}


# ---------------------------------------------------------------------- helpers


def find_helm() -> str | None:
    if os.environ.get("HELM"):
        return os.environ["HELM"]
    on_path = shutil.which("helm")
    if on_path:
        return on_path
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kubetf"
    for pattern in ("*/helm", "*/bin/helm"):
        for candidate in sorted(glob.glob(str(cache / pattern))):
            if os.access(candidate, os.X_OK):
                return candidate
    return None


@pytest.fixture(scope="module")
def helm() -> str:
    found = find_helm()
    if found is None:
        pytest.fail(
            "helm not found (needed to test the chart): set HELM=/path/to/helm, put helm on PATH, "
            "or install it with tests/cluster/local-cluster.sh (it goes under ~/.cache/kubetf/)"
        )
    return found


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=60, check=False)


def template(helm: str, *args: str) -> list[Obj]:
    result = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def load_dir(directory: Path) -> list[Obj]:
    objects: list[Obj] = []
    for path in sorted(directory.glob("*.yaml")):
        objects.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return objects


def installed_by_kubectl() -> list[Obj]:
    return load_dir(MANIFESTS / "rbac") + load_dir(MANIFESTS / "operator")


def key(obj: Obj) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def by_kind(objects: Iterable[Obj], kind: str) -> list[Obj]:
    return [obj for obj in objects if obj["kind"] == kind]


def one(objects: Iterable[Obj], kind: str) -> Obj:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {[key(o) for o in found]}"
    return found[0]


def permissions(role: Obj) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role.get("rules") or []
        for group in rule.get("apiGroups") or []
        for resource in rule.get("resources") or []
        for verb in rule.get("verbs") or []
    }


def schema() -> Obj:
    loaded: Obj = json.loads((CHART / "values.schema.json").read_text())
    return loaded


def default_values() -> Obj:
    loaded: Obj = yaml.safe_load((CHART / "values.yaml").read_text())
    return loaded


# ---------------------------------------------------------------------- chart files


def test_chart_crd_is_identical_to_the_source_crd() -> None:
    chart_crd = CHART / "crds" / SOURCE_CRD.name
    assert chart_crd.read_bytes() == SOURCE_CRD.read_bytes(), (
        f"{chart_crd.relative_to(REPO)} differs from {SOURCE_CRD.relative_to(REPO)}: run `make manifests`"
    )
    assert [p.name for p in (CHART / "crds").iterdir()] == [SOURCE_CRD.name]


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "kubetf"
    assert chart["version"] == "0.1.0"
    assert chart["appVersion"] == "0.1.0"


def test_default_values_satisfy_the_schema() -> None:
    jsonschema.Draft7Validator.check_schema(schema())
    jsonschema.Draft7Validator(schema()).validate(default_values())


@pytest.mark.parametrize(
    "change",
    [
        {"bogus": 1},
        {"image": {"repository": "kubetf/operator", "pullPolicy": "IfNotPresent", "bogus": 1}},
        {"metrics": {"enabled": True, "port": 9090, "servce": {}}},
        {"image": {"repository": "kubetf/operator", "pullPolicy": "IfNotPresent", "tag": "latest"}},
        {"watchNamespaces": ["Team_A"]},
        {"logFormat": "xml"},
        {"leaderElection": {"leaseDuration": 0}},
        {"leaderElection": {"retryPeriod": "0.0"}},
        {"progress": {"writeSeconds": "soon"}},
        {"leaderElection": {"leaseDuration": 8, "renewDeadlne": 5}},
        {"resources": {"limits": {"memory": "lots"}}},
    ],
)
def test_schema_rejects_bad_values(change: Obj) -> None:
    values = {**default_values(), **change}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema()).validate(values)


def test_helm_lint_passes(helm: str) -> None:
    result = run_helm(helm, "lint", "--strict", str(CHART))
    assert result.returncode == 0, result.stdout + result.stderr
    namespaced = run_helm(helm, "lint", "--strict", str(CHART), "--set", "watchNamespaces={team-a,team-b}")
    assert namespaced.returncode == 0, namespaced.stdout + namespaced.stderr


def test_helm_rejects_an_unknown_value(helm: str) -> None:
    result = run_helm(helm, "lint", str(CHART), "--set", "image.bogus=1")
    assert result.returncode != 0
    assert "bogus" in result.stdout + result.stderr


# ---------------------------------------------------------------------- plain-kubectl install path


def test_manifests_equal_the_default_render(helm: str) -> None:
    rendered = sorted(template(helm), key=key)
    committed = sorted((o for o in installed_by_kubectl() if o["kind"] != "Namespace"), key=key)
    assert [key(o) for o in committed] == [key(o) for o in rendered], "run helm/render-manifests.sh"
    for mine, theirs in zip(committed, rendered, strict=True):
        assert mine == theirs, f"{key(mine)} differs from the chart's default render: run helm/render-manifests.sh"


def test_manifests_namespace_enforces_restricted() -> None:
    namespace = one(load_dir(MANIFESTS / "operator"), "Namespace")
    assert namespace["metadata"]["name"] == NAMESPACE
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    # kubectl applies a directory in file name order: the namespace comes first.
    first = sorted((MANIFESTS / "operator").glob("*.yaml"))[0]
    assert [d["kind"] for d in yaml.safe_load_all(first.read_text()) if d] == ["Namespace"]
    cluster_scoped = (
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    )
    namespaced = [o for o in installed_by_kubectl() if o["kind"] not in cluster_scoped]
    assert namespaced and all(o["metadata"]["namespace"] == NAMESPACE for o in namespaced)


# ---------------------------------------------------------------------- RBAC


def operator_and_kueue(objects: Iterable[Obj]) -> tuple[Obj, Obj]:
    """The operator's ClusterRole, and the one that lets Kueue read TrainingJobs."""
    roles = {r["metadata"]["name"]: r for r in by_kind(objects, "ClusterRole")}
    assert set(roles) == {"kubetf-operator", "kubetf-operator-kueue"}, set(roles)
    return roles["kubetf-operator"], roles["kubetf-operator-kueue"]


def assert_least_privilege(roles: Iterable[Obj]) -> None:
    for role in roles:
        for rule in role.get("rules") or []:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in (rule.get(field) or []), f"{key(role)}: wildcard in {field}: {rule}"
            assert not rule.get("nonResourceURLs"), f"{key(role)}: nonResourceURLs: {rule}"
            assert not rule.get("resourceNames") or rule["resources"], rule
        granted = permissions(role)
        assert not {p for p in granted if p[1] in FORBIDDEN_RESOURCES}, f"{key(role)}: {granted}"
        assert not {p for p in granted if p[2] in FORBIDDEN_VERBS}, f"{key(role)}: {granted}"


def test_clusterwide_rbac_is_exactly_what_the_operator_uses() -> None:
    objects = installed_by_kubectl()
    role, kueue_role = operator_and_kueue(objects)
    assert (
        permissions(role) == OPERATOR_PERMISSIONS | CLUSTER_QUEUES | KOPF_CRDS | NODES | TOKEN_REVIEWS | KUEUE_CLASSES
    )
    assert permissions(kueue_role) == KUEUE_READS_JOBS
    kueue_binding = next(
        b for b in by_kind(objects, "ClusterRoleBinding") if b["roleRef"]["name"] == "kubetf-operator-kueue"
    )
    assert kueue_binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "kueue-controller-manager", "namespace": "kueue-system"}
    ]
    # Namespaced: only the leader election's Lease, in the operator's own namespace, and only that one by name.
    (lease_role,) = by_kind(objects, "Role")
    assert (lease_role["metadata"]["name"], lease_role["metadata"]["namespace"]) == (LEASE_ROLE, NAMESPACE)
    assert permissions(lease_role) == LEASE
    assert all(
        rule.get("resourceNames") == ["kubetf-operator"] for rule in lease_role["rules"] if "get" in rule["verbs"]
    )
    (lease_binding,) = by_kind(objects, "RoleBinding")
    assert lease_binding["roleRef"]["name"] == LEASE_ROLE
    assert_least_privilege([role, lease_role, kueue_role])
    binding = next(b for b in by_kind(objects, "ClusterRoleBinding") if b["roleRef"]["name"] == "kubetf-operator")
    account = one(objects, "ServiceAccount")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}
    ]
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]


def test_namespaced_watching_gets_roles_and_flags(helm: str) -> None:
    objects = template(helm, "--set", "watchNamespaces={team-a,team-b}")
    roles = [r for r in by_kind(objects, "Role") if r["metadata"]["name"] != LEASE_ROLE]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert permissions(role) == OPERATOR_PERMISSIONS
    bindings = [b for b in by_kind(objects, "RoleBinding") if b["metadata"]["name"] != LEASE_ROLE]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"][0]["namespace"] == NAMESPACE
    # Cluster-wide only what kopf needs for itself and a node read: nothing on TrainingJobs or pods.
    cluster_role, _ = operator_and_kueue(objects)
    assert permissions(cluster_role) == KOPF_CRDS | KOPF_NAMESPACES | NODES | TOKEN_REVIEWS | KUEUE_CLASSES
    assert_least_privilege([*roles, cluster_role])
    args = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    pairs = [args[i + 1] for i, arg in enumerate(args) if arg == "--namespace"]
    assert pairs == ["team-a", "team-b"]


def test_rbac_can_be_left_out(helm: str) -> None:
    objects = template(helm, "--set", "rbac.create=false", "--set", "serviceAccount.create=false")
    assert {o["kind"] for o in objects} == {
        "Deployment",
        "NetworkPolicy",
        "Service",  # the progress endpoint's
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    assert one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "default"


# ---------------------------------------------------------------------- the operator's Deployment


def restricted_violations(pod: Obj) -> list[str]:
    """The checks of the Pod Security Standard `restricted` (v1.30+ profile) that a pod spec can fail."""
    problems = []
    pod_context = pod.get("securityContext") or {}
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            problems.append(f"{flag} is set")
    allowed_volumes = {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= allowed_volumes:
            problems.append(f"volume {volume['name']}: {kinds - allowed_volumes}")
    for sysctl in pod_context.get("sysctls") or []:
        problems.append(f"sysctl {sysctl}")
    containers = [*(pod.get("initContainers") or []), *pod["containers"], *(pod.get("ephemeralContainers") or [])]
    for container in containers:
        name = container["name"]
        ctx = container.get("securityContext") or {}
        if ctx.get("privileged"):
            problems.append(f"{name}: privileged")
        if ctx.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation must be false")
        caps = ctx.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            problems.append(f"{name}: capabilities must drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: adds capabilities {caps['add']}")
        if ctx.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is not True:
            problems.append(f"{name}: runAsNonRoot must be true")
        if ctx.get("runAsUser", pod_context.get("runAsUser")) == 0:
            problems.append(f"{name}: runAsUser 0")
        seccomp = (ctx.get("seccompProfile") or pod_context.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile must be RuntimeDefault or Localhost, not {seccomp}")
        if ctx.get("procMount") not in (None, "Default"):
            problems.append(f"{name}: procMount")
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                problems.append(f"{name}: hostPort {port['hostPort']}")
    return problems


def test_restricted_check_catches_a_root_pod() -> None:
    pod = {"containers": [{"name": "c", "securityContext": {"privileged": True}}], "hostNetwork": True}
    assert len(restricted_violations(pod)) >= 5


def test_operator_pod_passes_the_restricted_pod_security_standard() -> None:
    pod = one(installed_by_kubectl(), "Deployment")["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    assert pod["securityContext"]["runAsUser"] == 1000
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["runAsUser"] == 1000


def test_operator_deployment() -> None:
    deployment = one(installed_by_kubectl(), "Deployment")
    assert deployment["metadata"]["namespace"] == NAMESPACE
    # An active operator and a standby (leader election), rolled over without a gap, on different nodes.
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    anti = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    term = anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    pod = deployment["spec"]["template"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    assert container["image"] == "kubetf/operator:0.1.0"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["args"] == [
        "operator",
        "--log-format",
        "json",
        "--liveness-port",
        "8080",
        "--metrics-port",
        "9090",
        "--lease-name",
        "kubetf-operator",
        "--lease-duration",
        "8",
        "--renew-deadline",
        "5",
        "--retry-period",
        "1",
        "--progress-port",
        "8090",
        "--progress-url",
        "http://kubetf-progress.kubetf-system.svc:8090/v1/progress",
        "--progress-write-seconds",
        "30",
        "--progress-stall-seconds",
        "600",
    ]
    probe = container["livenessProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert probe["path"] == "/healthz" and ports[probe["port"]] == 8080
    readiness = container["readinessProbe"]["httpGet"]  # a rolling upgrade waits until a new pod can take over
    assert readiness["path"] == "/readyz" and ports[readiness["port"]] == 8080
    assert ports["metrics"] == 9090 and ports["progress"] == 8090
    assert container["resources"]["limits"]["memory"] == "512Mi"  # a restart's relisting peak, not the steady state
    assert container["resources"]["requests"]["memory"]
    # The operator's pod must not look like one of the operator's children.
    assert pod["metadata"]["labels"].get("app.kubernetes.io/managed-by") != "kubetf"
    assert "kubetf.io/job-name" not in pod["metadata"]["labels"]


def test_image_tag_defaults_to_app_version_and_can_be_set(helm: str) -> None:
    (default,) = by_kind(template(helm), "Deployment")
    assert default["spec"]["template"]["spec"]["containers"][0]["image"] == "kubetf/operator:0.1.0"
    (custom,) = by_kind(template(helm, "--set", "image.tag=0.2.0-dev", "--set", "image.repository=r/op"), "Deployment")
    assert custom["spec"]["template"]["spec"]["containers"][0]["image"] == "r/op:0.2.0-dev"


def test_leader_election_timings_are_values(helm: str) -> None:
    (deployment,) = by_kind(
        template(helm, "--set", "leaderElection.leaseDuration=3", "--set", "leaderElection.renewDeadline=2.5",
                 "--set", "leaderElection.retryPeriod=0.5"),
        "Deployment",
    )  # fmt: skip
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    given = {flag: args[args.index(flag) + 1] for flag in ("--lease-duration", "--renew-deadline", "--retry-period")}
    assert given == {"--lease-duration": "3", "--renew-deadline": "2.5", "--retry-period": "0.5"}


def test_metrics_service_is_opt_in(helm: str) -> None:
    assert not [s for s in by_kind(template(helm), "Service") if s["metadata"]["name"] != "kubetf-progress"]
    objects = template(helm, "--set", "metrics.enabled=true")
    service = next(s for s in by_kind(objects, "Service") if s["metadata"]["name"] == "kubetf-metrics")
    deployment = one(objects, "Deployment")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}]


def test_notes_tell_how_to_submit_the_sample(helm: str) -> None:
    result = run_helm(helm, "install", "--dry-run=client", RELEASE, str(CHART), "--namespace", NAMESPACE)
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "manifests/samples/mnist-mwms.yaml" in notes
    assert "kubectl get tj" in notes
    assert (REPO / "manifests" / "samples" / "mnist-mwms.yaml").exists()


# ---------------------------------------------------------------------- the operator image


def test_operator_dockerfile_matches_the_chart() -> None:
    dockerfile = (REPO / "operator" / "Dockerfile").read_text()
    lines = [line.strip() for line in dockerfile.splitlines() if line.strip() and not line.startswith("#")]
    assert lines[0].startswith("ARG BASE_IMAGE=")
    assert "trainer" not in dockerfile.replace("no trainer extra", ""), "the operator image must not get TensorFlow"
    (user,) = [line.split()[1] for line in lines if line.startswith("USER ")]
    pod = one(installed_by_kubectl(), "Deployment")["spec"]["template"]["spec"]
    assert user == f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}"
    (entrypoint,) = [line for line in lines if line.startswith("ENTRYPOINT ")]
    assert json.loads(entrypoint.removeprefix("ENTRYPOINT "))[-1] == "kubetf"  # the chart passes only args
    assert json.loads(next(line for line in lines if line.startswith("CMD ")).removeprefix("CMD ")) == ["operator"]
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".git", ".venv"} <= set(ignored)


def test_progress_reports_have_a_service_token_reviews_and_can_be_turned_off(helm: str) -> None:
    objects = template(helm)
    service = next(s for s in by_kind(objects, "Service") if s["metadata"]["name"] == "kubetf-progress")
    deployment = one(objects, "Deployment")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [{"name": "progress", "port": 8090, "targetPort": "progress", "protocol": "TCP"}]
    off = template(helm, "--set", "progress.enabled=false")
    assert not by_kind(off, "Service")
    (container,) = one(off, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["args"][-2:] == ["--progress-port", "0"] and "--progress-url" not in container["args"]
    assert not TOKEN_REVIEWS & permissions(operator_and_kueue(off)[0])


def test_a_network_policy_lets_only_training_pods_reach_the_progress_port_and_nothing_else_in(helm: str) -> None:
    objects = template(helm)
    policy = one(objects, "NetworkPolicy")
    deployment = one(objects, "Deployment")
    assert policy["spec"]["podSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (progress,) = policy["spec"]["ingress"]  # no rule for /metrics or /healthz: only the node's kubelet probes it
    assert progress["ports"] == [{"port": "progress", "protocol": "TCP"}]
    assert progress["from"] == [
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/managed-by": "kubetf"}}}
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {p["name"] for p in container["ports"]} == {"healthz", "metrics", "progress"}
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    scraped = template(helm, "--set-json", f"networkPolicy.metricsFrom=[{json.dumps(monitoring)}]")
    rules = one(scraped, "NetworkPolicy")["spec"]["ingress"]
    assert {"from": [monitoring], "ports": [{"port": "metrics", "protocol": "TCP"}]} in rules
    quiet = template(helm, "--set", "progress.enabled=false")
    assert one(quiet, "NetworkPolicy")["spec"]["ingress"] == []  # nothing may come in
    assert not by_kind(template(helm, "--set", "networkPolicy.enabled=false"), "NetworkPolicy")


def test_kueues_access_to_training_jobs_can_be_left_out_or_given_to_another_account(helm: str) -> None:
    without = template(helm, "--set", "kueue.rbac=false")
    assert [r["metadata"]["name"] for r in by_kind(without, "ClusterRole")] == ["kubetf-operator"]
    other = template(helm, "--set", "kueue.serviceAccount.name=kueue", "--set", "kueue.serviceAccount.namespace=queues")
    binding = next(b for b in by_kind(other, "ClusterRoleBinding") if b["roleRef"]["name"] == "kubetf-operator-kueue")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kueue", "namespace": "queues"}]


# ---------------------------------------------------------------------- the admission policies (queue-name-policy.yaml)


def admit(operation: str, job: Obj, old: Obj | None = None) -> list[str]:
    """What the shipped ValidatingAdmissionPolicies answer to a TrainingJob write: the messages of the validations
    that refuse it, their CEL evaluated as the API server does (variables first, then each validation)."""
    import celpy

    env = celpy.Environment()

    def evaluate(expression: str, activation: dict[str, Any]) -> Any:
        result = env.program(env.compile(expression)).evaluate(activation)
        assert not isinstance(result, celpy.CELEvalError), f"{expression}: {result}"
        return result

    refusals = []
    for policy in by_kind(load_dir(MANIFESTS / "operator"), "ValidatingAdmissionPolicy"):
        rule = policy["spec"]["matchConstraints"]["resourceRules"][0]
        assert (rule["apiGroups"], rule["resources"], operation in rule["operations"]) == (
            ["kubetf.io"], ["trainingjobs"], True
        )  # fmt: skip
        activation: dict[str, Any] = {
            "object": celpy.json_to_cel(job),
            "oldObject": celpy.json_to_cel(old),
            "request": celpy.json_to_cel({"operation": operation}),
        }
        variables: dict[str, Any] = {}
        for variable in policy["spec"].get("variables") or []:
            variables[variable["name"]] = evaluate(variable["expression"], {**activation, "variables": variables})
        activation["variables"] = celpy.celtypes.MapType(
            {celpy.celtypes.StringType(k): v for k, v in variables.items()}
        )
        for validation in policy["spec"]["validations"]:
            if not evaluate(validation["expression"], activation):
                message = validation.get("message")
                if "messageExpression" in validation:
                    message = str(evaluate(validation["messageExpression"], activation))
                refusals.append(message)
    return refusals


def training_job(queue: str | None = None, phase: str | None = None, **spec: Any) -> Obj:
    template = {"spec": {"containers": [{"name": "tensorflow", "image": "kubetf/trainer:0.1.0"}]}}
    job: Obj = {
        "apiVersion": "kubetf.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "mnist", "namespace": "team-a", "labels": {"team": "vision"}},
        "spec": {"replicaSpecs": {"worker": {"replicas": 2, "template": template}}, **spec},
    }
    if queue is not None:
        job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = queue
    if phase is not None:
        job["status"] = {"phase": phase}
    return job


@pytest.mark.parametrize("phase", ["Pending", "Running", "Restarting"])
def test_the_queue_label_cannot_be_added_removed_or_changed_while_the_job_runs(phase: str) -> None:
    what = "the queue label cannot be {} while the job is " + phase
    for old, new, verb in ((None, "team-a", "added"), ("team-a", None, "removed"), ("team-a", "team-b", "changed")):
        (refusal,) = admit("UPDATE", training_job(new, phase), training_job(old, phase))
        assert refusal.startswith(f"metadata.labels[kueue.x-k8s.io/queue-name]: {what.format(verb)}"), refusal
        assert "suspend the job first (spec.runPolicy.suspend: true)" in refusal and "wait until it ends" in refusal
    running = training_job("team-a", phase)
    changed = training_job("team-a", phase)
    changed["metadata"]["labels"]["team"] = "speech"  # another label, a finalizer, the spec: not the queue's
    changed["metadata"]["finalizers"] = ["kopf.zalando.org/KopfFinalizerMarker"]
    assert admit("UPDATE", changed, running) == []


@pytest.mark.parametrize("phase", [None, "Queued", "Suspended", "Succeeded", "Failed"])
def test_a_job_that_does_not_run_may_change_its_queue(phase: str | None) -> None:
    for old, new in ((None, "team-a"), ("team-a", None), ("team-a", "team-b")):
        assert admit("UPDATE", training_job(new, phase), training_job(old, phase)) == []


def test_a_multikueue_job_needs_a_queue_and_may_gain_one_that_it_lacked() -> None:
    multikueue = "kueue.x-k8s.io/multikueue"
    refusal = (
        "spec.managedBy: kueue.x-k8s.io/multikueue needs the label kueue.x-k8s.io/queue-name, or nothing ever "
        "dispatches the job: add the label, naming a LocalQueue whose ClusterQueue has a MultiKueue admission check, "
        "or remove spec.managedBy to run the job on this cluster"
    )
    assert admit("CREATE", training_job(managedBy=multikueue)) == [refusal]
    assert admit("CREATE", training_job("team-a", managedBy=multikueue)) == []
    assert admit("CREATE", training_job(managedBy="kubetf.io/operator")) == []
    queued = training_job("team-a", None, managedBy=multikueue)
    assert admit("UPDATE", training_job(None, None, managedBy=multikueue), queued) == [refusal]
    # One made before the policy, waiting NotDispatched: it may still be deleted (its finalizer go), and be queued.
    lost = training_job(None, "Pending", managedBy=multikueue)
    assert admit("UPDATE", {**lost, "metadata": {**lost["metadata"], "finalizers": []}}, lost) == []
    assert admit("UPDATE", training_job("team-a", "Pending", managedBy=multikueue), lost) == []


@pytest.mark.parametrize(
    "job",
    [
        training_job("Team_A"),
        training_job(managedBy="kueue.x-k8s.io/multikueue"),
        training_job("team-a", managedBy="kueue.x-k8s.io/multikueue"),
        training_job("team-a"),
    ],
    ids=["bad label", "multikueue without a queue", "multikueue queued", "queued"],
)
def test_kubetf_validate_refuses_what_the_policies_refuse_at_create_time(job: Obj) -> None:
    from kubetf.core import api

    refused = [message.split(": ", 1)[0] for message in admit("CREATE", job)]
    assert [p.path for p in api.validate(job)] == refused


def test_kueue_writes_a_jobs_status_only_on_a_multikueue_manager(helm: str) -> None:
    def kueue_role(*values: str) -> Obj:
        return next(
            r for r in by_kind(template(helm, *values), "ClusterRole") if r["metadata"]["name"].endswith("-kueue")
        )

    assert permissions(kueue_role()) == KUEUE_READS_JOBS
    assert permissions(kueue_role("--set", "kueue.multiKueue=true")) == KUEUE_READS_JOBS | MULTIKUEUE_WRITES_STATUS
