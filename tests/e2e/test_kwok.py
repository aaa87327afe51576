"""Fake nodes from kwok (tests/cluster/kwok.py) work: they are Ready, only pods that tolerate their taint land on
them and reach Running there, kwok ends such a pod with the exit code asked for, the real node still runs real
containers, and a stopped fake node is lost the way a vanished machine is (the real node lifecycle controller
marks it NotReady and taint eviction deletes its pods, which then stay Terminating).

On the local cluster the fake nodes are added when missing (`local-cluster.sh fake-nodes 4`, which builds kwok on
first use); another cluster must have them already.
"""

from __future__ import annotations

import ipaddress
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from tests.cluster import kwok
from tests.cluster.fixture import wait_for
from tests.e2e.test_cluster_smoke import assert_succeeded, pod_manifest, run_pod

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("fake-nodes")]  # kwok-node-3 is stopped and started

COUNT = 4
LOST = f"{kwok.FAKE_NODE_PREFIX}{COUNT - 1}"  # the node the node-loss test stops (and starts again)


@pytest.fixture(scope="module")
def core(kube_cluster) -> client.CoreV1Api:
    return client.CoreV1Api(config.new_client_from_config(config_file=kube_cluster.kubeconfig))


@pytest.fixture(scope="module")
def fake_nodes(kube_cluster, core) -> list[str]:
    return kwok.ensure_fake_nodes(kube_cluster.kubeconfig, core, COUNT)


@pytest.fixture(scope="module")
def ns(core, fake_nodes) -> Iterator[str]:
    name = f"kwok-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name}})
    wait_for(lambda: _service_account(core, name), 60, f"the default service account in {name}")
    yield name
    core.delete_namespace(name)


def _service_account(core: client.CoreV1Api, ns: str):
    try:
        return core.read_namespaced_service_account("default", ns)
    except ApiException:
        return None


def fake_pod(name: str, **metadata) -> dict:
    manifest = pod_manifest(name, "raise SystemExit('kwok runs no containers')")
    manifest["metadata"].update(metadata)
    manifest["spec"] = kwok.on_fake_nodes(manifest["spec"])
    return manifest


def _pod(core: client.CoreV1Api, ns: str, name: str) -> client.V1Pod | None:
    try:
        return core.read_namespaced_pod(name, ns)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def _phase(core: client.CoreV1Api, ns: str, name: str, phase: str) -> client.V1Pod | None:
    pod = _pod(core, ns, name)
    return pod if pod and pod.status.phase == phase else None


def _condition(obj, type_: str) -> str | None:
    return next((c.status for c in obj.status.conditions or [] if c.type == type_), None)


def test_fake_nodes_are_ready_tainted_and_selectable(core, fake_nodes):
    nodes = {n.metadata.name: n for n in core.list_node().items}
    for name in fake_nodes:
        node = nodes[name]
        assert _condition(node, "Ready") == "True", node.status.conditions
        assert node.metadata.labels[kwok.FAKE_NODE_KEY] == "fake"
        assert any(t.key == kwok.FAKE_NODE_KEY and t.effect == "NoSchedule" for t in node.spec.taints or [])
        assert parse_quantity(node.status.allocatable["pods"]) >= 1000
        assert parse_quantity(node.status.allocatable["nvidia.com/gpu"]) >= 1
    real = [n for n in nodes.values() if kwok.FAKE_NODE_KEY not in (n.metadata.labels or {})]
    assert real, "no real node"
    for node in real:
        assert _condition(node, "Ready") == "True"
        assert not any(t.key == kwok.FAKE_NODE_KEY for t in node.spec.taints or [])


def test_pod_that_tolerates_the_taint_runs_on_a_fake_node_and_exits_when_asked(core, ns, fake_nodes):
    core.create_namespaced_pod(ns, fake_pod("runs"))
    pod = wait_for(lambda: _phase(core, ns, "runs", "Running"), 60, "pod runs to be Running on a fake node")
    assert pod.spec.node_name.startswith(kwok.FAKE_NODE_PREFIX)  # any fake node: a cluster may have more than four
    assert _condition(pod, "Ready") == "True"
    assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network(kwok.FAKE_POD_NETWORK)

    # a running pod ends when annotated (kwok-stages.yaml pod-exit) ...
    core.patch_namespaced_pod("runs", ns, {"metadata": {"annotations": {kwok.EXIT_CODE: "3"}}})
    pod = wait_for(lambda: _phase(core, ns, "runs", "Failed"), 30, "pod runs to fail with exit code 3")
    assert pod.status.container_statuses[0].state.terminated.exit_code == 3

    # ... or by itself, when its template says so
    core.create_namespaced_pod(ns, fake_pod("finishes", annotations={kwok.EXIT_CODE: "0", kwok.EXIT_AFTER: "2s"}))
    pod = wait_for(lambda: _phase(core, ns, "finishes", "Succeeded"), 60, "pod finishes to succeed")
    terminated = pod.status.container_statuses[0].state.terminated
    assert terminated.exit_code == 0 and terminated.reason == "Completed"


def test_a_deleted_pod_stops_and_keeps_its_finalizers_as_with_a_kubelet(core, ns, fake_nodes):
    """A kubelet stops a deleted pod's containers and leaves the object to the owners of its finalizers (Kueue's,
    on a pod group's pods, keeps the group's Workload alive): kwok must not remove them."""
    finalizer = "kubetf.io/test-holds"
    core.create_namespaced_pod(ns, fake_pod("held", finalizers=[finalizer]))
    wait_for(lambda: _phase(core, ns, "held", "Running"), 60, "pod held to be Running on a fake node")
    core.delete_namespaced_pod("held", ns)
    pod = wait_for(lambda: _phase(core, ns, "held", "Failed"), 30, "the deleted pod to stop (Failed)")
    assert pod.status.container_statuses[0].state.terminated.exit_code == 143
    assert pod.metadata.finalizers == [finalizer] and pod.metadata.deletion_timestamp
    # Watched for a while: kwok (pod-delete) deletes it again, and the finalizer keeps it.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert (_pod(core, ns, "held") or pytest.fail("gone with its finalizer")).metadata.finalizers == [finalizer]
        time.sleep(0.2)
    core.patch_namespaced_pod("held", ns, {"metadata": {"finalizers": None}})
    wait_for(lambda: _pod(core, ns, "held") is None, 30, "the pod gone once its finalizer was removed")


def test_real_node_still_runs_real_pods(core, ns, fake_nodes):
    pod, logs = run_pod(core, ns, "real", "print('a real container')")
    assert_succeeded(pod, logs)
    assert not pod.spec.node_name.startswith(kwok.FAKE_NODE_PREFIX)
    assert "a real container" in logs


def test_a_stopped_fake_node_is_lost_like_a_vanished_machine(kube_cluster, core, ns, fake_nodes):
    """fake-node-stop: NotReady after the node monitor grace period, tainted unreachable, its pod evicted and left
    Terminating (nobody confirms it); fake-node-start: Ready again and the pod's deletion completes."""
    manifest = fake_pod("lost")
    manifest["spec"]["nodeName"] = LOST
    manifest["spec"]["tolerations"].append(
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2}
    )
    core.create_namespaced_pod(ns, manifest)
    wait_for(lambda: _phase(core, ns, "lost", "Running"), 60, f"pod lost to be Running on {LOST}")

    stopped = time.monotonic()
    kwok.stop_fake_node(kube_cluster.kubeconfig, LOST)
    try:
        node = wait_for(
            lambda: (n := core.read_node(LOST)) and _condition(n, "Ready") == "Unknown" and n,
            150,
            f"{LOST} to become NotReady (Ready Unknown)",
            interval=1,
        )
        not_ready = time.monotonic() - stopped
        wait_for(
            lambda: any(t.key == "node.kubernetes.io/unreachable" for t in core.read_node(LOST).spec.taints or []),
            30,
            f"the unreachable taint on {LOST}",
            interval=0.5,
        )
        pod = wait_for(
            lambda: (p := _pod(core, ns, "lost")) and p.metadata.deletion_timestamp and p,
            60,
            "taint eviction to delete pod lost",
            interval=0.5,
        )
        evicted = time.monotonic() - stopped
        print(f"{LOST} stopped: NotReady after {not_ready:.0f}s, its pod evicted after {evicted:.0f}s")
        assert _condition(pod, "Ready") == "False"  # marked by the node lifecycle controller, not by kwok
        assert pod.status.phase == "Running"  # nobody on the node says otherwise
        assert any(c.type == "Ready" and c.status == "Unknown" for c in node.status.conditions)
        # a lost node confirms nothing: the deletion does not complete on its own, even when long overdue
        overdue = pod.metadata.deletion_timestamp + timedelta(seconds=5)
        wait_for(lambda: datetime.now(UTC) > overdue, 30, "the pod's deletion to be 5 s overdue", interval=0.5)
        assert _pod(core, ns, "lost") is not None
    finally:
        kwok.start_fake_node(kube_cluster.kubeconfig, LOST)
    wait_for(lambda: _condition(core.read_node(LOST), "Ready") == "True", 60, f"{LOST} Ready again", interval=0.5)
    wait_for(lambda: _pod(core, ns, "lost") is None, 60, "the evicted pod's deletion to complete", interval=0.5)
