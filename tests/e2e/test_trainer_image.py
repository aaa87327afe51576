"""The trainer image, built offline FROM the local base (`make images`, the e2e session's `images` fixture),
runs the examples in a plain container."""

from __future__ import annotations

import json
import subprocess
import time
import uuid

import pytest

from kubetf.cli.jobctl import progress_line

IMAGE = "kubetf/trainer:0.1.0"


pytestmark = pytest.mark.usefixtures("images")


@pytest.mark.tensorflow
@pytest.mark.timeout(180)
def test_image_runs_the_mwms_example_as_non_root():
    result = subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "-e",
            "TF_CPP_MIN_LOG_LEVEL=2",
            IMAGE,
            "python",
            "/opt/kubetf/examples/mnist_mwms.py",
            "--epochs",
            "2",
            "--steps-per-epoch",
            "10",
        ],
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [r for r in map(progress_line, result.stdout.splitlines()) if r]
    assert [r["kubetf"] for r in records] == ["start", "progress", "progress", "done"]
    # offline: one line says MNIST could not be had, the packaged digits are used
    assert sum("MNIST not available" in line for line in result.stdout.splitlines()) == 1
    user = subprocess.run(
        ["docker", "run", "--rm", IMAGE, "sh", "-c", "id -u; cat /proc/1/comm; env"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert user[0] == "1000" and user[1] == "kubetf-init"  # tini as PID 1, a non-root user
    assert "TF_USE_LEGACY_KERAS=1" in user and "PYTHONUNBUFFERED=1" in user


@pytest.mark.tensorflow
@pytest.mark.timeout(120)
def test_sigterm_stops_a_ps_server_even_as_pid_1():
    name = f"kubetf-test-{uuid.uuid4().hex[:8]}"
    tf_config = {
        "cluster": {"chief": ["localhost:2222"], "worker": ["localhost:2223"], "ps": ["localhost:2224"]},
        "task": {"type": "ps", "index": 0},
    }
    subprocess.run(
        [
            "docker",
            "run",
            "-d",
            "--name",
            name,
            "--entrypoint",
            "python",
            "-e",
            "KUBETF_STRATEGY=ParameterServer",
            "-e",
            f"TF_CONFIG={json.dumps(tf_config)}",
            IMAGE,
            "/opt/kubetf/examples/ps_training.py",
        ],
        capture_output=True,
        check=True,
    )
    try:
        deadline = time.monotonic() + 90
        while (
            "serving on grpc://"
            not in subprocess.run(["docker", "logs", name], capture_output=True, text=True, check=False).stdout
        ):
            assert time.monotonic() < deadline, "the ps server did not start"
            time.sleep(1)
        started = time.monotonic()
        subprocess.run(["docker", "stop", "-t", "30", name], capture_output=True, check=True)
        print(f"\nthe ps server stopped {time.monotonic() - started:.1f}s after docker stop's SIGTERM")
        code = subprocess.run(
            ["docker", "inspect", name, "--format", "{{.State.ExitCode}}"], capture_output=True, text=True, check=True
        ).stdout.strip()
        assert code == "143"  # its SIGTERM handler ended it, not the SIGKILL after 30 s (137)
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
