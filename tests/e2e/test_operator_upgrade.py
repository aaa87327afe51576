"""The installed operator: `helm upgrade` from the previous chart (one replica, Recreate) to two replicas with
leader election, and another replica that takes over when the leader's pod is killed."""

import subprocess
import time

import pytest
from kubernetes import client

from kubetf.core import api
from tests.cluster.fixture import wait_for
from tests.integration.conftest import replica

from .conftest import CHART_VALUES, OPERATOR_NAMESPACE, RELEASE, ROOT, helm

pytestmark = pytest.mark.serial  # the installed operator is replaced: other e2e tests would lose it meanwhile

PREVIOUS_CHART = "b388956"  # the last commit whose chart ran one replica without leader election
LEASE = "kubetf-operator"
SPEC = {"strategy": "MultiWorkerMirrored", "replicaSpecs": {"chief": replica(1), "worker": replica(1)}}


def operator_pods(cluster) -> list:
    return [p for p in all_operator_pods(cluster) if not p.metadata.deletion_timestamp and p.status.phase == "Running"]


def all_operator_pods(cluster) -> list:
    return cluster.core.list_namespaced_pod(OPERATOR_NAMESPACE, label_selector="app.kubernetes.io/name=kubetf").items


def holder(cluster) -> str:
    lease = client.CoordinationV1Api(cluster.api_client).read_namespaced_lease(LEASE, OPERATOR_NAMESPACE)
    return lease.spec.holder_identity or ""


def test_helm_upgrade_from_the_previous_chart_then_another_replica_takes_over(installed, namespace, tmp_path):
    cluster = installed
    previous = tmp_path / "previous"
    previous.mkdir()
    archive = subprocess.run(
        ["git", "archive", PREVIOUS_CHART, "helm/kubetf"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(previous)], input=archive, check=True)
    helm("uninstall", RELEASE, "--namespace", OPERATOR_NAMESPACE, "--wait")
    try:
        # The CRD stays the current one (helm never upgrades a CRD; users apply it first, as `make install` does):
        # the old chart's copy would only conflict with it.
        helm("install", RELEASE, str(previous / "helm" / "kubetf"), "--namespace", OPERATOR_NAMESPACE, "--wait",
             "--skip-crds")  # fmt: skip
    finally:  # whatever happened, the tests after this one get the current chart
        helm("upgrade", "--install", RELEASE, "helm/kubetf", "--namespace", OPERATOR_NAMESPACE, "--wait",
             "--timeout", "5m", *CHART_VALUES)  # fmt: skip

    deployment = client.AppsV1Api(cluster.api_client).read_namespaced_deployment(
        f"{RELEASE}-operator", OPERATOR_NAMESPACE
    )
    assert deployment.spec.strategy.type == "RollingUpdate"
    assert deployment.status.ready_replicas == 2
    pods = wait_for(lambda: len(p := operator_pods(cluster)) == 2 and p, 60, "two operator pods")
    names = {p.metadata.name for p in pods}
    leader = wait_for(
        lambda: next((n for n in names if holder(cluster).startswith(f"{n}_")), None), 30, "one of them to lead"
    )
    cluster.create_job(namespace, "first", SPEC)
    cluster.wait_pods(namespace, "first", lambda p: len(p) == 2, "the upgraded operator to create the pods", 30)

    # Killed as a node's kubelet kills it, 1 s after SIGTERM. The ReplicaSet starts a replacement at once, which reads
    # the dying leader's last renewals as the standby does: whichever of the two asks first once the lease expires
    # takes it (client-go's protocol promises a leader, not which one). Seen: the replacement won twice in four runs.
    cluster.core.delete_namespaced_pod(leader, OPERATOR_NAMESPACE, grace_period_seconds=1)
    killed = time.monotonic()
    successor = wait_for(
        lambda: (h := holder(cluster)) and not h.startswith(f"{leader}_") and h.rsplit("_", 1)[0],
        30,
        f"another replica than {leader} to take the lease",
    )
    takeover = time.monotonic() - killed
    role = "the standby" if successor in names else "the new replica"
    print(f"\n{role} {successor} took over {takeover:.1f}s after the leader's pod was killed (make bench measures it)")
    cluster.create_job(namespace, "second", SPEC)
    cluster.wait_pods(namespace, "second", lambda p: len(p) == 2, "the new leader to create the pods", 30)
    assert cluster.status(namespace, "first")["restarts"]["total"] == 0
    assert all(p["metadata"]["labels"][api.LABEL_ATTEMPT] == "0" for p in cluster.pods(namespace, "first").values())
