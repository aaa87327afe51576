"""`kubetf submit / status / logs / delete`: work with TrainingJobs in a cluster, with live progress."""

from __future__ import annotations

import io
import json
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any, TextIO

from kubernetes.client.exceptions import ApiException

from kubetf.cluster.kube import Kube, Obj
from kubetf.core import api, goodput
from kubetf.core import status as st
from kubetf.core.progress import curve, health, merge

POLL_SECONDS = 1.0


class JobError(Exception):
    """A user-facing failure of a job command."""


def progress_line(line: str) -> dict[str, Any] | None:
    """The trainer's progress record in one log line (`{"kubetf": ...}`, written by kubetf_trainer.progress.emit;
    a `role-index | ` prefix as `kubetf logs` prints is allowed), or None for any other output."""
    start = line.find('{"kubetf"')
    if start < 0:
        return None
    try:
        record = json.loads(line[start:])
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


# The trainer's phase lines (kubetf_trainer.phases) in words.
PHASES = {
    "started": "process started",
    "imported": "TensorFlow imported",
    "cluster": "cluster formed",
    "serving": "serving",
    "restored": "checkpoint restored",
    "first_step": "first training step done",
}


def _describe_phase(record: dict[str, Any]) -> str:
    text = PHASES.get(str(record.get("phase")), str(record.get("phase")))
    if record.get("step") is not None:
        text += f" at step {record['step']}"
    if record.get("seconds") is not None:
        text += f" ({_num(record['seconds'])}s)"
    return text


def describe_progress(record: dict[str, Any]) -> str:
    kind = record.get("kubetf")
    who = f"{record.get('role', '?')}-{record.get('index', '?')}"
    if kind == "start":
        initial = record.get("initial_epoch", 0)
        return f"{who} started" + (f", resuming at epoch {initial}" if initial else "")
    if kind == "progress":
        metrics = " ".join(f"{k}={_num(v)}" for k, v in (record.get("metrics") or {}).items())
        epochs = record.get("epochs")
        bar = _bar(record.get("epoch", 0), epochs) if epochs else ""
        return f"{bar} epoch {record.get('epoch')}/{epochs or '?'} loss={_num(record.get('loss'))} {metrics}".strip()
    if kind == "done":
        return f"{who} finished; model at {record.get('model_path', '?')}"
    if kind == "phase":
        return f"{who} {_describe_phase(record)}"
    if kind == "eval":
        metrics = " ".join(f"{k}={_num(v)}" for k, v in (record.get("metrics") or {}).items())
        return f"evaluator: {record.get('checkpoint', '?')} loss={_num(record.get('loss'))} {metrics}".strip()
    if kind == "fence":
        return f"{who} {_fence_words(record)}"
    return json.dumps(record)


def _fence_words(record: dict[str, Any]) -> str:
    """kubetf_trainer.fence's records: another run of the job (MultiKueue's copy on another cluster) holds or held
    the checkpoint directory they share."""
    state = record.get("state")
    other = record.get("holder") or record.get("before") or {}
    run = f"run {other.get('run', '?')} of job {other.get('job', '?')}"
    if state == "waiting":
        return f"waits, without training: {run} holds the checkpoint directory"
    if state == "held":
        return f"took the checkpoint directory over from {run} ({record.get('why', '?')})"
    if state == "finished elsewhere":
        return f"exits: {run} finished the training"
    if state == "superseded":
        return f"exits ({record.get('exit_code')}): {run} holds the checkpoint directory now"
    return json.dumps(record)


def _num(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _bar(done: int, total: int, width: int = 20) -> str:
    filled = int(width * min(done, total) / total) if total else 0
    return "[" + "#" * filled + "." * (width - filled) + "]"


def progress_task(job: Obj) -> tuple[str, int]:
    """The task whose log shows training progress: the chief, else worker 0."""
    roles = api.replica_specs(api.with_defaults(job))
    return ("chief", 0) if "chief" in roles else ("worker", 0)


class LogFollower(threading.Thread):
    """Follows one task's log across restarts (a new pod uid), passing each line to `on_line`."""

    def __init__(self, kube: Kube, namespace: str, pod_name: str, on_line: Any, from_start: bool = True) -> None:
        super().__init__(daemon=True, name=f"log-{pod_name}")
        self.kube, self.namespace, self.pod_name, self.on_line = kube, namespace, pod_name, on_line
        self.stopped = threading.Event()
        self.seen_uid: str | None = None
        self.from_start = from_start

    def run(self) -> None:
        while not self.stopped.is_set():
            uid = self._started_pod_uid()
            if uid is None or uid == self.seen_uid:
                self.stopped.wait(POLL_SECONDS)
                continue
            try:
                for line in self._lines():
                    self.on_line(line)
            except (ApiException, OSError):
                pass  # the pod went away mid-stream; a replacement is picked up by uid
            self.seen_uid = uid

    def _started_pod_uid(self) -> str | None:
        pod = self.kube.get_pod(self.namespace, self.pod_name)
        if pod is None:
            return None
        states = [c.get("state") or {} for c in (pod.get("status") or {}).get("containerStatuses") or []]
        started = any("running" in s or "terminated" in s for s in states)
        return str(pod["metadata"]["uid"]) if started else None

    def _lines(self) -> Iterator[str]:
        response = self.kube.pod_log(self.namespace, self.pod_name, follow=True)
        buffer = b""
        for chunk in response.stream(amt=4096, decode_content=True):
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                yield line.decode("utf-8", "replace")
        if buffer:
            yield buffer.decode("utf-8", "replace")


CURVE_WIDTH = 60


def progress_text(status: dict[str, Any], width: int) -> str:
    """The job's status.progress for a terminal: where it is, its rates and metrics, its health, the curves."""
    found = status.get("progress")
    if not isinstance(found, dict) or not found:
        return ""
    line = f"  progress: {found.get('summary', '?')}"
    for key, label in (("epoch", "epoch"), ("step", "step")):
        if isinstance(found.get(key), int):
            total = found.get(f"{key}s")
            line += f"  {label} {found[key]}" + (f"/{total}" if isinstance(total, int) else "")
    if isinstance(found.get("stepsPerSecond"), (int, float)):
        line += f"  {found['stepsPerSecond']:.3g} steps/s"
    if found.get("eta"):
        line += f"  ETA {found['eta']}"
    lines = [line]
    for key, label in (("metrics", "metrics"), ("evalMetrics", "evaluation")):
        if found.get(key):
            lines.append(f"  {label}: " + " ".join(f"{k}={_num(v)}" for k, v in found[key].items()))
    unhealthy = next((c for c in status.get("conditions") or [] if c.get("type") == health.UNHEALTHY), None)
    if unhealthy and unhealthy.get("status") == "True":
        lines.append(f"  {unhealthy.get('reason')}: {unhealthy.get('message')}")
    history = found.get("history") or []
    names = [n for n in ("loss", *(found.get("metrics") or {})) if any(n in p for p in history)]
    for name in dict.fromkeys(names[: 1 + merge.HISTORY_METRICS]):
        lines.append(textwrap.indent(curve.curve(history, name, width=width, height=8), "  "))
    return "\n".join(lines) + "\n"


def watch_status(kube: Kube, namespace: str, name: str, out: TextIO, every: float, clear: bool) -> int:
    """`kubetf status --watch`: the status again every `every` seconds until the job finishes (or Ctrl-C)."""
    while True:
        text = io.StringIO()
        print_status(kube, namespace, name, text)
        out.write(("\033[H\033[2J" if clear else "") + text.getvalue())
        out.flush()
        job = kube.get_job(namespace, name)
        if job is None or (job.get("status") or {}).get("phase") in st.FINISHED:
            return 0
        time.sleep(every)


def _summary(status: dict[str, Any]) -> str:
    restarts = status.get("restarts") or {}
    return (
        f"{status.get('phase', 'Pending')}"
        f" ready {status.get('ready', '-')}"
        f" restarts {restarts.get('total', 0)} (failures {restarts.get('failures', 0)},"
        f" disruptions {restarts.get('disruptions', 0)})"
    )


def follow(kube: Kube, namespace: str, name: str, out: TextIO, timeout: float | None = None) -> int:
    """Print phase changes and the trainer's progress until the job finishes. 0 when it Succeeded."""
    job = kube.get_job(namespace, name)
    if job is None:
        raise JobError(f"trainingjob {namespace}/{name} not found")
    role, index = progress_task(job)
    lock = threading.Lock()

    def emit(text: str) -> None:
        with lock:
            out.write(f"{time.strftime('%H:%M:%S')} {text}\n")
            out.flush()

    def on_line(line: str) -> None:
        record = progress_line(line)
        if record:
            emit(describe_progress(record))

    follower = LogFollower(kube, namespace, f"{name}-{role}-{index}", on_line)
    follower.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    last = ""
    try:
        while True:
            if deadline is not None and time.monotonic() > deadline:
                emit(f"gave up following after {timeout:.0f}s; the job goes on")
                return 2
            job = kube.get_job(namespace, name)
            if job is None:
                emit(f"trainingjob {namespace}/{name} was deleted")
                return 1
            status = job.get("status") or {}
            if not status:  # not seen by the operator yet
                time.sleep(POLL_SECONDS)
                continue
            condition = st.current_condition(status) or {}
            line = f"{_summary(status)}: {condition.get('reason', '')} {condition.get('message', '')}".rstrip()
            if line != last:
                emit(line)
                last = line
            if status.get("phase") in st.FINISHED:
                follower.stopped.wait(2)  # the last progress lines
                return 0 if status["phase"] == st.SUCCEEDED else 1
            time.sleep(POLL_SECONDS)
    finally:
        follower.stopped.set()


def submit(kube: Kube, job: Obj, namespace: str | None) -> Obj:
    if namespace:
        job.setdefault("metadata", {})["namespace"] = namespace
    job.setdefault("metadata", {}).setdefault("namespace", "default")
    try:
        return kube.create_job(job)
    except ApiException as error:
        if error.status == 409:
            meta = job["metadata"]
            raise JobError(
                f"trainingjob {meta['namespace']}/{meta['name']} already exists: "
                f"`kubetf delete {meta['name']} -n {meta['namespace']}` first, or rename it"
            ) from error
        raise JobError(_api_message(error)) from error


def _api_message(error: ApiException) -> str:
    try:
        return str(json.loads(error.body or "").get("message", error.reason))
    except (TypeError, ValueError):
        return f"{error.status} {error.reason}"


def _goodput_line(status: dict[str, Any], job: dict[str, Any]) -> str:
    """`87% of 1.2h trained; lost: restarting 5m, queued 2m, redone 40s` (kubetf.core.goodput, counted up to now)."""
    view = goodput.live(status, st.parse_time((job.get("metadata") or {}).get("creationTimestamp")), time.time())
    lost = [f"{cause} {goodput.duration(seconds)}" for cause, seconds in
            sorted(view.lost.items(), key=lambda item: -item[1]) if seconds >= 1]  # fmt: skip
    line = f"{view.ratio:.0%} of {goodput.duration(view.wall)} trained"
    return line + (f"; lost: {', '.join(lost)}" if lost else "")


def print_status(kube: Kube, namespace: str, name: str, out: TextIO) -> int:
    job = kube.get_job(namespace, name)
    if job is None:
        raise JobError(f"trainingjob {namespace}/{name} not found")
    status = job.get("status") or {}
    condition = st.current_condition(status) or {}
    spec = api.with_defaults(job)["spec"]
    out.write(f"{namespace}/{name}  strategy {spec['strategy']}  {_summary(status)}\n")
    if condition:
        out.write(f"  {condition.get('type')}: {condition.get('reason')}: {condition.get('message')}\n")
    for key in ("startTime", "completionTime"):
        if status.get(key):
            out.write(f"  {key}: {status[key]}\n")
    if (status.get("restarts") or {}).get("lastReason"):
        out.write(f"  last restart: {status['restarts']['lastReason']}\n")
    if status.get("goodput"):
        out.write(f"  goodput: {_goodput_line(status, job)}\n")
    out.write(progress_text(status, CURVE_WIDTH))
    out.write(f"  {'ROLE':<10} {'ACTIVE':>6} {'READY':>6} {'SUCCEEDED':>9} {'FAILED':>6}\n")
    for role, counts in (status.get("replicaStatuses") or {}).items():
        out.write(
            f"  {role:<10} {counts.get('active', 0):>6} {counts.get('ready', 0):>6}"
            f" {counts.get('succeeded', 0):>9} {counts.get('failed', 0):>6}\n"
        )
    # This job's own (its uid), as `kubectl describe` shows them: not an earlier job's of the same name.
    events = kube.list_events(namespace, name, (job.get("metadata") or {}).get("uid"))
    events = sorted(events, key=lambda e: e.get("lastTimestamp") or "")[-8:]
    if events:
        out.write("  events:\n")
        for event in events:
            out.write(
                f"    {event.get('lastTimestamp')} {event.get('type')} {event.get('reason')}: {event.get('message')}\n"
            )
    return 0


def print_logs(kube: Kube, namespace: str, name: str, out: TextIO, stream: bool, role: str | None) -> int:
    job = kube.get_job(namespace, name)
    if job is None:
        raise JobError(f"trainingjob {namespace}/{name} not found")
    tasks = [t for t in api.tasks(api.with_defaults(job)) if role is None or t[0] == role]
    lock = threading.Lock()
    followers = []
    for task_role, index in tasks:
        prefix = f"{task_role}-{index} | "

        def on_line(line: str, prefix: str = prefix) -> None:
            with lock:
                out.write(prefix + line + "\n")
                out.flush()

        pod_name = f"{name}-{task_role}-{index}"
        if stream:
            follower = LogFollower(kube, namespace, pod_name, on_line)
            follower.start()
            followers.append(follower)
            continue
        try:
            text = kube.pod_log(namespace, pod_name).data.decode("utf-8", "replace")
        except ApiException as error:
            on_line(f"(no log: {_api_message(error)})")
            continue
        for line in text.splitlines():
            on_line(line)
    if followers:
        try:
            while True:
                job = kube.get_job(namespace, name)
                if job is None or (job.get("status") or {}).get("phase") in st.FINISHED:
                    time.sleep(2)
                    return 0
                time.sleep(POLL_SECONDS)
        finally:
            for follower in followers:
                follower.stopped.set()
    return 0


def delete(kube: Kube, namespace: str, name: str, out: TextIO) -> int:
    job = kube.get_job(namespace, name)
    if job is None:
        raise JobError(f"trainingjob {namespace}/{name} not found")
    checkpoint = api.with_defaults(job)["spec"].get("checkpoint")
    kube.delete_job(namespace, name)
    out.write(f"trainingjob {namespace}/{name} deleted; its pods and service go with it\n")
    if checkpoint and not checkpoint.get("existingClaim"):
        claim = f"{name}-checkpoint"
        if checkpoint.get("retainOnDelete", True):
            out.write(
                f"checkpoint PVC {claim} kept (retainOnDelete); `kubectl delete pvc {claim} -n {namespace}`"
                " removes it\n"
            )
        else:
            out.write(f"checkpoint PVC {claim} deleted with the job\n")
    return 0
