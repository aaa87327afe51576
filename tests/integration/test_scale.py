"""Scale behaviours on the real API server: the operator never receives the cluster's other pods, and a burst of new
jobs does not hold back the recovery of a preempted one. (What they cost in memory and seconds at 10,000s of pods is
`make bench-scale` and `make bench-compare --foreign-pods`; a functional test asserts behaviour, not timings.)"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from kubetf.core.config import OperatorConfig
from tests.cluster.fixture import wait_for

from .conftest import LEASE_NAME, UNSCHEDULED, Operator, free_port, replica

FOREIGN_PODS = 300
BURST = 150
SPEC = {"strategy": "MultiWorkerMirrored", "replicaSpecs": {"chief": replica(1), "worker": replica(4)}}


@pytest.fixture
def namespace_operator(cluster, operator, namespace, tmp_path):
    """In place of this worker's operator, one that serves only this test's namespace: its cache holds this
    namespace's pods alone, whatever the worker's earlier tests leave behind or are still deleting."""
    operator.stop()
    own = Operator(
        cluster.kubeconfig, tmp_path / "namespace-operator.log", metrics_port=free_port(),
        flags=("--lease-name", LEASE_NAME, "--namespace", namespace, "--admitted-shape-seconds", "600"),
    )  # fmt: skip
    own.start()
    try:
        yield own
    finally:
        own.stop()
        operator.start()


def test_the_operator_never_receives_other_workloads_pods(cluster, namespace_operator, namespace):
    """Its pod watch is filtered by the API server: pods of other workloads, in the very namespace of its jobs,
    never reach it (its cache counts only its own)."""
    operator = namespace_operator
    pod = {
        "metadata": {"labels": {"app": "someone-else", "app.kubernetes.io/managed-by": "helm"}},
        "spec": {"schedulerName": UNSCHEDULED, "containers": [{"name": "app", "image": "example/app:1"}]},
    }

    def create(i: int) -> None:
        body = {**pod, "metadata": {**pod["metadata"], "name": f"other-{i}"}}
        # The answer read (not parsed): only then is its connection back in the pool, not a new TLS one per pod.
        _ = cluster.core.create_namespaced_pod(namespace, body, _preload_content=False).data

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, range(FOREIGN_PODS)))
    # A job's pods created after them, in the same namespace: one watch stream, in order. Once the operator has
    # cached these three, it has seen everything the stream held before them.
    cluster.create_job(namespace, "mine", {"strategy": "MultiWorkerMirrored", "replicaSpecs": {"worker": replica(3)}})
    cluster.wait_pods(namespace, "mine", lambda p: len(p) == 3, "the job's 3 pods")
    wait_for(lambda: operator.metric("kubetf_cached_pods") >= 3, 15, "the job's pods in the operator's cache")
    assert operator.metric("kubetf_cached_pods") == 3  # and none of the 300 others
    # Each of its API calls was timed (kubetf_api_request_seconds): the 3 pod creates and the dry run before them.
    creates = {"verb": "create", "resource": "pod"}
    assert operator.metric_total("kubetf_api_request_seconds_count", only=creates) == 4
    assert operator.metric_total("kubetf_api_requests_total", only=creates) == 4
    assert operator.metric_total("kubetf_api_request_seconds_sum", only=creates) > 0
    # A second job from the same template (its name as long): the API server admitted its pods' shape a moment ago,
    # so they are created without a dry run.
    cluster.create_job(namespace, "ours", {"strategy": "MultiWorkerMirrored", "replicaSpecs": {"worker": replica(3)}})
    cluster.wait_pods(namespace, "ours", lambda p: len(p) == 3, "the second job's 3 pods")
    total = lambda: operator.metric_total("kubetf_api_requests_total", only=creates)  # noqa: E731
    wait_for(lambda: total() >= 7, 15, "its creates counted (the answers read after the pods were stored)")
    assert total() == 7


def test_a_burst_of_creations_does_not_hold_back_the_recovery_of_a_preempted_job(cluster, operator, namespace):
    """A pod that ended goes ahead of new jobs' creations: the preempted group is whole again while the burst's
    jobs are still being created."""
    cluster.create_job(namespace, "victim", SPEC)
    cluster.run_all(namespace, "victim", 5)
    cluster.wait_phase(namespace, "victim", "Running")
    burst = threading.Thread(
        target=lambda: [cluster.create_job(namespace, f"burst-{i}", SPEC) for i in range(BURST)], daemon=True
    )
    burst.start()
    wait_for(lambda: len(cluster.pods(namespace, "burst-20")) == 5, 60, "the burst under way")
    cluster.delete_pod(cluster.live_pods(namespace, "victim")["victim-worker-2"])
    preempted = time.monotonic()
    cluster.wait_pods(
        namespace,
        "victim",
        lambda p: len(p) == 5 and all(x["metadata"]["labels"]["kubetf.io/attempt"] == "1" for x in p.values()),
        "the whole group recreated",
        timeout=30,
    )
    recovery = time.monotonic() - preempted
    pods = cluster.live_pods_by_job(namespace)
    applied = [name for name in cluster.statuses(namespace) if name.startswith("burst-")]
    waiting = [name for name in applied if len(pods.get(name, {})) < 5]  # applied, their pods still to create
    print(f"\npreemption to all 5 replacement pods: {recovery:.2f}s, {len(waiting)} burst jobs still without pods")
    burst.join(120)
    assert waiting, "the burst was over before the preempted group was recreated: it did not go first"


def test_a_burst_of_new_jobs_gets_its_pods_first_then_every_status_and_event(cluster, namespace_operator, namespace):
    """New jobs waiting for their pods go before new jobs' first statuses (the API server's CPU sets a burst's pace,
    and the status write is a new job's dearest call); no status and no CreatedPods event is lost by waiting."""
    operator, jobs = namespace_operator, 40
    operator.stop()  # the burst arrives while no operator runs: its start finds all 40 waiting, whatever the timing
    spec = {"strategy": "MultiWorkerMirrored", "replicaSpecs": {"worker": replica(3)}}
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: cluster.create_job(namespace, f"burst-{i}", spec), range(jobs)))
    operator.start()
    wait_for(
        lambda: sum(s.get("phase") == "Pending" for s in cluster.statuses(namespace).values()) == jobs,
        60,
        "every job of the burst Pending",
    )
    pods = cluster.live_pods_by_job(namespace)
    for i in range(jobs):
        name = f"burst-{i}"
        assert len(pods.get(name, {})) == 3, name
        tasks = cluster.status(namespace, name)["tasks"]
        assert {task["state"] for task in tasks.values()} == {"Created"}, (name, tasks)
        created = [e for e in cluster.events(namespace, name) if e["reason"] == "CreatedPods"]
        assert len(created) == 1, (name, created)
    # All 40 were queued before a worker started (the priming list): with 8 workers, at least the first 32 to have
    # their pods created found others still waiting for theirs, and held their statuses. (When those were written
    # is the machine's pace: at the queue's lowest priority, or 10 s later at the latest.)
    held = operator.metric("kubetf_first_statuses_held_total")
    assert held >= jobs - OperatorConfig().workers, held


def test_a_service_tried_by_creating_it_stops_a_job_whose_service_name_is_someone_elses(
    cluster, namespace_operator, namespace
):
    """A second job of a template the API server admitted a moment ago ("mine", "ours": names of one length): its pods
    are not tried, its Service is, by creating it first, alone. A Service of its name that is someone else's stops
    the job before any pod is made, as a dry run would, and the job goes on once that Service is gone."""
    spec = {"strategy": "MultiWorkerMirrored", "replicaSpecs": {"worker": replica(3)}}
    cluster.create_job(namespace, "mine", spec)
    cluster.wait_pods(namespace, "mine", lambda p: len(p) == 3, "the first job's pods")
    theirs = {"metadata": {"name": "ours"}, "spec": {"clusterIP": "None", "selector": {"app": "theirs"}}}
    cluster.core.create_namespaced_service(namespace, theirs)
    job = cluster.create_job(namespace, "ours", spec)
    status = wait_for(
        lambda: (s := cluster.status(namespace, "ours")).get("reason") == "NameInUse" and s, 20, "ours in NameInUse"
    )
    message = next(c for c in status["conditions"] if c["status"] == "True")["message"]
    assert "Service ours exists and is not this job's (no owner)" in message, message
    assert cluster.pods(namespace, "ours") == {}
    cluster.core.delete_namespaced_service("ours", namespace)
    cluster.wait_pods(namespace, "ours", lambda p: len(p) == 3, "its pods once the name is free", 30)
    service = cluster.core.read_namespaced_service("ours", namespace)
    assert [o.uid for o in service.metadata.owner_references] == [job["metadata"]["uid"]]
    # Service creates the API server took: mine's dry run and create; ours' create alone (its refused ones: 409s).
    operator, service_calls = namespace_operator, {"verb": "create", "resource": "service"}
    created = operator.metric_total("kubetf_api_requests_total", only=service_calls)
    refused = operator.metric_total("kubetf_api_errors_total", only=service_calls)
    assert (created - refused, refused >= 1) == (3, True), (created, refused)
