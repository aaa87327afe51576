"""The job's state, derived from its pods: per-task view, phase, conditions, replica counts, why it waits.

Pure functions. A task is `role-index`; its current pod is the one whose attempt label equals the task's attempt
in the job's status. Pods of older attempts are stale: they are being replaced and never count.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from kubetf.core import api
from kubetf.core.api import Job

Pod = dict[str, Any]

PENDING, QUEUED, RUNNING, RESTARTING, SUCCEEDED, FAILED, SUSPENDED = (
    "Pending",
    "Queued",
    "Running",
    "Restarting",
    "Succeeded",
    "Failed",
    "Suspended",
)
FINISHED = (SUCCEEDED, FAILED)
PHASES = (PENDING, QUEUED, RUNNING, RESTARTING, SUCCEEDED, FAILED, SUSPENDED)

# Task states kept in status.tasks.
WAITING, CREATED, COMPLETED = "Waiting", "Created", "Succeeded"


@dataclass(frozen=True)
class Patience:
    """How long a wait is normal (the operator's settings, kubetf.core.config): a pod the scheduler has not placed
    for less than `scheduling_grace` is not worth a Warning (a claim bound a second later, a node an autoscaler
    adds); an old pod still there `stuck_margin` after its grace period is stuck (its kubelet is gone or wedged)."""

    scheduling_grace: float
    stuck_margin: float


# Container waiting reasons that mean "this will not start by itself".
STUCK_WAITING_REASONS = {
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
}


def task_key(role: str, index: int) -> str:
    return f"{role}-{index}"


def parse_time(value: str | None) -> float | None:
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def format_time(epoch: float) -> str:
    return dt.datetime.fromtimestamp(int(epoch), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_task(pod: Pod) -> tuple[str, int, int] | None:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    try:
        return labels[api.LABEL_ROLE], int(labels[api.LABEL_INDEX]), int(labels.get(api.LABEL_ATTEMPT, "0"))
    except (KeyError, ValueError):
        return None


def is_deleting(pod: Pod) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def is_finished(pod: Pod) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def is_ready(pod: Pod) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or is_deleting(pod):
        return False
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    # Without readiness probes Ready follows the containers; a pod the kubelet has not reported yet is not ready.
    return conditions.get("Ready", "True" if not status.get("conditions") else "False") == "True"


def is_started(pod: Pod) -> bool:
    """Its containers run (or just finished: `is_succeeding`): the task takes part, ready or not. Not while its
    training container, exited, waits to be restarted in its pod (kubetf.core.inplace)."""
    status = pod.get("status") or {}
    if status.get("phase") not in ("Running", "Succeeded") or is_deleting(pod):
        return False
    if status.get("phase") == "Running":
        found = api.training_container_status(pod)
        state = (found.get("state") or {"running": {}}) if found is not None else {"running": {}}
        return "running" in state or is_succeeding(pod)
    return True


def is_succeeding(pod: Pod) -> bool:
    """Its training container exited 0 while the pod still says Running: the kubelet reports the container's end
    before the pod's, and no restart rule restarts an exit 0 (kubetf.core.inplace), so the pod is about to succeed."""
    if (pod.get("status") or {}).get("phase") != "Running":
        return False
    found = api.training_container_status(pod) or {}
    return ((found.get("state") or {}).get("terminated") or {}).get("exitCode") == 0


def unscheduled_since(pod: Pod, not_before: float | None = None) -> float | None:
    """When the scheduler first said it cannot place the pod, or None. `not_before`: when the job could start (its
    admission): the wait of a pod older than that counts from then (its condition keeps its own, older time)."""
    created = parse_time((pod.get("metadata") or {}).get("creationTimestamp"))
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            since = parse_time(condition.get("lastTransitionTime"))
            if since is None:
                since = created
            if since is not None and not_before is not None and created is not None and created < not_before:
                return max(since, not_before)
            return since
    return None


def pending_reason(
    pod: Pod, now: float | None = None, not_before: float | None = None, grace: float = 0.0
) -> str | None:
    """Why a pod that should run does not: the scheduler's or the kubelet's own words. With `now`, a scheduling
    wait shorter than `grace` (counted from `not_before` at the earliest) is not a reason yet."""
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            since = unscheduled_since(pod, not_before)
            if now is not None and since is not None and now < since + grace:
                break
            return f"{condition.get('reason', 'Unschedulable')}: {condition.get('message', '')}".rstrip(": ")
    for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK_WAITING_REASONS:
            return f"{waiting['reason']}: {waiting.get('message', '')}".rstrip(": ")
    return None


@dataclass
class TaskView:
    role: str
    index: int
    attempt: int
    state: str  # WAITING | CREATED | COMPLETED
    pod: Pod | None = None  # the current attempt's pod
    stale: list[Pod] = field(default_factory=list)  # pods of older attempts, to be gone before a new one
    # Restarts in place (kubetf.core.inplace): the exits of its pod's training container accounted for so far, and
    # until when an exit of it is part of a group restart already decided (not a new one).
    exits: int = 0
    in_place_by: float | None = None
    exits_at: int | None = None  # its exits when that group restart was decided

    @property
    def key(self) -> str:
        return task_key(self.role, self.index)

    def replace(self) -> None:
        """Its next attempt, in a new pod: its old pod goes with the stale ones (if any), and the exits counted of
        the old pod's container are not the new one's."""
        if self.pod is not None:
            self.stale.append(self.pod)
            self.pod = None
        self.attempt += 1
        self.state = WAITING
        self.exits, self.in_place_by, self.exits_at = 0, None, None


def task_records(job: Job) -> dict[str, dict[str, Any]]:
    records: dict[str, dict[str, Any]] = (job.get("status") or {}).get("tasks") or {}
    return records


def split_pods(job_name: str, pods: list[Pod]) -> tuple[list[Pod], list[Pod]]:
    """(the pods of TrainingJobs of this name: this job's and a previous job's of the same name, the others). Only the
    first are ever deleted, marked or counted: the others carry the job's labels but not its controller reference (a
    pod someone made by hand, another controller's), and at most keep a task's name taken (`name_taken`)."""
    own: list[Pod] = []
    others: list[Pod] = []
    for pod in pods:
        owners = [o for o in (pod.get("metadata") or {}).get("ownerReferences") or [] if o.get("controller")]
        owner = owners[0] if owners else {}
        ours = (
            owner.get("kind") == api.KIND
            and str(owner.get("apiVersion") or "").split("/")[0] == api.GROUP
            and owner.get("name") == job_name
        )
        (own if ours else others).append(pod)
    return own, others


def name_taken(job_name: str, role: str, index: int, others: list[Pod]) -> Pod | None:
    """Another's pod that holds the name of the task's pod (`split_pods`): the task waits, and says why."""
    name = f"{job_name}-{role}-{index}"
    return next((p for p in others if (p.get("metadata") or {}).get("name") == name), None)


def owned_by_another(job: Job, pod: Pod) -> bool:
    """A pod of a previous job of the same name (deleted and re-created while its pods terminate): never one of
    this job's, whatever its labels say. Pods without an owner (`kubetf local`) belong to the job they name."""
    uid = (job.get("metadata") or {}).get("uid")
    owners = [o for o in (pod.get("metadata") or {}).get("ownerReferences") or [] if o.get("controller")]
    return bool(uid and owners and owners[0].get("uid") != uid)


def observe(job: Job, pods: list[Pod]) -> tuple[dict[str, TaskView], list[Pod]]:
    """Each task with its current and stale pods, plus pods that belong to no task (left over from a spec change).

    A previous job's pod is stale for the task of its name: it is deleted and waited for, never counted."""
    records = task_records(job)
    views: dict[str, TaskView] = {}
    for role, index in api.tasks(job):
        record = records.get(task_key(role, index)) or {}
        views[task_key(role, index)] = TaskView(
            role, index, int(record.get("attempt", 0)), record.get("state", WAITING), exits=int(record.get("exits", 0)),
            in_place_by=parse_time(record.get("inPlaceBy")), exits_at=record.get("exitsAt"),
        )  # fmt: skip
    orphans = []
    for pod in pods:
        found = pod_task(pod)
        view = views.get(task_key(found[0], found[1])) if found else None
        if found is None or view is None:
            orphans.append(pod)
        elif found[2] == view.attempt and not owned_by_another(job, pod):
            view.pod = pod
        else:
            view.stale.append(pod)
    return views, orphans


def all_running(views: dict[str, TaskView]) -> bool:
    return all(v.state == COMPLETED or (v.pod is not None and is_started(v.pod)) for v in views.values())


def replica_statuses(views: dict[str, TaskView]) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    for view in views.values():
        role = counts.setdefault(view.role, {"active": 0, "ready": 0, "succeeded": 0, "failed": 0})
        pod = view.pod
        if view.state == COMPLETED:
            role["succeeded"] += 1
        elif pod is not None and not is_deleting(pod):
            phase = (pod.get("status") or {}).get("phase")
            if phase == "Failed":
                role["failed"] += 1
            elif phase != "Succeeded":
                role["active"] += 1
                role["ready"] += int(is_ready(pod))
    return counts


def waiting_message(
    views: dict[str, TaskView], job_name: str, now: float, not_before: float | None, patience: Patience
) -> tuple[str, str]:
    """(reason, message) for a job whose pods are not all running yet; `not_before`: when they could first start."""
    waiting = [v for v in views.values() if v.state != COMPLETED and not (v.pod is not None and is_started(v.pod))]
    total = sum(1 for v in views.values() if v.state != COMPLETED)
    grace = patience.scheduling_grace
    stuck = [(v, why) for v in waiting if v.pod is not None and (why := pending_reason(v.pod, now, not_before, grace))]
    if stuck:
        view, why = stuck[0]
        reason = why.split(":", 1)[0]
        more = f" (and {len(stuck) - 1} more)" if len(stuck) > 1 else ""
        name = f"{job_name}-{view.role}-{view.index}"
        return reason, f"{len(waiting)}/{total} pods not running; {name}{more}: {why}"
    margin = patience.stuck_margin
    old_pods = [p for v in views.values() for p in v.stale]
    old_pods.sort(key=lambda p: not is_stuck_terminating(p, now, margin))
    if old_pods and any(v.pod is None for v in waiting):
        old = old_pods[0]
        more = f" (and {len(old_pods) - 1} more)" if len(old_pods) > 1 else ""
        node = (old.get("spec") or {}).get("nodeName")
        where = f" on node {node}" if node else ""
        old_name = (old.get("metadata") or {}).get("name")
        if is_stuck_terminating(old, now, margin):
            since = (old.get("metadata") or {}).get("deletionTimestamp")
            return "PodStuckTerminating", (
                f"{len(waiting)}/{total} pods not running; the old pod {old_name}{more} is still terminating{where} "
                f"past its grace period (due {since}): its replacement waits until it is gone"
            )
        return (
            "PodsTerminating",
            f"{len(waiting)}/{total} pods not running; waiting for the old pod {old_name}{more} to terminate{where}",
        )
    return "PodsStarting", f"{len(waiting)}/{total} pods not running yet"


def stuck_terminating_at(pod: Pod, margin: float) -> float | None:
    """When a pod being deleted counts as stuck: its grace period is over (the API server sets deletionTimestamp
    to the deletion plus the grace period) and the kubelet has had `margin` more to confirm."""
    due = parse_time((pod.get("metadata") or {}).get("deletionTimestamp"))
    return due + margin if due is not None else None


def is_stuck_terminating(pod: Pod, now: float, margin: float) -> bool:
    at = stuck_terminating_at(pod, margin)
    return at is not None and now >= at


def set_condition(
    status: dict[str, Any], phase: str, reason: str, message: str, now: float, generation: int | None
) -> None:
    """Make `phase` the one True condition of the phases (metav1.Condition shape); the other phases turn False."""
    conditions = [dict(c) for c in status.get("conditions") or []]
    stamp = format_time(now)
    found = False
    for condition in conditions:
        if condition["type"] == phase:
            found = True
            if condition.get("status") != "True":
                condition["lastTransitionTime"] = stamp
            condition.update(status="True", reason=reason, message=message)
        elif condition["type"] in PHASES and condition.get("status") == "True":
            condition.update(status="False", lastTransitionTime=stamp)
        if generation is not None:
            condition["observedGeneration"] = generation
    if not found:
        new: dict[str, Any] = {
            "type": phase,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastTransitionTime": stamp,
        }
        if generation is not None:
            new["observedGeneration"] = generation
        conditions.append(new)
    status["conditions"] = conditions


def set_phase(
    status: dict[str, Any], phase: str, reason: str, message: str, now: float, generation: int | None
) -> None:
    """The job's phase and reason, and the condition that says them."""
    status["phase"] = phase
    status["reason"] = reason
    set_condition(status, phase, reason, message, now, generation)


def current_condition(status: dict[str, Any]) -> dict[str, Any] | None:
    """The condition of the job's phase (not one beside it: TrainingUnhealthy, ReconcileError)."""
    return next(
        (c for c in status.get("conditions") or [] if c.get("type") in PHASES and c.get("status") == "True"), None
    )


def merge_patch(old: Any, new: Any) -> Any:
    """RFC 7386 merge patch turning status `old` into `new` (removed keys become null)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch = {k: None for k in old if k not in new}
    for k, v in new.items():
        if k not in old:
            patch[k] = v
        elif old[k] != v:
            patch[k] = merge_patch(old[k], v)
    return patch
