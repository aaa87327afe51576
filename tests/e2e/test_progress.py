"""Progress on a real cluster: the installed chart's operator takes the reports of real TensorFlow pods (trainer
image) through its Service, `kubectl get tj` shows PROGRESS and ETA while they train, /metrics has the job's
gauges, a program whose loss is NaN is TrainingUnhealthy while it goes on running, and reports go on reaching the
status when the leader's pod is killed and the standby takes over."""

import re
import time

import pytest
from kubernetes import client

from kubetf.core import status as st
from tests.cluster.fixture import wait_for

from .conftest import OPERATOR_NAMESPACE, columns

# An unchanged Keras `fit` program (no kubetf import): the image's sitecustomize makes it report. The callback only
# slows it down so that it trains for about 30 s: status.progress is written every 5 s here (CHART_VALUES), so
# several times mid-run, each with its ETA.
FIT_PROGRAM = """
import time
import numpy as np
import tensorflow as tf
import tf_keras as keras

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = keras.Sequential([keras.layers.Dense(8, activation="relu", input_shape=(4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
x = np.random.rand(256, 4).astype("float32")
y = x.sum(axis=1, keepdims=True)

class Slow(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.4)

model.fit(x, y, epochs=10, batch_size=32, callbacks=[Slow()], verbose=2)
"""

NAN_PROGRAM = """
import time
from kubetf_trainer.report import report

for step in range(1, 400):
    report(step=step, steps=400, metrics={"loss": float("nan") if step > 3 else 1.0})
    time.sleep(0.5)
"""


# A program that reports without TensorFlow (the library's client alone): a step every half second for up to 5
# minutes, so that it still reports after a leader change however long the takeover takes (a 40 s program ended
# first once, its last report lost in the takeover's seconds, as the protocol allows).
STEPS_PROGRAM = """
import time
from kubetf_trainer.report import report

for step in range(1, 601):
    report(step=step, steps=600, metrics={"loss": 1.0 / step})
    time.sleep(0.5)
"""


# The program's first run trains a little and crashes; its second (restarted in its pod, or in a new one) resumes
# from an older checkpoint, reports once and hangs (a collective waiting for a peer that never comes). The crash's
# exit still sent its last state marked final, as the library does at every exit. Which run it is: the pod's own
# scratch volume (a restart in place keeps it) or its attempt (a new pod has a new one).
CRASH_THEN_HANG_PROGRAM = """
import os, sys, time
from kubetf_trainer.report import flush, report

first = os.environ["ATTEMPT"] == "0" and not os.path.exists("/scratch/ran")
open("/scratch/ran", "w").close()
if first:
    for step in range(1, 11):
        report(epoch=step // 5, epochs=10, step=10 * step, steps=100, stepsPerSecond=20.0, metrics={"loss": 1 / step})
        time.sleep(0.5)
    sys.exit(1)
report(step=30, steps=100, metrics={"loss": 0.5})
flush()
time.sleep(3600)
"""


def program_job(program: str, workers: int = 1) -> dict:
    container = {
        "name": "tensorflow",
        "image": "kubetf/trainer:0.1.0",
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-c", program],
        "env": [
            {"name": "TF_USE_LEGACY_KERAS", "value": "1"},
            {"name": "ATTEMPT", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['kubetf.io/attempt']"}}},
        ],
        "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "1536Mi"}},
        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    }
    spec = {"containers": [container], "volumes": [{"name": "scratch", "emptyDir": {}}]}
    return {
        "strategy": "MultiWorkerMirrored",
        "replicaSpecs": {"worker": {"replicas": workers, "template": {"spec": spec}}},
    }


def scrape_leader(cluster) -> str:
    """The leader's /metrics through the API server's pod proxy, as Prometheus would read it."""
    for pod in cluster.core.list_namespaced_pod(OPERATOR_NAMESPACE).items:
        text = cluster.core.connect_get_namespaced_pod_proxy_with_path(
            f"{pod.metadata.name}:9090", OPERATOR_NAMESPACE, "metrics"
        )
        if re.search(r"^kubetf_leader 1\.0$", text, re.M):
            return text
    return ""


@pytest.mark.tensorflow
def test_an_unchanged_fit_program_shows_progress_and_a_falling_eta_in_kubectl_get_and_in_metrics(installed, namespace):
    cluster = installed
    cluster.create_job(namespace, "fit", program_job(FIT_PROGRAM))
    seen: list[tuple[str, str]] = []
    etas: list[int] = []
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        status = cluster.status(namespace, "fit")
        row = columns(cluster, namespace, "fit")
        if row.get("PROGRESS") and (row["PROGRESS"], row.get("ETA")) not in seen:
            seen.append((row["PROGRESS"], row.get("ETA", "")))
        eta = (status.get("progress") or {}).get("etaSeconds")
        if status.get("phase") == "Running" and isinstance(eta, int) and (not etas or eta != etas[-1]):
            etas.append(eta)
        if status.get("phase") in ("Succeeded", "Failed"):
            break
        time.sleep(1)
    print(f"\nkubectl get tj PROGRESS, ETA while it trained: {seen}; etaSeconds: {etas}")
    assert status["phase"] == "Succeeded", status
    assert any(re.fullmatch(r"\d+%", p) and 0 < int(p[:-1]) < 100 and eta for p, eta in seen), seen
    assert len(etas) >= 2 and etas[-1] < etas[0], etas
    final = cluster.status(namespace, "fit")["progress"]
    assert (final["summary"], final["epoch"], final["epochs"]) == ("100%", 10, 10), final
    assert columns(cluster, namespace, "fit")["PROGRESS"] == "100%"
    metrics = scrape_leader(cluster)
    line = f'kubetf_job_progress_ratio{{job="fit",namespace="{namespace}"}} 1.0'
    assert line in metrics, [m for m in metrics.splitlines() if m.startswith("kubetf_job_")]
    assert re.search(rf'kubetf_job_metric{{job="fit",metric="loss",namespace="{namespace}"}} ', metrics)


def test_a_program_whose_loss_is_nan_is_unhealthy_and_goes_on_running(installed, namespace):
    cluster = installed
    cluster.create_job(namespace, "nan", program_job(NAN_PROGRAM))

    def unhealthy():
        status = cluster.status(namespace, "nan")
        found = [c for c in status.get("conditions") or [] if c["type"] == "TrainingUnhealthy"]
        return status if found and found[0]["status"] == "True" else None

    status = wait_for(unhealthy, 240, "the TrainingUnhealthy condition", interval=1)
    (condition,) = [c for c in status["conditions"] if c["type"] == "TrainingUnhealthy"]
    assert condition["reason"] == "LossNotFinite" and "loss is NaN" in condition["message"], condition
    assert status["phase"] == "Running"  # what to do about it is the user's
    events = cluster.events(namespace, "nan")
    assert [e["type"] for e in events if e["reason"] == "LossNotFinite"] == ["Warning"], events
    assert f'kubetf_job_training_unhealthy{{job="nan",namespace="{namespace}",reason="LossNotFinite"}} 1.0' in (
        scrape_leader(cluster)
    )


@pytest.mark.serial  # the installed operator's leader is killed: the other e2e tests would lose it meanwhile
def test_reports_reach_the_status_across_a_leader_change(installed, namespace):
    cluster = installed
    cluster.create_job(namespace, "steps", program_job(STEPS_PROGRAM))
    first = wait_for(lambda: (cluster.status(namespace, "steps").get("progress") or {}).get("step"), 120,
                     "the first report written")  # fmt: skip
    coordination = client.CoordinationV1Api(cluster.api_client)
    leader = coordination.read_namespaced_lease("kubetf-operator", OPERATOR_NAMESPACE).spec.holder_identity
    leader_pod = leader.rsplit("_", 1)[0]
    cluster.core.delete_namespaced_pod(leader_pod, OPERATOR_NAMESPACE, grace_period_seconds=0)  # no lease release
    killed = time.time()

    def new_leader() -> str | None:
        holder = coordination.read_namespaced_lease("kubetf-operator", OPERATOR_NAMESPACE).spec.holder_identity or ""
        return holder if holder and not holder.startswith(f"{leader_pod}_") else None

    standby = wait_for(new_leader, 60, "the standby to take the lease")
    took_over = time.time()

    def written_after_takeover() -> dict | None:
        progress = cluster.status(namespace, "steps").get("progress") or {}
        return progress if (st.parse_time(progress.get("lastReportTime")) or 0) > took_over else None

    after = wait_for(written_after_takeover, 60, "a report written by the new leader")
    print(f"\nleader {leader} killed at step {first}; {standby} led {took_over - killed:.1f}s later and wrote step "
          f"{after['step']}")  # fmt: skip
    assert after["step"] > first
    status = cluster.status(namespace, "steps")
    assert (status["phase"], status["restarts"]["total"]) == ("Running", 0), status  # the leader change cost nothing


def test_a_coordinator_that_crashed_once_and_then_hangs_is_stalled_and_keeps_no_stale_keys(installed, namespace):
    # The review's findings: progress was a merge patch of the whole object (a key the program no longer reported
    # stayed), and the final report every exit sends, a crash's too, switched the stall judge off for good.
    cluster = installed
    spec = program_job(CRASH_THEN_HANG_PROGRAM)
    spec["replicaSpecs"]["worker"]["restartPolicy"] = "OnFailure"
    spec["runPolicy"] = {"backoffSeconds": 1}
    cluster.create_job(namespace, "hang", spec)

    def resumed() -> dict | None:
        status = cluster.status(namespace, "hang")
        progress = status.get("progress") or {}
        return status if status.get("restarts", {}).get("failures") == 1 and progress.get("step") == 30 else None

    status = wait_for(resumed, 240, "the resumed run's report written", interval=1)
    progress = status["progress"]
    assert "final" not in progress and "epoch" not in progress, progress  # the first run's keys are gone
    assert progress["summary"] == "30%" and progress["metrics"]["loss"] == 0.5, progress
    resumed_at = time.monotonic()

    def stalled():
        status = cluster.status(namespace, "hang")
        found = [c for c in status.get("conditions") or [] if c["type"] == "TrainingUnhealthy"]
        return status if found and found[0]["status"] == "True" else None

    status = wait_for(stalled, 180, "TrainingStalled, 60 s after the last report", interval=1)
    (condition,) = [c for c in status["conditions"] if c["type"] == "TrainingUnhealthy"]
    print(f"\nTrainingStalled {time.monotonic() - resumed_at:.0f}s after the resumed report was seen: {condition}")
    assert condition["reason"] == "TrainingStalled" and "still at step 30" in condition["message"], condition
    assert status["phase"] == "Running"
    events = cluster.events(namespace, "hang")
    assert [e["type"] for e in events if e["reason"] == "TrainingStalled"] == ["Warning"], events
