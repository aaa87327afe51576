"""TrainingJobs as one of Kueue's external frameworks, under a real Kueue (its controller, its scheduler, its quota,
its webhooks) on the real API server: the operator makes each queued job's Workload and creates its pods only once
Kueue admits it. Pods are never scheduled here: the tests play the kubelet."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from kubernetes.client.exceptions import ApiException

from kubetf.core import api
from kubetf.core import status as st
from kubetf.core.scheduling import multikueue
from kubetf.core.scheduling import workload as kueue
from tests.cluster.fixture import wait_for
from tests.cluster.queues import Queue, admitted, finish_jobs, is_admitted, make_flavor, priority_classes

from .conftest import mwms_spec, ps_spec, replica


@pytest.fixture(scope="module")
def kueue_installed(kueue, cluster):
    make_flavor(cluster)


@pytest.fixture
def queue(cluster, namespace, kueue_installed):
    made = Queue(cluster, namespace, gpus=2)
    yield made
    finish_jobs(cluster, namespace)
    made.delete()


def gpu_job(spec: dict, gpus: int = 1) -> dict:
    for role in spec["replicaSpecs"].values():
        role["gpus"] = gpus
    return spec


def labelled(queue: Queue, **more: str) -> dict:
    return {"labels": {kueue.QUEUE_LABEL: queue.local, **more}}


def attempt(pod: dict) -> str:
    return pod["metadata"]["labels"]["kubetf.io/attempt"]


def condition(cluster, namespace: str, name: str) -> dict:
    status = cluster.status(namespace, name)
    return next(c for c in status.get("conditions") or [] if c["status"] == "True")


def workload_condition(workload: dict | None, type_: str) -> tuple[str, str] | None:
    conditions = ((workload or {}).get("status") or {}).get("conditions") or []
    found = next((c for c in conditions if c["type"] == type_), None)
    return (found["status"], found.get("reason", "")) if found else None


def two_workers() -> dict:
    return gpu_job({"strategy": "MultiWorkerMirrored", "replicaSpecs": {"worker": replica(2)}})


def test_a_job_waits_queued_with_no_pod_at_all_until_the_quota_frees(cluster, namespace, queue):
    big = cluster.create_job(namespace, "big", gpu_job(mwms_spec(), gpus=1), **labelled(queue))  # 3 GPUs > 2
    cluster.wait_phase(namespace, "big", "Queued")

    def says_why():
        message = condition(cluster, namespace, "big").get("message", "")
        return "insufficient" in message and message

    message = wait_for(says_why, 40, "big's condition to carry Kueue's reason")
    assert f"LocalQueue {queue.local} (ClusterQueue {queue.name})" in message
    workload = queue.workload(big)
    assert workload["metadata"]["ownerReferences"][0]["uid"] == big["metadata"]["uid"]
    assert [(p["name"], p["count"]) for p in workload["spec"]["podSets"]] == [("chief", 1), ("worker", 2)]
    assert cluster.pods(namespace, "big") == {}  # a queued job has no pod: nothing in etcd, nothing gated
    small = cluster.create_job(namespace, "small", two_workers(), **labelled(queue))
    pods = admitted(cluster, namespace, "small", 2, "small's pods, once admitted", 30)
    labels = next(iter(pods.values()))["metadata"]["labels"]
    assert (labels[kueue.PODSET_LABEL], labels[kueue.LOCAL_QUEUE_LABEL]) == ("worker", queue.local)
    cluster.run_all(namespace, "small", 2)
    cluster.wait_phase(namespace, "small", "Running")
    wait_for(lambda: queue.gpus_in_use() == 2, 10, "the ClusterQueue to count small's 2 GPUs")
    wait_for(
        lambda: workload_condition(queue.workload(small), "PodsReady") == ("True", "Started"), 10, "PodsReady reported"
    )
    assert cluster.pods(namespace, "big") == {}


def test_preemption_by_kueue_is_a_disruption_and_the_job_queues_again_without_pods(cluster, namespace, queue):
    priority_classes(cluster, **{"kubetf-low": 100, "kubetf-high": 1000})
    low = cluster.create_job(namespace, "low", two_workers(), **labelled(queue, **{kueue.PRIORITY_LABEL: "kubetf-low"}))
    admitted(cluster, namespace, "low", 2, "low admitted", 30)
    cluster.run_all(namespace, "low", 2)
    cluster.wait_phase(namespace, "low", "Running")
    assert queue.workload(low)["spec"]["priority"] == 100
    cluster.create_job(namespace, "high", two_workers(), **labelled(queue, **{kueue.PRIORITY_LABEL: "kubetf-high"}))
    status = cluster.wait_phase(namespace, "low", "Queued", timeout=40)
    assert status["restarts"]["disruptions"] == 1 and status["restarts"]["failures"] == 0
    assert "Preempted by Kueue" in status["restarts"]["lastReason"]
    # The pods stop (the test plays the kubelet); once none runs the operator gives the quota back and high goes.
    # The status says Queued before the pods are deleted, and a pod on no node goes at once: one may be gone by now.
    for pod in cluster.live_pods(namespace, "low").values():
        try:
            cluster.exit(pod, 143)
        except ApiException as error:
            if error.status != 404:
                raise
    wait_for(lambda: not cluster.pods(namespace, "low"), 30, "low's pods gone")
    wait_for(lambda: workload_condition(queue.workload(low), "Requeued") == ("True", "Preempted"), 10, "low requeued")
    admitted(cluster, namespace, "high", 2, "high admitted", 30)
    assert cluster.pods(namespace, "low") == {}  # queued again: no pod
    cluster.run_all(namespace, "high", 2)
    for pod in cluster.live_pods(namespace, "high").values():
        cluster.exit(pod, 0)
    cluster.wait_phase(namespace, "high", "Succeeded")
    pods = admitted(cluster, namespace, "low", 2, "low admitted again", 40)
    assert {attempt(p) for p in pods.values()} == {"1"}
    cluster.run_all(namespace, "low", 2)
    status = cluster.wait_phase(namespace, "low", "Running")
    assert status["restarts"]["total"] == 1


def test_an_evicted_worker_restarts_the_group_under_the_same_admission(cluster, namespace, queue):
    job = cluster.create_job(namespace, "mwms", gpu_job(mwms_spec(), gpus=0), **labelled(queue))
    admitted(cluster, namespace, "mwms", 3, "admitted", 30)
    cluster.run_all(namespace, "mwms", 3)
    cluster.wait_phase(namespace, "mwms", "Running")
    workload = queue.workload(job)
    worker = cluster.live_pods(namespace, "mwms")["mwms-worker-1"]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    evicted = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    cluster.set_status(worker, {"conditions": [{**evicted, "lastTransitionTime": now}]})
    cluster.delete_pod(worker)
    wait_for(lambda: all(attempt(p) == "1" for p in cluster.live_pods(namespace, "mwms").values()), 30, "new group")
    pods = admitted(cluster, namespace, "mwms", 3, "the whole group recreated", 30)
    cluster.run_all(namespace, "mwms", 3)
    status = cluster.wait_phase(namespace, "mwms", "Running")
    after = queue.workload(job)
    # The same Workload, never evicted, never requeued: the operator's own restart keeps the admission.
    assert after["metadata"]["uid"] == workload["metadata"]["uid"]
    assert is_admitted(after) and workload_condition(after, "Evicted") is None
    assert workload_condition(after, "Requeued") is None
    assert after["status"]["admission"] == workload["status"]["admission"]
    assert status["restarts"]["disruptions"] == 1 and "Queued" not in [
        e["reason"] for e in cluster.events(namespace, "mwms")
    ]
    assert len(pods) == 3


def test_a_finished_ps_job_gives_its_quota_back_within_a_second(cluster, namespace, queue):
    """Its ps and workers never exit by themselves: the Workload finishes with the job, not with its last pod, and
    the next job waiting for the quota is admitted."""
    spec = gpu_job(ps_spec(), gpus=0)
    spec["replicaSpecs"]["chief"]["gpus"] = 2  # the queue's 2 GPUs
    job = cluster.create_job(namespace, "ps", spec, **labelled(queue))
    admitted(cluster, namespace, "ps", 4, "admitted", 30)
    cluster.run_all(namespace, "ps", 4)
    cluster.wait_phase(namespace, "ps", "Running")
    cluster.create_job(namespace, "next", two_workers(), **labelled(queue))  # 2 GPUs too: it waits
    wait_for(lambda: "insufficient" in str(cluster.status(namespace, "next").get("conditions")), 30, "next waiting")
    cluster.exit(cluster.live_pods(namespace, "ps")["ps-chief-0"], 0)
    cluster.wait_phase(namespace, "ps", "Succeeded", timeout=10)
    ended = time.monotonic()
    wait_for(lambda: workload_condition(queue.workload(job), "Finished") == ("True", "Succeeded"), 1, "Finished")
    finished = time.monotonic() - ended
    admitted(cluster, namespace, "next", 2, "next admitted once ps's quota is back", 10)  # ... free again
    print(f"\nps Succeeded -> its Workload Finished {finished:.2f}s -> next admitted {time.monotonic() - ended:.2f}s")
    assert kueue.FINALIZER not in (queue.workload(job)["metadata"].get("finalizers") or [])


@pytest.mark.parametrize("how", ["delete", "suspend"])
def test_deleting_or_suspending_an_admitted_job_releases_its_quota(cluster, namespace, queue, how):
    job = cluster.create_job(namespace, "j", two_workers(), **labelled(queue))
    admitted(cluster, namespace, "j", 2, "admitted", 30)
    cluster.run_all(namespace, "j", 2)
    cluster.wait_phase(namespace, "j", "Running")
    wait_for(lambda: queue.gpus_in_use() == 2, 10, "the ClusterQueue to count the job's 2 GPUs")
    if how == "delete":
        cluster.custom.delete_namespaced_custom_object("kubetf.io", "v1alpha1", namespace, "trainingjobs", "j")
        wait_for(lambda: queue.gpus_in_use() == 0, 15, lambda: f"the quota released: {queue.explain(job)}")
        wait_for(lambda: queue.workload(job) is None, 30, "the Workload gone with its job (no finalizer left)")
        return
    cluster.patch_spec(namespace, "j", {"runPolicy": {"suspend": True}})
    wait_for(lambda: queue.workload(job)["spec"].get("active") is False, 10, "the Workload deactivated")
    for pod in cluster.live_pods(namespace, "j").values():
        cluster.exit(pod, 143)  # the kubelet stops them
    wait_for(lambda: queue.gpus_in_use() == 0, 15, lambda: f"the quota released: {queue.explain(job)}")
    cluster.wait_phase(namespace, "j", "Suspended")
    cluster.patch_spec(namespace, "j", {"runPolicy": {"suspend": False}})
    admitted(cluster, namespace, "j", 2, "admitted again after the resume", 60)
    assert queue.workload(job)["spec"]["active"] is True


def test_a_workload_deleted_under_a_running_job_stops_it_and_the_job_queues_under_a_new_one(cluster, namespace, queue):
    job = cluster.create_job(namespace, "j", two_workers(), **labelled(queue))
    admitted(cluster, namespace, "j", 2, "admitted", 30)
    cluster.run_all(namespace, "j", 2)
    cluster.wait_phase(namespace, "j", "Running")
    old = queue.workload(job)
    cluster.custom.delete_namespaced_custom_object(
        kueue.GROUP, kueue.VERSION, namespace, "workloads", old["metadata"]["name"]
    )
    status = wait_for(
        lambda: (s := cluster.status(namespace, "j"))["restarts"]["disruptions"] == 1 and s, 30, "the job stopped"
    )
    assert "WorkloadDeleted" in status["restarts"]["lastReason"]
    # The old pods stop. Never placed on a node, they may be gone already (404), and the next attempt's pods made
    # under the same names (422: another uid) once the new Workload was admitted.
    for pod in cluster.live_pods(namespace, "j").values():
        if attempt(pod) == "0":
            try:
                cluster.exit(pod, 143)
            except ApiException as error:
                if error.status not in (404, 422):
                    raise
    new = wait_for(
        lambda: (w := queue.workload(job)) is not None and w["metadata"]["uid"] != old["metadata"]["uid"] and w,
        30,
        "a new Workload",
    )
    pods = admitted(cluster, namespace, "j", 2, "admitted under its new Workload", 30)
    assert {attempt(p) for p in pods.values()} == {"1"} and is_admitted(queue.workload(job))
    assert new["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]


def test_a_local_queue_that_does_not_exist_is_said(cluster, namespace, kueue_installed):
    cluster.create_job(namespace, "lost", mwms_spec(), labels={kueue.QUEUE_LABEL: "no-such-queue"})
    try:
        status = cluster.wait_phase(namespace, "lost", "Queued")
        assert status["reason"] == "LocalQueueNotFound"
        assert "LocalQueue no-such-queue does not exist" in condition(cluster, namespace, "lost")["message"]
        cluster.wait_event(namespace, "lost", "LocalQueueNotFound")
        assert cluster.pods(namespace, "lost") == {}
    finally:
        finish_jobs(cluster, namespace)


def test_bad_queue_labels_and_managed_by_are_refused_at_apply_time(cluster, namespace):
    with pytest.raises(ApiException) as refused:
        cluster.create_job(namespace, "bad", mwms_spec(), labels={kueue.QUEUE_LABEL: "Team_A"})
    assert "is not a LocalQueue name" in json.loads(refused.value.body)["message"]
    with pytest.raises(ApiException) as refused:
        cluster.create_job(namespace, "bad", {**mwms_spec(), "managedBy": "someone/else"})
    assert 'spec.managedBy: Unsupported value: "someone/else"' in json.loads(refused.value.body)["message"]
    # Nothing would ever dispatch it: refused, with what to do.
    with pytest.raises(ApiException) as refused:
        cluster.create_job(namespace, "bad", {**mwms_spec(), "managedBy": multikueue.MANAGED_BY})
    assert refused.value.status == 422
    assert (
        "spec.managedBy: kueue.x-k8s.io/multikueue needs the label kueue.x-k8s.io/queue-name, or nothing ever "
        "dispatches the job: add the label, naming a LocalQueue whose ClusterQueue has a MultiKueue admission check"
    ) in json.loads(refused.value.body)["message"]
    assert cluster.job(namespace, "bad") is None


def set_phase(cluster, namespace: str, name: str, phase: str) -> None:
    """The job's phase, written on its status subresource as the operator writes it."""
    cluster.custom.patch_namespaced_custom_object_status(
        api.GROUP, api.VERSION, namespace, api.PLURAL, name, {"status": {"phase": phase}}
    )


def set_queue(cluster, namespace: str, name: str, queue: str | None) -> None:
    """`kubectl label tj NAME kueue.x-k8s.io/queue-name=QUEUE` (None: `...queue-name-`)."""
    body = {"metadata": {"labels": {kueue.QUEUE_LABEL: queue}}}
    cluster.custom.patch_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name, body)


def queue_of(cluster, namespace: str, name: str) -> str | None:
    return ((cluster.job(namespace, name) or {})["metadata"].get("labels") or {}).get(kueue.QUEUE_LABEL)


def test_the_queue_label_cannot_be_removed_or_added_while_the_job_runs(cluster, unserved_namespace):
    """No operator serves the namespace: the test writes each job's phase, and the chart's policy decides on it."""
    namespace = unserved_namespace
    cluster.create_job(namespace, "admitted", mwms_spec(), labels={kueue.QUEUE_LABEL: "team-a"})
    cluster.create_job(namespace, "unqueued", mwms_spec())
    set_phase(cluster, namespace, "admitted", "Running")
    set_phase(cluster, namespace, "unqueued", "Running")
    label = "metadata.labels[kueue.x-k8s.io/queue-name]: the queue label cannot be"
    for name, queue, verb in (("admitted", None, "removed"), ("admitted", "team-b", "changed"),
                              ("unqueued", "team-a", "added")):  # fmt: skip
        with pytest.raises(ApiException) as refused:
            set_queue(cluster, namespace, name, queue)
        assert refused.value.status == 422
        message = json.loads(refused.value.body)["message"]
        assert f"{label} {verb} while the job is Running" in message, message
        assert "suspend the job first (spec.runPolicy.suspend: true)" in message and "wait until it ends" in message
    assert (queue_of(cluster, namespace, "admitted"), queue_of(cluster, namespace, "unqueued")) == ("team-a", None)
    # Queued (not admitted) or Suspended (its pods gone, its quota given back): the job may move.
    set_phase(cluster, namespace, "admitted", "Queued")
    set_queue(cluster, namespace, "admitted", None)
    set_phase(cluster, namespace, "unqueued", "Suspended")
    set_queue(cluster, namespace, "unqueued", "team-a")
    assert (queue_of(cluster, namespace, "admitted"), queue_of(cluster, namespace, "unqueued")) == (None, "team-a")


def test_a_multikueue_job_admitted_without_a_multikueue_check_has_no_pod_and_says_nothing_will_dispatch_it(
    cluster, namespace, queue
):
    """This cluster's ClusterQueue has no MultiKueue admission check: Kueue admits the Workload here, and no worker
    will ever run the job (issue 46: it did nothing for good, silently). The operator makes the Workload, creates no
    pod, and says why: a NotDispatched condition and a Warning."""
    spec = {**two_workers(), "managedBy": multikueue.MANAGED_BY}
    remote = cluster.create_job(namespace, "remote", spec, **labelled(queue))
    workload = wait_for(lambda: queue.workload(remote), 30, "remote's Workload")
    wait_for(lambda: is_admitted(queue.workload(remote)), 30, "remote admitted here")
    status = cluster.wait_phase(namespace, "remote", "Pending")
    condition = next(c for c in status["conditions"] if c["type"] == "Pending")
    assert condition["reason"] == "NotDispatched" and "has no MultiKueue admission check" in condition["message"]
    assert any(e.get("type") == "Warning" and e.get("reason") == "NotDispatched"
               for e in cluster.events(namespace, "remote"))  # fmt: skip
    assert cluster.pods(namespace, "remote") == {}
    assert workload["metadata"]["ownerReferences"][0]["uid"] == remote["metadata"]["uid"]


def test_a_previous_jobs_workload_is_let_go_and_another_owners_is_never_touched(cluster, namespace, queue):
    """A Workload of an earlier job of the same name (its owner gone, its finalizer left) is finished and let go; a
    Workload labelled like the job's but owned by something else stays as it is."""
    holder = cluster.core.create_namespaced_config_map(namespace, {"metadata": {"name": "holder"}})

    def workload(name: str, owner: dict) -> dict:
        body = {
            "apiVersion": f"{kueue.GROUP}/{kueue.VERSION}",
            "kind": "Workload",
            "metadata": {
                "name": name, "finalizers": [kueue.FINALIZER], "ownerReferences": [{**owner, "controller": True}],
                "labels": {api.LABEL_MANAGED_BY: api.MANAGER, api.LABEL_JOB: "j"},
            },
            "spec": {"queueName": "no-such-queue", "podSets": [{"name": "worker", "count": 1, "template": {
                "spec": {"containers": [{"name": "c", "image": "example/x:1"}]}}}]},
        }  # fmt: skip
        return cluster.custom.create_namespaced_custom_object(kueue.GROUP, kueue.VERSION, namespace, "workloads", body)

    gone_uid = "0b5c5a1e-0000-4000-8000-000000000001"  # an earlier job j's
    earlier = {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": "j", "uid": gone_uid}
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "name": "holder", "uid": holder.metadata.uid}
    workload("trainingjob-j-earlier", earlier)
    workload("not-the-jobs", config_map)
    cluster.create_job(namespace, "j", two_workers(), **labelled(queue))
    read = lambda name: cluster.custom.get_namespaced_custom_object(  # noqa: E731
        kueue.GROUP, kueue.VERSION, namespace, "workloads", name
    )

    def let_go():
        try:
            found = read("trainingjob-j-earlier")
        except ApiException as error:
            return error.status == 404  # finished, finalizer removed, collected
        return not found["metadata"].get("finalizers") and workload_condition(found, "Finished")

    wait_for(let_go, 30, "the earlier job's Workload let go")
    stranger = read("not-the-jobs")
    assert stranger["metadata"]["finalizers"] == [kueue.FINALIZER]
    assert workload_condition(stranger, "Finished") is None
    cluster.custom.patch_namespaced_custom_object(
        kueue.GROUP, kueue.VERSION, namespace, "workloads", "not-the-jobs", {"metadata": {"finalizers": None}}
    )


def test_a_job_queued_preempted_once_and_failed_once_shows_its_goodput_adding_up_to_its_wall_time(
    cluster, namespace, queue, operator
):
    """Issue 47: the parts of a job's wall time (training and what was lost, by cause) add up to it within 1%: in its
    status, in `kubetf status` and in the operator's metrics. Queued behind a job that holds the quota, preempted
    once by a higher one, failed once, then succeeded; its worker 0 reports its steps as the trainer does."""
    from tests.integration.test_progress import token_for

    def resumed(cause: str) -> float:
        return operator.metric_total("kubetf_job_time_to_resume_seconds_count", only={"cause": cause})

    resumed_before = {cause: resumed(cause) for cause in ("preemption", "failure")}
    priority_classes(cluster, **{"kubetf-low": 100, "kubetf-high": 1000})
    cluster.create_job(namespace, "first", two_workers(), **labelled(queue))
    admitted(cluster, namespace, "first", 2, "first admitted", 30)
    cluster.run_all(namespace, "first", 2)
    low = cluster.create_job(namespace, "low", two_workers(), **labelled(queue, **{kueue.PRIORITY_LABEL: "kubetf-low"}))
    cluster.wait_phase(namespace, "low", "Queued")
    time.sleep(2)  # the job waits in its queue: time that must show as queued
    for pod in cluster.live_pods(namespace, "first").values():
        cluster.exit(pod, 0)
    admitted(cluster, namespace, "low", 2, "low admitted", 30)
    cluster.run_all(namespace, "low", 2)
    cluster.wait_phase(namespace, "low", "Running")

    def trains(steps: range) -> None:
        """Worker 0 reports a step every 0.2 s (50 steps a second): time that trains, seconds long each run."""
        pod = cluster.live_pods(namespace, "low")["low-worker-0"]
        token = token_for(cluster, namespace, pod)
        for step in steps:
            report = {"step": step, "steps": 10_000, "stepsPerSecond": 50.0}
            assert operator.report(token, json.dumps(report).encode())[0] == 204
            time.sleep(0.2)

    trains(range(10, 200, 10))
    cluster.create_job(namespace, "high", two_workers(), **labelled(queue, **{kueue.PRIORITY_LABEL: "kubetf-high"}))
    cluster.wait_phase(namespace, "low", "Queued", timeout=40)
    for pod in cluster.live_pods(namespace, "low").values():  # one may be gone already (as in the test above)
        try:
            cluster.exit(pod, 143)
        except ApiException as error:
            if error.status != 404:
                raise
    admitted(cluster, namespace, "high", 2, "high admitted", 30)
    cluster.run_all(namespace, "high", 2)
    for pod in cluster.live_pods(namespace, "high").values():
        cluster.exit(pod, 0)
    admitted(cluster, namespace, "low", 2, "low admitted again", 40)
    cluster.run_all(namespace, "low", 2)
    cluster.wait_phase(namespace, "low", "Running")
    trains(range(100, 300, 10))  # resumed from an earlier checkpoint: 90 steps redone
    cluster.exit(cluster.live_pods(namespace, "low")["low-worker-1"], 1)  # a failure: the group restarts
    wait_for(lambda: cluster.status(namespace, "low")["restarts"].get("failures") == 1, 20, "low's failure counted")
    cluster.wait_pods(namespace, "low", lambda p: len(p) == 2 and all(attempt(x) == "2" for x in p.values()),
                      "low's group recreated", 30)  # fmt: skip
    cluster.run_all(namespace, "low", 2)
    cluster.wait_phase(namespace, "low", "Running")
    trains(range(300, 400, 10))
    for pod in cluster.live_pods(namespace, "low").values():
        cluster.exit(pod, 0)
    status = cluster.wait_phase(namespace, "low", "Succeeded", timeout=30)
    assert (status["restarts"]["disruptions"], status["restarts"]["failures"]) == (1, 1)

    created = st.parse_time(low["metadata"]["creationTimestamp"])
    wall = st.parse_time(status["completionTime"]) - created
    kept = status["goodput"]
    seconds = kept["seconds"]
    assert sum(seconds.values()) == pytest.approx(wall, rel=0.01, abs=1.0), (low["metadata"]["creationTimestamp"],
                                                                            status)  # to the second (RFC 3339)
    assert seconds["queued"] > 0 and seconds.get("restarting", 0) > 0 and seconds.get("training", 0) > 0, kept
    assert seconds.get("redone", 0) > 0, kept
    said = subprocess.run(
        [sys.executable, "-m", "kubetf.cli", "status", "low", "-n", namespace, "--kubeconfig", cluster.kubeconfig],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    line = next(x for x in said.splitlines() if x.strip().startswith("goodput:"))
    assert f"{kept['ratio']:.0%} of" in line and "queued" in line, said

    def metric(name: str, **labels: str) -> float:
        return operator.metric_total(name, only={"namespace": namespace, "job": "low", **labels})

    lost = {cause: metric("kubetf_job_lost_seconds", cause=cause) for cause in seconds if cause != "training"}
    assert metric("kubetf_job_training_seconds") + sum(lost.values()) == pytest.approx(wall, rel=0.01, abs=1.0)
    assert metric("kubetf_job_goodput_ratio") == pytest.approx(kept["ratio"], abs=0.01)
    # one time to resume for each restart, once its first step came (the only restarts on this operator meanwhile)
    resumes = {cause: resumed(cause) - before for cause, before in resumed_before.items()}
    assert resumes == {"preemption": 1, "failure": 1}
