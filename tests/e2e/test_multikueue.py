"""MultiKueue across three control planes on this machine (tests/cluster/README.md, "MultiKueue"): a TrainingJob
submitted to the manager runs on worker1 (the local cluster, its real node, real TensorFlow) while worker2 has no
quota for it; the manager's job mirrors the worker's status (phase, restarts, PROGRESS); a pod evicted on the worker
is a disruption on the manager too; deleting the job on the manager deletes it everywhere.

kubetf runs on worker1 as the chart installs it and on the manager as a process (the manager has no node: a
MultiKueue manager runs no pod of the jobs it dispatches); worker2 is only a place MultiKueue may dispatch to.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from kubernetes.client.exceptions import ApiException

from kubetf.core import api, types
from kubetf.core.scheduling import multikueue
from kubetf.core.scheduling import workload as kueue
from tests.cluster.fixture import wait_for
from tests.cluster.queues import is_admitted
from tests.integration.conftest import Cluster, Operator

from .conftest import columns, delete_namespace, elapsed, sample

# Alone (make test's e2e stage of serial tests): bringing up two more API servers and Kueues took the machine's two
# cores for a minute, and the timing-bound tests beside them failed (a job not Queued in 30 s, an ETA never shown).
pytestmark = [pytest.mark.e2e, pytest.mark.serial, pytest.mark.xdist_group("multikueue")]  # (the group: run together)

QUEUE = "team-a"
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


@pytest.fixture(scope="module")
def manager_operator(planes, tmp_path_factory) -> Iterator[Operator]:
    """kubetf on the manager, as a process: every namespace, its default Lease (the manager has no other)."""
    operator = Operator(planes["manager"].kubeconfig, tmp_path_factory.mktemp("manager") / "operator.log", flags=())
    operator.start()
    yield operator
    operator.stop()


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


def queues(cluster: Cluster, namespace: str, name: str, cpu: str, check: str | None = None) -> None:
    """A ResourceFlavor, a ClusterQueue of `cpu` (with the admission check `check`) and the LocalQueue QUEUE."""
    try:
        cluster.core.create_namespace({"metadata": {"name": namespace}})
    except ApiException as error:
        if error.status != 409:
            raise
    _create(cluster, "resourceflavors", _object("ResourceFlavor", name))
    resources = [{"name": "cpu", "nominalQuota": cpu}, {"name": "memory", "nominalQuota": "64Gi"}]
    spec: dict = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "resourceGroups": [
            {"coveredResources": ["cpu", "memory"], "flavors": [{"name": name, "resources": resources}]}
        ],
    }
    if check:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": check}]}
    _create(cluster, "clusterqueues", _object("ClusterQueue", name, spec=spec))
    _create(cluster, "localqueues", _object("LocalQueue", QUEUE, spec={"clusterQueue": name}), namespace)


@pytest.fixture
def dispatching(planes, manager_operator, namespace) -> Iterator[str]:
    """In the test's namespace on all three: queues; worker1 with quota, worker2 with none; on the manager a
    ClusterQueue whose admission check is MultiKueue over both workers."""
    name = f"mk-{namespace}"
    manager = planes["manager"]
    _create(manager, "multikueueconfigs", _object("MultiKueueConfig", name, spec={"clusters": ["worker1", "worker2"]}))
    check = {"controllerName": "kueue.x-k8s.io/multikueue",
             "parameters": {"apiGroup": GROUP, "kind": "MultiKueueConfig", "name": name}}  # fmt: skip
    _create(manager, "admissionchecks", _object("AdmissionCheck", name, spec=check))
    queues(manager, namespace, name, "8", check=name)
    queues(planes["worker1"], namespace, name, "8")
    queues(planes["worker2"], namespace, name, "0")

    def active(cluster: Cluster, plural: str) -> bool:
        found = cluster.custom.get_cluster_custom_object(GROUP, VERSION, plural, name)
        return any(
            c["type"] == "Active" and c["status"] == "True" for c in found.get("status", {}).get("conditions", [])
        )

    wait_for(lambda: active(manager, "admissionchecks"), 60, "the MultiKueue admission check Active")
    for cluster in planes.values():
        wait_for(lambda cluster=cluster: active(cluster, "clusterqueues"), 60, "the ClusterQueues Active")
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


def test_a_job_deleted_on_the_manager_while_it_runs_stops_on_the_worker(planes, namespace, dispatching):
    """A job that sleeps (the program is not the point): running on worker1, deleted on the manager."""
    manager, worker1 = planes["manager"], planes["worker1"]
    container = {"name": "tensorflow", "image": "kubetf/python-base:bookworm", "imagePullPolicy": "IfNotPresent",
                 "args": ["python3", "-c", "import time; time.sleep(3600)"],
                 "resources": {"requests": {"cpu": "100m", "memory": "32Mi"}}}  # fmt: skip
    template = {"spec": {"terminationGracePeriodSeconds": 2, "containers": [container]}}
    spec = {
        "strategy": "MultiWorkerMirrored",
        "managedBy": multikueue.MANAGED_BY,
        "replicaSpecs": {"worker": {"replicas": 2, "template": template}},
    }
    created = manager.create_job(namespace, "mk-sleep", spec, labels={kueue.QUEUE_LABEL: QUEUE})
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
