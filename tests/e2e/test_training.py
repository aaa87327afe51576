"""Day one on a real cluster: install, train, preempt, resume (issue: helm, images, e2e)."""

import subprocess
import sys
import time

import yaml
from kubernetes import client

from tests.cluster.fixture import wait_for

from .conftest import OPERATOR_NAMESPACE, create, elapsed, progress, sample, wait_epoch


def reader_pod(cluster, namespace, claim, command):
    """A pod that runs `command` with the job's checkpoint volume mounted, and returns its log."""
    name = f"reader-{int(time.time() * 1000) % 100000}"
    cluster.core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {
                "restartPolicy": "Never",
                "securityContext": {"runAsNonRoot": True, "runAsUser": 1000},
                "containers": [
                    {
                        "name": "read",
                        "image": "kubetf/python-base:bookworm",
                        "imagePullPolicy": "IfNotPresent",
                        "command": command,
                        "volumeMounts": [{"name": "c", "mountPath": "/checkpoints"}],
                    }
                ],
                "volumes": [{"name": "c", "persistentVolumeClaim": {"claimName": claim}}],
            },
        },
    )
    wait_for(
        lambda: cluster.core.read_namespaced_pod(name, namespace).status.phase in ("Succeeded", "Failed"),
        120,
        f"{name} to finish",
        interval=0.5,
    )
    return cluster.core.read_namespaced_pod(name, namespace).status.phase, cluster.core.read_namespaced_pod_log(
        name, namespace
    )


def test_the_operator_runs_under_the_restricted_pod_security_standard(installed):
    apps = client.AppsV1Api(installed.api_client)
    (deployment,) = apps.list_namespaced_deployment(OPERATOR_NAMESPACE).items
    assert deployment.status.available_replicas == deployment.spec.replicas == 2  # a leader and a standby
    labels = installed.core.read_namespace(OPERATOR_NAMESPACE).metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_a_submitted_job_evicted_mid_training_saves_resumes_and_leaves_its_model(installed, namespace, tmp_path):
    """Day one, from `kubetf submit` to `kubetf delete`: the MNIST sample is followed with its progress; a worker is
    evicted mid-training; the trainer library's program saves on the SIGTERM (PreemptionCheckpointHandler, exit
    42) within its grace period (the operator does not hurry it: no SigtermIgnored); the whole group restarts once,
    counted as a disruption, resumes from that checkpoint and succeeds, and its model is on the checkpoint volume."""
    cluster = installed
    job = sample("mnist-mwms")
    container = job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    container["args"] = [{"5": "6", "20": "30"}.get(a, a) for a in container["args"]]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    start = time.monotonic()
    submit = subprocess.Popen(
        [sys.executable, "-m", "kubetf.cli", "submit", "-f", str(path), "-n", namespace, "--timeout", "900"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wait_epoch(cluster, namespace, "mnist-mwms-worker-0", 2, "two epochs done (a checkpoint to resume from)", 600)
    evicted = time.monotonic()
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "mnist-mwms-worker-1"}}
    cluster.core.create_namespaced_pod_eviction("mnist-mwms-worker-1", namespace, body)

    def saved() -> list[dict]:
        return [r for r in progress(cluster, namespace, "mnist-mwms-worker-1") if r["kubetf"] == "preempted"]

    (record,) = wait_for(saved, 120, "worker-1 saved on the SIGTERM and left", interval=0.5)
    print(f"\neviction -> worker-1 saved and exited {record['exit_code']}: {elapsed(evicted)}")
    assert record["saved"] is True and record["exit_code"] == 42, record
    output, _ = submit.communicate(timeout=960)
    print(f"mnist-mwms: apply -> Succeeded {elapsed(start)}\n{output}")
    assert submit.returncode == 0, output
    assert "epoch 6/6" in output
    status = cluster.status(namespace, "mnist-mwms")
    assert (status["phase"], status["restarts"]["disruptions"], status["restarts"]["failures"]) == ("Succeeded", 1, 0)
    assert status["tasks"]["worker-0"]["attempt"] == 1  # the whole group restarted
    ignored = cluster.core.list_namespaced_event(namespace, field_selector="reason=SigtermIgnored").items
    assert ignored == [], [e.message for e in ignored]
    records = progress(cluster, namespace, "mnist-mwms-worker-0")  # the replacement pod's log
    (resumed,) = [r for r in records if r["kubetf"] == "start"]
    assert resumed["initial_epoch"] >= 2, records  # from the checkpoint saved at the eviction, not from scratch
    epochs = [r["epoch"] for r in records if r["kubetf"] == "progress"]
    assert epochs == list(range(resumed["initial_epoch"] + 1, 7)), records
    losses = [r["loss"] for r in records if r["kubetf"] == "progress"]
    assert losses[-1] <= losses[0]
    assert [r for r in records if r["kubetf"] == "done"], records
    # The chief's (worker 0's) final model is on the PVC, readable by the next pod that mounts it.
    phase, listing = reader_pod(
        cluster, namespace, "mnist-mwms-checkpoint", ["sh", "-c", "ls -R /checkpoints/model | head -50"]
    )
    assert phase == "Succeeded", listing
    assert "saved_model.pb" in listing or ".keras" in listing or "variables" in listing, listing
    running = [p for p in cluster.pods(namespace, "mnist-mwms").values() if p["status"]["phase"] == "Running"]
    assert running == []  # nothing of the job keeps running

    def kubetf(*args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "kubetf.cli", *args, "-n", namespace],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    assert "Succeeded" in kubetf("status", "mnist-mwms")
    logs = kubetf("logs", "mnist-mwms").splitlines()
    assert any(line.startswith("worker-1 | ") for line in logs), logs[-20:]
    assert any(line.startswith("worker-0 | ") and '"kubetf": "done"' in line for line in logs), logs[-20:]
    deleted = kubetf("delete", "mnist-mwms")
    assert "checkpoint PVC mnist-mwms-checkpoint kept" in deleted
    wait_for(lambda: cluster.job(namespace, "mnist-mwms") is None, 30, "the job deleted")
    assert cluster.core.read_namespaced_persistent_volume_claim("mnist-mwms-checkpoint", namespace)


def test_parameter_server_job_with_evaluator_succeeds_and_a_deleted_worker_is_recreated_alone(installed, namespace):
    cluster = installed
    job = sample("ps-training")
    # 8 epochs, not the sample's 4: the worker deleted after the first one is seen gone while training goes on.
    for spec in job["spec"]["replicaSpecs"].values():
        args = spec["template"]["spec"]["containers"][0]["args"]
        args[args.index("--epochs") + 1] = "8"
    create(cluster, namespace, job)
    wait_epoch(cluster, namespace, "ps-training-chief-0", 1, "a first epoch", timeout=300)
    before = {n: p["metadata"]["uid"] for n, p in cluster.live_pods(namespace, "ps-training").items()}
    cluster.delete_pod(cluster.pods(namespace, "ps-training")["ps-training-worker-1"])
    status = cluster.wait_phase(namespace, "ps-training", "Succeeded", timeout=900)
    assert status["restarts"]["disruptions"] == 1
    assert status["tasks"]["worker-1"]["attempt"] == 1
    assert all(status["tasks"][t]["attempt"] == 0 for t in ("chief-0", "worker-0", "ps-0", "evaluator-0"))
    assert "ps-training-worker-1" in before
    # The evaluator, a sidecar, may start after training is over (TensorFlow's import is slow on a loaded node):
    # the job's success leaves it evaluatorGraceSeconds to evaluate every checkpoint, the last one too, and exit.
    wait_for(
        lambda: cluster.pods(namespace, "ps-training")["ps-training-evaluator-0"]["status"]["phase"] == "Succeeded",
        120, "the evaluator to exit on its own after its last evaluation",
    )  # fmt: skip
    evals = [r["epoch"] for r in progress(cluster, namespace, "ps-training-evaluator-0") if r["kubetf"] == "eval"]
    assert evals == list(range(1, 9)), evals  # each checkpoint once, in order, the final one included
    # ps and workers never exit by themselves: cleanPodPolicy Running stopped them.
    wait_for(
        lambda: all(p["status"]["phase"] != "Running" for p in cluster.live_pods(namespace, "ps-training").values()),
        60,
        "ps/worker pods stopped",
    )


def test_a_job_asking_for_more_gpus_than_the_node_has_stays_pending_and_says_why(installed, namespace):
    cluster = installed
    job = sample("mirrored")
    job["spec"]["replicaSpecs"]["chief"]["gpus"] = 64
    create(cluster, namespace, job)

    def says_why():
        status = cluster.status(namespace, "mirrored")
        current = next((c for c in status.get("conditions", []) if c["status"] == "True"), {})
        return "Insufficient nvidia.com/gpu" in current.get("message", "") and status

    # The scheduler's reason, once the checkpoint claim is bound: the GPUs.
    status = wait_for(says_why, 60, "the scheduler's GPU message in the condition")
    assert (status["phase"], status["reason"]) == ("Pending", "Unschedulable")
    installed.wait_event(namespace, "mirrored", "Unschedulable")


def test_a_missing_image_says_image_pull_backoff_then_fails_after_the_startup_timeout(installed, namespace):
    cluster = installed
    job = sample("mirrored")
    job["spec"]["replicaSpecs"]["chief"].pop("gpus")
    container = job["spec"]["replicaSpecs"]["chief"]["template"]["spec"]["containers"][0]
    container["image"] = "kubetf/missing:0.0.1"
    # Scheduled at once, however busy the node: with the sample's 1 CPU it waited Unschedulable behind the other
    # tests' TensorFlow pods until its startup timeout, and never reached the image pull (CI run 28).
    container["resources"] = {"requests": {"cpu": "10m", "memory": "32Mi"}}
    job["spec"]["runPolicy"] = {"startupTimeoutSeconds": 40}
    create(cluster, namespace, job)
    reasons = set()

    def failed():
        status = cluster.status(namespace, "mirrored")
        reasons.add(status.get("reason"))
        return status.get("phase") == "Failed" and status

    status = wait_for(failed, 120, "StartupTimeout", interval=0.5)
    assert reasons & {"ImagePullBackOff", "ErrImagePull"}, reasons
    assert status["reason"] == "StartupTimeout"
    message = next(c["message"] for c in status["conditions"] if c["status"] == "True")
    assert "Image" in message or "image" in message
