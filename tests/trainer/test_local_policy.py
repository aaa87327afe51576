"""`kubetf local` applies the operator's restart rules (kubetf.core.policy) to local processes. Tiny Python
commands instead of TensorFlow, so these take seconds."""

from __future__ import annotations

import pytest

SCRIPT = (
    "import os, sys; d = os.environ['KUBETF_CHECKPOINT_DIR']; role = os.environ['KUBETF_ROLE'];"
    "p = os.path.join(d, role + '-' + os.environ['KUBETF_INDEX']); n = len(open(p).read()) if os.path.exists(p) else 0;"
    "open(p, 'a').write('x'); codes = [int(c) for c in os.environ.get('CODES_' + role.upper(), '0').split(',')];"
    "print('attempt', n, flush=True); c = codes[min(n, len(codes) - 1)];"
    "os.kill(os.getpid(), -c) if c < 0 else sys.exit(c)"
)  # a negative code: killed by that signal, as from outside


def job(name, codes: dict[str, str], strategy="MultiWorkerMirrored", replicas=None, **spec):
    replicas = replicas or {"worker": 2}
    roles = {}
    for role, n in replicas.items():
        container = {
            "name": "tensorflow",
            "image": "kubetf/trainer:0.1.0",
            "command": ["python", "-c", SCRIPT],
            "env": [{"name": f"CODES_{r.upper()}", "value": c} for r, c in codes.items()],
        }
        roles[role] = {"replicas": n, "template": {"spec": {"containers": [container]}}}
        if role in spec.get("restart_policies", {}):
            roles[role]["restartPolicy"] = spec["restart_policies"][role]
    return {
        "apiVersion": "kubetf.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "strategy": strategy,
            "replicaSpecs": roles,
            "checkpoint": {"mountPath": "/nonexistent/kubetf", "size": "1Gi"},
            "runPolicy": spec.get("run_policy", {"backoffLimit": 2}),
        },
    }


@pytest.mark.timeout(60)
def test_failures_count_against_backoff_limit_and_the_job_fails_with_the_exit_code(local_run):
    run = local_run(job("fail", {"worker": "3"}), "--backoff-scale", "0")
    assert run.wait_exit(50) == 3
    assert sum("ended with exit code 3" in line for line in run.lines) == 3  # first run + backoffLimit 2
    assert any("BackoffLimitExceeded" in line for line in run.lines)


@pytest.mark.timeout(60)
def test_disruptions_do_not_count_against_backoff_limit(local_run):
    # Exit 42 (PreemptionCheckpointHandler saved), then a SIGTERM from outside.
    spec = job("disrupt", {"worker": "42,-15,0"}, run_policy={"backoffLimit": 0})
    run = local_run(spec)
    assert run.wait_exit(50) == 0, "\n".join(run.lines)
    assert "job succeeded (failures 0, disruptions" in run.lines[-1]


@pytest.mark.timeout(60)
def test_exit_143_from_the_program_itself_is_a_failure(local_run):
    spec = job("self143", {"worker": "143"}, run_policy={"backoffLimit": 0})
    run = local_run(spec)
    assert run.wait_exit(50) == 143, "\n".join(run.lines)
    assert any("BackoffLimitExceeded" in line for line in run.lines), run.lines[-5:]


@pytest.mark.timeout(60)
def test_exit_code_policy_makes_program_errors_permanent(local_run):
    spec = job("permanent", {"worker": "2"}, restart_policies={"worker": "ExitCode"})
    run = local_run(spec)
    assert run.wait_exit(50) == 2
    assert any("PermanentFailure" in line for line in run.lines)
    assert not any("attempt 1" in line for line in run.lines)


@pytest.mark.timeout(60)
def test_ps_success_stops_the_servers_and_the_evaluator_restarts_alone(local_run):
    # chief succeeds on its 1st attempt after a slow start; ps/worker never exit; the evaluator fails once
    spec = job(
        "psok",
        {"chief": "0", "evaluator": "1,0", "worker": "0", "ps": "0"},
        strategy="ParameterServer",
        replicas={"chief": 1, "worker": 1, "ps": 1, "evaluator": 1},
    )
    for role in ("worker", "ps"):  # servers: block until stopped
        spec["spec"]["replicaSpecs"][role]["template"]["spec"]["containers"][0]["command"] = [
            "python",
            "-c",
            "import time; print('serving', flush=True); time.sleep(600)",
        ]
    run = local_run(spec, "--backoff-scale", "0")
    assert run.wait_exit(50) == 0, "\n".join(run.lines)
    assert any("stopping worker-0, ps-0 (job succeeded)" in line for line in run.lines)
    restarts = [line for line in run.lines if "restarting" in line]
    assert all(line.endswith("restarting evaluator-0 (failures 1, disruptions 0)") for line in restarts)


@pytest.mark.timeout(60)
def test_the_kubetf_cli_runs_local(tmp_path):
    import subprocess
    import sys

    import yaml
    from conftest import child_env

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job("viacli", {"worker": "0"})))
    result = subprocess.run(
        [sys.executable, "-m", "kubetf.cli", "local", "-f", str(path), "--workdir", str(tmp_path / "run")],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "worker-0 | attempt 0" in result.stdout and "worker-1 | attempt 0" in result.stdout
    assert "job succeeded" in result.stdout
