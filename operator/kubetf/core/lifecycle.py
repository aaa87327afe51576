"""A job's lifecycle under way, pure: the decision being made (`Decision`), and the steps every path of it shares:
the phase and its condition (`derive_phase`, `transition`), a suspension, the end of a job and what its
cleanPodPolicy stops (kubetf.core.reconcile puts them in order)."""

from __future__ import annotations

import dataclasses
from typing import Any

from kubetf.core import api, scheduling, timers
from kubetf.core import status as st
from kubetf.core.config import OperatorConfig
from kubetf.core.plan import Event, Plan
from kubetf.core.refusals import WAITS
from kubetf.core.status import COMPLETED, Pod, TaskView
from kubetf.core.timers import Clock

# Waits that end by themselves: an Event at most, never a Warning.
EXPECTED_WAITS = ("PodsStarting", "PodsTerminating", "GangWaiting")


@dataclasses.dataclass
class Decision:
    """One reconcile's decision under way: the job, the status being decided and the plan it fills."""

    job: api.Job
    status: dict[str, Any]
    now: float
    plan: Plan
    config: OperatorConfig
    create: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    announce: bool = True  # False: the status follows what was created; its events were decided already
    integrations: list[scheduling.Integration] = dataclasses.field(default_factory=list)
    owned: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # Observed.owned
    pods: list[Pod] = dataclasses.field(default_factory=list)
    lost_nodes: dict[str, float] = dataclasses.field(default_factory=dict)

    def transition(self, phase: str, reason: str, message: str, event_type: str = "Normal") -> None:
        before = st.current_condition(self.status)
        st.set_phase(self.status, phase, reason, message, self.now, self.job["metadata"].get("generation"))
        # An event per change of phase or reason; a warning also when its message changes (a new pod is stuck).
        if not self.announce or (before is None and event_type == "Normal"):
            return  # a new job: the CreatedPods event says it
        if (
            before is None
            or (before["type"], before.get("reason")) != (phase, reason)
            or (event_type == "Warning" and before.get("message") != message)
        ):
            self.plan.events.append(Event(event_type, reason, message))

    def fail(self, reason: str, message: str, pods: list[Pod]) -> None:
        self.transition(st.FAILED, reason, message, "Warning")
        finish(self, pods)

    def situation(self, views: dict[str, TaskView]) -> scheduling.Situation:
        """What the job's scheduler integrations decide on (kubetf.core.scheduling)."""
        return scheduling.Situation(
            self.job, self.status, self.pods, views, self.owned, self.now, self.config, self.plan.admission,
            self.lost_nodes, creating=bool(self.create),
        )  # fmt: skip

    def regroup(self, views: dict[str, TaskView], restarted: set[tuple[str, int]]) -> None:
        situation = self.situation(views)
        for integration in self.integrations:
            integration.regroup(situation, restarted)

    @property
    def patience(self) -> st.Patience:
        return st.Patience(self.config.scheduling_grace, self.config.stuck_margin)


def suspend(d: Decision, pods: list[Pod]) -> None:
    """Suspend deletes every pod and keeps the counters; tasks not finished start over on resume (a new gang). The
    time it stays suspended does not count (kubetf.core.timers)."""
    job, status = d.job, d.status
    timers.account(status, Clock.STOPPED, d.now)
    if status.get("phase") != st.SUSPENDED:
        views, _ = st.observe(job, pods)
        restarted = {(v.role, v.index) for v in views.values() if v.state != COMPLETED}
        d.regroup(views, restarted)
        for view in views.values():
            if view.state != COMPLETED:
                view.replace()  # its pod is deleted with the others below
        store_tasks(status, views)
        d.plan.persist_first = True
    d.plan.delete += [p for p in pods if not st.is_deleting(p)]
    status.pop("restartAfter", None)
    store_tasks(status, st.observe(dict(job, status=status), [])[0])  # no pod counts as active or ready
    d.transition(st.SUSPENDED, "Suspended", "Job suspended: pods deleted, counters kept")


def finish(d: Decision, pods: list[Pod]) -> None:
    d.status.setdefault("completionTime", st.format_time(d.now))
    timers.account(d.status, Clock.STOPPED, d.now)
    d.status.pop("restartAfter", None)
    d.plan.persist_first = True
    d.create = []
    finished(d, pods)


def finished(d: Decision, pods: list[Pod]) -> None:
    """Stop what the cleanPodPolicy says, give back what the schedulers hold for the job, then wait for the TTL. A
    succeeded job's evaluator, a sidecar that may still be evaluating the last checkpoint, gets evaluatorGraceSeconds
    to finish on its own first."""
    clean = api.run_policy(d.job)["cleanPodPolicy"]
    grace = timers.evaluator_grace_due(d.job, d.status)
    for pod in pods:
        if st.is_deleting(pod) or clean == "None" or any(pod is p for p in d.plan.delete):
            continue
        if grace is not None and d.now < grace and _is_running_evaluator(pod):
            d.plan.wake_at(grace)
            continue
        if clean == "All" or not (st.is_finished(pod) or st.is_succeeding(pod)):  # its log kept as a finished one's
            d.plan.delete.append(pod)
    # The counts of a finished job are those of the pods it keeps: none active once cleaned up.
    kept = [p for p in pods if not any(p is q for q in d.plan.delete) and not st.is_deleting(p)]
    views = st.observe(dict(d.job, status=d.status), kept)[0]
    store_tasks(d.status, views)
    situation = d.situation(views)
    d.plan.writes += [w for integration in d.integrations for w in integration.finish(situation)]
    due = timers.ttl_due(d.job, d.status)
    d.plan.delete_job = due is not None and d.now >= due
    d.plan.wake_at(due if not d.plan.delete_job else None)


def _is_running_evaluator(pod: Pod) -> bool:
    task = st.pod_task(pod)
    return task is not None and task[0] == "evaluator" and not st.is_finished(pod)


def store_tasks(status: dict[str, Any], views: dict[str, TaskView]) -> None:
    status["tasks"] = {key: _record(v) for key, v in views.items()}
    status["replicaStatuses"] = st.replica_statuses(views)
    status["ready"] = f"{_ready(views)}/{len(views)}"


def _record(view: TaskView) -> dict[str, Any]:
    record: dict[str, Any] = {"attempt": view.attempt, "state": view.state}
    if view.exits:
        record["exits"] = view.exits
    if view.in_place_by is not None:
        record["inPlaceBy"] = st.format_time(view.in_place_by)
        record["exitsAt"] = view.exits_at or 0
    return record


def _ready(views: dict[str, TaskView]) -> int:
    return sum(1 for v in views.values() if v.pod is not None and st.is_ready(v.pod))


def derive_phase(d: Decision, views: dict[str, TaskView], previous: str | None) -> None:
    """The phase and its condition from the tasks: Queued while a scheduler keeps the pods out; Running once they all
    run (or the training does, while the evaluator alone waits); else why they wait."""
    job, status, gate = d.job, d.status, d.plan.gate
    store_tasks(status, views)
    if gate is not None and gate.queued:
        d.transition(st.QUEUED, gate.reason, gate.message, "Warning" if gate.warning else "Normal")
        return
    started = st.parse_time(status.get("activeSince"))
    if st.all_running(views):
        d.transition(st.RUNNING, "AllPodsRunning", _running_message(views))
        return
    reason, message = st.waiting_message(views, api.name(job), d.now, started, d.patience)
    training = {k: v for k, v in views.items() if v.role in api.TRAINING_ROLES}
    if training and st.all_running(training) and not any(v.stale for v in views.values()):
        # The training runs; the evaluator, outside any gang, waits alone: the job trains, and says why it waits.
        d.transition(st.RUNNING, "EvaluatorPending", f"the training runs; the evaluator waits: {message}",
                     "Normal" if reason in EXPECTED_WAITS else "Warning")  # fmt: skip
        return
    event_type = "Normal" if reason in EXPECTED_WAITS else "Warning"
    if d.plan.names_taken:
        reason, message, event_type = "PodNameInUse", _name_taken_message(d.plan.names_taken), "Warning"
    elif d.plan.waiting is not None:
        reason, message, timed_out = d.plan.waiting
        event_type = "Warning" if timed_out else "Normal"
    if any(status.get(wait) for wait in WAITS):
        return  # a refused create's condition stays until the creates go through (`after_creates`)
    current = st.current_condition(status) or {}
    # While a restart's old pods terminate and its new ones start, keep the restart's own reason visible until a
    # wait needs explaining (an old pod stuck terminating, a new one unschedulable).
    if (
        previous == st.RESTARTING
        and reason in EXPECTED_WAITS
        and reason != "GangWaiting"
        and current.get("type") == st.RESTARTING
        and current.get("reason") not in (*EXPECTED_WAITS, "PodStuckTerminating")
    ):
        return
    d.transition(st.RESTARTING if previous == st.RESTARTING else st.PENDING, reason, message, event_type)


def _name_taken_message(taken: list[tuple[str, Pod]]) -> str:
    name, holder = taken[0]
    owners = [o for o in holder["metadata"].get("ownerReferences") or [] if o.get("controller")]
    whose = f"{owners[0].get('kind')} {owners[0].get('name')}" if owners else "no owner"
    more = f" (and {len(taken) - 1} more)" if len(taken) > 1 else ""
    return (
        f"pod {name}{more} exists and is not this job's (its controller: {whose}): the operator never deletes it; "
        "its task waits until the name is free: delete that pod, or give the job another name"
    )


def _running_message(views: dict[str, TaskView]) -> str:
    """The same count as the READY column: pods running but not (yet) ready are said so."""
    total = len(views)
    done = sum(1 for v in views.values() if v.state == COMPLETED)
    ready = _ready(views)
    not_ready = f", {total - done - ready} not ready" if ready < total - done else ""
    finished_ = f", {done} finished" if done else ""
    return f"{total - done}/{total} pods running{not_ready}{finished_}"
