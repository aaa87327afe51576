"""`kubetf local -f JOB.yaml`: run a TrainingJob's replicas as local processes.

Each task (role, index) becomes one process running its training container's `command` + `args`, with the
environment the operator would inject (`builders.task_env`: TF_CONFIG on `localhost` ports, KUBETF_*), the
container's own `env`, and the trainer image's defaults (`TF_USE_LEGACY_KERAS=1`, `PYTHONUNBUFFERED=1`).
Output is prefixed `role-index | `; lines of kubetf local itself are prefixed `kubetf-local | `.

Image paths: `python`/`python3` as the program become this interpreter (or `--python`), and path prefixes
are rewritten by `--map IMAGE_PATH=LOCAL_PATH` (default: `/opt/kubetf` = the directory holding the
`kubetf_trainer` package, i.e. `trainer_image/` of a source checkout).

The checkpoint volume is `checkpoint.mountPath` when that directory exists and is writable, else
`WORKDIR/checkpoint`. WORKDIR (default `$TMPDIR/kubetf-local/<job>`) also gets `logs/role-index.log`.

Before starting anything it checks that the Python the tasks run can import TensorFlow, and says what to install.

Restarts follow the operator's rules (`kubetf.core.policy`): MultiWorkerMirrored restarts the whole chief+worker
group, ParameterServer a worker alone or a ps together with the chief, Independent and the evaluator every task
alone; exits by a signal
(137/143) or 42 are disruptions, other non-zero exits failures under `backoffLimit` (with backoff) and the
role's `restartPolicy`. The return value is the job's exit code: 0 when it succeeded per `successPolicy`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from kubetf.core import api, builders, policy, sigterm

Task = tuple[str, int]
PREFIX = "kubetf-local | "
IMAGE_ENV_DEFAULTS = {"TF_USE_LEGACY_KERAS": "1", "PYTHONUNBUFFERED": "1"}
PYTHON_NAMES = {"python", "python3", "python3.11"}
# find_spec, not an import: TensorFlow takes seconds to import on a small machine.
HAS_TENSORFLOW = "import importlib.util, sys; sys.exit(importlib.util.find_spec('tensorflow') is None)"
INSTALL_TENSORFLOW = (
    "install the trainer extra into it (pip install '.[trainer]' in a kubetf checkout: tensorflow-cpu, tf-keras, "
    "scikit-learn), or name an interpreter that has TensorFlow with --python"
)


def default_path_map() -> dict[str, str]:
    """`/opt/kubetf` (where the trainer image keeps kubetf_trainer and the examples) -> the local copy."""
    spec = importlib.util.find_spec("kubetf_trainer")
    if spec is None or not spec.origin:
        return {}
    root = os.path.dirname(os.path.dirname(os.path.abspath(spec.origin)))
    return {"/opt/kubetf": root}


def free_ports(count: int) -> list[int]:
    """`count` distinct free TCP ports on localhost (held open together so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _map_path(arg: str, path_map: dict[str, str]) -> str:
    for src, dst in path_map.items():
        src = src.rstrip("/")
        if arg == src or arg.startswith(src + "/"):
            return dst.rstrip("/") + arg[len(src) :]
        if "=" in arg:
            key, _, value = arg.partition("=")
            mapped = _map_path(value, {src: dst})
            if mapped != value:
                return f"{key}={mapped}"
    return arg


_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion in command/args (`$$(VAR)` escapes)."""

    def sub(m: re.Match[str]) -> str:
        return env.get(m.group(1), m.group(0))

    parts = arg.split("$$")
    return "$".join(_VAR.sub(sub, part) for part in parts)


def container_argv(container: dict[str, Any], env: dict[str, str], path_map: dict[str, str], python: str) -> list[str]:
    command = list(container.get("command") or [])
    args = list(container.get("args") or [])
    if not command and not args:
        raise ValueError(
            f"container {container.get('name', '?')!r} has no command/args: kubetf local cannot run the "
            "image's entrypoint, give the container a command"
        )
    argv = [_map_path(_expand(str(a), env), path_map) for a in command + args]
    if os.path.basename(argv[0]) in PYTHON_NAMES:
        argv[0] = python
    return argv


def container_env(container: dict[str, Any], warn: Callable[[str], None]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = _expand(str(item["value"]), env)
        elif "valueFrom" in item:
            warn(f"env {item['name']}: valueFrom is not supported locally, left unset")
        else:
            env[item["name"]] = ""
    return env


def checkpoint_dir(job: dict[str, Any], workdir: str) -> str | None:
    """`checkpoint.mountPath` if it is an existing writable directory, else `WORKDIR/checkpoint`."""
    checkpoint = job["spec"].get("checkpoint")
    if not checkpoint:
        return None
    mount = checkpoint.get("mountPath")
    if mount and os.path.isdir(mount) and os.access(mount, os.W_OK | os.X_OK):
        return str(mount)
    return os.path.join(workdir, "checkpoint")


@dataclass
class Replica:
    task: Task
    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    log_path: str
    attempt: int = -1
    proc: subprocess.Popen[bytes] | None = None
    threads: list[threading.Thread] = field(default_factory=list)
    stopping: bool = False

    @property
    def label(self) -> str:
        return f"{self.task[0]}-{self.task[1]}"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class LocalJob:
    """Runs one job; `run()` returns its exit code."""

    def __init__(
        self,
        job: dict[str, Any],
        workdir: str | None = None,
        *,
        path_map: dict[str, str] | None = None,
        python: str | None = None,
        grace_seconds: float = 10.0,
        evaluator_timeout: float | None = None,
        backoff_scale: float = 1.0,
        extra_env: dict[str, str] | None = None,
        out: TextIO | None = None,
    ):
        self.job = job
        self.name = api.name(job)
        self.workdir = os.path.abspath(workdir or os.path.join(tempfile.gettempdir(), "kubetf-local", self.name))
        self.path_map = default_path_map() if path_map is None else path_map
        self.python = python or sys.executable
        self.grace_seconds = grace_seconds
        self.evaluator_timeout = (
            api.run_policy(job).get("evaluatorGraceSeconds", 120) if evaluator_timeout is None else evaluator_timeout
        )
        self.backoff_scale = backoff_scale
        self.extra_env = extra_env or {}
        self.out = out or sys.stdout
        self.lock = threading.Lock()
        self.events: queue.Queue[tuple[Task, int, int]] = queue.Queue()
        self.replicas: dict[Task, Replica] = {}
        self.completed: set[Task] = set()
        self.failures = 0
        self.disruptions = 0
        self.interrupted = 0

    # ------------------------------------------------------------------ output
    def say(self, message: str) -> None:
        self.write(PREFIX + message)

    def write(self, line: str) -> None:
        with self.lock:
            self.out.write(line + "\n")
            self.out.flush()

    # ------------------------------------------------------------------ setup
    def prepare(self) -> None:
        os.makedirs(os.path.join(self.workdir, "logs"), exist_ok=True)
        ckpt = checkpoint_dir(self.job, self.workdir)
        if ckpt:
            os.makedirs(ckpt, exist_ok=True)
        tasks = api.tasks(self.job)
        ports = dict(zip(tasks, free_ports(len(tasks)), strict=True))

        def address_of(role: str, index: int) -> str:
            return f"localhost:{ports[(role, index)]}"

        base = dict(os.environ)
        for key in (
            "TF_CONFIG",
            "KUBETF_JOB_NAME",
            "KUBETF_ROLE",
            "KUBETF_INDEX",
            "KUBETF_STRATEGY",
            "KUBETF_CHECKPOINT_DIR",
            "KUBETF_RUN_ID",  # a run of this shell's job would wait for this one's checkpoint directory
        ):
            base.pop(key, None)
        for role, index in tasks:
            container = builders.training_container(self.job, role)
            env = dict(base)
            env.update(IMAGE_ENV_DEFAULTS)
            cenv = container_env(container, self.say)
            env.update(cenv)
            env.update(builders.task_env(self.job, role, index, address_of=address_of, checkpoint_dir=ckpt))
            env.update(self.extra_env)
            trainer_root = self.path_map.get("/opt/kubetf")
            if trainer_root:
                env["PYTHONPATH"] = os.pathsep.join(p for p in (trainer_root, env.get("PYTHONPATH")) if p)
            argv = container_argv(container, env, self.path_map, self.python)
            cwd = container.get("workingDir")
            cwd = _map_path(cwd, self.path_map) if cwd else None
            if cwd and not os.path.isdir(cwd):
                self.say(f"{role}-{index}: workingDir {cwd} does not exist here, using the current directory")
                cwd = None
            log_path = os.path.join(self.workdir, "logs", f"{role}-{index}.log")
            self.replicas[(role, index)] = Replica((role, index), argv, env, cwd, log_path)
        self.say(
            f"job {self.name} ({api.strategy(self.job)}): {len(tasks)} task(s), workdir {self.workdir}, "
            f"checkpoint {ckpt or '(none)'}"
        )

    def check_tensorflow(self) -> None:
        """Refuse to start when a Python the tasks run cannot import TensorFlow (`pip install .` has none)."""
        checked = set()
        for replica in self.replicas.values():
            program = replica.argv[0]
            if program in checked or (program != self.python and os.path.basename(program) not in PYTHON_NAMES):
                continue
            checked.add(program)
            try:
                found = subprocess.run([program, "-c", HAS_TENSORFLOW], env=replica.env, capture_output=True)
            except OSError as error:
                raise ValueError(f"{program}: cannot run it ({error.strerror}): {INSTALL_TENSORFLOW}") from error
            if found.returncode != 0:
                raise ValueError(f"{program} cannot import tensorflow ({replica.label} runs it): {INSTALL_TENSORFLOW}")

    # ------------------------------------------------------------------ processes
    def start(self, replica: Replica) -> None:
        replica.attempt += 1
        replica.stopping = False
        with open(replica.log_path, "ab") as log:
            log.write(f"--- attempt {replica.attempt}: {shlex.join(replica.argv)}\n".encode())
        proc = subprocess.Popen(
            replica.argv,
            env=replica.env,
            cwd=replica.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        replica.proc = proc
        attempt = replica.attempt
        self.say(
            f"started {replica.label} attempt {attempt} pid {proc.pid} "
            f"({replica.env['TF_CONFIG'] if attempt == 0 else 'same TF_CONFIG'})"
        )
        pump = threading.Thread(target=self._pump, args=(replica, proc), daemon=True)
        pump.start()
        replica.threads = [pump]

    def _pump(self, replica: Replica, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        prefix = f"{replica.label} | "
        swallowed = False
        with open(replica.log_path, "ab") as log:
            for raw in iter(proc.stdout.readline, b""):
                log.write(raw)
                log.flush()
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self.write(prefix + line)
                if not swallowed and sigterm.swallowed(line):
                    # As the operator does: nothing in the program acts on this SIGTERM (see kubetf.core.sigterm).
                    swallowed = True
                    self.say(f"{replica.label}: TensorFlow took the SIGTERM and nothing in the program acts on it; "
                             "killing it now")  # fmt: skip
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
        if swallowed:
            code = -signal.SIGTERM  # how it ended had TensorFlow not taken the signal
        self.events.put((replica.task, replica.attempt if replica.proc is proc else -1, code))

    def stop(self, replicas: Sequence[Replica], reason: str) -> None:
        """SIGTERM, then SIGKILL after the grace period; returns when all are gone."""
        live = [r for r in replicas if r.running()]
        if not live:
            return
        self.say(f"stopping {', '.join(r.label for r in live)} ({reason})")
        for r in live:
            r.stopping = True
            self._signal(r, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_seconds
        for r in live:
            assert r.proc is not None
            try:
                r.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._signal(r, signal.SIGKILL)
                r.proc.wait()
        for r in live:
            for t in r.threads:
                t.join(timeout=5)

    @staticmethod
    def _signal(replica: Replica, sig: int) -> None:
        assert replica.proc is not None
        try:
            os.killpg(replica.proc.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            with contextlib.suppress(ProcessLookupError):
                replica.proc.send_signal(sig)

    # ------------------------------------------------------------------ the run
    def run(self) -> int:
        self.prepare()
        self.check_tensorflow()
        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            for replica in self.replicas.values():
                self.start(replica)
            return self._loop()
        finally:
            self.stop(list(self.replicas.values()), "kubetf local is exiting")
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.interrupted = signum
        self.events.put((("", -1), -1, 0))

    def _loop(self) -> int:
        deadline_seconds = api.run_policy(self.job).get("activeDeadlineSeconds")
        started = time.monotonic()
        while True:
            timeout = 1.0
            if deadline_seconds:
                timeout = max(0.0, min(timeout, started + float(deadline_seconds) - time.monotonic()))
            try:
                task, attempt, code = self.events.get(timeout=timeout)
            except queue.Empty:
                if deadline_seconds and time.monotonic() - started >= float(deadline_seconds):
                    self.say(f"job failed: DeadlineExceeded (activeDeadlineSeconds={deadline_seconds})")
                    return 1
                continue
            if self.interrupted:
                self.say(f"interrupted by signal {self.interrupted}: stopping every replica")
                return 128 + self.interrupted
            replica = self.replicas[task]
            if attempt != replica.attempt or replica.stopping:
                continue  # a process this loop stopped on purpose
            result = self._handle_exit(replica, code)
            if result is not None:
                return result

    def _handle_exit(self, replica: Replica, code: int) -> int | None:
        role, index = replica.task
        restart_policy = self.job["spec"]["replicaSpecs"][role]["restartPolicy"]
        if code < 0:
            termination = policy.classify_signal(-code, restart_policy)
        else:
            termination = policy.classify_exit(code, restart_policy)
        shown = f"signal {-code}" if code < 0 else f"exit code {code}"
        if termination.outcome is policy.Outcome.SUCCEEDED:
            self.completed.add(replica.task)
            self.say(f"{replica.label} succeeded")
            if policy.succeeded(self.job, self.completed):
                return self._finish_success()
            return None
        decision = policy.decide(self.job, role, termination, self.failures, self.disruptions)
        if not decision.restart:
            self.say(f"{replica.label} ended with {shown}: job failed: {decision.reason}")
            exit_code = termination.exit_code if termination.exit_code else 1
            return exit_code if 0 < exit_code < 256 else 1
        disrupted = termination.outcome is policy.Outcome.DISRUPTED
        if disrupted:
            self.disruptions += 1
        else:
            self.failures += 1
        targets = [self.replicas[t] for t in policy.restart_targets(self.job, role, index)]
        # Every target runs again, a finished one too (policy.restart_targets says why).
        self.say(
            f"{replica.label} ended with {shown}: {decision.reason}; restarting "
            f"{', '.join(r.label for r in targets)} (failures {self.failures}, disruptions {self.disruptions})"
        )
        self.stop(targets, f"restart after {replica.label} ended")
        if not disrupted:
            delay = policy.backoff_seconds(self.job, self.failures) * self.backoff_scale
            if delay > 0:
                self.say(f"backoff {delay:.1f}s before restarting")
                if self._sleep_interruptible(delay):
                    return 128 + self.interrupted
        for r in targets:
            self.completed.discard(r.task)
            self.start(r)
        return None

    def _sleep_interruptible(self, seconds: float) -> bool:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self.interrupted:
                return True
            time.sleep(min(0.2, end - time.monotonic()))
        return bool(self.interrupted)

    def _finish_success(self) -> int:
        evaluators = [r for r in self.replicas.values() if r.task[0] == "evaluator" and r.running()]
        if evaluators:
            self.say(f"job succeeded; waiting up to {self.evaluator_timeout:.0f}s for the evaluator to finish")
            end = time.monotonic() + self.evaluator_timeout
            for r in evaluators:
                assert r.proc is not None
                with contextlib.suppress(subprocess.TimeoutExpired):
                    r.proc.wait(timeout=max(0.0, end - time.monotonic()))
                for t in r.threads:
                    t.join(timeout=5)
                if r.proc.returncode is not None:
                    r.stopping = True  # its exit is handled here, not by the event loop
                    code = r.proc.returncode
                    self.say(f"{r.label} succeeded" if code == 0 else f"{r.label} ended with exit code {code}")
        # Training tasks (e.g. the other MWMS workers) usually finish on their own a moment later.
        training = [r for r in self.replicas.values() if r.task[0] in ("chief", "worker") and r.running()]
        end = time.monotonic() + min(5.0, self.grace_seconds)
        for r in training:
            assert r.proc is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                r.proc.wait(timeout=max(0.0, end - time.monotonic()))
        others = [r for r in self.replicas.values() if r.running()]
        self.stop(others, "job succeeded")
        self.say(f"job succeeded (failures {self.failures}, disruptions {self.disruptions})")
        return 0


def load_job(path: str) -> dict[str, Any]:
    with open(path) if path != "-" else contextlib.nullcontext(sys.stdin) as f:
        docs = api.load_documents(f.read())
    jobs = [d for d in docs if isinstance(d, dict) and d.get("kind") == api.KIND]
    if not jobs:
        raise ValueError(f"{path}: no {api.KIND} in the file")
    return jobs[0]


def run_local(job: dict[str, Any], workdir: str | None = None, **options: Any) -> int:
    """Validate the job, run it locally and return its exit code (0: succeeded per successPolicy).

    `options` are `LocalJob`'s keyword arguments; `path_map` None means `default_path_map()`, `{}` runs commands
    untouched.
    """
    out: TextIO | None = options.get("out")
    err = out or sys.stderr
    problems = api.validate(job)
    if problems:
        for problem in problems:
            err.write(f"{PREFIX}invalid job: {problem}\n")
        return 1
    local = LocalJob(api.with_defaults(job), workdir, **options)
    try:
        return local.run()
    except ValueError as exc:
        err.write(f"{PREFIX}{exc}\n")
        return 1


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("-f", "--filename", required=True, help="the TrainingJob YAML ('-' for stdin)")
    parser.add_argument("--workdir", default=None, help="logs and checkpoint dir (default $TMPDIR/kubetf-local/JOB)")
    parser.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="IMAGE_PATH=LOCAL_PATH",
        help="rewrite a path prefix of the container command (default /opt/kubetf=<trainer_image>)",
    )
    parser.add_argument("--no-default-map", action="store_true", help="run the command paths as written")
    parser.add_argument("--python", default=None, help="interpreter for a `python` command (default: this one)")
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="extra environment for every replica"
    )
    parser.add_argument(
        "--grace-period", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL when stopping a replica"
    )
    parser.add_argument(
        "--evaluator-timeout",
        type=float,
        default=None,
        help="after success, how long the evaluator may take to finish (default: the job's evaluatorGraceSeconds)",
    )
    parser.add_argument(
        "--backoff-scale", type=float, default=1.0, help="multiply the failure backoff (0 restarts failures at once)"
    )
    return parser


def run_from_args(args: argparse.Namespace) -> int:
    try:
        job = load_job(args.filename)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"{PREFIX}{exc}\n")
        return 1
    path_map = {} if args.no_default_map else default_path_map()
    for item in args.map:
        src, sep, dst = item.partition("=")
        if not sep:
            sys.stderr.write(f"{PREFIX}--map {item!r}: expected IMAGE_PATH=LOCAL_PATH\n")
            return 2
        path_map[src] = os.path.abspath(dst)
    extra_env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep:
            sys.stderr.write(f"{PREFIX}--env {item!r}: expected NAME=VALUE\n")
            return 2
        extra_env[key] = value
    return run_local(
        job,
        args.workdir,
        path_map=path_map,
        python=args.python,
        grace_seconds=args.grace_period,
        evaluator_timeout=args.evaluator_timeout,
        backoff_scale=args.backoff_scale,
        extra_env=extra_env,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = add_arguments(argparse.ArgumentParser(prog="kubetf local", description=__doc__.splitlines()[0]))
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
