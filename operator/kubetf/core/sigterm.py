"""A group whose program lets TensorFlow swallow the SIGTERM: stop it now, not after its grace period.

What TensorFlow does (read in 2.21's sources, seen with tensorflow-cpu 2.21.0): creating a
MultiWorkerMirroredStrategy on a chief or worker configures the coordination service, and
`EagerContextDistributedManager::EnableCollectiveOps` (tensorflow/core/common_runtime/eager/
context_distributed_manager.cc) then creates the "sigterm" `PreemptionNotifier`. Its constructor
(`SigtermNotifier`, xla/tsl/distributed_runtime/preemption/preemption_notifier.cc) calls `std::signal(SIGTERM, h)`,
where `h` only sets a flag: whatever handled SIGTERM before is replaced, not chained (Python's `signal.getsignal`
still reports the old handler), and it stays for the life of the process, so a second SIGTERM does nothing either.
A thread polls the flag every second, logs the WARNING `preemption_notifier.cc:NN] SIGTERM caught at <time>` and
writes the task's name under `TF_DEFAULT_PREEMPTION_NOTICE_KEY` in the coordination service, which nothing reads
unless the program asks. No option or environment variable turns this off. The program trains on until SIGKILL.

A program that saves on SIGTERM (`tf.distribute.experimental.PreemptionCheckpointHandler`, or its own
`signal.signal` handler) installs its handler after the strategy's, so TensorFlow's never runs and never logs. The
line after a pod was asked to stop therefore proves that nothing in the program acts on that SIGTERM.

A pod already terminating cannot be hurried: a second deletion with a shorter grace period changes the API object,
but the kubelet (1.34, containerd) is already waiting out the first one (seen: SIGKILL after the first 120 s).
What does end such a group at once is the loss of one member: the others' collectives fail and they exit within
about 2 s (seen). So a group restart sends SIGTERM to one member first (the evicted one, when the eviction's own
deletion has not come yet) and holds the rest for the few seconds the line takes to appear. With the line, the rest
is deleted with a 1 s grace period and the first member follows; without it (a program that saves, whose members
all leave by themselves once one got SIGTERM, or one that hides TensorFlow's warnings with
TF_CPP_MIN_LOG_LEVEL >= 2) the rest keeps the pods' own grace period.

Only a MultiWorkerMirrored group restart is staged this way, the one case where a replacement group waits for the
old one to be gone. A suspension or the job's end deletes every pod at once with its own grace period (nothing
waits for them but Kueue's quota, and a program that saves on SIGTERM saves), and a ParameterServer job's tasks
hold no collective that would end them together.

Pure: `stage` asks for the logs it needs (`Staging.read`); the shell reads them and plans again.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubetf.core import api, policy
from kubetf.core import status as st
from kubetf.core.config import OperatorConfig

Pod = dict[str, Any]

SWALLOWED = "SIGTERM caught at"  # preemption_notifier.cc, printed once per process
STRATEGIES = ("MultiWorkerMirrored",)  # where TensorFlow installs the notifier and members end together
LOG_LIMIT_BYTES = 256 * 1024


@dataclass(frozen=True)
class Watched:
    """A pod of the job that was sent SIGTERM: when, how many of its checks are done, and what they found."""

    sent_at: float
    checks: int = 0
    swallowed: bool = False


@dataclass(frozen=True)
class LogRead:
    """A log to read before the plan is final: the training container's, since a little before the SIGTERM."""

    pod: Pod
    container: str
    since_seconds: int
    limit_bytes: int = LOG_LIMIT_BYTES


@dataclass(frozen=True)
class Staging:
    """How a group restart's deletions go: `delete` now with `grace` (None: the pods' own), `held` until
    `hold_until`; `read`: logs to read first; `memory`: what to remember of the pods sent SIGTERM; `ignored`: the
    messages of SigtermIgnored events."""

    delete: list[Pod]
    held: list[Pod] = field(default_factory=list)
    grace: int | None = None
    hold_until: float | None = None
    read: list[LogRead] = field(default_factory=list)
    memory: dict[str, Watched] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)


def stage(
    job: api.Job,
    deleting: list[Pod],
    pods: list[Pod],
    lost_nodes: Collection[str],
    memory: Mapping[str, Watched],
    logs: Mapping[str, str | None],
    now: float,
    config: OperatorConfig,
) -> Staging:
    """The deletions of a group restart (`deleting`, among the job's `pods`), staged as the module says."""
    if api.strategy(job) not in STRATEGIES or not deleting:
        return Staging(deleting)
    reachable = [p for p in pods if (p.get("spec") or {}).get("nodeName") not in lost_nodes]
    watched, read, ignored = _look(reachable, memory, logs, now, config)
    if read:
        return Staging([], deleting, read=read, memory=watched)
    grace, hold_until = deletion_grace(watched.values(), config)
    if hold_until is not None:
        return Staging([], deleting, grace, hold_until, memory=watched, ignored=ignored)
    if watched:
        return Staging(deleting, grace=grace, memory=watched, ignored=ignored)
    first, held = first_to_stop(deleting, member_gone(job, pods, deleting))
    return Staging(first, held, hold_until=now + config.sigterm_checks[0] if held else None)


def _look(
    pods: list[Pod], memory: Mapping[str, Watched], logs: Mapping[str, str | None], now: float, config: OperatorConfig
) -> tuple[dict[str, Watched], list[LogRead], list[str]]:
    """The pods sent SIGTERM, with what their logs say: (what is known, the logs still to read, the messages of
    the SIGTERMs found swallowed now)."""
    watched: dict[str, Watched] = {}
    read, ignored = [], []
    for pod in pods:
        sent_at = sigterm_sent_at(pod, config.sigterm_stop_grace)
        if sent_at is None:
            continue
        uid = pod["metadata"]["uid"]
        seen = memory.get(uid) or Watched(sent_at)
        due = checks_due(sent_at, seen.checks, now, config.sigterm_checks)
        if due > seen.checks and not seen.swallowed:
            if uid not in logs:
                since = max(1, math.ceil(now - sent_at + config.sigterm_clock_skew))
                read.append(LogRead(pod, training_container(pod), since))
            elif logs[uid] is None:  # unreadable (RBAC, a kubelet not answering): no later check can do better
                seen = Watched(sent_at, len(config.sigterm_checks))
            else:
                seen = Watched(sent_at, due, swallowed(logs[uid] or ""))
                if seen.swallowed:
                    ignored.append(_ignored(pod, config))
        watched[uid] = seen
    return watched, read, ignored


def _ignored(pod: Pod, config: OperatorConfig) -> str:
    name, grace = pod["metadata"]["name"], pod["metadata"].get("deletionGracePeriodSeconds")
    return (
        f"{name}: TensorFlow took the SIGTERM and nothing in the program acts on it; stopping the other pods at "
        f"once ({config.sigterm_stop_grace}s grace period) rather than letting them train on for {grace}s. To save "
        "a checkpoint on SIGTERM, use PreemptionCheckpointHandler."
    )


def sigterm_sent_at(pod: Pod, stop_grace: int) -> float | None:
    """When the pod's deletion sent its containers SIGTERM; None when it is not being deleted, its training
    container no longer runs, or its grace period is already as short as the operator would make it."""
    meta = pod.get("metadata") or {}
    deadline, grace = st.parse_time(meta.get("deletionTimestamp")), meta.get("deletionGracePeriodSeconds")
    if deadline is None or grace is None or grace <= stop_grace or not training_container_running(pod):
        return None
    return deadline - grace


def training_container(pod: Pod) -> str:
    containers = pod["spec"]["containers"]
    return str(containers[api.training_container_index(pod["spec"])]["name"])


def training_container_running(pod: Pod) -> bool:
    name = training_container(pod)
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == name:
            return "running" in (status.get("state") or {})
    return False


def checks_due(sent_at: float, done: int, now: float, checks: tuple[float, ...]) -> int:
    """How many of the checks should have happened by now (at least `done`)."""
    return max(done, sum(1 for after in checks if sent_at + after <= now))


def swallowed(log_text: str) -> bool:
    """Whether TensorFlow's own SIGTERM handler took the signal (see the module's docstring)."""
    return any(SWALLOWED in line and "preemption_notifier" in line for line in log_text.splitlines())


def deletion_grace(watched: Iterable[Watched], config: OperatorConfig) -> tuple[int | None, float | None]:
    """How the operator deletes this job's pods now: (grace period, None: the pods' own), and until when it holds
    the deletions (None: delete now) because a SIGTERM's check is still to come."""
    watched = list(watched)
    if any(w.swallowed for w in watched):
        return config.sigterm_stop_grace, None
    checks = config.sigterm_checks
    upcoming = [w.sent_at + checks[w.checks] for w in watched if w.checks < len(checks)]
    return None, min(upcoming, default=None)


def first_to_stop(pods: list[Pod], member_gone: bool = False) -> tuple[list[Pod], list[Pod]]:
    """The pods a group restart deletes now, and those it holds until the first one's SIGTERM was looked at: one
    running member goes first (a disrupted one if any); pods whose program does not run go at once. When a member
    has already ended, or its pod is gone or ended (`member_gone`, over the whole group: a pod object goes once its
    containers stopped), the others' collectives fail and they end by themselves: no need to ask."""
    running = [p for p in pods if training_container_running(p)]
    if len(running) < 2 or member_gone or any(_ended(p) for p in pods):
        return pods, []
    first = next((p for p in running if policy.disruption_reason(p)), running[0])
    held = [p for p in running if p is not first]
    return [p for p in pods if not any(p is h for h in held)], held


def member_gone(job: api.Job, pods: list[Pod], deleting: list[Pod]) -> bool:
    """Whether a task restarted together with one of `deleting` (policy.barrier) has no pod left among `pods` whose
    program may still run: its pod is gone, or its training container ended. An evicted pod whose program took the
    SIGTERM and exited stays, being deleted, until its kubelet confirms: stopping another member first and holding
    the rest for its log (seen on kwok, whose pods stop as a kubelet's: a second reconcile on every such eviction)
    would wait for nothing."""
    present = {task[:2] for pod in pods if (task := st.pod_task(pod)) is not None and not _ended(pod)}
    for pod in deleting:
        task = st.pod_task(pod)
        if task is not None and any(member not in present for member in policy.barrier(job, task[0], task[1])):
            return True
    return False


def _ended(pod: Pod) -> bool:
    name = training_container(pod)
    phase = (pod.get("status") or {}).get("phase")
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return phase in ("Succeeded", "Failed") or any(
        c.get("name") == name and "terminated" in (c.get("state") or {}) for c in statuses
    )
