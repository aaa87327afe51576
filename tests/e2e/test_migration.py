"""Moving to kubetf on a real cluster: a TF1 between-graph TFJob converted by `kubetf convert` survives the loss
of its ps: converted, run, the ps restarted alone as a disruption, both workers go on from the chief's checkpoint
(not from step 0), the job succeeds, the ps stopped. The only run of this TF1 program in the tests: a trainer-tier
copy under `kubetf local` asserted the same and cost a minute of that tier's serial TensorFlow. (The
guides' custom-training-loop programs are the trainer tier's: program behaviour; an unchanged one on the cluster
is test_sigterm.py's.) Tiny jobs: 2 CPU cores."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from tests.cluster.fixture import wait_for

from .conftest import create, elapsed

IMAGE = "kubetf/trainer:0.1.0"
RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}


def container(*args: str) -> dict:
    return {
        "name": "tensorflow",
        "image": IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "args": ["python", *args],
        "resources": RESOURCES,
    }


def log(cluster, namespace: str, pod: str) -> list[str]:
    try:
        # (None for a pod not scheduled yet: client 37 reads the API server's 204 so)
        return (cluster.core.read_namespaced_pod_log(pod, namespace) or "").splitlines()
    except ApiException:
        return []


def tf1_records(lines: list[str], kind: str) -> list[dict]:
    return [r for r in (json.loads(line) for line in lines if line.startswith('{"tf1"')) if r["tf1"] == kind]


def release(cluster, namespace: str) -> None:
    """Let the held workers go on: the file they wait for, written on their volume by a pod of the test's."""
    pod = {
        "metadata": {"name": "release"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "touch",
                    "image": "kubetf/python-base:bookworm",
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["touch", "/model/dist-mnist/release"],
                    "resources": RESOURCES,
                    "volumeMounts": [{"name": "model", "mountPath": "/model"}],
                }
            ],
            "volumes": [{"name": "model", "persistentVolumeClaim": {"claimName": "dist-mnist-model"}}],
        },
    }
    cluster.core.create_namespaced_pod(namespace, pod)
    wait_for(lambda: cluster.core.read_namespaced_pod("release", namespace).status.phase == "Succeeded", 120,
             "the release file written")  # fmt: skip


STEPS = 2500
HOLD = 1000  # every worker holds at this global step until the test releases it: the ps is deleted meanwhile


@pytest.mark.tensorflow
def test_converted_tf1_between_graph_tfjob_succeeds_after_its_ps_is_deleted(installed, namespace, tmp_path):
    cluster = installed
    # TF1 checkpoints are written by the ps tasks (each its variables) and the chief: a volume all of them mount,
    # the way such TFJobs carry one.
    cluster.core.create_namespaced_persistent_volume_claim(
        namespace,
        {
            "metadata": {"name": "dist-mnist-model"},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "100Mi"}}},
        },
    )
    program = container("/opt/kubetf/examples/tf1_between_graph.py", "--train-steps", str(STEPS), "--checkpoint-dir",
                        "/model/dist-mnist", "--hold-at-step", str(HOLD))  # fmt: skip
    program["volumeMounts"] = [{"name": "model", "mountPath": "/model"}]
    volume = {"name": "model", "persistentVolumeClaim": {"claimName": "dist-mnist-model"}}
    replica = {"restartPolicy": "OnFailure", "template": {"spec": {"containers": [program], "volumes": [volume]}}}
    tfjob = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "dist-mnist"},
        "spec": {
            "successPolicy": "AllWorkers",
            "runPolicy": {"cleanPodPolicy": "Running"},
            "tfReplicaSpecs": {"PS": {"replicas": 1, **replica}, "Worker": {"replicas": 2, **replica}},
        },
    }
    path = tmp_path / "tfjob.yaml"
    path.write_text(yaml.safe_dump(tfjob))
    converted = subprocess.run(
        [sys.executable, "-m", "kubetf.cli", "convert", "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert converted.returncode == 0, converted.stderr
    assert (
        converted.stderr.splitlines()[-1] == "1 TFJob(s): 1 converted cleanly, 0 converted with notes, 0 not converted"
    )
    job = yaml.safe_load(converted.stdout)
    assert job["spec"]["strategy"] == "Independent"
    start = time.monotonic()
    create(cluster, namespace, job)

    # Both workers hold at the step (a checkpoint every 200 before it), however far apart they started: the first
    # once trained all 2,500 steps while the second was still starting, and the ps was deleted after the end.
    wait_for(
        lambda: all(tf1_records(log(cluster, namespace, f"dist-mnist-worker-{i}"), "held") for i in (0, 1)),
        600,
        f"both workers held at global step {HOLD}",
        interval=1.0,
    )
    print(f"\ndist-mnist: apply -> both workers held at step {HOLD} {elapsed(start)}")
    ps = cluster.pods(namespace, "dist-mnist")["dist-mnist-ps-0"]
    cluster.delete_pod(ps)
    deleted = time.monotonic()
    release(cluster, namespace)
    status = cluster.wait_phase(namespace, "dist-mnist", "Succeeded", timeout=900)
    print(f"dist-mnist: ps deleted -> Succeeded {elapsed(deleted)}")

    restarts = status["restarts"]
    attempts = {task: state["attempt"] for task, state in status["tasks"].items()}
    assert restarts["disruptions"] == 1 and attempts["ps-0"] == 1, status  # the ps alone, a disruption
    # TF1's recovery is TensorFlow's: a worker whose step hits an error MonitoredTrainingSession does not retry
    # exits 1 (seen about 1 run in 6 on a loaded machine). kubetf then restarts that worker alone, as a failure, and
    # it rejoins from the checkpoint; the job still succeeds.
    in_place = {task: state.get("exits", 0) for task, state in status["tasks"].items()}  # restarted in its pod
    assert restarts["failures"] == sum(attempts[t] + in_place[t] for t in ("worker-0", "worker-1")), status
    if restarts["failures"]:
        print(f"dist-mnist: a worker failed while the ps came back: {restarts['lastReason']}")
    for task in ("worker-0", "worker-1"):
        lines = log(cluster, namespace, f"dist-mnist-{task}")
        # A recovered session (a worker may recover twice while the new ps comes up), or a restarted worker's
        # first session, goes on from the chief's checkpoint.
        sessions = tf1_records(lines, "resumed" if attempts[task] == 0 else "session")
        assert sessions and sessions[0]["step"] >= 200, (task, sessions)
        (done,) = tf1_records(lines, "done")
        assert done["step"] >= STEPS
    # The ps never exits by itself: cleanPodPolicy Running stops it.
    wait_for(
        lambda: all(p["status"]["phase"] != "Running" for p in cluster.live_pods(namespace, "dist-mnist").values()),
        60,
        "the ps stopped",
    )
