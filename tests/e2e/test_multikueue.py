"""MultiKueue across three control planes on this machine (tests/cluster/README.md, "MultiKueue"): a TrainingJob
submitted to the manager runs on worker1 (the local cluster, its real node, real TensorFlow) while worker2 has no
quota for it; the manager's job mirrors the worker's status (phase, restarts, PROGRESS); a pod evicted on the worker
is a disruption on the manager too; deleting the job on the manager deletes it everywhere. A worker cut off from the
manager loses the job to the other worker, and its copy once it is back (docs/kueue.md, "A lost worker").

kubetf runs on worker1 as the chart installs it and on the manager as a process (the manager has no node: a
MultiKueue manager runs no pod of the jobs it dispatches); worker2 is only a place MultiKueue may dispatch to, with
kubetf as a process for the lost-worker test (its pods are created there and never run: worker2 has no node).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from datetime import datetime

import pytest
from kubernetes.client.exceptions import ApiException

from kubetf.core import api, types
from kubetf.core.scheduling import multikueue
from kubetf.core.scheduling import workload as kueue
from tests.cluster.fixture import SCRIPT, wait_for
from tests.cluster.queues import is_admitted
from tests.integration.conftest import Cluster, Operator

from .conftest import columns, delete_namespace, elapsed, sample

# Alone (make test's e2e stage of serial tests): bringing up two more API servers and Kueues took the machine's two
# cores for a minute, and the timing-bound tests beside them failed (a job not Queued in 30 s, an ETA never shown).
pytestmark = [pytest.mark.e2e, pytest.mark.serial, pytest.mark.xdist_group("multikueue")]  # (the group: run together)

QUEUE = "team-a"
WORKER_LOST_TIMEOUT = 20  # the manager Kueue's multiKueue.workerLostTimeout (tests/cluster/local-cluster.sh)
KWOK_LABEL = "kwok.x-k8s.io/node"  # the local cluster's fake nodes (tests/cluster/README.md): no pod really runs there
GROUP, VERSION = kueue.GROUP, kueue.VERSION


@pytest.fixture(scope="module")
def planes(kube_cluster, kueue, installed) -> Iterator[dict[str, Cluster]]:
    """The manager, worker1 (the local cluster) and worker2, MultiKueue's clusters Active on the manager; the two
    planes stopped after the module's tests."""
    kubeconfigs = kube_cluster.install_multikueue()
    try:
        yield {
            "manager": Cluster(kubeconfigs["manager"]),
            "worker1": installed,
            "worker2": Cluster(kubeconfigs["worker2"]),
        }
    finally:
        kube_cluster.remove_multikueue()


def _operator(planes, plane: str, tmp_path_factory) -> Iterator[Operator]:
    """kubetf on a plane, as a process: every namespace, its default Lease (the plane has no other)."""
    operator = Operator(planes[plane].kubeconfig, tmp_path_factory.mktemp(plane) / "operator.log", flags=())
    operator.start()
    yield operator
    operator.stop()


@pytest.fixture(scope="module")
def manager_operator(planes, tmp_path_factory) -> Iterator[Operator]:
    yield from _operator(planes, "manager", tmp_path_factory)


@pytest.fixture(scope="module")
def worker2_operator(planes, tmp_path_factory) -> Iterator[Operator]:
    yield from _operator(planes, "worker2", tmp_path_factory)


def _object(kind: str, name: str, **rest) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": {"name": name}, **rest}


def _create(cluster: Cluster, plural: str, body: dict, namespace: str | None = None) -> None:
    try:
        if namespace is None:
            cluster.custom.create_cluster_custom_object(GROUP, VERSION, plural, body)
        else:
            cluster.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body)
    except ApiException as error:
        if error.status != 409:
            raise


def _resource_groups(name: str, cpu: str) -> list[dict]:
    resources = [{"name": "cpu", "nominalQuota": cpu}, {"name": "memory", "nominalQuota": "64Gi"}]
    return [{"coveredResources": ["cpu", "memory"], "flavors": [{"name": name, "resources": resources}]}]


def queues(cluster: Cluster, namespace: str, name: str, cpu: str, check: str | None = None) -> None:
    """A ResourceFlavor, a ClusterQueue of `cpu` (with the admission check `check`) and the LocalQueue QUEUE."""
    try:
        cluster.core.create_namespace({"metadata": {"name": namespace}})
    except ApiException as error:
        if error.status != 409:
            raise
    _create(cluster, "resourceflavors", _object("ResourceFlavor", name))
    spec: dict = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "resourceGroups": _resource_groups(name, cpu),
    }
    if check:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": check}]}
    _create(cluster, "clusterqueues", _object("ClusterQueue", name, spec=spec))
    _create(cluster, "localqueues", _object("LocalQueue", QUEUE, spec={"clusterQueue": name}), namespace)


def set_quota(cluster: Cluster, name: str, cpu: str) -> None:
    """ClusterQueue `name` (made by `queues`) given `cpu` of quota."""
    body = {"spec": {"resourceGroups": _resource_groups(name, cpu)}}
    cluster.custom.patch_cluster_custom_object(GROUP, VERSION, "clusterqueues", name, body)


@pytest.fixture
def dispatching(planes, manager_operator, namespace) -> Iterator[str]:
    """In the test's namespace on all three: queues; worker1 with quota, worker2 with none; on the manager a
    ClusterQueue whose admission check is MultiKueue over both workers."""
    yield from _dispatching(planes, namespace, worker1_cpu="8", worker2_cpu="0")


@pytest.fixture
def dispatching_to_worker2(planes, manager_operator, namespace) -> Iterator[str]:
    """As `dispatching`, but worker2 has the quota and worker1 none (yet)."""
    yield from _dispatching(planes, namespace, worker1_cpu="0", worker2_cpu="8")


def _dispatching(planes, namespace: str, worker1_cpu: str, worker2_cpu: str) -> Iterator[str]:
    name = f"mk-{namespace}"
    manager = planes["manager"]
    _create(manager, "multikueueconfigs", _object("MultiKueueConfig", name, spec={"clusters": ["worker1", "worker2"]}))
    check = {"controllerName": "kueue.x-k8s.io/multikueue",
             "parameters": {"apiGroup": GROUP, "kind": "MultiKueueConfig", "name": name}}  # fmt: skip
    _create(manager, "admissionchecks", _object("AdmissionCheck", name, spec=check))
    queues(manager, namespace, name, "8", check=name)
    queues(planes["worker1"], namespace, name, worker1_cpu)
    queues(planes["worker2"], namespace, name, worker2_cpu)
    wait_for(lambda: active(manager, "admissionchecks", name), 60, "the MultiKueue admission check Active")
    for cluster in planes.values():
        wait_for(lambda cluster=cluster: active(cluster, "clusterqueues", name), 60, "the ClusterQueues Active")
    yield name
    # Worker1 is the e2e tier's cluster: its namespace fixture would delete the namespace only after this teardown.
    for cluster in planes.values():
        delete_namespace(cluster, namespace)
    for plane, cluster in planes.items():
        wait_for(lambda cluster=cluster: _gone(cluster, namespace), 120, f"namespace {namespace} gone on {plane}")
        for plural in ("clusterqueues", "resourceflavors"):
            cluster.custom.delete_cluster_custom_object(GROUP, VERSION, plural, name)
    manager.custom.delete_cluster_custom_object(GROUP, VERSION, "admissionchecks", name)
    manager.custom.delete_cluster_custom_object(GROUP, VERSION, "multikueueconfigs", name)


def active(cluster: Cluster, plural: str, name: str) -> bool:
    """Kueue's cluster-scoped object `name` (an AdmissionCheck, a ClusterQueue, a MultiKueueCluster) says Active."""
    found = cluster.custom.get_cluster_custom_object(GROUP, VERSION, plural, name)
    return any(c["type"] == "Active" and c["status"] == "True" for c in found.get("status", {}).get("conditions", []))


def _gone(cluster: Cluster, namespace: str) -> bool:
    try:
        cluster.core.read_namespace(namespace)
    except ApiException as error:
        return error.status == 404
    return False


def mnist(name: str) -> dict:
    """The MNIST sample (2 workers), for MultiKueue: a few epochs, its pods asking for 1 cpu each of the quota."""
    job = sample("mnist-mwms")
    job["metadata"] = {"name": name, "labels": {kueue.QUEUE_LABEL: QUEUE}}
    job["spec"]["managedBy"] = multikueue.MANAGED_BY
    worker = job["spec"]["replicaSpecs"]["worker"]
    args = worker["template"]["spec"]["containers"][0]["args"]
    args[args.index("--epochs") + 1] = "4"
    args[args.index("--steps-per-epoch") + 1] = "20"
    return job


@pytest.mark.tensorflow
def test_a_job_submitted_to_the_manager_runs_on_the_worker_with_quota_and_mirrors_back(planes, namespace, dispatching):
    manager, worker1, worker2 = planes["manager"], planes["worker1"], planes["worker2"]
    job = mnist("mk-mnist")
    submitted = time.monotonic()
    created = manager.create_job(namespace, "mk-mnist", job["spec"], labels=job["metadata"]["labels"])
    workload_name = kueue.workload_name(created)

    def on_worker1() -> dict | None:
        copy = worker1.job(namespace, "mk-mnist")
        return copy if copy is not None and worker1.live_pods(namespace, "mk-mnist") else None

    copy = wait_for(on_worker1, 180, "the job copied to worker1 and its pods created there", interval=0.5)
    print(f"\nsubmitted on the manager -> pods on worker1: {elapsed(submitted)}")
    assert copy["metadata"]["annotations"][kueue.PREBUILT] == workload_name
    assert "managedBy" not in copy["spec"]
    assert worker2.job(namespace, "mk-mnist") is None  # no quota there: never dispatched
    assert manager.pods(namespace, "mk-mnist") == {}  # the manager runs nothing of it

    def adopted_by_the_copy() -> bool:  # the operator adopts the Workload in the round after it creates the pods
        workload = worker1.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "workloads", workload_name)
        return (types.controller_of(workload) or {}).get("uid") == copy["metadata"]["uid"]

    wait_for(adopted_by_the_copy, 10, "worker1's Workload adopted by the job's copy there", interval=0.5)

    # While it trains, the manager shows the worker's phase and progress.
    def shows_progress() -> dict | None:
        row = columns(manager, namespace, "mk-mnist")
        return row if row.get("PHASE") == "Running" and row.get("PROGRESS") not in (None, "", "-") else None

    row = wait_for(shows_progress, 300, "the manager's kubectl get tj to show Running and PROGRESS", interval=1)
    print(f"manager's kubectl get tj while it trains: {row}")

    # A pod evicted on the worker: a disruption there, and so on the manager.
    worker = next(iter(sorted(worker1.live_pods(namespace, "mk-mnist"))))
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": worker}}
    worker1.core.create_namespaced_pod_eviction(worker, namespace, body)
    wait_for(
        lambda: (manager.status(namespace, "mk-mnist").get("restarts") or {}).get("disruptions") == 1,
        120,
        "the eviction on worker1 counted as a disruption on the manager",
        interval=0.5,
    )
    status = manager.wait_phase(namespace, "mk-mnist", "Succeeded", timeout=900)
    assert (status["restarts"]["disruptions"], status["restarts"]["failures"]) == (1, 0)
    assert status.get("progress"), "the worker's progress, copied"
    ended = time.monotonic()

    def manager_workload_finished() -> bool:  # the manager's operator finishes it once it reads the mirrored phase
        workload = manager.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "workloads", workload_name)
        return any(c["type"] == "Finished" and c["status"] == "True" for c in workload["status"].get("conditions", []))

    wait_for(manager_workload_finished, 10, "the manager's Workload Finished once the job Succeeded")
    print(f"job Succeeded on the manager -> its Workload Finished there: {elapsed(ended)}")

    # Deleted on the manager: gone from the worker too.
    manager.custom.delete_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, "mk-mnist")
    wait_for(lambda: worker1.job(namespace, "mk-mnist") is None, 120, "the job gone from worker1")
    wait_for(lambda: not worker1.pods(namespace, "mk-mnist"), 120, "its pods gone from worker1")


def sleeper(seconds: int) -> dict:
    """A MultiKueue job of two workers that sleep `seconds` and succeed (the program is not the point)."""
    container = {"name": "tensorflow", "image": "kubetf/python-base:bookworm", "imagePullPolicy": "IfNotPresent",
                 "args": ["python3", "-c", f"import time; time.sleep({seconds})"],
                 "resources": {"requests": {"cpu": "100m", "memory": "32Mi"}}}  # fmt: skip
    template = {"spec": {"terminationGracePeriodSeconds": 2, "containers": [container]}}
    return {
        "strategy": "MultiWorkerMirrored",
        "managedBy": multikueue.MANAGED_BY,
        "replicaSpecs": {"worker": {"replicas": 2, "template": template}},
    }


def test_a_job_deleted_on_the_manager_while_it_runs_stops_on_the_worker(planes, namespace, dispatching):
    """A job that sleeps (the program is not the point): running on worker1, deleted on the manager."""
    manager, worker1 = planes["manager"], planes["worker1"]
    created = manager.create_job(namespace, "mk-sleep", sleeper(3600), labels={kueue.QUEUE_LABEL: QUEUE})
    manager.wait_phase(namespace, "mk-sleep", "Running", timeout=180)
    assert is_admitted(
        manager.custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, "workloads", kueue.workload_name(created)
        )
    )
    manager.custom.delete_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, "mk-sleep")
    wait_for(lambda: worker1.job(namespace, "mk-sleep") is None, 120, "the job gone from worker1")
    wait_for(lambda: not worker1.pods(namespace, "mk-sleep"), 120, "its pods gone from worker1")
    wait_for(
        lambda: not manager.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "workloads")["items"],
        60,
        "its Workload gone from the manager",
    )


def link(what: str, worker: str) -> None:
    """`local-cluster.sh multikueue-cut|multikueue-restore WORKER`: the manager's Kueue cut off the worker's API
    server (every packet refused, both ways), or reaching it again; nothing else on the worker is touched."""
    result = subprocess.run(
        ["bash", str(SCRIPT), f"multikueue-{what}", worker], capture_output=True, text=True, timeout=60, check=False
    )
    if result.returncode != 0:
        pytest.fail(f"local-cluster.sh multikueue-{what} {worker} exited {result.returncode}:\n{result.stderr}")


@pytest.fixture
def cut_worker2(planes) -> Iterator[None]:
    """Whatever the test does, the manager reaches worker2 again afterwards (its namespace must be deleted there)."""
    yield
    link("restore", "worker2")


def test_a_worker_cut_off_from_the_manager_loses_the_job_to_the_other_worker_and_its_copy_when_back(
    planes, namespace, dispatching_to_worker2, worker2_operator, cut_worker2
):
    """docs/kueue.md, "A lost worker": dispatched to worker2, the job stays there while worker2 is cut off the
    manager for less than workerLostTimeout (WORKER_LOST_TIMEOUT); past it the manager evicts
    the job and dispatches it again, to worker1, where it runs to the end on the real node while worker2's copy lives
    on (nothing can reach it); once the manager reaches worker2 again, Kueue removes that copy, its Workload and so
    its pods: no second copy is left."""
    manager, worker1, worker2 = planes["manager"], planes["worker1"], planes["worker2"]
    submitted = time.monotonic()
    created = manager.create_job(namespace, "mk-lost", sleeper(8), labels={kueue.QUEUE_LABEL: QUEUE})
    workload_name = kueue.workload_name(created)

    def dispatched_to() -> str | None:
        try:
            workload = manager.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "workloads", workload_name
            )
        except ApiException as error:
            if error.status == 404:  # not made yet
                return None
            raise
        return (workload.get("status") or {}).get("clusterName")

    wait_for(lambda: dispatched_to() == "worker2", 120, "the job dispatched to worker2, the worker with quota")
    lost = wait_for(
        lambda: (copy := worker2.job(namespace, "mk-lost")) and worker2.pods(namespace, "mk-lost") and copy,
        60,
        "the job's copy on worker2 and its pods (Pending: worker2 has no node)",
    )
    print(f"\nsubmitted on the manager -> the copy and its pods on worker2: {elapsed(submitted)}")
    assert worker1.job(namespace, "mk-lost") is None

    # worker1 gets room for the job: nothing moves while worker2 holds it.
    set_quota(worker1, dispatching_to_worker2, "8")
    link("cut", "worker2")
    cut, cut_at = time.monotonic(), time.time()
    wait_for(
        lambda: not active(manager, "multikueueclusters", "worker2"), 60, "MultiKueueCluster worker2 no longer Active"
    )
    print(f"worker2 cut off -> its MultiKueueCluster inactive: {elapsed(cut)}")

    wait_for(lambda: dispatched_to() == "worker1", 150, "the job dispatched again, to worker1", interval=0.5)
    print(f"worker2 cut off -> the job dispatched to worker1: {elapsed(cut)}")
    assert time.monotonic() - cut >= WORKER_LOST_TIMEOUT, "the job left worker2 before workerLostTimeout"
    # The lost worker's copy lives on: nothing reaches it.
    assert (worker2.job(namespace, "mk-lost") or {}).get("metadata", {}).get("uid") == lost["metadata"]["uid"]
    assert worker2.live_pods(namespace, "mk-lost")

    nodes = worker1.core.list_node().items
    real_nodes = {n.metadata.name for n in nodes if KWOK_LABEL not in (n.metadata.labels or {})}

    def running_on_worker1() -> dict | None:
        pods = worker1.live_pods(namespace, "mk-lost")
        running = {n: p for n, p in pods.items() if (p.get("status") or {}).get("phase") == "Running"}
        return running if len(running) == 2 else None

    pods = wait_for(running_on_worker1, 120, "both pods Running on worker1", interval=0.5)
    assert {p["spec"]["nodeName"] for p in pods.values()} <= real_nodes, "pods on worker1's real node"
    status = manager.wait_phase(namespace, "mk-lost", "Succeeded", timeout=120)
    print(f"worker2 cut off -> the job Succeeded on worker1, as the manager shows: {elapsed(cut)}")
    # The manager shows worker1's run: admitted, so started, after the cut (worker2's copy started before it).
    started = datetime.fromisoformat(status["startTime"].replace("Z", "+00:00")).timestamp()
    assert started >= int(cut_at), (status["startTime"], cut_at)
    assert status["replicaStatuses"]["worker"]["succeeded"] >= 1
    assert (status["restarts"]["failures"], status["restarts"]["disruptions"]) == (0, 0)
    assert worker2.job(namespace, "mk-lost") is not None, "worker2's copy, out of the manager's reach, is still there"

    link("restore", "worker2")
    healed = time.monotonic()
    wait_for(lambda: active(manager, "multikueueclusters", "worker2"), 400, "MultiKueueCluster worker2 Active again")
    print(f"worker2 reachable again -> its MultiKueueCluster Active: {elapsed(healed)}")

    def copy_gone() -> bool:
        workloads = worker2.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "workloads")["items"]
        return worker2.job(namespace, "mk-lost") is None and not workloads and not worker2.pods(namespace, "mk-lost")

    wait_for(copy_gone, 60, "worker2's copy of the job, its Workload and its pods removed by Kueue")
    print(f"worker2 reachable again -> its copy gone: {elapsed(healed)}")
    assert manager.status(namespace, "mk-lost")["phase"] == "Succeeded"
