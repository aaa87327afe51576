"""Real TensorFlow jobs run by `kubetf local` (TF_CONFIG from kubetf.core.builders.task_env, restarts by
kubetf.core.policy). Small on purpose: a few epochs of a few steps on scikit-learn's digits, 2 CPU cores."""

from __future__ import annotations

import glob
import os
import signal

import pytest
from conftest import (
    TOKEN,
    assert_authenticated,
    assert_clean,
    at_epoch_end,
    epoch_ends,
    is_subsequence,
    local_progress_env,
    make_job,
    with_results,
)

from tests.progress_server import progress_server

MWMS_ARGS = ["--data", "digits", "--batch-size", "32", "--learning-rate", "0.05"]


def _epochs(records: list[dict]) -> list[int]:
    return [int(r["epoch"]) for r in records]


@pytest.mark.timeout(300)
def test_mwms_two_workers_train_loss_falls_and_the_chief_reports_progress(local_run, tmp_path):
    job = make_job(
        "mwms",
        "MultiWorkerMirrored",
        {"worker": 2},
        [*MWMS_ARGS, "--epochs", "3", "--steps-per-epoch", "12"],
        example="mnist_mwms.py",
    )
    with progress_server(token=TOKEN) as server:
        run = local_run(job, *local_progress_env(server, tmp_path, KUBETF_PROGRESS_INTERVAL="0.2"))
        assert run.wait_exit(240) == 0, "\n".join(run.lines[-40:])

    for label in ("worker-0", "worker-1"):
        start = run.records("start", label)
        assert [s["initial_epoch"] for s in start] == [0]
        assert start[0]["num_workers"] == 2 and start[0]["strategy"] == "MultiWorkerMirrored"
        assert _epochs(run.records("progress", label)) == [1, 2, 3]
    progress = run.records("progress", "worker-0")
    assert progress[-1]["loss"] < progress[0]["loss"]
    # MWMS: both workers see the same all-reduced loss
    assert [p["loss"] for p in run.records("progress", "worker-1")] == pytest.approx([p["loss"] for p in progress])
    done = run.records("done")
    assert len(done) == 1 and done[0]["role"] == "worker" and done[0]["index"] == 0
    assert os.path.isfile(os.path.join(done[0]["model_path"], "saved_model.pb"))
    assert "job succeeded (failures 0, disruptions 0)" in run.lines[-1]
    # The JSON lines `kubetf submit` reads are as they were without reports
    kinds = [r["kubetf"] for r in run.records(label="worker-0") if r["kubetf"] != "phase"]
    assert kinds == ["start", "progress", "progress", "progress", "done"]
    # ... and each process said its phases once, in order (kubetf_trainer.phases)
    for label in ("worker-0", "worker-1"):
        said = run.records("phase", label)
        assert [p["phase"] for p in said] == ["started", "imported", "cluster", "restored", "first_step"], said
        assert [p["time"] for p in said] == sorted(p["time"] for p in said)
        assert said[3]["step"] == 0 and said[4]["step"] == 1  # nothing to restore: from the first step

    # The library's callback reports to the operator from the chief (worker 0) alone: one run, one final report
    # (a new epoch goes out at once, unless a POST is in flight: then the newest state wins, an epoch end may be
    # skipped)
    assert_clean(server)
    assert is_subsequence(epoch_ends(server), [(1, 12), (2, 24), (3, 36)]) and epoch_ends(server)[-1] == (3, 36)
    assert all(b["epochs"] == 3 and b["steps"] == 36 for b in server.accepted)
    assert set(at_epoch_end(server, 3)["metrics"]) == {"loss", "accuracy"}
    assert server.accepted[-1]["step"] == 36
    assert server.status is not None
    assert (server.status["percent"], server.status["summary"], server.status["final"]) == (100.0, "100%", True)
    history = [p["epoch"] for p in server.status["history"] if p["step"] == 12 * p["epoch"]]
    assert is_subsequence(history, [1, 2, 3]) and history[-1] == 3, server.status["history"]
    # TensorBoard: the chief's epoch scalars in the checkpoint volume
    assert glob.glob(str(run.workdir / "run" / "checkpoint" / "tensorboard" / "train" / "events.out.tfevents.*"))


@pytest.mark.timeout(300)
def test_ps_job_trains_and_evaluator_reports_each_checkpoint(local_run, tmp_path):
    job = make_job(
        "ps",
        "ParameterServer",
        {"chief": 1, "worker": 2, "ps": 1, "evaluator": 1},
        ["--data", "digits", "--epochs", "3", "--steps-per-epoch", "15"],
        example="ps_training.py",
    )
    with progress_server(token=TOKEN) as server:
        run = local_run(job, *local_progress_env(server, tmp_path))
        assert run.wait_exit(240) == 0, "\n".join(run.lines[-40:])

    progress = run.records("progress", "chief-0")
    assert _epochs(progress) == [1, 2, 3]
    assert progress[-1]["loss"] < progress[0]["loss"]
    evals = run.records("eval", "evaluator-0")
    assert [e["epoch"] for e in evals] == [1, 2, 3]
    assert [e["checkpoint"] for e in evals] == ["ckpt-0001", "ckpt-0002", "ckpt-0003"]
    assert all(e["loss"] is not None and "accuracy" in e["metrics"] for e in evals)
    assert run.records("done", "chief-0")
    # the evaluator stopped by itself after the last checkpoint; ps and workers were stopped by kubetf local
    assert any("evaluator-0 succeeded" in line for line in run.lines)
    assert not any(r["role"] in ("worker", "ps") for r in run.records() if r["kubetf"] != "phase")
    assert [r["phase"] for r in run.records("phase", "ps-0")] == ["started", "imported", "serving"]

    # Reports to the operator (every task has its variables, as in pods): the chief, ParameterServerStrategy's
    # coordinator, reports its fit's epoch ends (batch-level logs are not known yet under ParameterServerStrategy);
    # the evaluator each checkpoint's metrics, with no step; the workers and the ps nothing.
    assert_authenticated(server)
    chief = [b for b in server.accepted if "step" in b]
    evaluator = [b for b in server.accepted if "step" not in b]
    assert is_subsequence(epoch_ends(server), [(1, 15), (2, 30), (3, 45)]) and epoch_ends(server)[-1] == (3, 45)
    assert all(b["step"] % 15 == 0 and b["epochs"] == 3 for b in chief)
    assert len(chief) <= 4 and [b["final"] for b in chief].count(True) == 1 and chief[-1]["final"]
    epochs = [b["epoch"] for b in evaluator]  # evaluations within 0.5 s of each other are coalesced
    assert epochs[0] == 1 and epochs[-1] == 3 and epochs == sorted(epochs), evaluator
    assert all(set(b["metrics"]) == {"loss", "accuracy"} for b in with_results(evaluator))
    assert [b["final"] for b in evaluator].count(True) == 1
    checkpoints = run.workdir / "run" / "checkpoint"
    assert glob.glob(str(checkpoints / "tensorboard" / "eval" / "events.out.tfevents.*"))


@pytest.mark.timeout(400)
def test_mwms_worker_sigtermed_saves_then_one_killed_resumes_from_the_backup_the_group_restarting_each_time(local_run):
    """One job, two preemptions of worker 1 (MultiWorkerMirrored: the whole group restarts each time): first a
    SIGTERM, on which every worker saves the backup at the same step and exits 42; then, in the restarted group, a
    SIGKILL, with no chance to save: the next group resumes from the last backup. Each is a disruption."""
    epochs, steps = 5, 12
    job = make_job(
        "preempted",
        "MultiWorkerMirrored",
        {"worker": 2},
        [*MWMS_ARGS, "--epochs", str(epochs), "--steps-per-epoch", str(steps)],
        example="mnist_mwms.py",
    )
    run = local_run(job)
    run.wait_for(lambda lines: len(run.records("progress", "worker-0", lines)) >= 1, 200, "epoch 1 on worker-0")
    os.kill(run.pid("worker-1"), signal.SIGTERM)
    run.wait_for(lambda lines: any("started worker-1 attempt 1" in line for line in lines), 120, "the group restarted")
    first_restart = run.index_of("started worker-0 attempt 1")

    def progress_since_restart(lines: list[str]) -> int:
        return len(run.records("progress", "worker-0", lines[first_restart:]))

    run.wait_for(lambda lines: progress_since_restart(lines) >= 1, 200, "an epoch on the restarted worker-0")
    os.kill(run.pid("worker-1", 1), signal.SIGKILL)
    # Killed while tf-keras deleted its scratch copy of the backup, a worker leaves a state file naming deleted
    # data (a flake once): leave one every time; the restarted worker must not restore from it.
    scratch = run.workdir / "run" / "checkpoint" / "backup" / "workertemp_1"
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "checkpoint").write_text('model_checkpoint_path: "ckpt-2"\nall_model_checkpoint_paths: "ckpt-2"\n')
    assert run.wait_exit(300) == 0, "\n".join(run.lines[-40:])

    second_restart = run.index_of("started worker-0 attempt 2")
    before, first = run.lines[:first_restart], run.lines[first_restart:second_restart]
    second = run.lines[second_restart:]
    # SIGTERM: every worker saved the backup at the same step, then exited 42 (a disruption)
    preempted = {(r["role"], r["index"]): r for r in run.records("preempted", lines=before)}
    assert set(preempted) == {("worker", 0), ("worker", 1)}
    saved = preempted[("worker", 0)]  # the chief: it writes the backup
    assert saved["saved"] and saved["exit_code"] == 42
    assert preempted[("worker", 1)] == {**saved, "index": 1}
    assert saved["step"] > steps  # past the first epoch: mid-training, not at a boundary backup
    assert any("exit code 42" in line and "Disrupted" in line for line in before)
    assert any("restarting worker-0, worker-1" in line for line in before)  # MWMS: the whole group
    # ... and the restarted group resumed from that checkpoint: same epoch, and only the rest of it
    restored, stepped = (run.records("phase", "worker-0", first)[i] for i in (3, 4))
    assert (restored["phase"], restored["step"]) == ("restored", saved["step"])
    assert (stepped["phase"], stepped["step"]) == ("first_step", saved["step"] + 1)
    start = run.records("start", "worker-0", first)
    assert [s["initial_epoch"] for s in start] == [saved["epoch"]]
    done_before_kill = max(_epochs(run.records("progress", "worker-0", first)))
    assert _epochs(run.records("progress", "worker-0", first)) == list(range(saved["epoch"] + 1, done_before_kill + 1))

    # SIGKILL: no save; the whole group restarts again and resumes from the last backup (an epoch end)
    assert any("worker-1 ended with signal 9" in line and "Disrupted" in line for line in first)
    assert any("restarting worker-0, worker-1" in line for line in first)
    start = run.records("start", "worker-0", second)
    assert len(start) == 1
    initial = start[0]["initial_epoch"]
    assert initial >= done_before_kill
    # no epoch is run twice past the checkpoint, and the job finishes
    assert _epochs(run.records("progress", "worker-0", second)) == list(range(initial + 1, epochs + 1))
    assert run.records("done", "worker-0", second)
    assert "failures 0, disruptions 2" in run.lines[-1] and "succeeded" in run.lines[-1]


@pytest.mark.timeout(400)
def test_ps_lost_worker_restarts_alone_lost_ps_restarts_with_the_chief(local_run):
    epochs = 8
    job = make_job(
        "psfail",
        "ParameterServer",
        {"chief": 1, "worker": 2, "ps": 1},
        ["--data", "digits", "--epochs", str(epochs), "--steps-per-epoch", "60"],
        example="ps_training.py",
    )
    run = local_run(job)

    def chief_epochs(lines: list[str]) -> int:
        return len(run.records("progress", "chief-0", lines))

    run.wait_for(lambda lines: chief_epochs(lines) >= 2, 200, "epoch 2 on the chief")
    os.kill(run.pid("worker-1"), signal.SIGKILL)
    run.wait_for(lambda lines: any("started worker-1 attempt 1" in line for line in lines), 60, "worker-1 restart")
    after_worker = chief_epochs(run.lines)
    run.wait_for(lambda lines: chief_epochs(lines) >= after_worker + 2, 200, "two more chief epochs")
    os.kill(run.pid("ps-0"), signal.SIGKILL)
    assert run.wait_exit(300) == 0, "\n".join(run.lines[-40:])

    worker_restart = next(line for line in run.lines if "worker-1 ended with signal 9" in line)
    assert worker_restart.endswith("restarting worker-1 (failures 0, disruptions 1)")  # the worker alone
    ps_restart = next(line for line in run.lines if "ps-0 ended with signal 9" in line)
    assert "restarting chief-0, ps-0 (failures 0, disruptions 2)" in ps_restart  # the ps and the chief
    assert not any("started worker-0 attempt 1" in line for line in run.lines)

    restart = run.index_of("started chief-0 attempt 1")
    before, after = run.lines[:restart], run.lines[restart:]
    done_before = max(_epochs(run.records("progress", "chief-0", before)))
    start = run.records("start", "chief-0", after)[0]
    assert start["initial_epoch"] > 0 and start["initial_epoch"] >= done_before
    assert _epochs(run.records("progress", "chief-0", after)) == list(range(start["initial_epoch"] + 1, epochs + 1))
    assert run.records("done", "chief-0", after)
