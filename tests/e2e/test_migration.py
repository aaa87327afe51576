"""Moving to kubetf on a real cluster: a TF1 between-graph TFJob converted by `kubetf convert` survives the loss
of its ps, and the guides' custom-training-loop programs run (the MWMS one resumes from its CheckpointManager
checkpoint after an eviction). Tiny jobs: 2 CPU cores."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import yaml
from kubernetes.client.exceptions import ApiException

from kubetf import api
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
        return cluster.core.read_namespaced_pod_log(pod, namespace).splitlines()
    except ApiException:
        return []


def tf1_records(lines: list[str], kind: str) -> list[dict]:
    return [r for r in (json.loads(line) for line in lines if line.startswith('{"tf1"')) if r["tf1"] == kind]


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
    program = container("/opt/kubetf/examples/tf1_between_graph.py", "--train-steps", "20000", "--checkpoint-dir",
                        "/model/dist-mnist")  # fmt: skip
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

    wait_for(
        lambda: (
            any(r["step"] >= 1000 for r in tf1_records(log(cluster, namespace, "dist-mnist-worker-0"), "progress"))
            and tf1_records(log(cluster, namespace, "dist-mnist-worker-1"), "session")
        ),  # nothing to resume before it
        600,
        "1000 global steps (a checkpoint every 200) and both workers in session",
        interval=1.0,
    )
    print(f"\ndist-mnist: apply -> 1000 steps {elapsed(start)}")
    ps = cluster.pods(namespace, "dist-mnist")["dist-mnist-ps-0"]
    cluster.delete_pod(ps)
    deleted = time.monotonic()
    status = cluster.wait_phase(namespace, "dist-mnist", "Succeeded", timeout=900)
    print(f"dist-mnist: ps deleted -> Succeeded {elapsed(deleted)}")

    restarts = status["restarts"]
    attempts = {task: state["attempt"] for task, state in status["tasks"].items()}
    assert restarts["disruptions"] == 1 and attempts["ps-0"] == 1, status  # the ps alone, a disruption
    # TF1's recovery is TensorFlow's: a worker whose step hits an error MonitoredTrainingSession does not retry
    # exits 1 (seen about 1 run in 6 on a loaded machine). kubetf then restarts that worker alone, as a failure, and
    # it rejoins from the checkpoint; the job still succeeds.
    assert restarts["failures"] == attempts["worker-0"] + attempts["worker-1"], status
    if restarts["failures"]:
        print(f"dist-mnist: a worker failed while the ps came back: {restarts['lastReason']}")
    for task in ("worker-0", "worker-1"):
        lines = log(cluster, namespace, f"dist-mnist-{task}")
        # A recovered session (a worker may recover twice while the new ps comes up), or a restarted worker's
        # first session, goes on from the chief's checkpoint.
        sessions = tf1_records(lines, "resumed" if attempts[task] == 0 else "session")
        assert sessions and sessions[0]["step"] >= 200, (task, sessions)
        assert attempts[task] or sessions[0]["step"] < 20000, (task, sessions)  # recovered mid-training
        (done,) = tf1_records(lines, "done")
        assert done["step"] >= 19990
    # The ps never exits by itself: cleanPodPolicy Running stops it.
    wait_for(
        lambda: all(p["status"]["phase"] != "Running" for p in cluster.live_pods(namespace, "dist-mnist").values()),
        60,
        "the ps stopped",
    )


def test_guide_ps_custom_training_loop_succeeds(installed, namespace):
    cluster = installed
    pod = {"spec": {"containers": [container("/opt/kubetf/examples/ps_custom_loop.py", "--epochs", "2")]}}
    job = {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": "ps-ctl"},
        "spec": {
            "strategy": "ParameterServer",
            "replicaSpecs": {
                "chief": {"replicas": 1, "template": pod},
                "worker": {"replicas": 2, "template": pod},
                "ps": {"replicas": 1, "template": pod},
            },
        },
    }
    start = time.monotonic()
    create(cluster, namespace, job)
    status = cluster.wait_phase(namespace, "ps-ctl", "Succeeded", timeout=900)
    print(f"\nps-ctl: apply -> Succeeded {elapsed(start)}")
    assert status["restarts"]["total"] == 0
    chief = log(cluster, namespace, "ps-ctl-chief-0")
    epochs = [line for line in chief if line.startswith("Finished epoch")]
    assert len(epochs) == 2, chief[-20:]
    assert any(line.startswith("Final loss is") for line in chief), chief[-20:]


def test_guide_mwms_custom_training_loop_resumes_from_its_checkpoint_after_an_eviction(installed, namespace):
    cluster = installed
    args = ("/opt/kubetf/examples/mwms_custom_loop.py", "--epochs", "8", "--steps-per-epoch", "10")
    job = {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": "mwms-ctl"},
        "spec": {
            "strategy": "MultiWorkerMirrored",
            "replicaSpecs": {"worker": {"replicas": 2, "template": {"spec": {"containers": [container(*args)]}}}},
            "checkpoint": {"size": "1Gi"},
        },
    }
    create(cluster, namespace, job)
    wait_for(
        lambda: any(line.startswith("Epoch: 1,") for line in log(cluster, namespace, "mwms-ctl-worker-0")),
        600,
        "epoch 0 checkpointed, epoch 1 done",
        interval=1.0,
    )
    cluster.core.create_namespaced_pod_eviction(
        "mwms-ctl-worker-1",
        namespace,
        {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": "mwms-ctl-worker-1", "namespace": namespace},
        },
    )
    evicted = time.monotonic()
    status = cluster.wait_phase(namespace, "mwms-ctl", "Succeeded", timeout=900)
    print(f"\nmwms-ctl: eviction -> Succeeded {elapsed(evicted)}")
    assert status["restarts"] == status["restarts"] | {"failures": 0, "disruptions": 1}
    assert status["tasks"]["worker-0"]["attempt"] == 1  # the whole group restarted
    worker0 = log(cluster, namespace, "mwms-ctl-worker-0")  # the replacement pod's log
    (resumed,) = [line for line in worker0 if line.startswith("Resumed from ")]
    print(resumed)
    step = int(resumed.rsplit("step ", 1)[1].rstrip("."))
    assert step >= 10 and step % 10 == 0, resumed  # epoch 0 was saved before epoch 1 was seen done
    epochs = [int(line.split("Epoch: ")[1].split(",")[0]) for line in worker0 if line.startswith("Epoch: ")]
    assert epochs == list(range(step // 10, 8)), worker0[-20:]
