"""Steps/s of a 2-worker MultiWorkerMirrored job started by `kubetf local` vs the same processes by hand.

By hand = the two example processes started directly with the env `kubetf.core.builders.task_env` gives (TF_CONFIG
on localhost), output to pipes. `kubetf local` adds its supervisor, line prefixing and log files. Steps/s is the
mean of worker 0's per-epoch `steps_per_sec` (first epoch left out: graph tracing), wall is launch to exit.

    .venv/bin/python tests/bench/trainer_overhead.py [--epochs 4] [--steps-per-epoch 40] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "operator"), str(REPO / "trainer_image")]

from kubetf.cli import local  # noqa: E402
from kubetf.cli.jobctl import progress_line  # noqa: E402
from kubetf.core import api, builders  # noqa: E402

EXAMPLE = "/opt/kubetf/examples/mnist_mwms.py"


def make_job(name: str, args: list[str]) -> dict[str, Any]:
    container = {"name": "tensorflow", "image": "kubetf/trainer:0.1.0", "command": ["python", EXAMPLE, *args]}
    return {
        "apiVersion": "kubetf.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "strategy": "MultiWorkerMirrored",
            "replicaSpecs": {"worker": {"replicas": 2, "template": {"spec": {"containers": [container]}}}},
            "checkpoint": {"mountPath": "/nonexistent/kubetf-bench", "size": "1Gi"},
        },
    }


def base_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "operator"), str(REPO / "trainer_image")])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env |= {"TF_USE_LEGACY_KERAS": "1", "PYTHONUNBUFFERED": "1"}
    return env


def summarize(lines: list[str], wall: float, prefix: str = "") -> dict[str, Any]:
    progress = []
    for line in lines:
        if prefix and not line.startswith(prefix):
            continue
        record = progress_line(line)
        if record and record.get("kubetf") == "progress" and record.get("index") == 0:
            progress.append(record)
    rates = [float(p["steps_per_sec"]) for p in progress[1:] if p.get("steps_per_sec")]
    return {
        "wall_s": round(wall, 2),
        "epochs": len(progress),
        "steps_per_s": round(statistics.mean(rates), 3) if rates else None,
    }


def by_hand(job: dict[str, Any], workdir: str) -> dict[str, Any]:
    job = api.with_defaults(job)
    tasks = api.tasks(job)
    ports = dict(zip(tasks, local.free_ports(len(tasks)), strict=True))
    path_map = local.default_path_map()
    procs = []
    start = time.monotonic()
    for role, index in tasks:
        env = base_env() | builders.task_env(
            job,
            role,
            index,
            address_of=lambda r, i: f"localhost:{ports[(r, i)]}",
            checkpoint_dir=os.path.join(workdir, "checkpoint"),
        )
        argv = local.container_argv(builders.training_container(job, role), env, path_map, sys.executable)
        out = open(os.path.join(workdir, f"{role}-{index}.log"), "w+")  # noqa: SIM115
        procs.append((subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT), out))
    codes = [p.wait() for p, _ in procs]
    wall = time.monotonic() - start
    procs[0][1].seek(0)
    lines = procs[0][1].read().splitlines()
    for _, out in procs:
        out.close()
    if any(codes):
        raise SystemExit(f"by hand: exit codes {codes}, see {workdir}")
    return summarize(lines, wall)


def via_local(job: dict[str, Any], workdir: str) -> dict[str, Any]:
    job_file = os.path.join(workdir, "job.yaml")
    with open(job_file, "w") as f:
        yaml.safe_dump(job, f)
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "kubetf.cli.local", "-f", job_file, "--workdir", os.path.join(workdir, "run")],
        env=base_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    wall = time.monotonic() - start
    if proc.returncode:
        raise SystemExit(f"kubetf local: exit code {proc.returncode}, see {workdir}")
    return summarize(proc.stdout.splitlines(), wall, prefix="worker-0 | ")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps-per-epoch", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    train_args = [
        "--data",
        "digits",
        "--epochs",
        str(args.epochs),
        "--steps-per-epoch",
        str(args.steps_per_epoch),
        "--batch-size",
        str(args.batch_size),
        "--no-preemption-checkpoint",
    ]
    results: dict[str, list[dict[str, Any]]] = {"by_hand": [], "kubetf_local": []}
    with tempfile.TemporaryDirectory(prefix="kubetf-bench-") as tmp:
        for i in range(args.repeats):  # alternate, so that drift hits both the same way
            for mode, fn in (("by_hand", by_hand), ("kubetf_local", via_local)):
                workdir = os.path.join(tmp, f"{mode}-{i}")
                os.makedirs(workdir)
                result = fn(make_job(f"bench-{i}", train_args), workdir)
                results[mode].append(result)
                print(f"{mode:13s} run {i}: {result}", flush=True)
    summary = {}
    for mode, runs in results.items():
        rates = [r["steps_per_s"] for r in runs if r["steps_per_s"]]
        summary[mode] = {
            "steps_per_s": round(statistics.mean(rates), 3),
            "wall_s": round(statistics.mean(r["wall_s"] for r in runs), 2),
        }
    hand, loc = summary["by_hand"], summary["kubetf_local"]
    slower = hand["steps_per_s"] - loc["steps_per_s"]
    summary["steps_per_s_overhead_pct"] = round(100 * slower / hand["steps_per_s"], 2)
    summary["wall_overhead_pct"] = round(100 * (loc["wall_s"] - hand["wall_s"]) / hand["wall_s"], 2)
    print(
        f"2-worker MWMS, {args.epochs} epochs x {args.steps_per_epoch} steps, batch {args.batch_size}/worker, "
        f"{args.repeats} run(s) each"
    )
    print(f"  by hand      : {hand['steps_per_s']:8.3f} steps/s   wall {hand['wall_s']:6.2f} s")
    print(f"  kubetf local : {loc['steps_per_s']:8.3f} steps/s   wall {loc['wall_s']:6.2f} s")
    print(
        f"  overhead     : {summary['steps_per_s_overhead_pct']:+.2f}% steps/s, "
        f"{summary['wall_overhead_pct']:+.2f}% wall"
    )
    print(json.dumps({"kubetf": "bench", "name": "trainer_overhead", **summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
