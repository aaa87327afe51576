"""Programs moved from Kubeflow's TFJob and the guides' custom training loops, run by `kubetf local` with the
operator's restart rules. Tiny on purpose (2 CPU cores)."""

from __future__ import annotations

import json
import os
import signal

import pytest
from conftest import make_job

from kubetf.core.convert import convert


def tf1_records(lines: list[str], label: str, kind: str) -> list[dict]:
    prefix = f"{label} | "
    records = []
    for line in lines:
        if line.startswith(prefix) and line[len(prefix) :].startswith('{"tf1"'):
            record = json.loads(line[len(prefix) :])
            if record["tf1"] == kind:
                records.append(record)
    return records


@pytest.mark.timeout(300)
def test_converted_tf1_between_graph_job_survives_a_lost_ps(local_run, tmp_path):
    """The classic dist-mnist layout (PS + Worker, no chief) converted from a TFJob: the lost ps is recreated
    alone, the chief (worker 0) restores the variables from its checkpoint, every worker finishes."""
    container = {
        "name": "tensorflow",
        "image": "kubetf/trainer:0.1.0",
        "command": [
            "python",
            "/opt/kubetf/examples/tf1_between_graph.py",
            "--train-steps",
            "3000",
            "--checkpoint-dir",
            str(tmp_path / "model"),
        ],
    }
    replica = {"restartPolicy": "OnFailure", "template": {"spec": {"containers": [container]}}}
    tfjob = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "tf1"},
        "spec": {
            "successPolicy": "AllWorkers",
            "runPolicy": {"cleanPodPolicy": "Running"},
            "tfReplicaSpecs": {"PS": {"replicas": 1, **replica}, "Worker": {"replicas": 2, **replica}},
        },
    }
    conversion = convert(tfjob)
    assert conversion.notes == []
    job = conversion.job
    assert job["spec"]["strategy"] == "Independent"
    run = local_run(job)
    run.wait_for(
        lambda lines: any(r["step"] >= 600 for r in tf1_records(lines, "worker-0", "progress")),
        180,
        "600 global steps (checkpoints every 200)",
    )
    # A non-chief worker polls for the initialised model every 30 s (TF's SessionManager): on a busy machine the
    # chief could finish every step meanwhile. It waits, paused, until worker 1 has a session to recover.
    os.kill(run.pid("worker-0"), signal.SIGSTOP)
    try:
        run.wait_for(lambda lines: tf1_records(lines, "worker-1", "session"), 120, "worker 1 in session")
        os.kill(run.pid("ps-0"), signal.SIGKILL)
    finally:
        os.kill(run.pid("worker-0"), signal.SIGCONT)
    assert run.wait_exit(240) == 0, "\n".join(run.lines[-40:])

    restarts = [line for line in run.lines if "restarting" in line]
    assert len(restarts) == 1 and restarts[0].endswith("restarting ps-0 (failures 0, disruptions 1)"), restarts
    assert [line for line in run.lines if "started worker-" in line and "attempt 1" in line] == []
    # Both workers recreated their session on the restarted ps (a worker may recover twice while the new ps comes
    # up) and went on from the chief's checkpoint, not from step 0.
    chief_resumed, *_ = tf1_records(run.lines, "worker-0", "resumed")
    assert 200 <= chief_resumed["step"] < 3000, chief_resumed
    # Under load the chief may finish the remaining steps before worker 1 has its new session: 3000 is allowed.
    worker_resumed, *_ = tf1_records(run.lines, "worker-1", "resumed")
    assert worker_resumed["step"] >= 200, worker_resumed
    for label in ("worker-0", "worker-1"):
        (done,) = tf1_records(run.lines, label, "done")
        assert done["step"] >= 3000
    assert run.lines[-1].endswith("job succeeded (failures 0, disruptions 1)")


@pytest.mark.timeout(300)
def test_guide_ps_custom_training_loop_with_cluster_coordinator(local_run):
    job = make_job(
        "ps-ctl",
        "ParameterServer",
        {"chief": 1, "worker": 2, "ps": 1},
        ["--epochs", "2", "--steps-per-epoch", "5"],
        example="ps_custom_loop.py",
    )
    run = local_run(job)
    assert run.wait_exit(240) == 0, "\n".join(run.lines[-40:])
    epochs = [line for line in run.lines if line.startswith("chief-0 | Finished epoch")]
    assert len(epochs) == 2, run.lines[-40:]
    assert any(line.startswith("chief-0 | Final loss is") for line in run.lines)


EPOCHS = 16  # still training a second after the SIGTERM, when TensorFlow says it swallowed it: about 1 s an epoch


@pytest.mark.timeout(420)
def test_guide_mwms_custom_training_loop_resumes_from_its_checkpoint_manager_checkpoint(local_run):
    job = make_job(
        "mwms-ctl",
        "MultiWorkerMirrored",
        {"worker": 2},
        # Enough epochs to still train a second after the SIGTERM, when TensorFlow says it swallowed it.
        ["--epochs", str(EPOCHS), "--steps-per-epoch", "10", "--per-worker-batch-size", "32"],
        example="mwms_custom_loop.py",
    )
    # As in the trainer image: TensorFlow's warnings shown, among them the one saying it swallowed the SIGTERM.
    job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "TF_CPP_MIN_LOG_LEVEL", "value": "1"}
    ]
    run = local_run(job)
    run.wait_for(lambda lines: any(line.startswith("worker-0 | Epoch: 1,") for line in lines), 240, "epoch 1 done")
    os.kill(run.pid("worker-1"), signal.SIGTERM)  # a preemption: the whole group restarts
    assert run.wait_exit(300) == 0, "\n".join(run.lines[-40:])

    restart = run.index_of("restarting worker-0, worker-1")
    resumed = [line for line in run.lines[restart:] if line.startswith("worker-0 | Resumed from ")]
    assert len(resumed) == 1, run.lines[restart:]
    step = int(resumed[0].rsplit("step ", 1)[1].rstrip("."))
    assert step >= 10 and step % 10 == 0  # epoch 0 was saved before epoch 1 was seen done; epoch boundary
    epochs_after = [
        int(line.split("Epoch: ")[1].split(",")[0]) for line in run.lines[restart:] if "worker-0 | Epoch:" in line
    ]
    assert epochs_after == list(range(step // 10, EPOCHS))
    assert run.lines[-1].endswith("job succeeded (failures 0, disruptions 1)")
