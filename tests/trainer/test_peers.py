"""A MultiWorkerMirrored group whose tasks restart as the kubelet restarts them in place: each task's program started
again the moment it ends, in its own "pod" (here: a process on localhost), nothing restarting the others
(kubetf_trainer.peers)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import child_env, make_job

from kubetf.cli.jobctl import progress_line
from kubetf.cli.local import LocalJob

MWMS_ARGS = ["--data", "digits", "--batch-size", "32", "--epochs", "4", "--steps-per-epoch", "10"]


class InPlace:
    """The tasks of a job as processes, each started again when it ends (but for exit 0), as restart rules do."""

    def __init__(self, job: dict, workdir: Path) -> None:
        with open(workdir / "local.log", "w") as out:
            local = LocalJob(job, str(workdir), out=out)
            local.prepare()  # the operator's environment for each task, on localhost
        self.replicas = {f"{role}-{index}": replica for (role, index), replica in local.replicas.items()}
        for replica in self.replicas.values():
            replica.env = {**child_env(), **{k: v for k, v in replica.env.items() if k.startswith(("TF_", "KUBETF_"))}}
        self.logs = workdir
        self.runs: dict[str, list[subprocess.Popen[bytes]]] = {task: [] for task in self.replicas}
        for task in self.replicas:
            self._start(task)

    def _start(self, task: str) -> None:
        replica = self.replicas[task]
        with open(self.logs / f"{task}-{len(self.runs[task])}.log", "wb") as log:
            run = subprocess.Popen(replica.argv, env=replica.env, stdout=log, stderr=subprocess.STDOUT)
        self.runs[task].append(run)

    def run(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ended = {task: runs[-1].poll() for task, runs in self.runs.items()}
            if all(code == 0 for code in ended.values()):
                return
            for task, code in ended.items():
                if code not in (None, 0):
                    self._start(task)
            time.sleep(0.05)
        raise AssertionError(f"not done in {timeout}s: {self.output('worker-0', -1)[-3000:]}")

    def codes(self, task: str) -> list[int | None]:
        return [run.returncode for run in self.runs[task]]

    def output(self, task: str, run: int) -> str:
        return (self.logs / f"{task}-{run % len(self.runs[task])}.log").read_text(errors="replace")

    def records(self, task: str, run: int) -> list[dict]:
        return [r for r in map(progress_line, self.output(task, run).splitlines()) if r]

    def stop(self) -> None:
        for runs in self.runs.values():
            for run in runs:
                if run.poll() is None:
                    run.kill()
                    run.wait()


@pytest.mark.timeout(400)
def test_a_worker_that_crashed_and_restarted_in_its_pod_ends_its_group_at_once_and_the_group_resumes(tmp_path):
    """worker-1 crashes after epoch 2 and is started again at once; the chief, worker-0, sees its new token and ends
    the group (without waiting for TensorFlow's heartbeat timeout); it restarts too, and both resume from epoch 2."""
    job = make_job("inplace", "MultiWorkerMirrored", {"worker": 2}, [*MWMS_ARGS, "--fail-after-epoch", "worker-1:2"],
                   example="mnist_mwms.py")  # fmt: skip
    group = InPlace(job, tmp_path)
    try:
        group.run(300)
    finally:
        group.stop()
    assert group.codes("worker-1") == [1, 0] and group.codes("worker-0") == [1, 0]
    assert "kubetf_trainer: worker-1 restarted: the group ends, to restart as a whole" in group.output("worker-0", 0)
    for task in ("worker-0", "worker-1"):
        resumed = {r["phase"]: r for r in group.records(task, 1) if r["kubetf"] == "phase"}
        assert (resumed["restored"]["step"], resumed["first_step"]["step"]) == (20, 21)
        assert [r["epoch"] for r in group.records(task, 1) if r["kubetf"] == "progress"] == [3, 4]
    done = json.dumps([r for r in group.records("worker-0", 1) if r["kubetf"] == "done"])
    assert '"epochs": 4' in done
