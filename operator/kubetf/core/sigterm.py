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

Pure functions; the controller reads the log and deletes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kubetf.core import api, policy
from kubetf.core import status as st

SWALLOWED = "SIGTERM caught at"  # preemption_notifier.cc, printed once per process
# Seconds after a SIGTERM to look for the line (the notifier polls every second; a loaded node logs late). The
# deletions of a group restart wait for these checks, at most the last one. The first, at once, finds out whether
# the log can be read at all: when it cannot (no kubelet answers, no RBAC for pods/log) no later check could find
# the line either, and the group is deleted without waiting.
CHECKS_AFTER_SIGTERM = (0.0, 2.0, 4.0, 6.0)
# The rest of the group is deleted with this grace period: through the kubelet (SIGKILL now, then the pod object
# goes), so unlike a grace period of 0 a pod never vanishes from the API while its process still runs.
STOP_GRACE_SECONDS = 1
# The log is read from a little before the SIGTERM (clocks of the API server and the node differ).
CLOCK_SKEW_SECONDS = 5.0
LOG_LIMIT_BYTES = 256 * 1024


def sigterm_sent_at(pod: dict[str, Any]) -> float | None:
    """When the pod's deletion sent its containers SIGTERM; None when it is not being deleted, its training
    container no longer runs, or its grace period is already as short as the operator would make it."""
    meta = pod.get("metadata") or {}
    deadline, grace = st.parse_time(meta.get("deletionTimestamp")), meta.get("deletionGracePeriodSeconds")
    if deadline is None or grace is None or grace <= STOP_GRACE_SECONDS or not training_container_running(pod):
        return None
    return deadline - grace


def training_container(pod: dict[str, Any]) -> str:
    containers = pod["spec"]["containers"]
    return str(containers[api.training_container_index(pod["spec"])]["name"])


def training_container_running(pod: dict[str, Any]) -> bool:
    name = training_container(pod)
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == name:
            return "running" in (status.get("state") or {})
    return False


def checks_due(sent_at: float, done: int, now: float) -> int:
    """How many of the checks should have happened by now (at least `done`)."""
    return max(done, sum(1 for after in CHECKS_AFTER_SIGTERM if sent_at + after <= now))


def next_check(sent_at: float, done: int) -> float | None:
    return sent_at + CHECKS_AFTER_SIGTERM[done] if done < len(CHECKS_AFTER_SIGTERM) else None


def log_since_seconds(sent_at: float, now: float) -> int:
    return max(1, math.ceil(now - sent_at + CLOCK_SKEW_SECONDS))


def swallowed(log_text: str) -> bool:
    """Whether TensorFlow's own SIGTERM handler took the signal (see the module's docstring)."""
    return any(SWALLOWED in line and "preemption_notifier" in line for line in log_text.splitlines())


@dataclass(frozen=True)
class Watched:
    """A pod of the job that was sent SIGTERM: when, how many of its checks are done, and what they found."""

    sent_at: float
    checks: int = 0
    swallowed: bool = False


def deletion_grace(watched: Iterable[Watched]) -> tuple[int | None, float | None]:
    """How the operator deletes this job's pods now: (grace period, None: the pods' own), and until when it holds
    the deletions (None: delete now) because a SIGTERM's check is still to come."""
    watched = list(watched)
    if any(w.swallowed for w in watched):
        return STOP_GRACE_SECONDS, None
    upcoming = [at for w in watched if (at := next_check(w.sent_at, w.checks)) is not None]
    return None, min(upcoming, default=None)


def first_to_stop(
    pods: list[dict[str, Any]], member_gone: bool = False
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pods a group restart deletes now, and those it holds until the first one's SIGTERM was looked at: one
    running member goes first (a disrupted one if any); pods whose program does not run go at once. When a member
    has already ended, or its pod is gone (`member_gone`: a pod object goes once its containers stopped), the
    others' collectives fail and they end by themselves: no need to ask."""
    running = [p for p in pods if training_container_running(p)]
    if len(running) < 2 or member_gone or any(_ended(p) for p in pods):
        return pods, []
    first = next((p for p in running if policy.disruption_reason(p)), running[0])
    held = [p for p in running if p is not first]
    return [p for p in pods if not any(p is h for h in held)], held


def member_gone(job: api.Job, pods: list[dict[str, Any]], deleting: list[dict[str, Any]]) -> bool:
    """Whether a task restarted together with one of `deleting` (policy.barrier) has no pod left among `pods`."""
    present = {task[:2] for task in map(st.pod_task, pods) if task is not None}
    for pod in deleting:
        task = st.pod_task(pod)
        if task is not None and any(member not in present for member in policy.barrier(job, task[0], task[1])):
            return True
    return False


def _ended(pod: dict[str, Any]) -> bool:
    name = training_container(pod)
    phase = (pod.get("status") or {}).get("phase")
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return phase in ("Succeeded", "Failed") or any(
        c.get("name") == name and "terminated" in (c.get("state") or {}) for c in statuses
    )
