"""The guides' custom training loops, unchanged, run by `kubetf local` with the operator's restart rules and its
progress variables: they train, resume, and their own prints reach the operator as progress. (A TF1 program moved
from Kubeflow's TFJob is e2e's test_migration.py: converted, its ps lost and recreated on the cluster, the chief
and the workers going on from the chief's checkpoint.) Tiny on purpose (2 CPU cores)."""

from __future__ import annotations

import itertools
import os
import signal

import pytest
from conftest import TOKEN, assert_authenticated, assert_clean, local_progress_env, make_job

from tests.progress_server import progress_server


@pytest.mark.timeout(300)
def test_guide_ps_custom_training_loop_with_cluster_coordinator_trains_and_its_prints_are_reported(local_run, tmp_path):
    job = make_job(
        "ps-ctl",
        "ParameterServer",
        {"chief": 1, "worker": 2, "ps": 1},
        ["--epochs", "2", "--steps-per-epoch", "5"],
        example="ps_custom_loop.py",
    )
    with progress_server(token=TOKEN) as server:
        run = local_run(job, *local_progress_env(server, tmp_path, KUBETF_PROGRESS_EPOCHS="2"))
        assert run.wait_exit(240) == 0, "\n".join(run.lines[-40:])
    epochs = [line for line in run.lines if line.startswith("chief-0 | Finished epoch")]
    assert len(epochs) == 2, run.lines[-40:]
    assert any(line.startswith("chief-0 | Final loss is") for line in run.lines)

    # The coordinator's "Finished epoch ..." and "Final loss is ..." lines, read by the image's sitecustomize: the
    # chief reports, the workers and the ps (the same program) do not
    assert_clean(server)
    reported = [b["epoch"] for b in server.accepted]
    assert reported[0] == 1 and reported[-1] == 2 and reported == sorted(reported)
    assert server.status is not None and server.status["summary"] == "100%"
    assert set(server.status["metrics"]) == {"accuracy", "loss"}


EPOCHS = 8  # still training a few seconds after the SIGTERM (after epoch 1), when TensorFlow says it swallowed it


@pytest.mark.timeout(420)
def test_guide_mwms_custom_training_loop_resumes_from_its_checkpoint_manager_checkpoint_and_reports(
    local_run, tmp_path
):
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
    with progress_server(token=TOKEN) as server:
        run = local_run(job, *local_progress_env(server, tmp_path, KUBETF_PROGRESS_EPOCHS=str(EPOCHS)))
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

    # The guide's "Epoch: N, accuracy: ..., train_loss: ..." prints on the chief (worker 0), read by the image's
    # sitecustomize, across both attempts: the restarted chief first says where it resumed (its "Resumed from ..."
    # line: a position, no metrics), may report that epoch again, then goes on to the end
    assert_authenticated(server)
    reported = [b["epoch"] for b in server.accepted]
    assert sum(later < earlier for earlier, later in itertools.pairwise(reported)) <= 1, reported
    assert all(b["epochs"] == EPOCHS for b in server.accepted)
    assert all(set(b["metrics"]) == {"accuracy", "loss"} for b in server.accepted if "metrics" in b)
    positions = [b for b in server.accepted if "metrics" not in b and not b["final"]]
    assert positions == [{"epoch": step // 10, "epochs": EPOCHS, "final": False}], positions
    assert reported[-1] == EPOCHS and server.accepted[-1]["final"]
    assert server.status is not None and server.status["summary"] == "100%"
