"""Time rules, pure: which time counts against a job, and when each of its timers falls due.

A job's clock runs only while it may run: from the moment its pods may start (Kueue admitted it; without Kueue,
its first reconcile) until it waits for admission again (Kueue preempted it), is suspended or ends. Time spent
waiting in a queue or suspended never counts, however long:

- `activeDeadlineSeconds`: the job's active time, summed over its admissions (status.activeSeconds, plus
  now - status.activeSince while active). A job preempted after 3 h of a 4 h deadline has 1 h left once readmitted.
- `startupTimeoutSeconds`: per pod, from the moment it may start: its creation, or the job's latest admission when
  that came later. While the job waits for Kueue it has no pod, and nothing counts. Creates the API server refuses count
  from the first refusal (status.createRejectedSince, kubetf.core.refusals).
- the failure backoff (status.restartAfter), `ttlSecondsAfterFinished` and `evaluatorGraceSeconds` (both from
  completionTime) are points in time: a restart keeps the job's admission, and a finished job waits for nothing.

The status keeps what the clock needs, so a restarted operator counts on: `startTime` (first start),
`activeSince` (start of the current active period, absent while not active), `activeSeconds` (earlier periods)
and `queuedSince` (while it waits for admission, with `queuePosition`: Kueue's place in its ClusterQueue).
"""

from __future__ import annotations

import enum
from typing import Any

from kubetf.core import api
from kubetf.core import status as st
from kubetf.core.api import Job
from kubetf.core.status import TaskView

Pod = dict[str, Any]


class Clock(enum.Enum):
    ACTIVE = "active"  # its pods may run: the clock runs
    QUEUED = "queued"  # waiting for Kueue's admission
    STOPPED = "stopped"  # suspended or finished


def account(status: dict[str, Any], clock: Clock, now: float, admitted_at: float | None = None) -> None:
    """Open or close the job's active period in `status`. `admitted_at`: when Kueue admitted it, so a period
    opened late (the operator was down, a watch event came late) starts when the pods could really start."""
    since = st.parse_time(status.get("activeSince"))
    if clock is Clock.ACTIVE:
        if since is None:
            start = now
            if admitted_at is not None:
                queued = st.parse_time(status.get("queuedSince"))
                start = max(min(admitted_at, now), queued if queued is not None else admitted_at)
            status["activeSince"] = st.format_time(start)
            status.setdefault("startTime", status["activeSince"])
        status.pop("queuedSince", None)
        return
    if since is not None:
        status["activeSeconds"] = int(status.get("activeSeconds") or 0) + max(0, int(now - since))
        del status["activeSince"]
    if clock is Clock.QUEUED:
        status.setdefault("queuedSince", st.format_time(now))
    else:
        status.pop("queuedSince", None)
        status.pop("queuePosition", None)


def account_job(
    status: dict[str, Any], queued: bool, position: int | None, admitted_at: float | None, now: float
) -> None:
    """Open or close the job's active period (`account`): it is active unless it waits in a queue (`queued`: Kueue
    has not admitted it; `position`: its place there, when known). `admitted_at`: when it was admitted."""
    if queued:
        account(status, Clock.QUEUED, now)
        if position is not None:
            status["queuePosition"] = position
        else:
            status.pop("queuePosition", None)
        return
    status.pop("queuePosition", None)
    account(status, Clock.ACTIVE, now, admitted_at)


def active_seconds(status: dict[str, Any], now: float) -> float:
    """The job's active time so far."""
    since = st.parse_time(status.get("activeSince"))
    return float(status.get("activeSeconds") or 0) + (max(0.0, now - since) if since is not None else 0.0)


def deadline(job: Job, status: dict[str, Any]) -> float | None:
    """When activeDeadlineSeconds runs out, if the job stays active; None without a deadline or while not active."""
    seconds = api.run_policy(job).get("activeDeadlineSeconds")
    since = st.parse_time(status.get("activeSince"))
    if not seconds or since is None:
        return None
    return since + seconds - float(status.get("activeSeconds") or 0)


def startup_due(job: Job, pod: Pod, status: dict[str, Any], not_before: float | None = None) -> float | None:
    """When `pod`, not started yet, exceeds startupTimeoutSeconds; None when nothing counts for it: no timeout, or
    the job is not active. `not_before`: when its gang was placed (the wait before that is the schedule timeout's,
    kubetf.core.scheduling.gangs)."""
    timeout = api.run_policy(job).get("startupTimeoutSeconds")
    active_since = st.parse_time(status.get("activeSince"))
    if not timeout or active_since is None:
        return None
    created = st.parse_time((pod.get("metadata") or {}).get("creationTimestamp"))
    if created is None:
        return None
    return max(created, active_since, not_before or created) + timeout


def ttl_due(job: Job, status: dict[str, Any]) -> float | None:
    """When a finished job is deleted (ttlSecondsAfterFinished after completionTime)."""
    ttl = api.run_policy(job).get("ttlSecondsAfterFinished")
    finished_at = st.parse_time(status.get("completionTime"))
    return finished_at + ttl if ttl is not None and finished_at is not None else None


def evaluator_grace_due(job: Job, status: dict[str, Any]) -> float | None:
    """Until when a succeeded job's running evaluator may finish its last evaluation (evaluatorGraceSeconds)."""
    finished_at = st.parse_time(status.get("completionTime"))
    if status.get("phase") != st.SUCCEEDED or finished_at is None:
        return None
    return finished_at + api.run_policy(job)["evaluatorGraceSeconds"]


def deadline_exceeded(job: Job, status: dict[str, Any], now: float) -> str | None:
    """The failure's message once the job was active longer than activeDeadlineSeconds."""
    due = deadline(job, status)
    if due is None or now < due:
        return None
    seconds = api.run_policy(job)["activeDeadlineSeconds"]
    return f"Job was active longer than activeDeadlineSeconds={seconds} (time queued or suspended not counted)"


def startup_timeout(
    job: Job,
    views: dict[str, TaskView],
    status: dict[str, Any],
    gated: bool,
    now: float,
    holding: bool = False,
    not_before: float | None = None,
) -> tuple[str | None, float | None]:
    """A pod that could not start within startupTimeoutSeconds of the moment it may: the failure's message, else
    when the next pod's time runs out. Nothing counts while the job's pods may not be here (`gated`: it waits for
    Kueue's admission). While its gang is not placed (`holding`), its training pods are the schedule timeout's; once
    it is placed they count from then (`not_before`)."""
    if gated:
        return None, None
    next_due = None
    for view in views.values():
        pod = view.pod
        if pod is None or st.is_deleting(pod) or (pod.get("status") or {}).get("phase") not in (None, "Pending"):
            continue
        training = view.role in api.TRAINING_ROLES
        if holding and training:
            continue
        due = startup_due(job, pod, status, not_before if training else None)
        if due is None:
            continue
        if now >= due:
            # The scheduler's words even inside their grace period: they say why, better than no reason at all.
            why = st.pending_reason(pod) or "containers not started"
            name = (pod.get("metadata") or {}).get("name")
            timeout = api.run_policy(job)["startupTimeoutSeconds"]
            return f"{name} was not running startupTimeoutSeconds={timeout} after it could start: {why}", None
        next_due = due if next_due is None else min(next_due, due)
    return None, next_due


def warnings_due(views: dict[str, TaskView], status: dict[str, Any], now: float, patience: st.Patience) -> float | None:
    """When a wait becomes worth reporting: a pod unscheduled past the scheduling grace, an old pod still
    terminating past its grace period (no event comes then: the reconcile must be woken)."""
    started = st.parse_time(status.get("activeSince"))
    upcoming = []
    for view in views.values():
        since = st.unscheduled_since(view.pod, started) if view.pod is not None else None
        if since is not None:
            upcoming.append(since + patience.scheduling_grace)
        upcoming += [at for old in view.stale if (at := st.stuck_terminating_at(old, patience.stuck_margin))]
    return min((at for at in upcoming if at > now), default=None)
