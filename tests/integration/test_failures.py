"""Failures the rude way (issue 9), on a real API server: old pods that will not go away, a name used again, signals
nobody sent, a kubelet that refuses a pod, waits that end by themselves.

A finalizer stands in for a kubelet that never confirms a deletion: the pod stays terminating until it is removed.
"""

import time

import pytest
from kubernetes.client.exceptions import ApiException

from kubetf.core import api
from kubetf.core import status as st
from kubetf.core.config import DEFAULTS
from tests.cluster.fixture import wait_for

from .conftest import mwms_spec

HOLD = "kubetf.io/test-hold"


def running(cluster, namespace, name, spec, count):
    cluster.create_job(namespace, name, spec)
    cluster.run_all(namespace, name, count)
    return cluster.wait_phase(namespace, name, "Running")


def hold(cluster, pod):
    meta = pod["metadata"]
    cluster.core.patch_namespaced_pod(meta["name"], meta["namespace"], {"metadata": {"finalizers": [HOLD]}})


def release(cluster, namespace, job):
    for name, pod in cluster.pods(namespace, job).items():
        if HOLD in (pod["metadata"].get("finalizers") or []):
            cluster.core.patch_namespaced_pod(name, namespace, {"metadata": {"finalizers": None}})


def attempts(pods):
    return {name: pod["metadata"]["labels"][api.LABEL_ATTEMPT] for name, pod in pods.items()}


def warnings(cluster, namespace, name, reason):
    return [e for e in cluster.events(namespace, name) if e["type"] == "Warning" and e["reason"] == reason]


def test_a_new_group_waits_until_every_old_member_is_gone_and_a_stuck_one_is_reported(cluster, namespace):
    spec = mwms_spec()
    for role in ("chief", "worker"):  # grace 0: a held pod counts as stuck 15 s after its deletion
        spec["replicaSpecs"][role]["template"]["spec"]["terminationGracePeriodSeconds"] = 0
    running(cluster, namespace, "gb", spec, 3)
    pods = cluster.pods(namespace, "gb")
    hold(cluster, pods["gb-worker-0"])  # its kubelet will never confirm
    cluster.delete_pod(pods["gb-worker-1"])  # the disruption
    stuck = wait_for(
        lambda: (s := cluster.status(namespace, "gb")).get("reason") == "PodStuckTerminating" and s,
        DEFAULTS.stuck_margin + 15,
        "the job to report the old worker stuck terminating",
    )
    assert "gb-worker-0 is still terminating" in st.current_condition(stuck)["message"]
    assert stuck["restarts"]["disruptions"] == 1 and stuck["restarts"]["failures"] == 0
    assert warnings(cluster, namespace, "gb", "PodStuckTerminating")
    # The new chief and worker-1 had their own old pods gone long ago, yet none of the new group exists.
    assert sorted(cluster.pods(namespace, "gb")) == ["gb-worker-0"]
    release(cluster, namespace, "gb")
    pods = cluster.wait_pods(
        namespace, "gb", lambda p: len(p) == 3 and set(attempts(p).values()) == {"1"}, "the new group, whole"
    )
    cluster.run_all(namespace, "gb", 3)
    status = cluster.wait_phase(namespace, "gb", "Running")
    assert status["restarts"]["total"] == 1


def test_a_job_recreated_under_the_same_name_never_adopts_the_old_jobs_pods(cluster, namespace):
    old = running(cluster, namespace, "rc", mwms_spec(maxDisruptions=0), 3)
    for pod in cluster.pods(namespace, "rc").values():
        hold(cluster, pod)
    old_uid = cluster.job(namespace, "rc")["metadata"]["uid"]
    cluster.custom.delete_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, "rc")
    wait_for(lambda: cluster.job(namespace, "rc") is None, 20, "the old job gone")
    wait_for(
        lambda: all(p["metadata"].get("deletionTimestamp") for p in cluster.pods(namespace, "rc").values()),
        30,
        "the garbage collector deleting the old pods",
    )
    created = cluster.create_job(namespace, "rc", mwms_spec(maxDisruptions=0))
    assert created["metadata"]["uid"] != old_uid
    status = wait_for(
        lambda: (
            "waiting for the old pod"
            in (st.current_condition(s := cluster.status(namespace, "rc")) or {}).get("message", "")
            and s
        ),
        20,
        "the new job to wait for the old pods",
    )
    # With maxDisruptions 0, counting the old pods' deletion would have failed the job.
    assert status["phase"] == "Pending" and status["restarts"]["total"] == 0, status
    assert old["restarts"]["total"] == 0
    release(cluster, namespace, "rc")
    pods = cluster.wait_pods(namespace, "rc", lambda p: len(p) == 3, "the new job's own pods")
    assert {p["metadata"]["ownerReferences"][0]["uid"] for p in pods.values()} == {created["metadata"]["uid"]}
    cluster.run_all(namespace, "rc", 3)
    assert cluster.wait_phase(namespace, "rc", "Running")["restarts"]["total"] == 0


@pytest.mark.parametrize(
    "situation,deleted_first,counter",
    [
        ("SIGKILL and nobody deleted the pod (a liveness probe, the program)", False, "failures"),
        ("SIGTERM after someone deleted the pod", True, "disruptions"),
    ],
)
def test_exit_137_or_143_is_a_disruption_only_when_someone_stopped_the_pod(
    cluster, namespace, situation, deleted_first, counter
):
    running(cluster, namespace, "sg", mwms_spec(), 3)
    pod = cluster.pods(namespace, "sg")["sg-worker-0"]
    if deleted_first:
        hold(cluster, pod)
        cluster.delete_pod(pod)
        pod = cluster.pods(namespace, "sg")["sg-worker-0"]
    cluster.exit(pod, 143 if deleted_first else 137)
    status = wait_for(
        lambda: (s := cluster.status(namespace, "sg"))["restarts"]["total"] == 1 and s, 15, "the restart counted"
    )
    assert status["restarts"][counter] == 1, situation
    release(cluster, namespace, "sg")
    cluster.wait_pods(namespace, "sg", lambda p: set(attempts(p).values()) == {"1"} and len(p) == 3, "the new group")


def test_a_pod_the_kubelet_refused_at_admission_is_a_disruption(cluster, namespace):
    running(cluster, namespace, "ad", mwms_spec(backoffLimit=0), 3)
    pod = cluster.pods(namespace, "ad")["ad-worker-1"]
    # What a kubelet whose device plugin lost its GPUs reports: Failed, no container ever ran.
    cluster.set_status(
        pod,
        {
            "phase": "Failed",
            "reason": "OutOfnvidia.com/gpu",
            "message": "Node didn't have enough resource: nvidia.com/gpu",
        },
    )
    status = wait_for(
        lambda: (s := cluster.status(namespace, "ad"))["restarts"]["total"] == 1 and s, 15, "the restart counted"
    )
    assert status["restarts"]["disruptions"] == 1 and status["restarts"]["failures"] == 0
    assert "OutOfnvidia.com/gpu" in status["restarts"]["lastReason"]
    assert status["phase"] == "Restarting"  # backoffLimit 0 untouched


def test_an_mwms_group_restart_reruns_a_worker_that_had_finished(cluster, namespace):
    spec = mwms_spec()
    spec["successPolicy"] = "AllWorkers"
    running(cluster, namespace, "fin", spec, 3)
    cluster.exit(cluster.pods(namespace, "fin")["fin-worker-1"], 0)
    wait_for(lambda: cluster.status(namespace, "fin")["tasks"]["worker-1"]["state"] == "Succeeded", 10, "worker-1 done")
    cluster.delete_pod(cluster.pods(namespace, "fin")["fin-chief-0"])
    pods = cluster.wait_pods(
        namespace, "fin", lambda p: len(p) == 3 and set(attempts(p).values()) == {"1"}, "the whole group again"
    )
    assert sorted(pods) == ["fin-chief-0", "fin-worker-0", "fin-worker-1"]
    cluster.run_all(namespace, "fin", 3)
    status = cluster.wait_phase(namespace, "fin", "Running")
    assert status["tasks"]["worker-1"] == {"attempt": 1, "state": "Created"}


def test_a_finished_job_and_a_suspended_one_count_only_the_pods_they_keep(cluster, namespace):
    running(cluster, namespace, "done", mwms_spec(), 3)
    cluster.exit(cluster.pods(namespace, "done")["done-chief-0"], 0)
    status = cluster.wait_phase(namespace, "done", "Succeeded")
    assert status["ready"] == "0/3"
    assert status["replicaStatuses"]["worker"]["active"] == 0
    assert status["replicaStatuses"]["chief"]["succeeded"] == 1

    running(cluster, namespace, "susp", mwms_spec(), 3)
    cluster.patch_spec(namespace, "susp", {"runPolicy": {"suspend": True}})
    status = cluster.wait_phase(namespace, "susp", "Suspended")
    assert status["ready"] == "0/3"
    assert all(counts["active"] == 0 for counts in status["replicaStatuses"].values())


def test_the_checkpoint_cannot_change_while_the_job_exists(cluster, namespace):
    spec = mwms_spec()
    spec["checkpoint"] = {"size": "1Gi", "mountPath": "/ckpt"}
    cluster.create_job(namespace, "ck", spec)
    with pytest.raises(ApiException) as refused:
        cluster.patch_spec(namespace, "ck", {"checkpoint": {"mountPath": "/elsewhere"}})
    assert refused.value.status == 422
    assert "spec.checkpoint: Invalid value" in refused.value.body
    assert "checkpoint cannot change once the job exists" in refused.value.body


def test_a_short_wait_for_a_node_posts_no_warning_and_a_long_one_does(cluster, namespace):
    cluster.create_job(namespace, "sch", mwms_spec())
    pods = cluster.wait_pods(namespace, "sch", lambda p: len(p) == 3, "3 pods")
    now = time.time()

    def unschedulable(pod, since):
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims.",
            "lastTransitionTime": st.format_time(since),
        }
        cluster.set_status(pod, {"phase": "Pending", "conditions": [condition]})

    for pod in pods.values():
        unschedulable(pod, now)
    # A claim the provisioner binds a moment later: the pods start, and no warning was ever posted.
    cluster.run_all(namespace, "sch", 3)
    cluster.wait_phase(namespace, "sch", "Running")
    assert warnings(cluster, namespace, "sch", "Unschedulable") == []

    cluster.create_job(namespace, "sch2", mwms_spec())
    pods = cluster.wait_pods(namespace, "sch2", lambda p: len(p) == 3, "3 pods")
    for pod in pods.values():
        unschedulable(pod, now - DEFAULTS.scheduling_grace)  # waiting this long already: worth a warning
    cluster.wait_event(namespace, "sch2", "Unschedulable")
    # The event goes out before the status write that records the same decision (a crash repeats an event, never
    # loses one): the condition follows it.
    wait_for(lambda: cluster.status(namespace, "sch2").get("reason") == "Unschedulable", 10, "the condition's reason")
