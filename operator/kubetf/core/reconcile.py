"""The reconcile decision, pure: from a job (with its status) and its pods, what to write, delete and create.

The operator (handlers.py) fetches, calls `plan`, then carries the plan out in this order: persist the decided
status (restart counters and attempt numbers are written before any pod is touched, so a restarted operator
neither loses nor double-counts a restart), delete, create, then `after_creation` for the final status.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from kubetf.core import api, builders, kueue, policy, timers
from kubetf.core import status as st
from kubetf.core.api import Job
from kubetf.core.policy import Outcome, Termination
from kubetf.core.status import COMPLETED, CREATED, WAITING, Pod, TaskView
from kubetf.core.timers import REFUSED_SINCE, Clock


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Plan:
    job: Job  # the job with the CRD's defaults applied
    status: dict[str, Any]
    persist_first: bool = False  # the status holds decisions that must be stored before pods are touched
    delete: list[Pod] = field(default_factory=list)
    force_delete: list[Pod] = field(default_factory=list)  # on a lost node: no kubelet will confirm a deletion
    create: list[dict[str, Any]] = field(default_factory=list)
    ensure: list[dict[str, Any]] = field(default_factory=list)  # Service and PVC, made before the first pods
    events: list[Event] = field(default_factory=list)
    requeue_at: float | None = None
    delete_job: bool = False
    admission: kueue.Admission | None = None  # a queued job's admission by Kueue, as read before planning
    # Kueue's pod groups (kubetf.core.kueue): pods whose Kueue finalizer is removed, pods marked not to be replaced.
    release: list[Pod] = field(default_factory=list)
    unretriable: list[Pod] = field(default_factory=list)

    def wake_at(self, when: float | None) -> None:
        if when is not None and (self.requeue_at is None or when < self.requeue_at):
            self.requeue_at = when


# While a pod is being deleted on a node, its node is looked at again this often: a node that stopped reporting
# sends no event of its own.
NODE_CHECK_SECONDS = 10


def plan(
    stored: Job,
    pods: list[Pod],
    now: float,
    lost_nodes: frozenset[str] = frozenset(),
    admission: kueue.Admission | None = None,
) -> Plan:
    """`lost_nodes`: the nodes of the job's pods that are NotReady, unreachable or gone; `admission`: for a job with
    a queue label, what Kueue says of it (both read by the caller)."""
    result = _plan(stored, pods, now, lost_nodes, admission)
    _deal_with_lost_nodes(result, pods, now, lost_nodes)
    _kueue_bookkeeping(result, pods, lost_nodes)
    return result


def _plan(
    stored: Job, pods: list[Pod], now: float, lost_nodes: frozenset[str], admission: kueue.Admission | None
) -> Plan:
    job = api.with_defaults(stored)
    status: dict[str, Any] = copy.deepcopy(stored.get("status") or {})
    status.setdefault("restarts", {"failures": 0, "disruptions": 0, "total": 0})
    result = Plan(job=job, status=status, admission=admission)
    generation = stored["metadata"].get("generation")
    if generation is not None:
        status["observedGeneration"] = generation
    phase = status.get("phase")

    def transition(new_phase: str, reason: str, message: str, event_type: str = "Normal") -> None:
        before = st.current_condition(status)
        status["phase"] = new_phase
        status["reason"] = reason
        st.set_condition(status, new_phase, reason, message, now, generation)
        # An event per change of phase or reason; a warning also when its message changes (a new pod is stuck).
        if before is None and event_type == "Normal":
            return  # a new job: the CreatedPods event says it
        if (
            before is None
            or (before["type"], before.get("reason")) != (new_phase, reason)
            or (event_type == "Warning" and before.get("message") != message)
        ):
            result.events.append(Event(event_type, reason, message))

    if phase in st.FINISHED:
        _finished(job, pods, status, now, result)
        return result

    # The API server enforced the CRD's schema and CEL rules at create time; what is left is the operator's.
    problems = api.operator_problems(job)
    if problems:
        transition(st.FAILED, "InvalidSpec", "; ".join(str(p) for p in problems), "Warning")
        _finish(job, pods, status, now, result)
        return result

    if api.run_policy(job).get("suspend"):
        _suspend(job, pods, status, now, result, transition)
        return result
    if phase == st.SUSPENDED:
        result.events.append(Event("Normal", "Resumed", "Job resumed: creating its pods"))
        phase = None

    views, orphans = st.observe(job, pods)
    result.delete += [p for p in orphans if not st.is_deleting(p)]
    for view in views.values():
        if view.state == WAITING and view.pod is not None:
            view.state = CREATED  # created by an operator that stopped before it could record it

    deadline = timers.deadline(job, status)
    if deadline is not None and now >= deadline:
        seconds = api.run_policy(job)["activeDeadlineSeconds"]
        transition(
            st.FAILED,
            "DeadlineExceeded",
            f"Job was active longer than activeDeadlineSeconds={seconds} (time queued or suspended not counted)",
            "Warning",
        )
        _finish(job, pods, status, now, result)
        return result

    # Tasks whose current pod finished or vanished.
    ended: list[tuple[TaskView, Termination]] = []
    for view in views.values():
        if view.state == COMPLETED:
            continue
        termination = _termination(job, view)
        if termination is None:
            continue
        if termination.outcome is Outcome.SUCCEEDED:
            view.state = COMPLETED
        else:
            ended.append((view, termination))

    completed = {(v.role, v.index) for v in views.values() if v.state == COMPLETED}
    _store_tasks(status, views)
    if policy.succeeded(job, completed):
        who = ", ".join(builders.pod_name(api.name(job), r, i) for r, i in policy.success_tasks(job))
        transition(st.SUCCEEDED, "Succeeded", f"{who} exited 0")
        _finish(job, pods, status, now, result)
        return result

    if ended:
        if not _restart(job, views, ended, status, now, result, transition):
            _finish(job, pods, status, now, result)
            return result
        phase = st.RESTARTING
    elif phase == st.RESTARTING:
        _count_node_loss_as_disruption(job, views, status, lost_nodes, result, transition)

    # Stale pods go first; a task's replacement is created only once its old pod is gone (the name is free) and no
    # old pod of any task it restarts together with (policy.barrier) may still run. One that runs nothing and is
    # only kept for Kueue's bookkeeping (kueue.held) runs no old program.
    restart_after = st.parse_time(status.get("restartAfter"))
    for view in views.values():
        result.delete += [p for p in view.stale if not st.is_deleting(p)]
    terminating = {(v.role, v.index) for v in views.values() if any(not kueue.held(p, lost_nodes) for p in v.stale)}
    old_workload = _previous_runs_workload(result.admission, pods)
    for view in views.values():
        if view.state != WAITING or view.pod is not None or view.stale:
            continue
        if terminating and any(task in terminating for task in policy.barrier(job, view.role, view.index)):
            continue
        if old_workload:
            continue  # the Workload's deletion (watched) brings the job back
        if restart_after is not None and now < restart_after:
            result.wake_at(restart_after)
            continue
        result.create.append(builders.desired_pod(job, view.role, view.index, view.attempt))
    if restart_after is not None and now >= restart_after:
        status.pop("restartAfter", None)
    if result.create:
        result.ensure = [o for o in (builders.desired_pvc(job), builders.desired_service(job)) if o is not None]
        if admission is not None and not admission.installed and phase in (None, st.PENDING):
            reason, message = admission.waiting(job)
            result.events.append(Event("Warning", reason, message + "; its pods run without queueing"))

    _account(status, views, result.admission, now)
    _wake_when_waits_turn_into_warnings(views, status, now, result)
    _startup_timeout(job, views, status, now, result, transition)
    if status.get("phase") != st.FAILED:
        _create_timeout(job, status, now, result, transition)
    if status.get("phase") == st.FAILED:
        _finish(job, pods, status, now, result)
        return result

    _derive_phase(job, views, phase, status, transition, now, result.admission)
    result.wake_at(timers.deadline(job, status))
    return result


def _account(status: dict[str, Any], views: dict[str, TaskView], admission: kueue.Admission | None, now: float) -> None:
    """Open or close the job's active period (core.timers): it is active unless it waits for Kueue's admission."""
    if _waits_for_admission(views, admission):
        timers.account(status, Clock.QUEUED, now)
        if admission is not None and admission.position is not None:
            status["queuePosition"] = admission.position
        else:
            status.pop("queuePosition", None)
        return
    status.pop("queuePosition", None)
    admitted_at = st.parse_time(admission.admitted_at) if admission is not None else None
    timers.account(status, Clock.ACTIVE, now, admitted_at)


def _previous_runs_workload(admission: kueue.Admission | None, pods: list[Pod]) -> bool:
    """A resumed job's group still names the finished Workload of its run before the suspension until Kueue's
    pods are gone and it is garbage-collected: pods created meanwhile would join a finished Workload, never to
    be admitted."""
    return admission is not None and admission.finished and not pods


def after_creation(plan_: Plan, pods: list[Pod], created: list[dict[str, Any]], now: float) -> dict[str, Any]:
    """The status once `created` pods exist beside `pods`: their tasks become Created, and the phase follows."""
    job = plan_.job
    status = copy.deepcopy(plan_.status)
    tasks = status.setdefault("tasks", {})
    for pod in created:
        found = st.pod_task(pod)
        if found:
            tasks[st.task_key(found[0], found[1])] = {"attempt": found[2], "state": CREATED}
    if status.get("phase") in (*st.FINISHED, st.SUSPENDED):
        return status
    job_with_status = dict(job, status=status)
    views, _ = st.observe(job_with_status, [*pods, *created])
    generation = job["metadata"].get("generation")
    _account(status, views, plan_.admission, now)  # pods just created may be gated: the job waits for Kueue
    _derive_phase(
        job,
        views,
        status.get("phase"),
        status,
        lambda p, r, m, *_: _set(status, p, r, m, now, generation),
        now,
        plan_.admission,
    )
    # Their timers too: their ADDED events carry nothing the creates did not return, so they bring no reconcile.
    _wake_when_waits_turn_into_warnings(views, status, now, plan_)
    _startup_timeout(job, views, status, now, plan_, lambda *_: None)
    return status


def _set(status: dict[str, Any], phase: str, reason: str, message: str, now: float, generation: int | None) -> None:
    status["phase"] = phase
    status["reason"] = reason
    st.set_condition(status, phase, reason, message, now, generation)


def _termination(job: Job, view: TaskView) -> Termination | None:
    restart_policy = job["spec"]["replicaSpecs"][view.role]["restartPolicy"]
    pod = view.pod
    if pod is None:
        if view.state == CREATED:
            return Termination(Outcome.DISRUPTED, "PodDeleted: the pod was deleted while the job ran")
        return None
    termination = policy.classify_pod(pod, restart_policy)
    if termination is not None:
        return termination
    reason = policy.disruption_reason(pod)
    if st.is_deleting(pod):
        # Only stale pods are deleted by the operator while a job runs: anyone else's deletion is a disruption.
        return Termination(Outcome.DISRUPTED, reason or "PodDeleted: the pod is being deleted")
    return Termination(Outcome.DISRUPTED, reason) if reason else None


def _restart(
    job: Job,
    views: dict[str, TaskView],
    ended: list[tuple[TaskView, Termination]],
    status: dict[str, Any],
    now: float,
    result: Plan,
    transition: Any,
) -> bool:
    """Count one restart for everything that ended together and bump the attempts to replace. False: job failed.

    When several tasks end at once (an MWMS peer dies and the others crash waiting for it), the disruption, if
    any, is the cause: it is counted, the crashes are not.
    """
    ended.sort(key=lambda e: (e[1].outcome is not Outcome.DISRUPTED, e[1].outcome is not Outcome.PERMANENT))
    cause_view, cause = ended[0]
    restarts = status["restarts"]
    decision = policy.decide(job, cause_view.role, cause, restarts.get("failures", 0), restarts.get("disruptions", 0))
    name = builders.pod_name(api.name(job), cause_view.role, cause_view.index)
    if not decision.restart:
        reason, _, detail = decision.reason.partition(": ")
        transition(st.FAILED, reason, f"{name}: {detail}", "Warning")
        result.persist_first = True
        return False
    disrupted = cause.outcome is Outcome.DISRUPTED
    restarts["disruptions" if disrupted else "failures"] = (
        restarts.get("disruptions" if disrupted else "failures", 0) + 1
    )
    restarts["total"] = restarts.get("failures", 0) + restarts.get("disruptions", 0)
    restarts["lastReason"] = f"{name} {decision.reason}"
    restarts["lastKind"] = "Disruption" if disrupted else "Failure"
    restarts["lastTime"] = st.format_time(now)
    targets: list[tuple[str, int]] = []
    # Kueue stops the whole group at once (preemption, eviction): every task not finished restarts, and the
    # deletions of the others, seen in later reconciles, are not counted again.
    stopped_by_kueue = any(v.pod is not None and kueue.termination_target(v.pod) for v, _ in ended)
    if stopped_by_kueue and result.admission is not None:  # queued again at once, whatever the Workload still says
        result.admission = dataclasses.replace(result.admission, stopped=True)
    everything = [(v, None) for v in views.values() if v.state != COMPLETED] if stopped_by_kueue else []
    for view, _termination in [*ended, *everything]:
        targets += [t for t in policy.restart_targets(job, view.role, view.index) if t not in targets]
    for role, index in targets:
        view = views[st.task_key(role, index)]  # a finished one too: the new group needs it (restart_targets)
        if view.pod is not None:
            view.stale.append(view.pod)
            view.pod = None
        view.attempt += 1
        view.state = WAITING
    _store_tasks(status, views)
    if not disrupted:
        status["restartAfter"] = st.format_time(now + policy.backoff_seconds(job, restarts["failures"]))
    restarted = ", ".join(builders.pod_name(api.name(job), r, i) for r, i in targets)
    transition(
        st.RESTARTING,
        "Disrupted" if disrupted else "Failed",
        f"{name} {decision.reason}; restarting {restarted}",
        "Warning",
    )
    result.persist_first = True
    return True


def _count_node_loss_as_disruption(
    job: Job,
    views: dict[str, TaskView],
    status: dict[str, Any],
    lost_nodes: frozenset[str],
    result: Plan,
    transition: Any,
) -> None:
    """A restart counted as a failure becomes a disruption when one of its old pods turns out to be on a lost node.

    A node that vanishes without a word is marked NotReady only after the node controller's grace period (40-50 s);
    MultiWorkerMirrored peers crash on the lost collective before that, and their exit is all the operator saw. The
    restart waits for every old pod anyway (policy.barrier), so the cause is settled then: a lost node caused it.
    """
    restarts = status["restarts"]
    if restarts.get("lastKind") != "Failure":
        return
    lost = [p for v in views.values() for p in v.stale if (p.get("spec") or {}).get("nodeName") in lost_nodes]
    if not lost:
        return
    pod_name = lost[0]["metadata"]["name"]
    node = lost[0]["spec"]["nodeName"]
    restarts["failures"] = max(0, restarts.get("failures", 0) - 1)
    restarts["disruptions"] = restarts.get("disruptions", 0) + 1
    restarts["lastKind"] = "Disruption"
    restarts["lastReason"] = (
        f"{pod_name} Disrupted: NodeLost: node {node} stopped reporting (the failures of its peers followed)"
    )
    status.pop("restartAfter", None)  # no failure backoff for a disruption
    transition(st.RESTARTING, "NodeLost", f"{restarts['lastReason']}; counted as a disruption", "Warning")
    result.persist_first = True


def _deal_with_lost_nodes(result: Plan, pods: list[Pod], now: float, lost_nodes: frozenset[str]) -> None:
    """Pods on a lost node are force-deleted (unless the job opts out): their kubelet will never confirm a graceful
    deletion, and a replacement waits until the old pod is gone. Pods being deleted elsewhere get their node looked
    at again in a while."""
    if api.run_policy(result.job)["forceDeleteOnNodeLoss"]:
        doomed = [p for p in pods if st.is_deleting(p)] + result.delete
        result.force_delete = [p for p in doomed if (p.get("spec") or {}).get("nodeName") in lost_nodes]
        forced = {id(p) for p in result.force_delete}
        result.delete = [p for p in result.delete if id(p) not in forced]
        for pod in result.force_delete:
            node = pod["spec"]["nodeName"]
            message = f"{pod['metadata']['name']}: node {node} stopped reporting and cannot confirm the deletion"
            result.events.append(Event("Warning", "ForceDeleted", message))
    nodes = {(p.get("spec") or {}).get("nodeName") for p in pods if st.is_deleting(p)}
    if nodes - lost_nodes - {None}:
        result.wake_at(now + NODE_CHECK_SECONDS)


def _kueue_bookkeeping(result: Plan, pods: list[Pod], lost_nodes: frozenset[str]) -> None:
    """Kueue's side of the plan (see kubetf.core.kueue): a job that ends marks its pods not to be replaced, so Kueue
    finishes its Workload and releases the quota; deleted pods that run nothing lose Kueue's finalizer, so their
    names are free for replacements and an ending job's pods are gone at once."""
    if not any(kueue.FINALIZER in ((p.get("metadata") or {}).get("finalizers") or []) for p in pods):
        return  # no pod of the job is Kueue's
    ending = result.status.get("phase") in (*st.FINISHED, st.SUSPENDED) or result.delete_job
    if ending:
        result.unretriable = kueue.needs_unretriable(pods)
    group = kueue.group_name(result.job)
    ours = [p for p in pods if ((p.get("metadata") or {}).get("labels") or {}).get(kueue.GROUP_LABEL) == group]
    others = [p for p in pods if p not in ours]  # a previous job's of the same name: its group has ended
    workload = result.admission.workload if result.admission else None
    views, _ = st.observe(dict(result.job, status=result.status), ours)
    staying = [v.pod for v in views.values() if v.pod is not None and not st.is_deleting(v.pod)]
    staying = [p for p in staying if p not in result.delete]
    result.release = kueue.to_release(ours, lost_nodes, ending, staying, workload)
    result.release += kueue.to_release(others, lost_nodes, ending=True)


def _store_tasks(status: dict[str, Any], views: dict[str, TaskView]) -> None:
    status["tasks"] = {key: {"attempt": v.attempt, "state": v.state} for key, v in views.items()}
    status["replicaStatuses"] = st.replica_statuses(views)
    status["ready"] = f"{_ready(views)}/{len(views)}"


def _ready(views: dict[str, TaskView]) -> int:
    return sum(1 for v in views.values() if v.pod is not None and st.is_ready(v.pod))


# Waits that end by themselves: an Event at most, never a Warning.
EXPECTED_WAITS = ("PodsStarting", "PodsTerminating")


def _derive_phase(
    job: Job,
    views: dict[str, TaskView],
    previous: str | None,
    status: dict[str, Any],
    transition: Any,
    now: float,
    admission: kueue.Admission | None = None,
) -> None:
    _store_tasks(status, views)
    running = _all_running(views)
    if not running and _waits_for_admission(views, admission):
        reason, message = admission.waiting(job) if admission else ("Queued", "waiting for Kueue to admit the pods")
        transition(st.QUEUED, reason, message, "Normal" if reason == "Queued" else "Warning")
        return
    if running:
        total = len(views)
        done = sum(1 for v in views.values() if v.state == COMPLETED)
        ready = _ready(views)
        # The same count as the READY column: pods running but not (yet) ready are said so.
        not_ready = f", {total - done - ready} not ready" if ready < total - done else ""
        finished = f", {done} finished" if done else ""
        transition(st.RUNNING, "AllPodsRunning", f"{total - done}/{total} pods running{not_ready}{finished}")
        return
    reason, message = st.waiting_message(views, api.name(job), now, st.parse_time(status.get("activeSince")))
    event_type = "Normal" if reason in EXPECTED_WAITS else "Warning"
    if status.get(REFUSED_SINCE) or status.get(UNAVAILABLE_SINCE):
        return  # a refused create's condition stays until the creates go through (`after_creates`)
    if previous == st.RESTARTING:
        current = st.current_condition(status) or {}
        # Keep the restart's own reason visible while its old pods terminate and its new ones start, until a
        # wait needs explaining (an old pod stuck terminating, a new one unschedulable).
        if (
            reason in EXPECTED_WAITS
            and current.get("type") == st.RESTARTING
            and current.get("reason") not in (*EXPECTED_WAITS, "PodStuckTerminating")
        ):
            return
        transition(st.RESTARTING, reason, message, event_type)
        return
    transition(st.PENDING, reason, message, event_type)


def _all_running(views: dict[str, TaskView]) -> bool:
    return all(v.state == COMPLETED or (v.pod is not None and st.is_started(v.pod)) for v in views.values())


def _waits_for_admission(views: dict[str, TaskView], admission: kueue.Admission | None) -> bool:
    """The job cannot run until Kueue admits its group: its LocalQueue is missing, or its group is not admitted and
    its pods are gated (or, none left, will be when created). A restart under an admitted group never waits: Kueue
    ungates the replacements at once."""
    if admission is None or not admission.installed or _all_running(views):
        return False
    if admission.cluster_queue is None:
        return True  # Kueue cannot admit it: say why, whatever the pods show
    if admission.admitted:
        return False
    current = [v.pod for v in views.values() if v.pod is not None and not st.is_deleting(v.pod)]
    return not current or any(kueue.is_gated(p) for p in current)


def _wake_when_waits_turn_into_warnings(
    views: dict[str, TaskView], status: dict[str, Any], now: float, result: Plan
) -> None:
    """Reconcile again when a wait becomes worth reporting: a pod unscheduled past the grace, an old pod still
    terminating past its grace period."""
    started = st.parse_time(status.get("activeSince"))
    for view in views.values():
        since = st.unscheduled_since(view.pod, started) if view.pod is not None else None
        if since is not None and now < since + st.SCHEDULING_GRACE_SECONDS:
            result.wake_at(since + st.SCHEDULING_GRACE_SECONDS)
        for old in view.stale:
            at = st.stuck_terminating_at(old)
            if at is not None and now < at:
                result.wake_at(at)


def _startup_timeout(
    job: Job, views: dict[str, TaskView], status: dict[str, Any], now: float, result: Plan, transition: Any
) -> None:
    """Fail the job when a pod could not start within startupTimeoutSeconds of the moment it may (core.timers)."""
    for view in views.values():
        pod = view.pod
        if pod is None or st.is_deleting(pod) or (pod.get("status") or {}).get("phase") not in (None, "Pending"):
            continue
        due = timers.startup_due(job, pod, status, result.admission)
        if due is None:
            continue
        if now >= due:
            # The scheduler's words even inside their grace period: they say why, better than no reason at all.
            why = st.pending_reason(pod) or "containers not started"
            name = (pod.get("metadata") or {}).get("name")
            timeout = api.run_policy(job)["startupTimeoutSeconds"]
            transition(
                st.FAILED,
                "StartupTimeout",
                f"{name} was not running startupTimeoutSeconds={timeout} after it could start: {why}",
                "Warning",
            )
            result.persist_first = True
            return
        result.wake_at(due)


def _suspend(job: Job, pods: list[Pod], status: dict[str, Any], now: float, result: Plan, transition: Any) -> None:
    """Suspend deletes every pod and keeps the counters; tasks not finished start over on resume. The time it stays
    suspended does not count (kubetf.core.timers)."""
    timers.account(status, Clock.STOPPED, now)
    views, _ = st.observe(job, pods)
    if status.get("phase") != st.SUSPENDED:
        for view in views.values():
            if view.state != COMPLETED:
                view.attempt += 1
                view.state = WAITING
        _store_tasks(status, views)
        result.persist_first = True
    result.delete += [p for p in pods if not st.is_deleting(p)]
    status.pop("restartAfter", None)
    _store_tasks(status, st.observe(dict(job, status=status), [])[0])  # no pod counts as active or ready
    transition(st.SUSPENDED, "Suspended", "Job suspended: pods deleted, counters kept")


def _finish(job: Job, pods: list[Pod], status: dict[str, Any], now: float, result: Plan) -> None:
    status.setdefault("completionTime", st.format_time(now))
    timers.account(status, Clock.STOPPED, now)
    status.pop("restartAfter", None)
    result.persist_first = True
    result.create = []
    result.ensure = []
    _finished(job, pods, status, now, result)


def _finished(job: Job, pods: list[Pod], status: dict[str, Any], now: float, result: Plan) -> None:
    """Stop what the cleanPodPolicy says, then wait for the TTL."""
    clean = api.run_policy(job)["cleanPodPolicy"]
    for pod in pods:
        if st.is_deleting(pod) or clean == "None":
            continue
        if clean == "All" or not st.is_finished(pod):
            result.delete.append(pod)
    # The counts of a finished job are those of the pods it keeps: none active once cleaned up.
    deleted = {id(p) for p in result.delete}
    kept = [p for p in pods if id(p) not in deleted and not st.is_deleting(p)]
    _store_tasks(status, st.observe(dict(job, status=status), kept)[0])
    due = timers.ttl_due(job, status)
    if due is not None:
        if now >= due:
            result.delete_job = True
        else:
            result.wake_at(due)


# ---------------------------------------------------------------------- creates the API server refuses

INVALID, DENIED, NAME_IN_USE, UNAVAILABLE = "Invalid", "Denied", "NameInUse", "Unavailable"
UNAVAILABLE_SINCE = "createUnavailableSince"  # status field: since when creates have met an unavailable API
# Kubernetes' quantity grammar (resource.Quantity): what the API server cannot even decode as a Pod.
_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?$")


@dataclass(frozen=True)
class Refusal:
    """The API server would not create one of the job's objects, classified by kube.py from its answer."""

    # INVALID: wrong as written, never created | DENIED: quota, admission, webhook | NAME_IN_USE | UNAVAILABLE: the API
    # server or a webhook it calls cannot answer now (5xx, timeout)
    cause: str
    kind: str  # Pod | Service | PersistentVolumeClaim
    name: str
    message: str  # the API server's own words (for NAME_IN_USE: whose the object is)


def dry_run_objects(plan_: Plan) -> list[dict[str, Any]]:
    """What to dry-run on the server before a Pending job creates anything (none of its tasks created: a new job,
    or one resumed, whose templates may have changed while it was suspended): the Service, the PVC and one pod per
    role. Pods of one role differ only in name, hostname, labels and env values, which the CRD already checked
    (names) or cannot be invalid (strings); the last index, the longest name, stands for its role. Empty for a
    restart: a request per role for nothing."""
    tasks = (plan_.status.get("tasks") or {}).values()
    if not plan_.create or plan_.status.get("phase") != st.PENDING or any(t.get("state") != WAITING for t in tasks):
        return []
    last = {pod["metadata"]["labels"][api.LABEL_ROLE]: pod for pod in plan_.create}
    return [*plan_.ensure, *last.values()]


def after_creates(
    plan_: Plan, pods: list[Pod], created: list[dict[str, Any]], refusal: Refusal | None, now: float
) -> dict[str, Any]:
    """`after_creation`, then what a refused create means: INVALID fails the job; DENIED and NAME_IN_USE keep it
    Pending (or Restarting) with the reason in its condition, a Warning event, and startupTimeoutSeconds counting
    from the first refusal. None: nothing was refused, the wait (if any) is over."""
    if refusal is None:
        waits = (REFUSED_SINCE, UNAVAILABLE_SINCE)
        without = dataclasses.replace(plan_, status={k: v for k, v in plan_.status.items() if k not in waits})
        status = after_creation(without, pods, created, now)
        plan_.wake_at(without.requeue_at)
        return status
    status = after_creation(plan_, pods, created, now)
    job = plan_.job
    generation = job["metadata"].get("generation")
    before = st.current_condition(plan_.status) or {}
    if refusal.cause == UNAVAILABLE:
        _unavailable(plan_, status, refusal, before, now)
        return status
    if refusal.cause == INVALID:
        reason = "InvalidPodTemplate" if refusal.kind == "Pod" else "InvalidSpec"
        message = _invalid_message(job, refusal)
        _set(status, st.FAILED, reason, message, now, generation)
        status.setdefault("completionTime", st.format_time(now))
        status.pop("restartAfter", None)
        status.pop(REFUSED_SINCE, None)
        plan_.events.append(Event("Warning", reason, message))
        return status
    phase = st.RESTARTING if status.get("phase") == st.RESTARTING else st.PENDING
    message = _waiting_message(job, refusal)
    _set(status, phase, refusal.cause if refusal.cause == NAME_IN_USE else "CreateRejected", message, now, generation)
    since = status.setdefault(REFUSED_SINCE, st.format_time(now))
    timeout = api.run_policy(job).get("startupTimeoutSeconds")
    if timeout:
        plan_.wake_at((st.parse_time(since) or now) + timeout)
    after = st.current_condition(status) or {}
    if [before.get(k) for k in ("type", "reason", "message")] != [after.get(k) for k in ("type", "reason", "message")]:
        plan_.events.append(Event("Warning", after["reason"], message))
    return status


def _unavailable(plan_: Plan, status: dict[str, Any], refusal: Refusal, before: dict[str, Any], now: float) -> None:
    """The API server or a webhook it calls could not answer a create: named in the condition and a Warning, retried
    soon (the operator's retry cap for unavailable APIs); no time counts against the job, whose fault it is not."""
    phase = status.get("phase")
    phase = phase if phase in (st.RESTARTING, st.QUEUED) else st.PENDING
    what = f"{refusal.kind} {refusal.name}"
    message = (
        f"{what} could not be created: {refusal.message}. The API server, or an admission webhook it calls, is "
        "not answering; retrying until it does (this time does not count against startupTimeoutSeconds)"
    )
    _set(status, phase, "CreateUnavailable", message, now, plan_.job["metadata"].get("generation"))
    status.setdefault(UNAVAILABLE_SINCE, st.format_time(now))
    after = st.current_condition(status) or {}
    if [before.get(k) for k in ("type", "reason", "message")] != [after.get(k) for k in ("type", "reason", "message")]:
        plan_.events.append(Event("Warning", "CreateUnavailable", message))


def _create_timeout(job: Job, status: dict[str, Any], now: float, result: Plan, transition: Any) -> None:
    """startupTimeoutSeconds also covers pods that could not even be created (refused since REFUSED_SINCE)."""
    due = timers.create_retry_due(job, status)
    if due is None or not result.create:
        return
    if now < due:
        result.wake_at(due)
        return
    timeout = api.run_policy(job)["startupTimeoutSeconds"]
    why = (st.current_condition(status) or {}).get("message", "")
    transition(
        st.FAILED, "StartupTimeout", f"pods could not be created for startupTimeoutSeconds={timeout}: {why}", "Warning"
    )
    result.persist_first = True


def _role_of(job: Job, pod_name_: str) -> str:
    return pod_name_[len(api.name(job)) + 1 :].rpartition("-")[0]


def _invalid_message(job: Job, refusal: Refusal) -> str:
    if refusal.kind != "Pod":
        where = "spec.checkpoint" if refusal.kind == "PersistentVolumeClaim" else "the job's spec"
        return (
            f"the API server refused {refusal.kind} {refusal.name}: {refusal.message}. "
            f"Fix {where}, then delete and re-apply the job"
        )
    role = _role_of(job, refusal.name)
    template = f"spec.replicaSpecs.{role}.template"
    fields = ""
    if "quantities" in refusal.message:  # a decoding error: the API server names no field, so find them
        pod_spec = (job["spec"]["replicaSpecs"].get(role) or {}).get("template", {}).get("spec") or {}
        bad = _bad_quantities(pod_spec, f"{template}.spec")
        fields = f" (invalid quantities: {', '.join(bad)})" if bad else ""
    return (
        f"replica {role}: the API server refused pod {refusal.name}: {refusal.message}{fields}. "
        f"Fix {template}, then delete and re-apply the job"
    )


def _bad_quantities(pod_spec: dict[str, Any], prefix: str) -> list[str]:
    bad = []
    for key in ("initContainers", "containers"):
        for i, container in enumerate(pod_spec.get(key) or []):
            resources = container.get("resources") or {}
            for kind in ("limits", "requests"):
                for resource, value in (resources.get(kind) or {}).items():
                    if not _QUANTITY.match(str(value)):
                        bad.append(f"{prefix}.{key}[{i}].resources.{kind}.{resource}={value!r}")
    return bad


_ADVICE = (
    ("exceeded quota", "free quota or raise the namespace's ResourceQuota"),
    ("PodSecurity", "make the template meet the namespace's Pod Security level"),
    ("admission webhook", "the webhook named above refused it: change the template or ask the cluster's admins"),
    ("denied request", "the admission policy named above refused it: change the template or ask the cluster's admins"),
)


def _waiting_message(job: Job, refusal: Refusal) -> str:
    timeout = api.run_policy(job).get("startupTimeoutSeconds")
    limit = f"; the job fails if its pods cannot be created within startupTimeoutSeconds={timeout}" if timeout else ""
    if refusal.cause == NAME_IN_USE:
        return f"waiting to create {refusal.kind} {refusal.name}: {refusal.message}; created once it is gone{limit}"
    if refusal.kind == "Pod":
        what = f"pod {refusal.name} (replica {_role_of(job, refusal.name)})"
    else:
        what = f"{refusal.kind} {refusal.name}"
    advice = next(
        (a for marker, a in _ADVICE if marker in refusal.message),
        "check the namespace's quotas, LimitRanges and admission policies",
    )
    return f"{what} could not be created: {refusal.message}. To fix: {advice}. Retrying with backoff{limit}"
