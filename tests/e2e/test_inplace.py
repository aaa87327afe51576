"""Restarts in place on the local node's real kubelet (Kubernetes 1.37: container restart rules on): a program
that fails restarts in its own pod, counted as a failure, timed by the kubelet's crash-loop back-off, ended by
backoffLimit; a MultiWorkerMirrored group restarts in place as one restart and keeps its pods; a kubelet that does
not serve the rules (kwok's fake nodes) ends the pod, which is recreated, and the job says so."""

from __future__ import annotations

import time

import pytest

from kubetf.core import status as st
from tests.cluster import kwok
from tests.cluster.fixture import wait_for

from .conftest import elapsed, sample

pytestmark = pytest.mark.e2e

# Which run this is: the pod's scratch volume, which a restart in place keeps (a new pod has a new one).
RUNS = """
import os, sys, time
runs = len(os.listdir("/scratch"))
open(f"/scratch/run-{runs}", "w").close()
print(f"run {runs}", flush=True)
"""


def program(code: str, **run_policy) -> dict:
    container = {
        "name": "tensorflow",
        "image": "kubetf/python-base:bookworm",
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3", "-c", RUNS + code],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    }
    spec = {"terminationGracePeriodSeconds": 2, "containers": [container],
            "volumes": [{"name": "scratch", "emptyDir": {}}]}  # fmt: skip
    return {
        "strategy": "Independent",
        "replicaSpecs": {"worker": {"replicas": 1, "template": {"spec": spec}}},
        "runPolicy": run_policy,
    }


def container(pod: dict) -> dict:
    return next(c for c in (pod.get("status") or {}).get("containerStatuses") or [] if c["name"] == "tensorflow")


def test_a_program_that_fails_restarts_in_its_own_pod_as_a_failure(installed, namespace):
    cluster = installed
    cluster.create_job(namespace, "once", program("time.sleep(1); sys.exit(1 if runs == 0 else 0)"))
    first = cluster.wait_pods(namespace, "once", lambda p: len(p) == 1, "its pod", timeout=60)["once-worker-0"]
    status = cluster.wait_phase(namespace, "once", "Succeeded", timeout=120)
    pod = cluster.pods(namespace, "once")["once-worker-0"]
    assert pod["metadata"]["uid"] == first["metadata"]["uid"]  # the same pod, on the same node
    assert container(pod)["restartCount"] == 1 and container(pod)["lastState"]["terminated"]["exitCode"] == 1
    assert status["restarts"]["failures"] == 1 and status["restarts"]["inPlace"] == "Enabled"
    assert status["tasks"]["worker-0"] == {"attempt": 0, "state": "Succeeded", "exits": 1}
    said = [e["message"] for e in cluster.events(namespace, "once") if e["reason"] == "Failed"]
    assert said and said[0].endswith("restarting once-worker-0 in place"), said


def test_a_program_that_keeps_failing_in_place_backs_off_and_ends_the_job_at_its_backoff_limit(installed, namespace):
    cluster = installed
    cluster.create_job(namespace, "always", program("time.sleep(3); sys.exit(1)", backoffLimit=2))
    starts: dict[int, tuple[float, float]] = {}  # restartCount -> (its start, the exit before it), kubelet's clocks

    def record():
        pod = cluster.pods(namespace, "always").get("always-worker-0")
        if pod is not None:
            found = container(pod) if (pod.get("status") or {}).get("containerStatuses") else {}
            running, last = (found.get("state") or {}).get("running"), (found.get("lastState") or {}).get("terminated")
            if running and last:
                starts.setdefault(found["restartCount"], (st.parse_time(running["startedAt"]),
                                                          st.parse_time(last["finishedAt"])))  # fmt: skip
        status = cluster.status(namespace, "always")
        return status if status.get("phase") == "Failed" else None

    status = wait_for(record, 180, "always Failed at its backoff limit", interval=0.3)
    assert status["reason"] == "BackoffLimitExceeded" and status["restarts"]["failures"] == 2, status
    assert status["tasks"]["worker-0"]["attempt"] == 0  # never recreated
    # the kubelet's crash-loop back-off: the first restart at once, the second 10 s after its exit
    print(f"\nrestarts in place: {[(n, round(s - e, 1)) for n, (s, e) in sorted(starts.items())]} (start - exit)")
    assert starts[1][0] - starts[1][1] < 5
    assert starts[2][0] - starts[2][1] >= 9


@pytest.mark.tensorflow
def test_a_multi_worker_mirrored_failure_restarts_the_group_in_its_pods_and_training_resumes(installed, namespace):
    """Real TensorFlow: worker 1's program fails after epoch 2 (once); worker 0's collectives fail with it; both
    restart in their pods (no pod recreated), count one failure, resume from the backup and succeed."""
    cluster = installed
    job = sample("mnist-mwms")
    args = job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]["args"]
    args[args.index("--epochs") + 1] = "5"
    args += ["--fail-after-epoch", "worker-1:2"]
    cluster.create_job(namespace, "mw", job["spec"])
    pods = cluster.wait_pods(namespace, "mw", lambda p: len(p) == 2, "its 2 pods", timeout=60)
    uids = {n: p["metadata"]["uid"] for n, p in pods.items()}
    start = time.monotonic()
    status = cluster.wait_phase(namespace, "mw", "Succeeded", timeout=600)
    print(f"\nmnist-mwms with a failure after epoch 2: Succeeded {elapsed(start)}")
    assert status["restarts"]["failures"] == 1 and status["restarts"]["disruptions"] == 0, status["restarts"]
    after = cluster.pods(namespace, "mw")
    assert {n: p["metadata"]["uid"] for n, p in after.items()} == uids  # the group kept its pods
    assert all(container(p)["restartCount"] >= 1 for p in after.values())  # both restarted in place
    assert status["tasks"]["worker-1"]["exits"] >= 1 and status["tasks"]["worker-0"]["attempt"] == 0


def test_on_a_kubelet_without_restart_rules_the_pod_is_recreated_and_the_job_says_so(installed, namespace):
    """kwok's fake nodes end a pod as a kubelet that ignores restart rules does (older than 1.34, or the feature off
    on that node): the pod is recreated, as before, and status.restarts.inPlace says Unsupported."""
    cluster = installed
    kwok.ensure_fake_nodes(cluster.kubeconfig, cluster.core, 1)
    fake = {"name": "tensorflow", "image": "kubetf/python-base:bookworm", "command": ["true"]}
    template = {"metadata": {"annotations": {kwok.EXIT_CODE: "1", kwok.EXIT_AFTER: "2s"}},
                "spec": kwok.on_fake_nodes({"containers": [fake]})}  # fmt: skip
    spec = {"strategy": "Independent", "replicaSpecs": {"worker": {"replicas": 1, "template": template}},
            "runPolicy": {"backoffSeconds": 0}}  # fmt: skip
    cluster.create_job(namespace, "fake", spec)
    status = wait_for(
        lambda: (s := cluster.status(namespace, "fake")).get("restarts", {}).get("failures", 0) >= 1 and s,
        60, "fake's first failure",
    )  # fmt: skip
    assert status["restarts"]["inPlace"] == "Unsupported", status["restarts"]
    pods = cluster.wait_pods(
        namespace, "fake", lambda p: p.get("fake-worker-0", {}).get("metadata", {}).get("labels", {}).get(
            "kubetf.io/attempt") == "1", "its replacement", timeout=60)  # fmt: skip
    assert "restartPolicyRules" not in pods["fake-worker-0"]["spec"]["containers"][0]
