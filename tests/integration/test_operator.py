"""The operator's behaviours (brief items 1-10) against a real API server."""

import random
import time

import pytest
from kubernetes.client.exceptions import ApiException

from kubetf.core import api
from kubetf.core import status as st
from tests.cluster.fixture import wait_for

from .conftest import mwms_spec, replica

PS_SPEC = {
    "strategy": "ParameterServer",
    "replicaSpecs": {"chief": replica(1), "worker": replica(2), "ps": replica(1), "evaluator": replica(1)},
    "checkpoint": {"size": "1Gi"},
}
PS_PODS = ["ps-chief-0", "ps-evaluator-0", "ps-ps-0", "ps-worker-0", "ps-worker-1"]


def attempts(pods):
    return {name: pod["metadata"]["labels"][api.LABEL_ATTEMPT] for name, pod in pods.items()}


def uids(pods):
    return {name: pod["metadata"]["uid"] for name, pod in pods.items()}


def running(cluster, namespace, name, spec, count):
    cluster.create_job(namespace, name, spec)
    cluster.run_all(namespace, name, count)
    return cluster.wait_phase(namespace, name, "Running")


def test_job_creates_exactly_its_owned_children_and_runs(cluster, namespace):
    job = cluster.create_job(namespace, "ps", PS_SPEC)
    pods = cluster.wait_pods(namespace, "ps", lambda p: len(p) == 5, "5 pods")
    assert sorted(pods) == PS_PODS
    for pod in pods.values():
        (owner,) = pod["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
            "TrainingJob",
            "ps",
            job["metadata"]["uid"],
            True,
        )
    service = cluster.core.read_namespaced_service("ps", namespace)
    assert service.spec.cluster_ip == "None"
    assert service.metadata.owner_references[0].uid == job["metadata"]["uid"]
    pvc = cluster.core.read_namespaced_persistent_volume_claim("ps-checkpoint", namespace)
    assert pvc.metadata.owner_references is None  # retainOnDelete defaults to true
    cluster.wait_phase(namespace, "ps", "Pending")  # written after the creates and their event
    cluster.run_all(namespace, "ps", 5)
    status = cluster.wait_phase(namespace, "ps", "Running")
    assert status["ready"] == "5/5"
    assert status["replicaStatuses"]["worker"] == {"active": 2, "ready": 2, "succeeded": 0, "failed": 0}
    (condition,) = [c for c in status["conditions"] if c["status"] == "True"]
    assert condition["type"] == "Running"
    assert condition["observedGeneration"] == 1
    cluster.wait_event(namespace, "ps", "CreatedPods", "Normal")


def test_operator_killed_mid_creation_converges_without_duplicates(cluster, short_lease_operator, namespace):
    operator = short_lease_operator
    rng = random.Random(7)
    names = [f"kill-{i}" for i in range(4)]
    for name in names:
        cluster.create_job(namespace, name, PS_SPEC)
        time.sleep(rng.uniform(0.0, 0.15))  # kill at a different point of each creation
        operator.kill()
        operator.start()
    for name in names:
        pods = cluster.wait_pods(namespace, name, lambda p: len(p) == 5, f"{name} pods", 20)
        assert sorted(pods) == [p.replace("ps-", f"{name}-", 1) for p in PS_PODS]
        assert set(attempts(pods).values()) == {"0"}
        status = wait_for(
            lambda n=name: (
                (s := cluster.status(namespace, n)).get("tasks")
                and all(t["state"] == "Created" for t in s["tasks"].values())
                and s
            ),
            30,
            f"{name} converged",
        )
        assert status["restarts"]["total"] == 0
        assert {t["state"] for t in status["tasks"].values()} == {"Created"}
    services = cluster.core.list_namespaced_service(namespace).items
    assert sorted(s.metadata.name for s in services) == sorted(names)


def test_mwms_eviction_restarts_the_group_as_a_disruption(cluster, namespace):
    running(cluster, namespace, "mw", mwms_spec(backoffLimit=0), 3)
    before = uids(cluster.pods(namespace, "mw"))
    evicted = cluster.pods(namespace, "mw")["mw-worker-1"]
    # What the eviction API and the kubelet leave on a pod: the DisruptionTarget condition and a SIGTERM exit.
    disruption = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "EvictionByEvictionAPI",
        "message": "Eviction API: evicting",
    }
    cluster.exit(evicted, 143, conditions=(disruption,))
    pods = cluster.wait_pods(
        namespace, "mw", lambda p: len(p) == 3 and set(attempts(p).values()) == {"1"}, "the group at attempt 1"
    )
    assert all(uids(pods)[n] != before[n] for n in pods)
    status = cluster.status(namespace, "mw")
    assert status["restarts"]["disruptions"] == 1
    assert status["restarts"]["failures"] == 0
    assert "EvictionByEvictionAPI" in status["restarts"]["lastReason"]
    cluster.run_all(namespace, "mw", 3)
    cluster.wait_phase(namespace, "mw", "Running")


def test_mwms_failures_count_until_backoff_limit_then_fail_and_clean(cluster, namespace):
    running(cluster, namespace, "mf", mwms_spec(backoffLimit=1), 3)
    cluster.exit(cluster.pods(namespace, "mf")["mf-worker-0"], 1)
    wait_for(
        lambda: (
            set(attempts(cluster.live_pods(namespace, "mf")).values()) == {"1"}
            and len(cluster.live_pods(namespace, "mf")) == 3
        ),
        15,
        "group restarted after the failure",
    )
    assert cluster.status(namespace, "mf")["restarts"]["failures"] == 1
    cluster.run_all(namespace, "mf", 3)
    cluster.wait_phase(namespace, "mf", "Running")
    cluster.exit(cluster.pods(namespace, "mf")["mf-worker-1"], 1)
    status = cluster.wait_phase(namespace, "mf", "Failed")
    assert status["reason"] == "BackoffLimitExceeded"
    (current,) = [c for c in status["conditions"] if c["status"] == "True"]
    assert (current["type"], current["message"]) == ("Failed", "mf-worker-1: exit code 1 after 1 restart(s)")
    # cleanPodPolicy Running: running pods stopped, the failed pod kept for its logs.
    wait_for(lambda: sorted(cluster.live_pods(namespace, "mf")) == ["mf-worker-1"], 10, "running pods cleaned")
    cluster.wait_event(namespace, "mf", "BackoffLimitExceeded")


def test_ps_worker_deleted_is_recreated_alone(cluster, namespace):
    running(cluster, namespace, "ps", PS_SPEC, 5)
    before = cluster.pods(namespace, "ps")
    cluster.delete_pod(before["ps-worker-1"])
    old_uid = before["ps-worker-1"]["metadata"]["uid"]
    pods = cluster.wait_pods(
        namespace, "ps", lambda p: uids(p).get("ps-worker-1") not in (None, old_uid), "a new ps-worker-1"
    )
    assert attempts(pods)["ps-worker-1"] == "1"
    assert {n: u for n, u in uids(pods).items() if n != "ps-worker-1"} == {
        n: u for n, u in uids(before).items() if n != "ps-worker-1"
    }
    assert cluster.status(namespace, "ps")["restarts"]["disruptions"] == 1


def test_ps_failure_recreates_it_and_restarts_the_chief(cluster, namespace):
    running(cluster, namespace, "ps", {**PS_SPEC, "runPolicy": {"backoffSeconds": 0}}, 5)
    before = cluster.pods(namespace, "ps")
    cluster.exit(before["ps-ps-0"], 1)
    pods = cluster.wait_pods(
        namespace,
        "ps",
        lambda p: len(p) == 5 and attempts(p)["ps-ps-0"] == "1" and attempts(p)["ps-chief-0"] == "1",
        "ps and chief recreated",
    )
    for unchanged in ("ps-worker-0", "ps-worker-1", "ps-evaluator-0"):
        assert pods[unchanged]["metadata"]["uid"] == before[unchanged]["metadata"]["uid"]
    assert cluster.status(namespace, "ps")["restarts"]["failures"] == 1


# 137 with nobody deleting the pod: exit codes 128-255 are retryable under ExitCode.
@pytest.mark.parametrize("code,phase", [(2, "Failed"), (137, "Restarting")])
def test_exit_code_restart_policy(cluster, namespace, code, phase):
    spec = mwms_spec()
    spec["replicaSpecs"]["worker"]["restartPolicy"] = "ExitCode"
    running(cluster, namespace, "ec", spec, 3)
    cluster.exit(cluster.pods(namespace, "ec")["ec-worker-0"], code)
    status = cluster.wait_phase(namespace, "ec", phase)
    if code == 2:
        assert status["reason"] == "PermanentFailure"
    else:
        assert status["restarts"]["failures"] == 1
        assert status["restarts"]["disruptions"] == 0


def test_chief_success_stops_the_rest_and_never_reruns_completed_workers(cluster, namespace):
    running(cluster, namespace, "ps", {**PS_SPEC, "runPolicy": {"evaluatorGraceSeconds": 3}}, 5)
    cluster.exit(cluster.pods(namespace, "ps")["ps-worker-0"], 0)
    wait_for(lambda: cluster.status(namespace, "ps")["tasks"]["worker-0"]["state"] == "Succeeded", 10, "worker-0 done")
    cluster.delete_pod(cluster.pods(namespace, "ps")["ps-worker-0"])
    cluster.exit(cluster.pods(namespace, "ps")["ps-chief-0"], 0)
    status = cluster.wait_phase(namespace, "ps", "Succeeded")
    assert status["completionTime"]
    # The ps and workers are stopped at once; the evaluator, which may still be evaluating the last checkpoint, only
    # by its grace's own timer (this one never exits): not before completionTime + 3 s.
    wait_for(lambda: sorted(cluster.live_pods(namespace, "ps")) == ["ps-chief-0"], 20, "running pods stopped")
    assert time.time() >= st.parse_time(status["completionTime"]) + 3
    assert cluster.status(namespace, "ps")["phase"] == "Succeeded"
    # Every pod's deletion brings the job back to a reconcile: watched until they are all gone and a second more,
    # no pod of the job may be created (a wrong operator would re-create the completed worker then).
    assert cluster.pods_created(namespace, "ps", until=lambda: sorted(cluster.pods(namespace, "ps")) == ["ps-chief-0"],
                                then=1.0) == []  # fmt: skip


def test_active_deadline_fires_without_any_other_event(cluster, namespace):
    # Long enough for the job to be seen Running first on a busy machine (with 4 s, a reconcile held up 8 s once saw
    # the deadline before the pods' start).
    running(cluster, namespace, "dl", mwms_spec(activeDeadlineSeconds=10), 3)
    status = cluster.wait_phase(namespace, "dl", "Failed", timeout=20)  # nothing else happens to the job meanwhile
    assert status["reason"] == "DeadlineExceeded"


def test_startup_timeout_fails_a_job_stuck_pending(cluster, namespace):
    cluster.create_job(namespace, "st", mwms_spec(startupTimeoutSeconds=3))
    status = cluster.wait_phase(namespace, "st", "Failed", timeout=30)
    assert status["reason"] == "StartupTimeout"
    assert "startupTimeoutSeconds=3" in next(c["message"] for c in status["conditions"] if c["status"] == "True")


def test_ttl_deletes_the_finished_job(cluster, namespace):
    running(cluster, namespace, "ttl", mwms_spec(ttlSecondsAfterFinished=2), 3)
    cluster.exit(cluster.pods(namespace, "ttl")["ttl-chief-0"], 0)
    cluster.wait_phase(namespace, "ttl", "Succeeded")
    wait_for(lambda: cluster.job(namespace, "ttl") is None, 10, "the job deleted by its TTL")


def test_suspend_deletes_pods_keeps_counters_and_resume_recreates(cluster, namespace):
    running(cluster, namespace, "sus", mwms_spec(), 3)
    cluster.delete_pod(cluster.pods(namespace, "sus")["sus-worker-0"])
    wait_for(lambda: cluster.status(namespace, "sus").get("restarts", {}).get("disruptions") == 1, 10, "a disruption")
    cluster.patch_spec(namespace, "sus", {"runPolicy": {"suspend": True}})
    cluster.wait_phase(namespace, "sus", "Suspended")
    wait_for(lambda: cluster.pods(namespace, "sus") == {}, 10, "pods deleted on suspend")
    cluster.patch_spec(namespace, "sus", {"runPolicy": {"suspend": False}})
    wait_for(lambda: len(cluster.live_pods(namespace, "sus")) == 3, 10, "pods recreated on resume")
    status = cluster.status(namespace, "sus")
    assert status["restarts"]["disruptions"] == 1
    assert status["restarts"]["failures"] == 0


def test_the_crd_rejects_bad_jobs_before_the_operator_sees_them(cluster, namespace):
    spec = mwms_spec()
    spec["replicaSpecs"]["chief"]["replicas"] = 2
    with pytest.raises(ApiException) as error:
        cluster.create_job(namespace, "two-chiefs", spec)
    assert error.value.status == 422
    assert "at most one chief" in error.value.body
    spec = mwms_spec()
    spec["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0].pop("image")
    with pytest.raises(ApiException) as error:
        cluster.create_job(namespace, "no-image", spec)
    assert "image" in error.value.body
    with pytest.raises(ApiException) as error:
        cluster.create_job(namespace, "n" * 60, mwms_spec())
    assert "too long" in error.value.body


def test_a_job_the_operator_cannot_run_fails_with_a_reason_and_no_pods(cluster, namespace):
    spec = mwms_spec()
    spec["replicaSpecs"]["worker"]["template"]["spec"]["restartPolicy"] = "Always"
    cluster.create_job(namespace, "bad", spec)
    status = cluster.wait_phase(namespace, "bad", "Failed")
    assert status["reason"] == "InvalidSpec"
    assert cluster.pods(namespace, "bad") == {}
    assert cluster.core.list_namespaced_service(namespace).items == []


def test_the_topology_changes_only_while_suspended(cluster, namespace):
    running(cluster, namespace, "grow", mwms_spec(), 3)
    with pytest.raises(ApiException) as error:
        cluster.patch_spec(namespace, "grow", {"replicaSpecs": {"worker": {"replicas": 3}}})
    assert error.value.status == 422
    assert "only while the job is suspended" in error.value.body
    cluster.patch_spec(namespace, "grow", {"runPolicy": {"suspend": True}})
    cluster.wait_phase(namespace, "grow", "Suspended")
    cluster.patch_spec(namespace, "grow", {"replicaSpecs": {"worker": {"replicas": 3}}})
    cluster.patch_spec(namespace, "grow", {"runPolicy": {"suspend": False}})
    pods = cluster.wait_pods(namespace, "grow", lambda p: len(p) == 4, "4 pods after the resize")
    assert sorted(pods) == ["grow-chief-0", "grow-worker-0", "grow-worker-1", "grow-worker-2"]
