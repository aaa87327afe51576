"""The trainer's phase lines (kubetf_trainer.phases): who says them, once each, with the right times; what the image's
sitecustomize says at interpreter start and when TensorFlow's import ends (a stand-in `tensorflow`, no TensorFlow)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kubetf.cli import jobctl
from kubetf_trainer import phases

TRAINER = Path(__file__).resolve().parents[2] / "trainer_image"
TF_CONFIG = json.dumps({"cluster": {"worker": ["w0:2222", "w1:2222"]}, "task": {"type": "worker", "index": 1}})


@pytest.fixture
def task(monkeypatch):
    """This process as worker 1 of a job, its phases not said yet; what it says, as lines."""
    for name in ("KUBETF_ROLE", "KUBETF_INDEX", phases.ENV_OFF, phases.ENV_PID):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TF_CONFIG", TF_CONFIG)
    monkeypatch.setattr(phases, "_said", set())
    out = io.StringIO()
    monkeypatch.setattr(sys, "__stdout__", out)
    return out


def said(out: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_phase_is_said_once_as_a_json_line_on_the_process_own_stdout(task, capsys):
    before = time.time()
    assert phases.mark(phases.CLUSTER, seconds=0.5)["phase"] == "cluster"
    assert phases.mark(phases.CLUSTER, seconds=0.7) is None
    phases.mark(phases.RESTORED, at=123.4567, step=20)
    [cluster, restored] = said(task)
    assert cluster["kubetf"] == "phase" and (cluster["role"], cluster["index"]) == ("worker", 1)
    assert before - 0.001 <= cluster["time"] <= time.time() + 0.001 and cluster["seconds"] == 0.5  # to the ms
    assert restored == {"kubetf": "phase", "role": "worker", "index": 1, "phase": "restored", "time": 123.457,
                        "step": 20}  # fmt: skip
    assert capsys.readouterr().out == ""  # not sys.stdout: a program may have redirected it meanwhile


@pytest.mark.parametrize(
    "env,says",
    [
        ({"TF_CONFIG": TF_CONFIG}, True),
        ({"KUBETF_ROLE": "chief"}, True),
        ({}, False),  # not a task of a job: any other Python program in the image
        ({"TF_CONFIG": TF_CONFIG, "KUBETF_PHASES": "0"}, False),
        ({"TF_CONFIG": TF_CONFIG, "KUBETF_PHASES_PID": "1"}, False),  # a process a task started
        ({"TF_CONFIG": TF_CONFIG, "KUBETF_PHASES_PID": str(os.getpid())}, True),
    ],
)
def test_only_the_tasks_of_a_job_say_their_phases(env, says):
    assert phases.enabled(env) is says


def test_the_start_time_is_the_kernels_start_of_the_process():
    before = time.time()
    probe = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        time.sleep(0.3)  # the start is when the process began, not when it was asked
        started = phases.process_start_time(probe.pid)
    finally:
        probe.communicate(b"")
    tick = 1 / os.sysconf("SC_CLK_TCK")  # the kernel counts a process's start in clock ticks
    assert started is not None and before - tick - 0.005 < started < time.time() - 0.25, (before, started)


def run_in_image_like_env(tmp_path: Path, code: str, **env: str) -> list[dict]:
    """`python -c code` as the image starts a task's program (its sitecustomize on PYTHONPATH), with a `tensorflow`
    that takes 0.2 s to import; the phase lines it printed."""
    fake = tmp_path / "fake" / "tensorflow"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "__init__.py").write_text("import time\ntime.sleep(0.2)\nVERSION = 'fake'\n")
    path = os.pathsep.join([str(TRAINER), str(tmp_path / "fake")])
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KUBETF_", "TF_CONFIG"))}
    result = subprocess.run(
        [sys.executable, "-c", code], env={**base, "PYTHONPATH": path, **env}, capture_output=True, text=True,
        check=False, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return [r for r in map(jobctl.progress_line, result.stdout.splitlines()) if r and r["kubetf"] == "phase"]


def test_the_image_says_when_a_task_started_and_when_its_tensorflow_import_ended(tmp_path):
    code = (
        "import os, subprocess, sys, time\n"
        "began = time.time()\n"
        "import tensorflow\n"
        "print('imported', began, time.time(), flush=True)\n"
        "import tensorflow\n"  # a second import is no second line
        "subprocess.run([sys.executable, '-c', 'import tensorflow'], check=True)\n"  # nor a child's
    )
    before = time.time()
    lines = run_in_image_like_env(tmp_path, code, TF_CONFIG=TF_CONFIG)
    assert [r["phase"] for r in lines] == ["started", "imported"]
    started, imported = lines
    assert before - 0.02 <= started["time"] <= imported["time"] - 0.2 and started["pid"] > 0
    assert imported["seconds"] >= 0.2 and (imported["role"], imported["index"]) == ("worker", 1)


def test_other_programs_in_the_image_say_nothing(tmp_path):
    assert run_in_image_like_env(tmp_path, "import tensorflow") == []
    assert run_in_image_like_env(tmp_path, "import tensorflow", TF_CONFIG=TF_CONFIG, KUBETF_PHASES="0") == []


def test_phases_are_described_for_people():
    record = {"kubetf": "phase", "role": "worker", "index": 0, "phase": "imported", "seconds": 5.93, "time": 1.0}
    assert jobctl.describe_progress(record) == "worker-0 TensorFlow imported (5.93s)"
    record = {"kubetf": "phase", "role": "chief", "index": 0, "phase": "first_step", "step": 21, "time": 1.0}
    assert jobctl.describe_progress(record) == "chief-0 first training step done at step 21"
