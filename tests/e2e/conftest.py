"""e2e tier: the operator installed with helm, real TensorFlow in real pods on the local node.

Once per run (tests/cluster/session.py, whatever the number of xdist workers) the images are built and loaded
(`make images`; skipped when KUBETF_IMAGES_BUILT=1 says the Makefile just did it) and the chart is installed into a
namespace that enforces the `restricted` Pod Security Standard. It stays installed, as `make demo` leaves it;
test_uninstall.py (marked serial: `make test` runs it after the rest) uninstalls it and checks what is left.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from kubetf.cli import jobctl
from tests.cluster.fixture import wait_for
from tests.cluster.session import once
from tests.integration.conftest import Cluster

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_NAMESPACE = "kubetf-system"
RELEASE = "kubetf"
# The chart's defaults but one: progress written every 5 s, not 30, as the tests' jobs train for a minute and their
# ETA must be seen to fall.
# Progress written every 5 s (several times in a short run); a stall judged after 60 s (a test hangs a program).
# And everything the chart ships for monitoring turned on, as a platform team would (tests/e2e/test_monitoring.py):
# the scrape annotations, the dashboard's ConfigMap, the ServiceMonitor and the PrometheusRule (their CRDs first).
MONITORING_VALUES = (
    "--set", "metrics.scrapeAnnotations=true,metrics.dashboard.enabled=true",
    "--set", "metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true",
)  # fmt: skip
CHART_VALUES = ("--set", "progress.writeSeconds=5", "--set", "progress.stallSeconds=60", *MONITORING_VALUES)


TROUBLE = re.compile(r'"severity": "(warning|error|critical)"|leader|lease', re.I)


def pytest_collection_modifyitems(items):
    for item in items:
        if "/tests/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report carries the installed operators' log lines about its namespace and the end of its pods'
    logs: CI prints only the report, and the cluster, with the pods' logs, is gone after it."""
    report = yield
    fixtures = getattr(item, "funcargs", {})
    cluster, namespace = fixtures.get("installed"), fixtures.get("namespace")
    if report.failed and isinstance(cluster, Cluster) and isinstance(namespace, str):
        with contextlib.suppress(Exception):  # the report is what matters; its extra section is best effort
            for pod in cluster.core.list_namespaced_pod(OPERATOR_NAMESPACE).items:
                lines = cluster.core.read_namespaced_pod_log(pod.metadata.name, OPERATOR_NAMESPACE).splitlines()
                about = [line for line in lines if namespace in line][-100:]
                if about:
                    report.sections.append((f"operator {pod.metadata.name} log about {namespace}", "\n".join(about)))
                # What stops every job's reconciles at once: a lease lost or won, a warning, an error.
                troubles = [line for line in lines if TROUBLE.search(line) and namespace not in line][-30:]
                if troubles:
                    title = f"operator {pod.metadata.name} leadership, warnings, errors"
                    report.sections.append((title, "\n".join(troubles)))
            for pod in cluster.core.list_namespaced_pod(namespace).items:  # what the training programs saw
                log = cluster.core.read_namespaced_pod_log(pod.metadata.name, namespace, tail_lines=40) or ""
                report.sections.append((f"pod {pod.metadata.name} log (last 40 lines)", log))
    return report


def run(*args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False)
    if check and result.returncode != 0:
        pytest.fail(f"`{' '.join(args)}` exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def tool(name: str) -> str:
    path = shutil.which(name, path=f"{Path.home()}/.cache/kubetf/bin:{os.environ.get('PATH', '')}")
    if not path:
        pytest.fail(f"{name} not found: `tests/cluster/local-cluster.sh up` installs it under ~/.cache/kubetf/bin")
    return path


@pytest.fixture(scope="session")
def e2e_cluster(kube_cluster) -> Cluster:
    cluster = Cluster(kube_cluster.kubeconfig)
    env_kubeconfig = os.environ.setdefault("KUBECONFIG", kube_cluster.kubeconfig)
    assert env_kubeconfig
    return cluster


@pytest.fixture(scope="session")
def images(e2e_cluster, request):
    with once(request.config, "images") as first:
        if first and os.environ.get("KUBETF_IMAGES_BUILT") != "1":
            run("make", "images", timeout=2400)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run(tool("helm"), *args, check=check)


@pytest.fixture(scope="session")
def installed(e2e_cluster, images, request) -> Cluster:
    """The chart installed as a user would, into a namespace enforcing the restricted Pod Security Standard."""
    with once(request.config, "chart") as first:
        if first:
            install_chart(e2e_cluster)
    return e2e_cluster


def install_chart(e2e_cluster: Cluster) -> None:
    labels = {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }
    try:
        e2e_cluster.core.create_namespace({"metadata": {"name": OPERATOR_NAMESPACE, "labels": labels}})
    except ApiException as error:
        if error.status != 409:
            raise
        e2e_cluster.core.patch_namespace(OPERATOR_NAMESPACE, {"metadata": {"labels": labels}})
    # As `make install` does: helm never upgrades a CRD it finds (the integration tier may have put an older one
    # there), so the CRD goes first, applied server-side over whoever wrote it before.
    run(tool("kubectl"), "apply", "--server-side", "--force-conflicts", "-f", "manifests/crd/")
    monitoring_crds = run("tests/monitoring/prometheus-operator-crds.sh").stdout.strip()
    run(tool("kubectl"), "apply", "--server-side", "--force-conflicts", "-f", monitoring_crds)
    image = operator_image_id()
    rolls = ("--set-string", f"podAnnotations.kubetf\\.io/image-id={image}") if image else ()
    helm("upgrade", "--install", RELEASE, "helm/kubetf", "--namespace", OPERATOR_NAMESPACE, "--wait", "--timeout", "5m",
         *CHART_VALUES, *rolls)  # fmt: skip


def operator_image_id() -> str | None:
    """The id of the operator image `make images` built, as a pod annotation: an image rebuilt under the same tag then
    rolls the installed operator (on a cluster kept from an earlier run, the chart's Deployment was unchanged and its
    pods went on running the previous code). None without docker (the images come from elsewhere)."""
    docker = shutil.which("docker")
    version = yaml.safe_load((ROOT / "helm" / "kubetf" / "Chart.yaml").read_text())["appVersion"]
    if docker is None:
        return None
    found = run(docker, "image", "inspect", "-f", "{{.Id}}", f"kubetf/operator:{version}", check=False)
    return (found.stdout.strip() or None) if found.returncode == 0 else None


@pytest.fixture(scope="session")
def volcano(kube_cluster, installed, request) -> Cluster:
    """Volcano in the cluster, installed once per run when missing (on the local cluster: built on first use; `make
    test` installs it beside the unit tier) and left installed, as a shared cluster has it; and the installed
    operator sees it."""
    with once(request.config, "volcano") as first:
        if first:
            kube_cluster.install_volcano()
            operator_sees_volcano(installed)
    return installed


def operator_sees_volcano(cluster: Cluster) -> None:
    """Wait until the operator takes a job asking for Volcano: it reads the cluster's APIs (discovery) every 30 s
    at most, and an operator that read them before Volcano was installed refuses such a job until it reads them
    again. A suspended job of one worker (no pods) is asked, a new one after each refusal."""
    name = f"e2e-volcano-{uuid.uuid4().hex[:6]}"
    cluster.core.create_namespace({"metadata": {"name": name}})
    spec = {
        "strategy": "MultiWorkerMirrored",
        "replicaSpecs": {"worker": {"replicas": 1, "template": {"spec": {"containers": [
            {"name": "tensorflow", "image": "kubetf/python-base:bookworm", "command": ["true"]}]}}}},
        "runPolicy": {"suspend": True, "schedulingPolicy": {"gangScheduler": "Volcano"}},
    }  # fmt: skip
    asked = [0]

    def accepted() -> bool:
        job = f"probe-{asked[0]}"
        status = cluster.status(name, job) if asked[0] else {"phase": "Failed"}
        if (status.get("gang") or {}).get("scheduler") == "Volcano":
            return True
        if status.get("phase") == "Failed":  # refused (GangSchedulerUnavailable): ask again
            asked[0] += 1
            cluster.create_job(name, f"probe-{asked[0]}", spec)
        return False

    start = time.monotonic()
    try:
        wait_for(accepted, 120, "the operator to take a job asking for Volcano", interval=1)
    finally:
        delete_namespace(cluster, name)
    print(f"the operator took a Volcano job after {elapsed(start)} ({asked[0]} asked)")


@pytest.fixture
def namespace(installed):
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    installed.core.create_namespace({"metadata": {"name": name}})
    wait_for(lambda: _service_account(installed, name), 30, f"the default ServiceAccount in {name}")
    yield name
    delete_namespace(installed, name)


def delete_namespace(cluster: Cluster, name: str) -> None:
    """Delete a test's namespace and stop its pods at once: a program that swallows SIGTERM (the guide's MWMS loop
    does) went on training through its 120 s grace period, on the cores the next tests needed. Once the namespace is
    terminating no pod can be created in it, so none is recreated meanwhile. Already deleted (a fixture of the test
    deleted it and waited for it to go) is fine."""
    try:
        cluster.core.delete_namespace(name)
        cluster.core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    except ApiException as error:
        if error.status not in (404, 409):
            raise


def _service_account(cluster: Cluster, namespace: str):
    try:
        return cluster.core.read_namespaced_service_account("default", namespace)
    except ApiException:
        return None


def sample(name: str) -> dict:
    """A sample job, its pods asking for 100m of CPU (their limits kept): the tests beside it share the node's 2
    cores, and the samples' requests (up to 500m a pod) left a third job Pending for CPU while two ran."""
    job = yaml.safe_load((ROOT / "manifests" / "samples" / f"{name}.yaml").read_text())
    for spec in job["spec"]["replicaSpecs"].values():
        for container in spec["template"]["spec"]["containers"]:
            container.setdefault("resources", {}).setdefault("requests", {})["cpu"] = "100m"
    return job


def create(cluster: Cluster, namespace: str, job: dict) -> dict:
    return cluster.create_job(namespace, job["metadata"]["name"], job["spec"])


def progress(cluster: Cluster, namespace: str, pod: str) -> list[dict]:
    """The trainer's progress records in a pod's log so far."""
    try:
        # None, not "", for a pod not scheduled yet: the API server answers 204 there, which client 37 reads as None
        text = cluster.core.read_namespaced_pod_log(pod, namespace) or ""
    except ApiException:
        return []
    return [r for r in map(jobctl.progress_line, text.splitlines()) if r]


def wait_progress(cluster: Cluster, namespace: str, pod: str, predicate, what: str, timeout: float = 300) -> list:
    def check():
        records = progress(cluster, namespace, pod)
        return records if predicate(records) else None

    return wait_for(check, timeout, what, interval=1.0)


def wait_epoch(cluster: Cluster, namespace: str, pod: str, epoch: int, what: str, timeout: float = 600) -> list:
    """The pod's progress records once its trainer has finished `epoch` epochs."""
    return wait_progress(
        cluster, namespace, pod, lambda rs: any(r["kubetf"] == "progress" and r["epoch"] >= epoch for r in rs), what,
        timeout,
    )  # fmt: skip


def columns(cluster: Cluster, namespace: str, name: str) -> dict[str, str]:
    """`kubectl get tj NAME`'s columns by header; an empty cell (no ETA yet) is ""."""
    return table_row(cluster.kubectl("get", "tj", name, "-n", namespace).stdout)


def table_row(table: str) -> dict[str, str]:
    """kubectl's table of one object as {header: cell}, cut where the header's columns start (cells may be empty)."""
    header, row = table.splitlines()[:2]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    bounds = zip(starts, [*starts[1:], None], strict=True)
    return {header[a:b].strip(): row[a:b].strip() for a, b in bounds}


def elapsed(start: float) -> str:
    return f"{time.monotonic() - start:.1f}s"
