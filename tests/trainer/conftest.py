"""Trainer tier: real TensorFlow processes on localhost, TF_CONFIG from the project's own builders."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "operator"), str(REPO / "trainer_image")]

from kubetf.cli.jobctl import progress_line  # noqa: E402
from tests.progress_server import ProgressServer  # noqa: E402

# `make test` runs this tier in the background of a shell, which starts it with SIGINT ignored: Ctrl-C stopped the
# cluster tests beside it and left this tier running. Python's own handler back, Ctrl-C stops it too.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# First: xdist's worker reads `xdist_group` in its own hook, and a marker added after it is never seen.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.trainer)


def child_env(**extra: str) -> dict[str, str]:
    """Environment for processes that must use this checkout's kubetf and kubetf_trainer."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "operator"), str(REPO / "trainer_image")])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["TF_USE_LEGACY_KERAS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def make_job(
    name: str,
    strategy: str,
    replicas: dict[str, int],
    args: list[str],
    *,
    example: str,
    run_policy: dict[str, Any] | None = None,
) -> dict[str, Any]:
    container = {
        "name": "tensorflow",
        "image": "kubetf/trainer:0.1.0",
        "command": ["python", f"/opt/kubetf/examples/{example}", *args],
    }
    return {
        "apiVersion": "kubetf.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "strategy": strategy,
            "replicaSpecs": {
                role: {"replicas": n, "template": {"spec": {"containers": [dict(container)]}}}
                for role, n in replicas.items()
            },
            "checkpoint": {"mountPath": "/nonexistent/kubetf-checkpoints", "size": "1Gi"},
            "runPolicy": run_policy or {"backoffLimit": 2},
        },
    }


class LocalRun:
    """`python -m kubetf.cli.local -f JOB --workdir W` with its output collected line by line."""

    def __init__(self, job: dict[str, Any], workdir: Path, *extra_args: str):
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        job_file = workdir / "job.yaml"
        job_file.write_text(yaml.safe_dump(job))
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kubetf.cli.local",
                "-f",
                str(job_file),
                "--workdir",
                str(workdir / "run"),
                "--grace-period",
                "5",
                *extra_args,
            ],
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_for(self, predicate: Callable[[list[str]], Any], timeout: float, what: str = "") -> Any:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                result = predicate(self.lines)
                if result:
                    return result
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self.reader.is_alive()):
                    tail = "\n".join(self.lines[-40:])
                    raise AssertionError(f"timed out waiting for {what or predicate}; output tail:\n{tail}")
                self.cond.wait(timeout=min(left, 1.0))

    def wait_exit(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            tail = "\n".join(self.lines[-40:])
            raise AssertionError(f"kubetf local did not finish in {timeout}s; output tail:\n{tail}") from None
        self.reader.join(timeout=10)
        return code

    def records(
        self, kind: str | None = None, label: str | None = None, lines: list[str] | None = None
    ) -> list[dict[str, Any]]:
        out = []
        for line in self.lines if lines is None else lines:
            if label and not line.startswith(f"{label} | "):
                continue
            record = progress_line(line)
            if record and (kind is None or record.get("kubetf") == kind):
                out.append(record)
        return out

    def pid(self, label: str, attempt: int = 0) -> int:
        marker = f"started {label} attempt {attempt} pid "
        for line in self.lines:
            if marker in line:
                return int(line.split(marker, 1)[1].split()[0])
        raise AssertionError(f"{label} attempt {attempt} was not started")

    def index_of(self, fragment: str) -> int:
        for i, line in enumerate(self.lines):
            if fragment in line:
                return i
        raise AssertionError(f"no line contains {fragment!r}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def local_run(tmp_path: Path) -> Iterator[Callable[..., LocalRun]]:
    runs: list[LocalRun] = []

    def start(job: dict[str, Any], *extra_args: str) -> LocalRun:
        run = LocalRun(job, tmp_path / api_name(job), *extra_args)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.stop()


def api_name(job: dict[str, Any]) -> str:
    return str(job["metadata"]["name"])


# Progress reports (protocol v1) to tests.progress_server, a local stand-in for the operator's endpoint.
TOKEN = "projected-sa-token"


def progress_variables(url: str, tmp_path: Path) -> dict[str, str]:
    """The progress variables the operator gives a task, with a token file (its newline as `echo` writes one: the
    reporter strips it)."""
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    return {"KUBETF_PROGRESS_URL": url, "KUBETF_PROGRESS_TOKEN_FILE": str(token), "KUBETF_PROGRESS_INTERVAL": "0.5"}


def local_progress_env(server: ProgressServer, tmp_path: Path, **extra: str) -> list[str]:
    """`kubetf local` arguments that give every task the operator's progress variables, as its pods get them."""
    env = {**progress_variables(server.url, tmp_path), **extra}
    return [arg for name, value in env.items() for arg in ("--env", f"{name}={value}")]


def epoch_ends(server: ProgressServer) -> list[tuple[int, int]]:
    """(epoch, step) of the reports at epoch ends, in order, once each (the exit-time report repeats the last)."""
    out: list[tuple[int, int]] = []
    for b in server.accepted:
        if b.get("steps") and b["step"] * b["epochs"] == b["epoch"] * b["steps"] and (b["epoch"], b["step"]) not in out:
            out.append((b["epoch"], b["step"]))
    return out


def is_subsequence(items: list[Any], of: list[Any]) -> bool:
    """Every item in `of`, in its order (reports coalesced by the reporter leave some out)."""
    rest = iter(of)
    return all(item in rest for item in items)


def at_epoch_end(server: ProgressServer, epoch: int) -> dict[str, Any]:
    ends = epoch_ends(server)
    return next(
        b for b in server.accepted if b.get("steps") and (b["epoch"], b["step"]) in ends and b["epoch"] == epoch
    )


def with_results(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The reports that carry results: all but a final one that only repeats the position (the report at exit is
    sent alone when the last result went out more than 0.5 s before it; else the two are one)."""
    return [b for b in reports if "metrics" in b or not b["final"]]


def assert_authenticated(server: ProgressServer) -> None:
    assert server.errors == [], server.errors  # every body passed the operator's parser
    assert {r["headers"].get("Authorization") for r in server.requests} == {f"Bearer {TOKEN}"}


def assert_clean(server: ProgressServer) -> None:
    """One run of one reporting task: authenticated, the step never goes back, one final report, last."""
    assert_authenticated(server)
    steps = [b["step"] for b in server.accepted if "step" in b]
    assert steps == sorted(steps), steps
    assert server.accepted[-1]["final"] is True
    assert [b["final"] for b in server.accepted].count(True) == 1
