"""Two runs of one job on one checkpoint directory, as MultiKueue's two copies of a job are when a worker was cut off
from the manager and the job dispatched again to another worker that shares the storage (docs/kueue.md, "The
checkpoint"): real TensorFlow, each run a `kubetf local` of its own with its own run identity (in a cluster the
operator sets KUBETF_RUN_ID to the job's uid there)."""

from __future__ import annotations

import json

import pytest
from conftest import make_job

from tests.cluster.fixture import wait_for

MWMS_ARGS = ["--data", "digits", "--batch-size", "32", "--learning-rate", "0.05"]
LEASE = 3.0  # seconds: KUBETF_CHECKPOINT_LEASE_SECONDS (120 in a cluster)


def copy_of_the_job(name: str, shared: str, hold_after_epoch: int) -> dict:
    job = make_job(
        name,
        "MultiWorkerMirrored",
        {"worker": 1},
        [*MWMS_ARGS, "--epochs", "3", "--steps-per-epoch", "8", "--hold-after-epoch", str(hold_after_epoch)],
        example="mnist_mwms.py",
    )
    job["spec"]["checkpoint"]["mountPath"] = shared  # an existing directory: every run uses it as it is
    return job


def run_env(run: str) -> tuple[str, ...]:
    return ("--env", f"KUBETF_RUN_ID={run}", "--env", f"KUBETF_CHECKPOINT_LEASE_SECONDS={LEASE}")


@pytest.mark.timeout(400)
def test_a_second_run_waits_while_the_first_lives_resumes_from_it_and_a_run_that_waited_for_the_end_leaves(
    local_run, tmp_path
):
    shared = tmp_path / "shared-checkpoints"
    shared.mkdir()
    first = local_run(copy_of_the_job("first", str(shared), hold_after_epoch=1), *run_env("copy-a"))
    first.wait_for(lambda lines: first.records("held", "worker-0", lines), 240, "the first run held after epoch 1")

    # The second run waits, without training, however long the first lives.
    second = local_run(copy_of_the_job("second", str(shared), hold_after_epoch=2), *run_env("copy-b"))
    waiting = second.wait_for(lambda lines: second.records("fence", "worker-0", lines), 120, "the second run waiting")
    assert (waiting[0]["state"], waiting[0]["holder"]["run"]) == ("waiting", "copy-a")
    beats = shared / ".kubetf-fence" / "tasks" / "copy-a.worker-0"  # the first run's heartbeat (fence.py)
    beat = json.loads(beats.read_text())["beat"]
    wait_for(lambda: json.loads(beats.read_text())["beat"] >= beat + 2 * 12, 4 * LEASE, "two leases of the first run")
    assert not second.records("start"), "the second run trained while the first one lived"

    # The first run stops (its copy deleted, or preempted, as SIGTERM says): the second takes the directory and
    # resumes from the first one's backup, not from scratch.
    first.stop()
    second.wait_for(lambda lines: second.records("start", "worker-0", lines), 120, "the second run training")
    (took,) = [r for r in second.records("fence", "worker-0") if r["state"] == "held"]
    assert (took["before"]["run"], took["why"]) == ("copy-a", "released")
    (start,) = second.records("start", "worker-0")
    assert start["initial_epoch"] == 1, "resumed from the first run's epoch-1 backup"
    assert [r["epoch"] for r in first.records("progress", "worker-0")] == [1], "the first wrote nothing after"
    second.wait_for(lambda lines: second.records("held", "worker-0", lines), 120, "the second run held after epoch 2")

    # A restart of the first run (its copy coming back) waits in turn; the second finishes the training meanwhile:
    # the first then has nothing left to do and ends successfully, without training.
    again = local_run(copy_of_the_job("first-again", str(shared), hold_after_epoch=1), *run_env("copy-a"))
    waiting = again.wait_for(lambda lines: again.records("fence", "worker-0", lines), 120, "the first run waiting")
    assert (waiting[0]["state"], waiting[0]["holder"]["run"]) == ("waiting", "copy-b")
    (shared / "release").touch()
    assert second.wait_exit(180) == 0, "\n".join(second.lines[-40:])
    assert [r["epoch"] for r in second.records("progress", "worker-0")] == [2, 3]
    assert second.records("done", "worker-0")
    assert again.wait_exit(120) == 0, "\n".join(again.lines[-40:])
    assert [r["state"] for r in again.records("fence", "worker-0")] == ["waiting", "finished elsewhere"]
    assert not again.records("start"), "it never trained"
