"""TrainingJobs under a real Kueue (its webhook, its controller, its quota) on the real API server. Pods are never
scheduled here: Kueue gates and ungates them, the tests play the kubelet."""

from __future__ import annotations

import json
import threading
import time

import pytest
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from kubetf.core import kueue
from tests.cluster.fixture import wait_for
from tests.cluster.queues import Queue, admitted, finish_jobs, make_flavor, priority_classes

from .conftest import UNSCHEDULED, mwms_spec, ps_spec, replica


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


def test_a_job_waits_queued_with_no_pod_running_until_the_quota_frees(cluster, namespace, queue):
    spec = gpu_job(mwms_spec(), gpus=1)  # 1 chief + 2 workers of 1 GPU: 3 > 2, never admitted whole
    big = cluster.create_job(namespace, "big", spec, **labelled(queue))
    cluster.wait_phase(namespace, "big", "Queued")
    small = gpu_job({"strategy": "MultiWorkerMirrored", "replicaSpecs": {"worker": replica(2)}})
    cluster.create_job(namespace, "small", small, **labelled(queue))

    def says_why():
        message = condition(cluster, namespace, "big").get("message", "")
        return "insufficient" in message and message

    message = wait_for(says_why, 40, "big's condition to carry Kueue's reason")
    assert f"LocalQueue {queue.local} (ClusterQueue {queue.name})" in message
    pods = cluster.pods(namespace, "big")
    assert len(pods) == 3 and all(kueue.is_gated(p) for p in pods.values())  # all-or-nothing: none runs
    assert cluster.wait_phase(namespace, "big", "Queued")["reason"] == "Queued"
    # The small one fits: admitted whole, ungated, running.
    admitted(cluster, namespace, "small", 2, "small's pods ungated", 30)
    cluster.run_all(namespace, "small", 2)
    cluster.wait_phase(namespace, "small", "Running")
    wait_for(lambda: queue.gpus_in_use() == 2, 10, "the ClusterQueue to count small's 2 GPUs")
    assert queue.workload(big)["metadata"]["name"] == kueue.group_name(big)


def test_preemption_by_kueue_is_a_disruption_and_the_job_queues_again(cluster, namespace, queue):
    priority_classes(cluster, **{"kubetf-low": 100, "kubetf-high": 1000})
    spec = gpu_job({"strategy": "MultiWorkerMirrored", "replicaSpecs": {"worker": replica(2)}})
    cluster.create_job(namespace, "low", spec, **labelled(queue, **{kueue.PRIORITY_LABEL: "kubetf-low"}))
    admitted(cluster, namespace, "low", 2, "low admitted", 30)
    cluster.run_all(namespace, "low", 2)
    cluster.wait_phase(namespace, "low", "Running")
    group = {p["metadata"]["labels"][kueue.GROUP_LABEL] for p in cluster.pods(namespace, "low").values()}
    cluster.create_job(namespace, "high", spec, **labelled(queue, **{kueue.PRIORITY_LABEL: "kubetf-high"}))
    status = cluster.wait_phase(namespace, "low", "Queued", timeout=40)
    assert status["restarts"]["disruptions"] == 1 and status["restarts"]["failures"] == 0
    assert "by Kueue" in status["restarts"]["lastReason"]
    admitted(cluster, namespace, "high", 2, "high admitted", 30)
    # low's new pods wait, gated, in the same group (its Workload kept its place); its counters are kept.
    pods = cluster.wait_pods(namespace, "low", lambda p: len(p) == 2, "low's new pods", 30)
    assert all(kueue.is_gated(p) for p in pods.values())
    assert {p["metadata"]["labels"][kueue.GROUP_LABEL] for p in pods.values()} == group
    assert {p["metadata"]["labels"]["kubetf.io/attempt"] for p in pods.values()} == {"1"}
    # high finishes: low is admitted again.
    cluster.run_all(namespace, "high", 2)
    for pod in cluster.live_pods(namespace, "high").values():
        cluster.exit(pod, 0)
    cluster.wait_phase(namespace, "high", "Succeeded")
    admitted(cluster, namespace, "low", 2, "low admitted again", 40)
    cluster.run_all(namespace, "low", 2)
    status = cluster.wait_phase(namespace, "low", "Running")
    assert status["restarts"]["total"] == 1


def test_an_evicted_worker_restarts_the_group_under_the_same_admission(cluster, namespace, queue):
    job = cluster.create_job(namespace, "mwms", gpu_job(mwms_spec(), gpus=0), **labelled(queue))
    admitted(cluster, namespace, "mwms", 3, "admitted", 30)
    cluster.run_all(namespace, "mwms", 3)
    cluster.wait_phase(namespace, "mwms", "Running")
    admitted_by = queue.workload(job)["metadata"]["uid"]
    seen: dict[str, set] = {"phases": set(), "admitted": set()}
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            seen["phases"].add(cluster.status(namespace, "mwms").get("phase"))
            workload = queue.workload(job) or {}
            admitted = any(
                c["type"] == "Admitted" and c["status"] == "True"
                for c in workload.get("status", {}).get("conditions", [])
            )
            seen["admitted"].add((workload.get("metadata", {}).get("uid"), admitted))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        worker = cluster.live_pods(namespace, "mwms")["mwms-worker-1"]
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        evicted = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
        cluster.set_status(worker, {"conditions": [{**evicted, "lastTransitionTime": now}]})
        cluster.delete_pod(worker)
        wait_for(lambda: all(attempt(p) == "1" for p in cluster.live_pods(namespace, "mwms").values()), 30, "new group")
        pods = admitted(cluster, namespace, "mwms", 3, "the whole group recreated and ungated", 30)
        cluster.run_all(namespace, "mwms", 3)
        status = cluster.wait_phase(namespace, "mwms", "Running")
    finally:
        stop.set()
        watcher.join()
    events = [(e["reason"], e["message"]) for e in cluster.events(namespace, "mwms")]
    assert "Queued" not in seen["phases"], events
    assert seen["admitted"] == {(admitted_by, True)}, "the Workload was replaced or lost its admission"
    assert status["restarts"]["disruptions"] == 1
    assert len(pods) == 3


def test_a_finished_ps_job_gives_its_quota_back_at_once(cluster, namespace, queue):
    cluster.create_job(namespace, "ps", gpu_job(ps_spec(), gpus=0), **labelled(queue))
    admitted(cluster, namespace, "ps", 4, "admitted", 30)
    cluster.run_all(namespace, "ps", 4)
    cluster.wait_phase(namespace, "ps", "Running")
    wait_for(lambda: queue.cq()["status"].get("reservingWorkloads") == 1, 10, "the ClusterQueue to count the job")
    cluster.exit(cluster.live_pods(namespace, "ps")["ps-chief-0"], 0)
    cluster.wait_phase(namespace, "ps", "Succeeded")
    ended = time.monotonic()
    # The ps and workers never exit by themselves: the operator stops them, marked so that Kueue ends the group.
    wait_for(lambda: queue.cq()["status"].get("reservingWorkloads") == 0, 10, "the ClusterQueue's usage back to 0")
    print(f"\nquota released {time.monotonic() - ended:.2f}s after the job succeeded")


@pytest.mark.parametrize("how", ["delete", "suspend"])
def test_deleting_or_suspending_an_admitted_job_releases_its_quota(cluster, namespace, queue, how):
    spec = gpu_job({"strategy": "MultiWorkerMirrored", "replicaSpecs": {"worker": replica(2)}})
    job = cluster.create_job(namespace, "j", spec, **labelled(queue))
    admitted(cluster, namespace, "j", 2, "admitted", 30)
    cluster.run_all(namespace, "j", 2)
    cluster.wait_phase(namespace, "j", "Running")
    wait_for(lambda: queue.gpus_in_use() == 2, 10, "the ClusterQueue to count the job's 2 GPUs")
    if how == "delete":
        cluster.custom.delete_namespaced_custom_object("kubetf.io", "v1alpha1", namespace, "trainingjobs", "j")
    else:
        cluster.patch_spec(namespace, "j", {"runPolicy": {"suspend": True}})
    wait_for(lambda: queue.gpus_in_use() == 0, 15, lambda: f"the quota released: {queue.explain(job)}")
    wait_for(lambda: not cluster.pods(namespace, "j"), 15, "the pods gone, none stuck on Kueue's finalizer")
    if how == "suspend":
        cluster.wait_phase(namespace, "j", "Suspended")
        cluster.patch_spec(namespace, "j", {"runPolicy": {"suspend": False}})
        admitted(cluster, namespace, "j", 2, "admitted again after the resume", 30)
        assert queue.workload(job) is not None


def test_a_local_queue_that_does_not_exist_is_said(cluster, namespace, kueue_installed):
    cluster.create_job(namespace, "lost", mwms_spec(), labels={kueue.QUEUE_LABEL: "no-such-queue"})
    try:
        status = cluster.wait_phase(namespace, "lost", "Queued")
        assert status["reason"] == "LocalQueueNotFound"
        assert "LocalQueue no-such-queue does not exist" in condition(cluster, namespace, "lost")["message"]
        cluster.wait_event(namespace, "lost", "LocalQueueNotFound")
        assert not any(p["status"].get("phase") == "Running" for p in cluster.pods(namespace, "lost").values())
    finally:
        finish_jobs(cluster, namespace)


def test_bad_queue_labels_and_managed_by_are_refused_at_apply_time(cluster, namespace):
    with pytest.raises(ApiException) as refused:
        cluster.create_job(namespace, "bad", mwms_spec(), labels={kueue.QUEUE_LABEL: "Team_A"})
    assert "is not a LocalQueue name" in json.loads(refused.value.body)["message"]
    with pytest.raises(ApiException) as refused:
        cluster.create_job(namespace, "bad", {**mwms_spec(), "managedBy": "someone/else"})
    assert 'spec.managedBy: Unsupported value: "someone/else"' in json.loads(refused.value.body)["message"]


def test_a_job_managed_by_multikueue_is_left_alone(cluster, namespace, kueue_installed):
    spec = {**mwms_spec(), "managedBy": kueue.MANAGED_BY_MULTIKUEUE}
    cluster.create_job(namespace, "remote", spec, labels={kueue.QUEUE_LABEL: "team-a"})
    cluster.create_job(namespace, "local", mwms_spec())
    cluster.wait_phase(namespace, "local", "Pending")  # the operator is at work: the other job it leaves alone
    assert cluster.pods(namespace, "remote") == {} and cluster.status(namespace, "remote") == {}


def plain_pod_group(cluster, namespace: str, queue: Queue, group: str) -> dict:
    """Another team's plain pod group of one pod, in Kueue's own way (no TrainingJob): Kueue's webhook gates it,
    Kueue makes its Workload `group` and admits it; the test plays the kubelet."""
    pod = {
        "metadata": {
            "name": f"{group}-0",
            "labels": {kueue.QUEUE_LABEL: queue.local, kueue.GROUP_LABEL: group},
            "annotations": {kueue.TOTAL_ANNOTATION: "1"},
        },
        "spec": {"schedulerName": UNSCHEDULED, "containers": [{"name": "main", "image": "example/finetune:1"}]},
    }
    cluster.core.create_namespaced_pod(namespace, pod)

    def ungated():
        name = pod["metadata"]["name"]
        found = cluster.raw(cluster.core.read_namespaced_pod(name, namespace, _preload_content=False))
        return not kueue.is_gated(found) and found

    running = wait_for(ungated, 30, f"the pod group {group} admitted")
    cluster.run(running)
    return running


class WorkloadDeletions:
    """The Workloads deleted in the namespace from now until `stop` (a watch: a negative check over its whole
    window; `stop` fails the test when the watch ended early, and a deletion may have gone unseen)."""

    def __init__(self, cluster, namespace: str) -> None:
        self.deleted: list[str] = []
        self.ended_early: BaseException | str | None = None
        self.stopping = threading.Event()
        listed = cluster.custom.list_namespaced_custom_object(kueue.GROUP, kueue.VERSION, namespace, "workloads")
        self.stream = watch.Watch()
        args = (cluster.custom.list_namespaced_custom_object, kueue.GROUP, kueue.VERSION, namespace, "workloads")
        version = listed["metadata"]["resourceVersion"]
        self.thread = threading.Thread(target=self._record, args=(args, version), daemon=True)
        self.thread.start()

    def _record(self, args: tuple, version: str) -> None:
        try:
            for event in self.stream.stream(*args, resource_version=version, timeout_seconds=300):
                if event["type"] == "DELETED":
                    self.deleted.append(event["object"]["metadata"]["name"])
            if not self.stopping.is_set():
                self.ended_early = "the watch timed out"
        except Exception as error:
            if not self.stopping.is_set():
                self.ended_early = error

    def stop(self) -> list[str]:
        self.stopping.set()
        self.stream.stop()
        assert self.ended_early is None, f"the Workloads' watch ended before the window did: {self.ended_early}"
        return self.deleted


def test_another_teams_pod_group_named_like_the_job_and_its_pod_survive_the_jobs_end(cluster, namespace, queue):
    # The review's finding: a job `bert` that ended deleted the Workload `bert-finetune` (any `<job>-<8 characters>`
    # was taken for its own group), and Kueue then took the other team's running pod away.
    foreign = plain_pod_group(cluster, namespace, queue, "bert-finetune")
    deletions = WorkloadDeletions(cluster, namespace)
    try:
        job = cluster.create_job(namespace, "bert", {"strategy": "MultiWorkerMirrored", "replicaSpecs": {
            "worker": replica(1)}}, **labelled(queue))  # fmt: skip
        admitted(cluster, namespace, "bert", 1, "bert admitted", 30)
        cluster.run_all(namespace, "bert", 1)
        cluster.wait_phase(namespace, "bert", "Running")
        cluster.exit(cluster.live_pods(namespace, "bert")["bert-worker-0"], 0)
        cluster.wait_phase(namespace, "bert", "Succeeded")
        cluster.custom.delete_namespaced_custom_object("kubetf.io", "v1alpha1", namespace, "trainingjobs", "bert")
        own = kueue.group_name(job)
        wait_for(lambda: not cluster.pods(namespace, "bert"), 30, "bert's pods gone")
        wait_for(lambda: queue.workload(job) is None, 30, f"bert's own Workload {own} gone")
        # The job's farewell is done once its pods' DELETED events were handled; a later one would find nothing.
        survivor = cluster.raw(cluster.core.read_namespaced_pod(foreign["metadata"]["name"], namespace,
                                                               _preload_content=False))  # fmt: skip
        kept = cluster.custom.get_namespaced_custom_object(
            kueue.GROUP, kueue.VERSION, namespace, "workloads", "bert-finetune"
        )
    finally:
        deleted = deletions.stop()
        # The other team's pod goes at the end of the test (its own, not the operator's: the test plays that team).
        name = foreign["metadata"]["name"]
        cluster.core.patch_namespaced_pod(name, namespace, {"metadata": {"finalizers": None}})
        cluster.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    assert "bert-finetune" not in deleted, deleted
    assert not kept["metadata"].get("deletionTimestamp")
    assert survivor["metadata"]["uid"] == foreign["metadata"]["uid"]
    assert not survivor["metadata"].get("deletionTimestamp") and survivor["status"]["phase"] == "Running"


def test_two_jobs_whose_names_share_54_characters_keep_their_own_workloads(cluster, namespace, queue):
    names = ["x" * 54 + "a", "x" * 54 + "b"]  # 55 characters: a group name keeps 54 of them (and 8 of the uid)
    # A chief alone: its pod name, {job}-chief-0, is the longest that fits 63 characters.
    spec = {"strategy": "MultiWorkerMirrored", "replicaSpecs": {"chief": replica(1)}}
    jobs = {name: cluster.create_job(namespace, name, spec, **labelled(queue)) for name in names}
    for name in names:
        admitted(cluster, namespace, name, 1, f"{name} admitted", 30)
        cluster.run_all(namespace, name, 1)
        cluster.wait_phase(namespace, name, "Running")
    kept = queue.workload(jobs[names[1]])
    deletions = WorkloadDeletions(cluster, namespace)
    try:
        cluster.custom.delete_namespaced_custom_object("kubetf.io", "v1alpha1", namespace, "trainingjobs", names[0])
        wait_for(lambda: not cluster.pods(namespace, names[0]), 30, "the first job's pods gone")
        wait_for(lambda: queue.workload(jobs[names[0]]) is None, 30, "the first job's Workload gone")
    finally:
        deleted = deletions.stop()
    assert kueue.group_name(jobs[names[1]]) not in deleted, deleted
    assert queue.workload(jobs[names[1]])["metadata"]["uid"] == kept["metadata"]["uid"]
    assert cluster.status(namespace, names[1])["phase"] == "Running"
    assert len(cluster.live_pods(namespace, names[1])) == 1
