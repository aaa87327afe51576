"""How fast training resumes after a restart, on real TensorFlow in pods on the local node: prints numbers, asserts
nothing.

    python -m tests.bench.resume [--pairs 3] [--no-default-backoff] [--rounds 1] [--strategies mwms,ps]
                                 [--causes failure,deleted,evicted,group] [--without byhand,kubeflow]

The trainer image's samples, small (10 steps an epoch, 100 m of CPU asked, 1 CPU at most a pod, no evaluator):
MultiWorkerMirrored (`mnist_mwms.py`, 2 workers) and ParameterServer (`ps_training.py`, chief + 2 workers + 1 ps).
For each restart cause, the time from the cause to the first training step after the restore, split into phases:

- failure: the program fails after epoch 2 (`--fail-after-epoch`: MWMS worker-1, the ParameterServer chief; it
  crashes: `os._exit(1)`), restarted in place, and recreated (`restartInPlace: false`) with `backoffSeconds: 0` (its
  first restart at once, as the kubelet's in place) and with its default 10 s (`--no-default-backoff`: not),
  alternated, `--pairs` times;
- deleted: a worker pod deleted (its grace period: the trainer saves and exits on SIGTERM); recreated;
- evicted: a worker pod evicted (the Eviction API, its grace period); recreated;
- group: the operator's own group restart. MultiWorkerMirrored: the other worker, which the operator restarts
  because a worker was deleted (the run of `deleted`, that worker's pod's phases); ParameterServer: a ps deleted,
  which the operator recreates together with the chief it restarts.

The phases, as seconds after the cause (a group of pods: the last of them):
- noticed: the job's status counts the restart (the operator's view);
- gone: the old pods are gone (recreated), or the old programs exited (in place);
- created: the new pods exist (recreated), or the kubelet reports the containers running again (in place);
- started, imported, cluster, restored, first step: the trainer's phase lines (`kubetf_trainer.phases`): the new
  process began, TensorFlow imported, the strategy's cluster formed (a ParameterServer worker or ps: serving),
  BackupAndRestore restored, the first step done (`step`: the global step it resumed at).
A ParameterServer worker's loss does not stop training (the coordinator goes on with the other worker): its rows end
with the worker serving again.

Beside kubetf (its own operator process from this checkout, as the other benchmarks run it; an installed one is
scaled to zero meanwhile, and this checkout's CRD is applied):
- by hand: the same programs as processes on this machine (the operator's TF_CONFIG on localhost, this checkout's
  venv, not CPU-limited), a failed or SIGTERM'd task and its group killed and started again the moment the bench
  sees it: the limit;
- Kubeflow's TFJob (training-operator v1.9.4, tests/bench/kubeflow.py), `restartPolicy: OnFailure` (its pods
  restart in place by the kubelet), the same programs with a checkpoint volume: for each cause it either resumes
  (its phases) or says what happened instead.

Ends with the in-place vs recreated ratio for a MultiWorkerMirrored program failure (the median of each, and per
pair). Uses $KUBECONFIG, else brings the local cluster up. Hold the shared cluster for the run (`flock`); about 10
minutes on 2 cores with the defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kubetf.cli.local import LocalJob
from kubetf.core import api as kapi
from tests.bench import kubeflow
from tests.bench.common import cpu_by_process, machine_cpu
from tests.cluster.fixture import ensure_cluster, wait_for
from tests.integration.conftest import (
    AS_INSTALLED,
    Cluster,
    Operator,
    pause_installed_operators,
    resume_installed_operators,
)

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "kubetf/trainer:0.1.0"
STEPS = 10  # an epoch: about a second of training on this machine, so that a cause lands mid-epoch
EPOCHS = 1000  # never reached: the bench ends each job once its causes are measured
FAIL_AFTER = 2
TRAIN_BETWEEN = 2  # epochs trained after a resume before the next cause
RESUME_TIMEOUT = 240.0
PHASES = ("noticed", "gone", "created", "started", "imported", "cluster", "restored", "first_step")
HEADERS = ("noticed", "gone", "created", "started", "imported", "cluster", "restored", "first step")
CAUSES = ("failure", "deleted", "evicted", "group")
# How a TrainingJob's failures restart: (job name part, its runPolicy). Recreating after a failure waits
# backoffSeconds (10 s unless set), where the kubelet restarts a container at once the first time: `recreated` sets
# 0, comparing the two ways themselves; `recreated 10s` is what a user gets without setting it.
WAYS = {
    "in place": ("inplace", {}),
    "recreated": ("recreate", {"restartInPlace": False, "backoffSeconds": 0}),
    "recreated 10s": ("recreate10", {"restartInPlace": False}),
}
DID_NOT = "did not"  # a row's note when the job never got to its cause or never resumed from it


# --- what the trainer said --------------------------------------------------------------------------------------


@dataclass
class Run:
    """One process of a task: its phase lines (wall-clock times), and what it said besides."""

    task: str  # role-index
    source: str  # the pod's name, or the by-hand process's
    phases: dict[str, float] = field(default_factory=dict)
    step: int | None = None  # the step its first step did (the resumed position)
    failing: float | None = None
    progress: list[float] = field(default_factory=list)  # when each epoch's progress line came


class Lines:
    """The trainer's JSON lines from every process, split into runs at each `started` line."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # predicates of `wait` read under it
        self.runs: list[Run] = []
        self._current: dict[tuple[str, str], Run] = {}
        self.changed = threading.Condition(self.lock)

    def feed(self, source: str, record: dict[str, Any], seen: float) -> None:
        task = f"{record.get('role')}-{record.get('index')}"
        kind = record.get("kubetf")
        with self.lock:
            run = self._current.get((source, task))
            if (kind == "phase" and record.get("phase") == "started") or run is None:
                run = Run(task, source)
                self.runs.append(run)
                self._current[(source, task)] = run
            if kind == "phase":
                run.phases.setdefault(str(record["phase"]), float(record.get("time") or seen))
                if record.get("phase") == "first_step":
                    run.step = record.get("step")
            elif kind == "failing":
                run.failing = float(record.get("time") or seen)
            elif kind == "progress":
                run.progress.append(seen)
            self.changed.notify_all()

    def since(self, t0: float) -> list[Run]:
        """The runs whose process started after t0 (a tick of the kernel's clock early is still after)."""
        with self.lock:
            return [r for r in self.runs if r.phases.get("started", 0) >= t0 - 0.02]

    def trained(self, task: str, after: float) -> int:
        """Epochs the task finished after `after` (its progress lines), whatever process."""
        return sum(1 for r in self.runs if r.task == task for t in r.progress if t > after)

    def wait(self, predicate: Callable[[], Any], timeout: float, what: str, trouble: Callable[[], str] = str) -> Any:
        """`predicate()` once it holds; TimeoutError after `timeout`, or as soon as `trouble()` says something."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                found = predicate()
                if found:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{what}: not in {timeout:.0f}s")
                if said := trouble():
                    raise TimeoutError(f"{what}: {said}")
                self.changed.wait(min(left, 1.0))


def parse(line: str) -> dict[str, Any] | None:
    start = line.find('{"kubetf"')
    if start < 0:
        return None
    with contextlib.suppress(ValueError):
        record = json.loads(line[start:])
        return record if isinstance(record, dict) else None
    return None


# --- what the cluster said --------------------------------------------------------------------------------------


@dataclass
class PodLife:
    """One pod (uid) as the bench's watch saw it, on the bench's clock."""

    name: str
    uid: str
    added: float
    deleted: float | None = None
    restarts: int = 0  # the training container's restartCount, last seen
    exited: dict[int, float] = field(default_factory=dict)  # restartCount -> first seen terminated (or restarted)
    running: dict[int, float] = field(default_factory=dict)  # restartCount -> first seen running


class Watched:
    """One job as the bench sees it: its pods and its status (two watches), and every pod's log (each container it
    runs) into `lines`. Times are when the bench saw things, but for the trainer's own lines."""

    def __init__(self, api: client.ApiClient, namespace: str, job: str, kind: tuple[str, str, str], label: str) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.namespace, self.job, self.kind, self.label = namespace, job, kind, label
        self.lines = Lines()
        self.lock = threading.Lock()
        self.pods: dict[str, PodLife] = {}  # uid -> life
        self.got: dict[str, set[str]] = {}  # pod name -> log lines read
        self.job_updates: list[tuple[float, dict[str, Any]]] = []  # (seen, status)
        self.stopped = threading.Event()
        self._threads = [
            threading.Thread(target=self._watch, args=(self._list_pods, self._on_pod), daemon=True),
            threading.Thread(target=self._watch, args=(self._list_jobs, self._on_job), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self.stopped.set()

    def _list_pods(self, **kw: Any) -> Any:
        selector = f"{self.label}={self.job}"
        return self.core.list_namespaced_pod(self.namespace, label_selector=selector, _preload_content=False, **kw)

    def _list_jobs(self, **kw: Any) -> Any:
        group, version, plural = self.kind
        return self.custom.list_namespaced_custom_object(
            group,
            version,
            self.namespace,
            plural,
            field_selector=f"metadata.name={self.job}",
            _preload_content=False,
            **kw,
        )

    def _watch(self, lister: Callable[..., Any], on_event: Callable[[str, dict, float], None]) -> None:
        while not self.stopped.is_set():
            try:
                listed = json.loads(lister().data)
                for item in listed["items"]:
                    on_event("ADDED", item, time.time())
                rv = listed["metadata"]["resourceVersion"]
                while not self.stopped.is_set():
                    response = lister(watch=True, resource_version=rv, timeout_seconds=5, allow_watch_bookmarks=True)
                    buffer = b""
                    for chunk in response.stream(65536):
                        buffer += chunk
                        *complete, buffer = buffer.split(b"\n")
                        for line in complete:
                            if not line.strip():
                                continue
                            event = json.loads(line)
                            if event["type"] == "ERROR":
                                raise RuntimeError(event["object"])
                            rv = event["object"]["metadata"]["resourceVersion"]
                            if event["type"] != "BOOKMARK":
                                on_event(event["type"], event["object"], time.time())
            except Exception:  # an expired resourceVersion, a dropped connection: list again
                time.sleep(0.2)

    def _on_job(self, kind: str, job: dict, seen: float) -> None:
        with self.lock:
            self.job_updates.append((seen, copy.deepcopy(job.get("status") or {})))

    def _on_pod(self, kind: str, pod: dict, seen: float) -> None:
        meta, status = pod["metadata"], pod.get("status") or {}
        with self.lock:
            life = self.pods.get(meta["uid"])
            if life is None:
                life = self.pods[meta["uid"]] = PodLife(meta["name"], meta["uid"], seen)
                threading.Thread(target=self._follow, args=(life,), daemon=True).start()
            if kind == "DELETED":
                life.deleted = life.deleted or seen
            container = next((c for c in status.get("containerStatuses") or [] if c["name"] == "tensorflow"), None)
            if container is None:
                return
            count = int(container.get("restartCount") or 0)
            for earlier in range(life.restarts, count):  # restarted meanwhile: that run had exited
                life.exited.setdefault(earlier, seen)
            life.restarts = max(life.restarts, count)
            state = container.get("state") or {}
            if "terminated" in state:
                life.exited.setdefault(count, seen)
            if "running" in state:
                life.running.setdefault(count, seen)

    def _follow(self, life: PodLife) -> None:
        """The pod's log, every container it runs (a restart in place starts a new one), until the pod is gone. Lines
        read twice (again after a restart, or by the follower of the pod of that name before) count once."""
        with self.lock:
            got = self.got.setdefault(life.name, set())
        while not self.stopped.is_set() and life.deleted is None:
            for previous in (True, False):  # the previous container's, in case it came and went between two reads
                try:
                    response = self.core.read_namespaced_pod_log(
                        life.name,
                        self.namespace,
                        container="tensorflow",
                        timestamps=True,
                        previous=previous,
                        follow=not previous,
                        _preload_content=False,
                    )
                    buffer = b""
                    for chunk in response.stream(65536):
                        buffer += chunk
                        *complete, buffer = buffer.split(b"\n")
                        for raw in complete:
                            self._line(life, raw.decode(errors="replace"), got)
                except Exception:  # not started yet, gone, another pod of that name now
                    pass
            time.sleep(0.2)

    def _line(self, life: PodLife, line: str, got: set[str]) -> None:
        stamp, _, text = line.partition(" ")
        record = parse(text)
        if record is None:
            return
        with self.lock:
            if line in got:
                return
            got.add(line)
        try:
            seen = _parse_rfc3339(stamp)
        except ValueError:
            seen = time.time()
        self.lines.feed(life.name, record, seen)

    def lives(self, name: str) -> list[PodLife]:
        with self.lock:
            return [life for life in self.pods.values() if life.name == name]

    def noticed(self, t0: float, before: int) -> float | None:
        """When the job's status first counted a restart after t0 (`before`: its count then)."""
        with self.lock:
            for seen, status in self.job_updates:
                if seen >= t0 and _restarts(status) > before:
                    return seen
        return None

    def restarts_now(self) -> int:
        with self.lock:
            return _restarts(self.job_updates[-1][1]) if self.job_updates else 0


def _restarts(status: dict[str, Any]) -> int:
    """A job's restarts so far: kubetf's `restarts.total`; a TFJob's restartCount of its replicas, and its
    Restarting condition (as a count of transitions seen)."""
    if "restarts" in status:
        return int((status.get("restarts") or {}).get("total") or 0)
    count = sum(int(r.get("restartCount") or 0) for r in (status.get("replicaStatuses") or {}).values())
    restarting = [c for c in status.get("conditions") or [] if c.get("type") == "Restarting" and c["status"] == "True"]
    return count + len(restarting)


def _parse_rfc3339(stamp: str) -> float:
    """`2026-11-28T02:52:22.272921413Z` (the kubelet's log timestamps, in nanoseconds)."""
    import datetime as dt

    whole, _, frac = stamp.rstrip("Z").partition(".")
    base = dt.datetime.fromisoformat(whole).replace(tzinfo=dt.UTC).timestamp()
    return base + (float("0." + frac) if frac else 0.0)


# --- measuring one restart --------------------------------------------------------------------------------------


@dataclass
class Row:
    """One restart: the seconds from its cause to each phase."""

    strategy: str  # "mwms" | "ps"
    cause: str
    way: str  # "in place" | "recreated" | "by hand" | "Kubeflow"
    at: dict[str, float] = field(default_factory=dict)
    step: int | None = None  # the global step training resumed at
    note: str = ""


@dataclass
class Snapshot:
    """A job just before a cause: its restarts so far, its pods and their containers' restart counts."""

    restarts: int = 0
    counts: dict[str, int] = field(default_factory=dict)  # live pod uid -> restartCount

    @classmethod
    def of(cls, watched: Watched) -> Snapshot:
        with watched.lock:
            counts = {uid: life.restarts for uid, life in watched.pods.items() if life.deleted is None}
        return cls(watched.restarts_now(), counts)


def trainer_phases(lines: Lines, t0: float, tasks: list[str], end: str) -> tuple[dict[str, float], int | None]:
    """The phases of the runs that `tasks` started after t0, the last of each; for each task the first run that
    reached `end` (a process that died on its way there and was started again counts from its start)."""
    found: dict[str, list[float]] = {}
    step = None
    for task in tasks:
        runs = [r for r in lines.since(t0) if r.task == task]
        run = next((r for r in runs if end in r.phases), runs[-1] if runs else None)
        if run is None:
            continue
        first = runs[0].phases  # the task's first process after the cause: when it started
        for phase in ("started", "imported"):
            if phase in first:
                found.setdefault(phase, []).append(first[phase])
        for phase in ("cluster", "restored", "first_step"):
            at = run.phases.get(phase) or (run.phases.get("serving") if phase == "cluster" else None)
            if at is not None:
                found.setdefault(phase, []).append(at)
        if run.step is not None:
            step = run.step
    return {phase: max(times) for phase, times in found.items()}, step


def pod_phases(watched: Watched, t0: float, before: Snapshot, tasks: list[str]) -> dict[str, float]:
    """noticed, gone and created, as the bench's watches saw them."""
    out: dict[str, float] = {}
    noticed = watched.noticed(t0, before.restarts)
    if noticed is not None:
        out["noticed"] = noticed
    gone: list[float | None] = []
    created: list[float | None] = []
    for task in tasks:
        lives = sorted(watched.lives(f"{watched.job}-{task}"), key=lambda life: life.added)
        old = [life for life in lives if life.uid in before.counts]
        new = [life for life in lives if life.uid not in before.counts and life.added >= t0 - 1]
        if new:  # recreated
            gone.append(old[-1].deleted if old else None)
            created.append(new[0].added)
        elif old:  # restarted in place: the old program exited, the kubelet ran the container again
            life, count = old[-1], before.counts[old[-1].uid]
            gone.append(life.exited.get(count))
            created.append(life.running.get(count + 1))
    if gone and None not in gone:
        out["gone"] = max(t for t in gone if t is not None)
    if created and None not in created:
        out["created"] = max(t for t in created if t is not None)
    return out


def row(strategy: str, cause: str, way: str, t0: float, phases: dict[str, float], step: int | None) -> Row:
    return Row(strategy, cause, way, {p: round(t - t0, 2) for p, t in phases.items()}, step)


# --- the jobs -----------------------------------------------------------------------------------------------------


def sample(name: str) -> dict[str, Any]:
    import yaml

    return yaml.safe_load((ROOT / "manifests" / "samples" / f"{name}.yaml").read_text())


def program(spec: dict[str, Any], extra: list[str]) -> None:
    """The samples' programs, small and many epochs; 100m of CPU asked (the limit kept), as the e2e tier runs them
    beside other pods on the node's 2 cores."""
    for role in spec["replicaSpecs"].values():
        for container in role["template"]["spec"]["containers"]:
            args = container["args"]
            for flag, value in (("--epochs", EPOCHS), ("--steps-per-epoch", STEPS)):
                args[args.index(flag) + 1] = str(value)
            args += extra
            container.setdefault("resources", {}).setdefault("requests", {})["cpu"] = "100m"


def mwms_spec(extra: list[str], **run_policy: Any) -> dict[str, Any]:
    spec = sample("mnist-mwms")["spec"]
    program(spec, extra)
    spec["runPolicy"] = {**spec.get("runPolicy", {}), "backoffLimit": 10, **run_policy}
    spec["runPolicy"].pop("ttlSecondsAfterFinished", None)
    return spec


def ps_spec(extra: list[str], **run_policy: Any) -> dict[str, Any]:
    spec = sample("ps-training")["spec"]
    spec["replicaSpecs"].pop("evaluator")  # a sidecar: it never stops training; one more TensorFlow on 2 cores
    program(spec, extra)
    for role in spec["replicaSpecs"].values():
        role["restartPolicy"] = "OnFailure"
    spec["runPolicy"] = {**spec.get("runPolicy", {}), "backoffLimit": 10, **run_policy}
    return spec


@dataclass(frozen=True)
class Strategy:
    title: str
    spec: Callable[..., dict[str, Any]]
    fails: str  # the task whose program fails
    disrupted: str  # the worker deleted, evicted
    trains: list[str]  # the tasks whose first step ends a resume (the first: whose epochs say the job trains)


STRATEGIES = {
    "mwms": Strategy("MultiWorkerMirrored, 2 workers (mnist_mwms.py)", mwms_spec, "worker-1", "worker-1",
                     ["worker-0", "worker-1"]),
    "ps": Strategy("ParameterServer, chief + 2 workers + 1 ps (ps_training.py)", ps_spec, "chief-0", "worker-1",
                   ["chief-0"]),
}  # fmt: skip


def restarted(strategy: str, cause: str) -> tuple[list[str], list[str], str]:
    """For a cause: the tasks that restart (the rows' phases are the last of them), the tasks whose `end` phase ends
    the restart, and that phase."""
    if strategy == "mwms":
        tasks = ["worker-0"] if cause == "group" else ["worker-0", "worker-1"]
        return tasks, ["worker-0", "worker-1"], "first_step"
    if cause == "failure":
        return ["chief-0"], ["chief-0"], "first_step"
    if cause == "group":  # a ps deleted: it and the chief
        return ["ps-0", "chief-0"], ["chief-0"], "first_step"
    return ["worker-1"], ["worker-1"], "serving"  # the chief trains on meanwhile


# --- where the jobs run -------------------------------------------------------------------------------------------


class Target:
    """A running job the bench causes restarts in: on the cluster (kubetf, Kubeflow) or as processes (by hand)."""

    way = ""
    lines: Lines

    def snapshot(self) -> Snapshot:
        return Snapshot()

    def disrupt(self, cause: str, task: str) -> float:
        """Delete, evict or SIGTERM the task; the moment it was asked."""
        raise NotImplementedError

    def pod_phases(self, t0: float, before: Snapshot, tasks: list[str]) -> dict[str, float]:
        raise NotImplementedError

    def describe(self) -> str:
        return ""

    def trouble(self) -> str:
        """Why waiting on this job is in vain (it failed), or ""."""
        return ""

    def stop(self) -> None:
        raise NotImplementedError


class OnCluster(Target):
    """A TrainingJob or a TFJob, its pods on the local node."""

    def __init__(self, bench: Bench, name: str, kind: tuple[str, str, str], label: str, way: str) -> None:
        self.bench, self.name, self.kind, self.way = bench, name, kind, way
        self.watched = Watched(bench.api, bench.namespace, name, kind, label)
        self.lines = self.watched.lines

    def snapshot(self) -> Snapshot:
        return Snapshot.of(self.watched)

    def disrupt(self, cause: str, task: str) -> float:
        pod = f"{self.name}-{task}"
        t0 = time.time()
        if cause == "evicted":
            body = {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": pod, "namespace": self.bench.namespace},
            }
            self.bench.core.create_namespaced_pod_eviction(pod, self.bench.namespace, body)
        else:
            self.bench.core.delete_namespaced_pod(pod, self.bench.namespace)
        return t0

    def pod_phases(self, t0: float, before: Snapshot, tasks: list[str]) -> dict[str, float]:
        return pod_phases(self.watched, t0, before, tasks)

    def describe(self) -> str:
        with self.watched.lock:
            status = self.watched.job_updates[-1][1] if self.watched.job_updates else {}
        pods = {
            life.name.removeprefix(self.name + "-"): life for life in self.watched.pods.values() if not life.deleted
        }
        return (
            f"phase {status.get('phase') or _condition(status)}; pods {', '.join(sorted(pods))}; "
            f"{status.get('reason') or status.get('message') or ''}"
        ).strip()

    def trouble(self) -> str:
        with self.watched.lock:
            status = self.watched.job_updates[-1][1] if self.watched.job_updates else {}
        if status.get("phase") == "Failed" or _condition(status).startswith("Failed"):
            return f"the job failed: {status.get('reason') or _condition(status)}"
        return ""

    def stop(self) -> None:
        self.watched.stop()
        group, version, plural = self.kind
        with contextlib.suppress(ApiException):
            self.bench.custom.delete_namespaced_custom_object(group, version, self.bench.namespace, plural, self.name)
        self.bench.clear_pods(self.watched.label, self.name)


def _condition(status: dict[str, Any]) -> str:
    """A TFJob's latest condition."""
    conditions = [c for c in status.get("conditions") or [] if c.get("status") == "True"]
    if not conditions:
        return "?"
    last = conditions[-1]
    return f"{last['type']} ({last.get('reason', '')}: {str(last.get('message', ''))[:200]})"


class ByHand(Target):
    """The job's programs as processes on this machine, with the operator's environment (`kubetf local`'s), each
    restart done the moment the bench sees its cause: a failed task and the rest of its group are killed (SIGKILL)
    and started again; a task that saved on SIGTERM (exit 42) lets its group save and leave first."""

    way = "by hand"

    def __init__(self, strategy: str, spec: dict[str, Any], workdir: Path) -> None:
        self.strategy = strategy
        job = {"apiVersion": kapi.API_VERSION, "kind": kapi.KIND, "metadata": {"name": "byhand"}, "spec": spec}
        with open(os.devnull, "w") as quiet:
            local = LocalJob(job, str(workdir), python=sys.executable, out=quiet)
            local.prepare()
        self.replicas = {f"{role}-{index}": r for (role, index), r in local.replicas.items()}
        for replica in self.replicas.values():
            replica.env.pop("PYTHONDONTWRITEBYTECODE", None)  # as the image, which ships compiled modules
            replica.env.update(
                PYTHONPYCACHEPREFIX=str(Path.home() / ".cache" / "kubetf" / "pycache-bench-resume"),
                TF_CPP_MIN_LOG_LEVEL="1",
            )
        self.lines = Lines()
        self.lock = threading.Lock()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.restarts: list[tuple[float, float, float, list[str]]] = []  # (exit seen, group gone, group started, group)
        self.stopped = threading.Event()
        for task in self.replicas:
            self._start(task)
        threading.Thread(target=self._supervise, daemon=True).start()

    def _start(self, task: str) -> None:
        replica = self.replicas[task]
        proc = subprocess.Popen(
            replica.argv,
            env=replica.env,
            cwd=replica.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[task] = proc
        threading.Thread(target=self._read, args=(task, proc), daemon=True).start()

    def _read(self, task: str, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            record = parse(raw.decode(errors="replace"))
            if record is not None:
                self.lines.feed(task, record, time.time())

    def _group(self, task: str) -> list[str]:
        if self.strategy == "mwms":
            return list(self.replicas)
        return [task, "chief-0"] if task.startswith("ps-") else [task]

    def _supervise(self) -> None:
        while not self.stopped.is_set():
            with self.lock:
                for task, proc in list(self.procs.items()):
                    code = proc.poll()
                    if code is None:
                        continue
                    seen = time.time()
                    group = self._group(task)
                    for other in group:
                        if other != task and code != 42:
                            with contextlib.suppress(ProcessLookupError):
                                self.procs[other].kill()
                    for other in group:
                        self.procs[other].wait()
                    gone = time.time()
                    for other in group:
                        self._start(other)
                    self.restarts.append((seen, gone, time.time(), group))
            time.sleep(0.02)

    def disrupt(self, cause: str, task: str) -> float:
        t0 = time.time()
        with self.lock:
            self.procs[task].terminate()
        return t0

    def pod_phases(self, t0: float, before: Snapshot, tasks: list[str]) -> dict[str, float]:
        with self.lock:
            after = [r for r in self.restarts if r[0] >= t0]
        if not after:
            return {}
        seen, gone, started, _ = after[0]
        return {"noticed": seen, "gone": gone, "created": started}

    def stop(self) -> None:
        self.stopped.set()
        with self.lock:
            for proc in self.procs.values():
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()


# --- causing restarts ---------------------------------------------------------------------------------------------


def measure(target: Target, strategy: str, cause: str, since: float) -> tuple[list[Row], float]:
    """Cause one restart in a running job and time it: its rows (MultiWorkerMirrored's `deleted` also gives the
    `group` row), and when training went on after it (the next cause waits for epochs after that)."""
    info = STRATEGIES[strategy]
    lead = info.trains[0]
    tasks, ends, end = restarted(strategy, cause)
    lines = target.lines
    try:
        if cause == "failure":  # the program fails by itself after epoch FAIL_AFTER of the job's first run
            lines.wait(lambda: lines.trained(lead, 0) >= 1, RESUME_TIMEOUT, f"{lead}'s first epoch", target.trouble)
            before = target.snapshot()
            failed = lines.wait(
                lambda: next((r for r in lines.runs if r.task == info.fails and r.failing), None),
                RESUME_TIMEOUT,
                f"{info.fails}'s failure",
                target.trouble,
            )
            t0 = failed.failing
        else:
            lines.wait(lambda: lines.trained(lead, since) >= TRAIN_BETWEEN, RESUME_TIMEOUT, f"{lead} training",
                       target.trouble)  # fmt: skip
            before = target.snapshot()
            victim = "ps-0" if strategy == "ps" and cause == "group" else info.disrupted
            t0 = target.disrupt(cause, victim)
    except TimeoutError as error:  # the job never got to its cause
        return [Row(strategy, cause, target.way, note=f"{DID_NOT} train: {error}; {target.describe()}")], time.time()

    def resumed() -> bool:
        runs = lines.since(t0)
        return all(any(end in r.phases for r in runs if r.task == task) for task in ends)

    try:
        lines.wait(resumed, RESUME_TIMEOUT, "the resume", target.trouble)
    except TimeoutError as error:
        return [Row(strategy, cause, target.way, note=f"{DID_NOT} resume: {error}; {target.describe()}")], time.time()
    time.sleep(1.0)  # the last status and pod updates of the restart reach the watches
    out = []
    for name, group in [(cause, tasks)] + (
        [("group", ["worker-0"])] if strategy == "mwms" and cause == "deleted" else []
    ):
        phases, step = trainer_phases(lines, t0, group, end)
        phases.update(target.pod_phases(t0, before, group))
        found = row(strategy, name, target.way, t0, phases, step)
        if end == "serving":  # a ParameterServer worker: the chief did not wait for it
            with lines.lock:
                restarted_chief = any(r.task == lead for r in lines.since(t0))
                meanwhile = lines.trained(lead, t0) - lines.trained(lead, t0 + found.at.get("cluster", 0))
            found.note = (
                "the chief restarted" if restarted_chief else f"the chief trained on ({meanwhile} epochs meanwhile)"
            )
        out.append(found)
    ended = max((t0 + v for r in out for v in r.at.values()), default=time.time())
    return out, ended


def drive(start: Callable[[list[str]], Target], strategy: str, causes: list[str]) -> list[Row]:
    """The causes in order on one job, each measured once its job trained on after the previous one; a job that did
    not resume is replaced by a new one for the causes left. A failure can only be a job's first cause."""
    rows: list[Row] = []
    pending = list(causes)
    if strategy == "mwms" and "group" in pending:  # measured within `deleted`
        pending.remove("group")
        if "deleted" not in pending:
            pending.append("deleted")
    while pending:
        extra = ["--fail-after-epoch", f"{STRATEGIES[strategy].fails}:{FAIL_AFTER}"] if pending[0] == "failure" else []
        target = start(extra)
        since = 0.0
        try:
            try:
                target.lines.wait(lambda t=target: t.lines.runs, RESUME_TIMEOUT, "a phase line", target.trouble)
            except TimeoutError as error:
                raise RuntimeError(
                    f"{target.way}: {error}: does the trainer image carry this checkout's kubetf_trainer? (make images)"
                ) from None
            while pending:
                cause = pending.pop(0)
                found, since = measure(target, strategy, cause, since)
                rows += [r for r in found if r.cause in causes]
                if found[-1].note.startswith(DID_NOT):
                    break
                if pending and pending[0] == "failure":
                    break
        finally:
            target.stop()
    return rows


# --- the run ----------------------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.kubeconfig = ensure_cluster().kubeconfig
        self.cluster = Cluster(self.kubeconfig)
        self.api = self.cluster.api_client
        self.core, self.custom = self.cluster.core, self.cluster.custom
        self.namespace = f"bench-resume-{uuid.uuid4().hex[:6]}"
        self.logs = Path(tempfile.mkdtemp(prefix="bench-resume-"))
        self.jobs = 0

    def name(self, prefix: str) -> str:
        self.jobs += 1
        return f"{prefix}-{self.jobs}"

    def kubetf(self, strategy: str, way: str) -> Callable[[list[str]], Target]:
        """A TrainingJob whose failures restart as `way` says (WAYS); a disruption recreates pods whatever it says."""

        def start(extra: list[str]) -> Target:
            name = self.name(f"{strategy}-{WAYS[way][0]}")
            self.cluster.create_job(self.namespace, name, STRATEGIES[strategy].spec(extra, **WAYS[way][1]))
            return OnCluster(self, name, (kapi.GROUP, kapi.VERSION, kapi.PLURAL), kapi.LABEL_JOB, way)

        return start

    def kubeflow(self, strategy: str) -> Callable[[list[str]], Target]:
        def start(extra: list[str]) -> Target:
            name = self.name(f"{strategy}-tfjob")
            self.core.create_namespaced_persistent_volume_claim(
                self.namespace,
                {
                    "metadata": {"name": f"{name}-checkpoint"},
                    "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
                },
            )
            spec = STRATEGIES[strategy].spec(extra)
            replicas = {}
            for role, replica in spec["replicaSpecs"].items():
                template = copy.deepcopy(replica["template"])
                pod = template["spec"]
                pod["volumes"] = [{"name": "checkpoint", "persistentVolumeClaim": {"claimName": f"{name}-checkpoint"}}]
                for container in pod["containers"]:
                    container["volumeMounts"] = [{"name": "checkpoint", "mountPath": "/checkpoints"}]
                    container["env"] = [{"name": "KUBETF_CHECKPOINT_DIR", "value": "/checkpoints"}]
                replicas[{"ps": "PS"}.get(role, role.capitalize())] = {
                    "replicas": replica["replicas"],
                    "restartPolicy": "OnFailure",
                    "template": template,
                }
            body = {
                "apiVersion": f"{kubeflow.GROUP}/{kubeflow.API_VERSION}",
                "kind": kubeflow.KIND,
                "metadata": {"name": name, "namespace": self.namespace},
                "spec": {"tfReplicaSpecs": replicas},
            }
            self.custom.create_namespaced_custom_object(
                kubeflow.GROUP, kubeflow.API_VERSION, self.namespace, kubeflow.PLURAL, body
            )
            return OnCluster(
                self,
                name,
                (kubeflow.GROUP, kubeflow.API_VERSION, kubeflow.PLURAL),
                kubeflow.JOB_LABEL,
                "Kubeflow TFJob",
            )

        return start

    def by_hand(self, strategy: str) -> Callable[[list[str]], Target]:
        def start(extra: list[str]) -> Target:
            return ByHand(strategy, STRATEGIES[strategy].spec(extra), self.logs / self.name(f"{strategy}-byhand"))

        return start

    def delete_namespace(self) -> None:
        with contextlib.suppress(ApiException):
            self.core.delete_namespace(self.namespace, grace_period_seconds=0)

        def gone() -> bool:
            try:
                self.core.read_namespace(self.namespace)
                return False
            except ApiException as error:
                return error.status == 404

        wait_for(gone, 180, f"namespace {self.namespace} gone", interval=1)

    def clear_pods(self, label: str, job: str) -> None:
        """Stop what is left of a job at once (grace 0): the next one must not share the cores with it."""
        selector = f"{label}={job}"
        for pod in self.core.list_namespaced_pod(self.namespace, label_selector=selector).items:
            with contextlib.suppress(ApiException):
                self.core.delete_namespaced_pod(pod.metadata.name, self.namespace, grace_period_seconds=0)
        wait_for(
            lambda: not self.core.list_namespaced_pod(self.namespace, label_selector=selector).items,
            120,
            f"{job}'s pods gone",
            interval=0.5,
        )


def median_row(rows: list[Row]) -> Row:
    """The median of each phase over rounds (a phase some rounds did not see: over those that did)."""
    first = rows[0]
    at = {
        p: round(statistics.median(r.at[p] for r in rows if p in r.at), 2)
        for p in PHASES
        if any(p in r.at for r in rows)
    }
    notes = sorted({r.note for r in rows if r.note})
    steps = {r.step for r in rows if r.step is not None}
    return Row(first.strategy, first.cause, first.way, at, min(steps) if steps else None, "; ".join(notes))


def longest(at: dict[str, float]) -> str:
    """The phase that took longest: the largest gap between one phase and the one before it."""
    previous, best, name = 0.0, -1.0, ""
    for phase in PHASES:
        if phase not in at:
            continue
        gap = at[phase] - previous
        if gap > best:
            best, name = gap, phase
        previous = max(previous, at[phase])
    return f"{HEADERS[PHASES.index(name)]} {best:.1f}s" if name else ""


def table(rows: list[Row], strategy: str) -> None:
    print(f"\n{STRATEGIES[strategy].title}: seconds from the cause to each phase (median; - not seen)")
    header = f"{'cause':<9} {'restart':<15}" + "".join(f"{h:>11}" for h in HEADERS) + f"{'step':>6}  longest phase"
    print(header)
    for cause in CAUSES:
        for way in (*WAYS, "by hand", "Kubeflow TFJob"):
            found = [r for r in rows if r.strategy == strategy and r.cause == cause and r.way == way]
            if not found:
                continue
            m = median_row(found)
            cells = "".join(f"{m.at[p]:>11.2f}" if p in m.at else f"{'-':>11}" for p in PHASES)
            step = f"{m.step:>6}" if m.step is not None else f"{'-':>6}"
            n = f" (n={len(found)})" if len(found) > 1 else ""
            print(f"{cause:<9} {way:<15}{cells}{step}  {longest(m.at)}{n}{'  ' + m.note if m.note else ''}")


def ratio(rows: list[Row]) -> None:
    """In place vs recreated, MultiWorkerMirrored program failure: the medians, and run by run (alternated)."""
    found = {way: [r.at["first_step"] for r in rows if r.strategy == "mwms" and r.cause == "failure" and r.way == way
                   and "first_step" in r.at] for way in WAYS}  # fmt: skip
    if not found["in place"]:
        return
    a = statistics.median(found["in place"])
    print(f"\nMultiWorkerMirrored program failure, cause to first step, in place: {a:.2f}s")
    for way in ("recreated", "recreated 10s"):
        if found[way]:
            b = statistics.median(found[way])
            each = ", ".join(f"{r / i:.2f}" for i, r in zip(found["in place"], found[way], strict=False))
            print(f"  {way}: {b:.2f}s: in place {b / a:.2f}x as fast (run by run: {each})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3, help="failures in place and recreated, alternated")
    parser.add_argument(
        "--default-backoff",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="failures recreated with the default backoffSeconds (10 s) too",
    )
    parser.add_argument("--rounds", type=int, default=1, help="every other measurement, this many times")
    parser.add_argument("--causes", default=",".join(CAUSES), help="comma-separated: " + ", ".join(CAUSES))
    parser.add_argument("--strategies", default="mwms,ps", help="comma-separated: mwms, ps")
    parser.add_argument("--without", default="", help="comma-separated: byhand, kubeflow")
    args = parser.parse_args()
    causes = [c for c in CAUSES if c in args.causes.split(",")]
    strategies = [s for s in STRATEGIES if s in args.strategies.split(",")]
    without = set(args.without.split(",")) - {""}

    signal.signal(signal.SIGTERM, _interrupted)  # as Ctrl-C: the cleanup runs
    bench = Bench(args)
    binary = kubeflow.build() if "kubeflow" not in without else None
    machine, began = cpu_by_process(), time.monotonic()
    print(
        f"bench-resume {time.strftime('%Y-%m-%d %H:%M')}: causes {', '.join(causes)}; {args.pairs} pairs, "
        f"{args.rounds} round(s); cluster {bench.kubeconfig}; logs {bench.logs}",
        flush=True,
    )
    bench.cluster.install_crd()
    paused = pause_installed_operators(bench.cluster)
    operator = Operator(bench.kubeconfig, bench.logs / "operator.log", flags=AS_INSTALLED)
    trainer = None
    created_crd = False
    rows: list[Row] = []
    try:
        operator.start()
        if binary:
            created_crd = not _tfjob_crd(bench)
            kubeflow.install_crd(bench.kubeconfig, bench.api)
            kubeflow.prepare_certs(bench.api)
            trainer = kubeflow.TrainingOperator(binary, bench.kubeconfig, bench.logs / "training-operator.log")
            trainer.start()
        bench.core.create_namespace({"metadata": {"name": bench.namespace}})
        wait_for(lambda: _service_account(bench), 30, "the namespace's default ServiceAccount")

        def run(what: str, start: Callable[[list[str]], Target], strategy: str, which: list[str]) -> None:
            if not which:
                return
            began = time.monotonic()
            found = drive(start, strategy, which)
            rows.extend(found)
            print(
                f"  {what}: {', '.join(which)} in {time.monotonic() - began:.0f}s: "
                + "; ".join(f"{r.cause} {r.at.get('first_step', r.note or '?')}" for r in found),
                flush=True,
            )

        for strategy in strategies:
            if "failure" in causes:
                ways = [way for way in WAYS if way != "recreated 10s" or args.default_backoff]
                for pair in range(args.pairs):  # alternated: no way always runs first, on the warmer node
                    for way in ways[pair % len(ways) :] + ways[: pair % len(ways)]:
                        run(f"{strategy} {way}, run {pair + 1}", bench.kubetf(strategy, way), strategy, ["failure"])
            others = [c for c in causes if c != "failure"]
            for round_ in range(args.rounds):
                run(f"{strategy} kubetf, round {round_ + 1}", bench.kubetf(strategy, "recreated"), strategy, others)
                if "byhand" not in without:
                    mine = [c for c in causes if c != "evicted"]  # by hand, an eviction is a SIGTERM: `deleted`
                    run(f"{strategy} by hand, round {round_ + 1}", bench.by_hand(strategy), strategy, mine)
                if trainer is not None:
                    run(f"{strategy} Kubeflow, round {round_ + 1}", bench.kubeflow(strategy), strategy, causes)
    finally:  # the cluster as it was: each step however the others went, and not cut short by a second Ctrl-C
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        steps: list[Callable[[], Any]] = [operator.stop, bench.delete_namespace]
        if trainer is not None:
            steps.append(trainer.stop)
        if created_crd:
            steps.append(
                lambda: client.ApiextensionsV1Api(bench.api).delete_custom_resource_definition(kubeflow.CRD_NAME)
            )
        steps.append(lambda: resume_installed_operators(bench.cluster, paused))
        for step in steps:
            try:
                step()
            except BaseException as error:  # wait_for's pytest.fail too
                print(f"cleaning up: {error}", file=sys.stderr)
    for strategy in strategies:
        table(rows, strategy)
    ratio(rows)
    # Absolute times move with the machine's load: what ran meanwhile (the programs are `python`, the pods' too).
    print(f"\nthis machine: {machine_cpu(machine, cpu_by_process(), time.monotonic() - began, {os.getpid(): 'bench'})}")
    print(f"logs: {bench.logs}")


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _tfjob_crd(bench: Bench) -> bool:
    try:
        client.ApiextensionsV1Api(bench.api).read_custom_resource_definition(kubeflow.CRD_NAME)
        return True
    except ApiException as error:
        if error.status != 404:
            raise
        return False


def _service_account(bench: Bench) -> bool:
    try:
        bench.core.read_namespaced_service_account("default", bench.namespace)
        return True
    except ApiException:
        return False


if __name__ == "__main__":
    main()
