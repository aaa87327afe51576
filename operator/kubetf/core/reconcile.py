"""The reconcile decision, pure: from what a reconcile observed, everything the shell does (kubetf.core.plan).

This module puts the policies in order; each lives in its own file: what ends a task and who restarts with it
(policy), timers, create refusals (refusals), lost nodes (node_loss), Kueue's job framework (kueue), an MWMS group's
SIGTERM (sigterm), the training's health (progress), the job's state from its pods (status). Restart counts and
attempts are decided before any pod is touched (`Plan.persist_first`): a restart is never lost nor counted twice.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from kubetf.core import api, builders, failing, gang, kueue, node_loss, policy, refusals, sigterm, timers
from kubetf.core import status as st
from kubetf.core.api import Job
from kubetf.core.config import OperatorConfig
from kubetf.core.plan import Dispatch, Event, Farewell, Observed, Plan, runs_here
from kubetf.core.policy import Outcome, Termination
from kubetf.core.progress import health, identity
from kubetf.core.refusals import Refusal
from kubetf.core.status import COMPLETED, CREATED, WAITING, Pod, TaskView
from kubetf.core.timers import Clock

# Waits that end by themselves: an Event at most, never a Warning.
EXPECTED_WAITS = ("PodsStarting", "PodsTerminating")


@dataclasses.dataclass
class _Decision:
    """One reconcile's decision under way: the job, the status being decided and the plan it fills."""

    job: Job
    status: dict[str, Any]
    now: float
    plan: Plan
    config: OperatorConfig
    create: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    announce: bool = True  # False: the status follows what was created; its events were decided already
    gang: str | None = None  # the job's gang scheduler (kubetf.core.gang), None: none
    gang_objects: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # to create before its pods

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
        _finish(self, pods)

    @property
    def patience(self) -> st.Patience:
        return st.Patience(self.config.scheduling_grace, self.config.stuck_margin)


def plan(seen: Observed, config: OperatorConfig) -> Plan:
    """Everything to do for a job that exists (`seen.job`), in the order the shell does it (kubetf.core.plan)."""
    assert seen.job is not None and runs_here(seen.job), "a job that does not run here has `farewell`"
    status: dict[str, Any] = copy.deepcopy(seen.job.get("status") or {})
    result = Plan(job=api.with_defaults(seen.job), status=status, admission=seen.admission)
    status.setdefault("restarts", {"failures": 0, "disruptions": 0, "total": 0})
    generation = seen.job["metadata"].get("generation")
    if generation is not None:
        status["observedGeneration"] = generation
    decision = _Decision(result.job, status, seen.now, result, config)
    stale = _decide(decision, seen)
    _training(result, seen, config)
    if seen.failing is None:  # its failures' condition, cleared (it is set where they happen: runtime.controller)
        failing.mark(status, None, config.reconcile_error_after, seen.now)
    _deletions(result, seen, stale, config)
    _creations(result, decision.create, config, decision.gang_objects)
    _workload(decision, seen)
    return result


def _training(result: Plan, seen: Observed, config: OperatorConfig) -> None:
    """The progress the operator holds goes into the status when its write is due, else with any status write of
    this plan; the training's health is judged on it (kubetf.core.progress.health), not on the stored copy."""
    held, status = seen.progress, result.status
    result.progress = held
    if held is not None and held.release:
        status["progress"] = held.progress
    elif held is not None:
        result.progress_along = held.progress
    freshest = held.progress if held is not None else status.get("progress")
    role, index = identity.coordinator(result.job)
    done = (status.get("tasks") or {}).get(st.task_key(role, index), {}).get("state") == COMPLETED
    judgement = health.judge(status, freshest, seen.now, config.progress_stall_seconds, done)
    if judgement.conditions:
        status["conditions"] = judgement.conditions
    result.events += [Event("Warning", reason, message) for reason, message in judgement.events]
    result.wake_at(judgement.wake_at)


def decide(seen: Observed, config: OperatorConfig) -> Plan | Farewell | Dispatch:
    """The plan of a job that runs here; the Workload alone of one MultiKueue runs on another cluster; the farewell
    of one that is gone."""
    if runs_here(seen.job):
        return plan(seen, config)
    if seen.job is not None and not seen.job["metadata"].get("deletionTimestamp") and kueue.dispatched(seen.job):
        return dispatch(seen, config)
    return farewell(seen)


def farewell(seen: Observed) -> Farewell:
    """A job that is gone, or being deleted: its Workloads are finished and let go (Kueue's FinalizeOrphanedWorkload),
    and its pods left by Kueue's pod integration released (kubetf.core.kueue)."""
    name = seen.key[1]
    writes = [
        w
        for workload in kueue.orphans(seen.workloads, None, name)
        for w in kueue.goodbye(workload, "OwnerNotFound", "The workload's owner no longer exists", seen.now)
    ]
    return Farewell(writes, [p for p in seen.pods if kueue.legacy_held(p, seen.lost_nodes)])


def dispatch(seen: Observed, config: OperatorConfig) -> Dispatch:
    """A job MultiKueue runs on a worker cluster (kubetf.core.kueue.dispatched): here it has its Workload and no
    pod, and its status is Kueue's copy of the worker's, never written here. Its Workload follows that copy: made
    while it has none, PodsReady, finished when the copy says the job ended. Evicted, its quota goes back at once:
    no pod of it runs here, and Kueue removes the worker's copy (and its pods) once this reservation is gone; a
    lost worker's copy would never say its pods stopped."""
    assert seen.job is not None
    job, admission, now = api.with_defaults(seen.job), seen.admission, seen.now
    result = Dispatch()
    name = api.name(job)
    result.writes += [
        w
        for workload in kueue.orphans(seen.workloads, job, name)
        for w in kueue.goodbye(workload, "OwnerNotFound", "The workload's owner no longer exists", now)
    ]
    if admission is None or not admission.installed:
        return result
    status = job.get("status") or {}
    workload = admission.workload
    if workload is None:
        if status.get("phase") not in st.FINISHED:
            result.create = _new_workload(job, admission, config)
        return result
    if status.get("phase") in st.FINISHED:
        message = (st.current_condition(status) or {}).get("message") or ""
        result.writes += kueue.goodbye(workload, "Succeeded" if status["phase"] == st.SUCCEEDED else "Failed", message,
                                       now)  # fmt: skip
        return result
    result.writes += _object_writes(job, admission, config, suspended=bool(api.run_policy(job).get("suspend")))
    result.writes += _status_writes(admission, now, ready=_all_ready(job, status), running=False)
    return result


def _decide(d: _Decision, seen: Observed) -> list[Pod]:
    """Decide the job's status and what to create; returns the old pods of a restart to delete (staged later)."""
    phase = d.status.get("phase")
    if phase in st.FINISHED:
        _finished(d, seen.pods)
        return []
    # The API server enforced the CRD's schema and CEL rules at create time; what is left is the operator's.
    problems = api.operator_problems(d.job)
    if problems:
        d.fail("InvalidSpec", "; ".join(str(p) for p in problems), seen.pods)
        return []
    d.gang, refused = _gang_scheduler(d, seen)
    if refused:
        d.fail("GangSchedulerUnavailable", refused, seen.pods)
        return []
    if api.run_policy(d.job).get("suspend"):
        _suspend(d, seen.pods)
        return []
    if phase == st.SUSPENDED:
        d.plan.events.append(Event("Normal", "Resumed", "Job resumed: creating its pods"))
    return _live(d, seen)


def _live(d: _Decision, seen: Observed) -> list[Pod]:
    job, status, result, pods = d.job, d.status, d.plan, seen.pods
    phase = None if status.get("phase") == st.SUSPENDED else status.get("phase")
    views, orphans = st.observe(job, pods)
    result.delete += [p for p in orphans if not st.is_deleting(p)]
    for view in views.values():
        if view.state == WAITING and view.pod is not None:
            view.state = CREATED  # created by an operator that stopped before it could record it
    expired = timers.deadline_exceeded(job, status, d.now)
    if expired:
        d.fail("DeadlineExceeded", expired, pods)
        return []
    ended = policy.ended(job, views)
    _store_tasks(status, views)
    if policy.succeeded(job, {(v.role, v.index) for v in views.values() if v.state == COMPLETED}):
        who = ", ".join(builders.pod_name(api.name(job), r, i) for r, i in policy.success_tasks(job))
        d.transition(st.SUCCEEDED, "Succeeded", f"{who} exited 0")
        _finish(d, pods)
        return []
    stopped = _stopped_by_kueue(d, views)
    if stopped:
        ended, everything = stopped, True  # the whole job stops: Kueue's eviction is the one cause
    else:
        everything = False
    if ended:
        if not _restart(d, views, ended, everything):
            _finish(d, pods)
            return []
        phase = st.RESTARTING
    elif phase == st.RESTARTING and (recount := node_loss.caused_restart(views, status, seen.lost_nodes)):
        d.transition(st.RESTARTING, "NodeLost", recount, "Warning")
        result.persist_first = True
    taken = _replace(d, views, seen, phase) if not kueue.waits_for_admission(result.admission) else []
    timers.account_job(status, result.admission, d.now)
    waiting = _gang_wait(d, seen, views)
    if waiting is not None and waiting.timed_out and gang.policy(job).get("onScheduleTimeout") == "Fail":
        result.delete += [p for v in views.values() for p in v.stale if not st.is_deleting(p)]
        d.fail("GangScheduleTimeout", waiting.message, pods)
        return []
    result.wake_at(timers.warnings_due(views, status, d.now, d.patience))
    placed_at = st.parse_time((status.get("gang") or {}).get("placedAt"))
    failure, due = timers.startup_timeout(
        job, views, status, result.admission, d.now, gang_waiting=waiting is not None, not_before=placed_at
    )
    result.wake_at(due)
    if failure is None and d.create:
        failure, due = refusals.create_timeout(job, status, d.now)
        result.wake_at(due)
    stale = [p for v in views.values() for p in v.stale if not st.is_deleting(p)]
    if failure is not None:
        result.delete += stale
        d.fail("StartupTimeout", failure, pods)
        return []
    result.names_taken = taken
    result.gang_waiting = (waiting.reason, waiting.message) if waiting is not None else None
    _derive_phase(d, views, phase)
    result.wake_at(timers.deadline(job, status))
    return stale


def _gang_scheduler(d: _Decision, seen: Observed) -> tuple[str | None, str | None]:
    """The job's gang scheduler, chosen once and kept in status.gang for the job's life (the cluster's APIs may come
    and go; a job never changes how its pods are placed); and why the one it asks for cannot be had."""
    chosen = (d.status.get("gang") or {}).get("scheduler")
    if chosen:
        return (None if chosen == "None" else chosen), None
    if d.status.get("startTime"):  # started before the operator placed gangs (an upgrade): as it started
        d.status["gang"] = {"scheduler": "None"}
        return None, None
    found, refused = gang.scheduler(d.job, seen.served)
    if refused is None:
        d.status["gang"] = {"scheduler": found or "None"}
    return found, refused


def _gang_due(d: _Decision, training: list[TaskView]) -> bool:
    """Whether the generation's gang objects are made now: with its pods; for Kubernetes' own gang also as soon as a
    group restart is decided, while the old pods go, so their replacements wait on nothing else once they are gone (a
    PodGroup without pods holds nothing there; Volcano's would hold its queue's quota beside the old pods')."""
    if d.create:
        return True
    return d.gang == gang.KUBERNETES and any(v.state == WAITING and v.pod is None for v in training)


@dataclasses.dataclass(frozen=True)
class _Waiting:
    reason: str  # GangWaiting, or GangScheduleTimeout past the schedule timeout
    message: str
    timed_out: bool


def _gang_wait(d: _Decision, seen: Observed, views: dict[str, TaskView]) -> _Waiting | None:
    """Keep status.gang current (its PodGroup, since when it waits, when it was placed) and say whether the gang
    waits to be placed, why (the scheduler's own words) and whether past its schedule timeout. Only time the job may
    run counts: not Kueue's queue, not a suspension."""
    job, status, now = d.job, d.status, d.now
    record = dict(status.get("gang") or {})
    if d.gang not in (gang.KUBERNETES, gang.VOLCANO):
        return None
    name = gang.group_name(job, gang.generation(job, status))
    if record.get("podGroup") != name:  # a new generation: a new gang to place
        record = {"scheduler": d.gang, "podGroup": name}
    d.plan.delete_objects = gang.stale_groups(job, seen.pod_groups, seen.pods, name)
    training = [v for v in views.values() if v.role in api.TRAINING_ROLES and v.state != COMPLETED]
    if not any(g.get("metadata", {}).get("name") == name for g in seen.pod_groups):
        d.gang_objects = gang.desired_objects(job, d.gang, status) if _gang_due(d, training) else []
    active = status.get("activeSince") is not None
    if gang.placed(job, views):
        record.pop("waitingSince", None)
        record.setdefault("placedAt", st.format_time(now))
        status["gang"] = record
        return None
    record.pop("placedAt", None)
    if not active or not any(v.pod is not None for v in training):
        record.pop("waitingSince", None)
        status["gang"] = record
        return None
    record.setdefault("waitingSince", st.format_time(now))
    status["gang"] = record
    since = st.parse_time(record["waitingSince"]) or now
    unbound = [v for v in training if not (v.pod is not None and (v.pod.get("spec") or {}).get("nodeName"))]
    words, said_why = gang.waiting_words([v.pod for v in unbound if v.pod is not None], seen.pod_groups, name)
    message = (
        f"waiting for {gang.min_available(job)} training pods to be placed together by {d.gang} (PodGroup {name}) "
        f"since {record['waitingSince']}: {len(unbound)} not placed yet"
    )
    if words:
        message += f"; the scheduler: {words}"
    timeout = gang.policy(job).get("scheduleTimeoutSeconds")
    if timeout and now >= since + timeout:
        if gang.policy(job).get("onScheduleTimeout") == "Fail":
            return _Waiting(
                "GangScheduleTimeout", f"not placed within scheduleTimeoutSeconds={timeout}: {message}", True
            )
        return _Waiting("GangScheduleTimeout", f"past scheduleTimeoutSeconds={timeout}, waiting on: {message}", True)
    if timeout:
        d.plan.wake_at(since + timeout)
    grace = since + d.config.scheduling_grace
    if not said_why and now < grace:  # a gang placed within seconds is the usual start: no reason to say more
        d.plan.wake_at(grace)
        return None
    return _Waiting("GangWaiting", message, False)


def _stopped_by_kueue(d: _Decision, views: dict[str, TaskView]) -> list[tuple[TaskView, Termination]]:
    """A queued job whose pods run while Kueue does not admit it (evicted: preempted, a PodsReady timeout,
    deactivated; its Workload deleted; or pods older than its Workload): every pod stops, as one disruption."""
    admission = d.plan.admission
    if admission is None or not kueue.waits_for_admission(admission):
        return []
    live = [v for v in views.values() if v.state != COMPLETED and v.pod is not None and not st.is_deleting(v.pod)]
    return [(live[0], Termination(Outcome.DISRUPTED, admission.eviction()))] if live else []


def _workload(d: _Decision, seen: Observed) -> None:
    """The job's part of Kueue's protocol (kubetf.core.kueue): its Workload made while it has none (once no pod of
    it runs); a prebuilt one adopted; its queue and PodSets following the job while it holds no quota; deactivated
    while the job is suspended; PodsReady; the quota given back after an eviction once no pod runs; finished when
    the job ends. And the Workloads of a previous job of its name, let go."""
    job, status, admission, now = d.job, d.status, d.plan.admission, d.now
    writes = d.plan.workload_writes
    writes += [
        w
        for workload in kueue.orphans(seen.workloads, job, api.name(job))
        for w in kueue.goodbye(workload, "OwnerNotFound", "The workload's owner no longer exists", now)
    ]
    if admission is None or not admission.installed:
        return
    workload, phase = admission.workload, status.get("phase")
    if workload is None:
        if admission.priority is not None and admission.priority.problem:
            d.plan.wake_at(now + d.config.local_queue_recheck)  # no watch shows the class: read it again then
        made = _new_workload(job, admission, d.config)
        if (
            made is not None
            and phase not in (*st.FINISHED, st.SUSPENDED)
            and kueue.inactive(seen.pods, seen.lost_nodes)
        ):
            d.plan.batches = [[made]]  # created as the job's pods are: a refusal is the job's to say (refusals)
        return
    if phase in st.FINISHED:
        message = (st.current_condition(status) or {}).get("message") or ""
        writes += kueue.goodbye(workload, "Succeeded" if phase == st.SUCCEEDED else "Failed", message, now)
        return
    inactive = kueue.inactive(seen.pods, seen.lost_nodes)
    if admission.deleting:  # deleted by someone: once the job's pods are gone, it goes (and a new one is made)
        writes += [kueue.WorkloadWrite(workload, "unfinalize")] if inactive and kueue.finalized(workload) else []
        return
    writes += _object_writes(job, admission, d.config, suspended=phase == st.SUSPENDED)
    writes += _status_writes(admission, now, ready=_all_ready(job, status), running=not inactive)


def _new_workload(job: Job, admission: kueue.Admission, config: OperatorConfig) -> dict[str, Any] | None:
    """The Workload to make for a job without one: none for MultiKueue's copy on a worker (Kueue made it: the job
    waits until it is seen), without a LocalQueue, or while its priority class cannot be read (its status says why)."""
    if kueue.prebuilt_name(job) or admission.cluster_queue is None:
        return None
    if admission.priority is None or admission.priority.problem:
        return None
    return kueue.desired_workload(job, _templates(job, config), admission.priority)


def _templates(job: Job, config: OperatorConfig) -> dict[str, Pod]:
    """A pod of each role as the operator creates it (its first task's): the Workload's PodSets' templates."""
    return {role: builders.desired_pod(job, role, 0, 0, config.progress_url) for role in api.replica_specs(job)}


def _object_writes(
    job: Job, admission: kueue.Admission, config: OperatorConfig, suspended: bool
) -> list[kueue.WorkloadWrite]:
    """Writes of the Workload's metadata and spec, as one merge patch: a prebuilt one adopted, its queue and PodSets
    following the job (not a prebuilt one's: Kueue made it), its activation following the job's suspension."""
    workload = admission.workload
    assert workload is not None
    parts = []
    if kueue.prebuilt_name(job):
        parts.append(kueue.adoption(workload, job))
    else:
        parts.append(kueue.spec_update(workload, job, _templates(job, config)))
    parts.append(kueue.activation(workload, not suspended))
    patch: dict[str, Any] = {}
    for part in parts:
        for key, value in (part or {}).items():
            patch[key] = {**patch.get(key, {}), **value}
    return [kueue.WorkloadWrite(workload, "object", patch)] if patch else []


def _status_writes(admission: kueue.Admission, now: float, ready: bool, running: bool) -> list[kueue.WorkloadWrite]:
    """PodsReady, and the quota given back once an evicted job has no pod running: one status patch."""
    workload = admission.workload
    assert workload is not None
    write = kueue.StatusWrite(workload, now)
    write.pods_ready(kueue.condition(workload, "Admitted") == "True", ready)
    if admission.evicted and admission.quota_reserved and not running:
        write.release()
    return [kueue.WorkloadWrite(workload, "status", write.patch)] if write.patch is not None else []


def _all_ready(job: Job, status: dict[str, Any]) -> bool:
    """Every task's pod ready, or its task finished (Kueue's PodsReady: `count` pods ready or succeeded), from the
    status alone (a MultiKueue manager has nothing else: Kueue's copy of the worker's)."""
    counts = (status.get("replicaStatuses") or {}).values()
    return sum(int(c.get("ready") or 0) + int(c.get("succeeded") or 0) for c in counts) >= len(api.tasks(job))


def _replace(d: _Decision, views: dict[str, TaskView], seen: Observed, phase: str | None) -> list[tuple[str, Pod]]:
    """Create the tasks that have no pod. A task's replacement is created only once its old pod is gone (the name
    is free) and no old pod of a task it restarts together with (policy.barrier) may still run; one that runs
    nothing and is only kept by Kueue's pod integration (kueue.legacy_held) runs no old program. A Kueue-admitted
    job's pods get what its admission assigned (kueue.pod_set_infos). Returns the tasks' pod names that another's
    pod holds (they wait)."""
    job, status, admission = d.job, d.status, d.plan.admission
    restart_after = st.parse_time(status.get("restartAfter"))
    terminating = {
        (v.role, v.index) for v in views.values() if any(not kueue.legacy_held(p, seen.lost_nodes) for p in v.stale)
    }
    infos = kueue.pod_set_infos(admission) if admission is not None and admission.admitted else {}
    taken: list[tuple[str, Pod]] = []
    for view in views.values():
        if view.state != WAITING or view.pod is not None or view.stale:
            continue
        holder = st.name_taken(api.name(job), view.role, view.index, seen.foreign)
        if holder is not None:
            taken.append((builders.pod_name(api.name(job), view.role, view.index), holder))
            continue
        if terminating and any(task in terminating for task in policy.barrier(job, view.role, view.index)):
            continue
        if restart_after is not None and d.now < restart_after:
            d.plan.wake_at(restart_after)
            continue
        where = gang.placement(job, d.gang, status, view.role)
        pod = builders.desired_pod(job, view.role, view.index, view.attempt, d.config.progress_url, where)
        kueue.apply(pod, infos.get(view.role))
        d.create.append(pod)
    if restart_after is not None and d.now >= restart_after:
        status.pop("restartAfter", None)
    if d.create and admission is not None and not admission.installed and phase in (None, st.PENDING):
        reason, message = admission.waiting(job)
        d.plan.events.append(Event("Warning", reason, message + "; its pods run without queueing"))
    return taken


def _deletions(result: Plan, seen: Observed, stale: list[Pod], config: OperatorConfig) -> None:
    """How the decided deletions go: forced on lost nodes (node_loss), a group restart's staged (sigterm); pods
    Kueue's pod integration still holds, released (kueue.legacy_held)."""
    job, lost = result.job, seen.lost_nodes
    deleting = [*result.delete, *stale]
    through_kubelet, result.force_delete, notices = node_loss.force_deletions(job, seen.pods, deleting, lost)
    result.events += notices
    stale = [p for p in through_kubelet if any(p is s for s in stale)]
    staging = sigterm.stage(job, stale, seen.pods, lost, seen.sigterm, seen.logs, seen.now, config)
    result.delete = [p for p in through_kubelet if not any(p is s for s in stale)] + staging.delete
    result.grace, result.held, result.hold_until = staging.grace, staging.held, staging.hold_until
    result.read_logs, result.sigterm = staging.read, staging.memory
    result.events += [Event("Normal", "SigtermIgnored", message) for message in staging.ignored]
    result.wake_at(node_loss.next_look(seen.pods, lost, seen.now, config.node_check_seconds))
    result.release = [p for p in seen.pods if kueue.legacy_held(p, lost)]


def _creations(
    result: Plan, pods: list[dict[str, Any]], config: OperatorConfig, gang_objects: list[dict[str, Any]]
) -> None:
    """The PVC and the gang's objects first, so the scheduler never sees a pod without its claim or its PodGroup;
    the Service with the pods' first batch; batches that double (the Job controller's slow start), at most
    `creates_per_reconcile` pods a turn, so a 1,000-worker job does not hold a worker while other jobs wait."""
    if not pods:
        result.batches = [gang_objects] if gang_objects else []  # a restart's next gang, before its pods (_gang_due)
        return
    now_, result.more_to_create = pods[: config.creates_per_reconcile], len(pods) > config.creates_per_reconcile
    claim, service = builders.desired_pvc(result.job), builders.desired_service(result.job)
    objects = [service, *now_] if service is not None else now_
    start, size = 0, config.first_batch + (service is not None)
    first = ([claim] if claim is not None else []) + gang_objects
    result.batches = [first] if first else []
    while start < len(objects):
        result.batches.append(objects[start : start + size])
        start, size = start + size, size * 2
    result.trial = refusals.trial(result.status, result.batches)


def first_report_may_wait(stored: dict[str, Any], final: Plan, created: list[dict[str, Any]],
                          refusal: Refusal | None) -> bool:  # fmt: skip
    """Whether the status of a plan that created pods could be left to the job's next reconcile: it is the job's
    first (never reported before), Pending, nothing refused, and it records no decision that reconcile could not make
    again. Pods the status does not record are taken for created (`_live`); a gang's scheduler, once chosen, is kept
    in the status for the job's life (`_gang_scheduler`): a job with one is never left (its pods carry none without
    one, and a choice made again differs only if the cluster's gang APIs came meanwhile, as after an operator that
    stopped between its creates and its status write)."""
    chosen = (final.status.get("gang") or {}).get("scheduler")
    return (
        not stored.get("phase")
        and final.status.get("phase") == st.PENDING
        and bool(created)
        and refusal is None
        and chosen in (None, "None")
    )


def after_creates(
    plan_: Plan, pods: list[Pod], created: list[dict[str, Any]], refusal: Refusal | None, now: float,
    config: OperatorConfig,
) -> Plan:  # fmt: skip
    """The plan once its creates were made: `created` pods exist beside `pods`, their tasks are Created and the
    phase follows; a refused create (the trial's or a real one) says why (kubetf.core.refusals). None refused:
    any wait for refused creates is over."""
    status = copy.deepcopy(plan_.status)
    if refusal is None:
        status = {k: v for k, v in status.items() if k not in refusals.WAITS}
    final = dataclasses.replace(plan_, status=status, events=list(plan_.events))
    if created:
        final.events.append(Event("Normal", "CreatedPods", f"Created {', '.join(_names(created))}"))
    tasks = status.setdefault("tasks", {})
    for pod in created:
        found = st.pod_task(pod)
        if found:
            tasks[st.task_key(found[0], found[1])] = {"attempt": found[2], "state": CREATED}
    if status.get("phase") not in (*st.FINISHED, st.SUSPENDED):
        views, _ = st.observe(dict(final.job, status=status), [*pods, *created])
        decision = _Decision(final.job, status, now, final, config, announce=False)
        timers.account_job(status, final.admission, now)
        _derive_phase(decision, views, status.get("phase"))
        # Their timers too: their ADDED events carry nothing the creates did not return, so they bring no reconcile.
        final.wake_at(timers.warnings_due(views, status, now, decision.patience))
        final.wake_at(timers.startup_timeout(final.job, views, status, final.admission, now)[1])
    if refusal is not None:
        refusals.record(final, st.current_condition(plan_.status) or {}, refusal, now)
    return final


def _restart(
    d: _Decision, views: dict[str, TaskView], ended: list[tuple[TaskView, Termination]], everything: bool = False
) -> bool:
    """Count one restart for everything that ended together and bump the attempts to replace (`everything`: every
    task not finished). False: job failed.

    When several tasks end at once (an MWMS peer dies and the others crash waiting for it), the disruption, if
    any, is the cause: it is counted, the crashes are not.
    """
    job, status, restarts = d.job, d.status, d.status["restarts"]
    ended.sort(key=lambda e: (e[1].outcome is not Outcome.DISRUPTED, e[1].outcome is not Outcome.PERMANENT))
    cause_view, cause = ended[0]
    decision = policy.decide(job, cause_view.role, cause, restarts.get("failures", 0), restarts.get("disruptions", 0))
    name = builders.pod_name(api.name(job), cause_view.role, cause_view.index)
    d.plan.persist_first = True
    if not decision.restart:
        reason, _, detail = decision.reason.partition(": ")
        d.transition(st.FAILED, reason, f"{name}: {detail}", "Warning")
        return False
    disrupted = cause.outcome is Outcome.DISRUPTED
    kind = "disruptions" if disrupted else "failures"
    restarts[kind] = restarts.get(kind, 0) + 1
    restarts["total"] = restarts.get("failures", 0) + restarts.get("disruptions", 0)
    restarts["lastReason"] = f"{name} {decision.reason}"
    restarts["lastKind"] = "Disruption" if disrupted else "Failure"
    restarts["lastTime"] = st.format_time(d.now)
    targets = _restart_targets(d, views, ended, everything)
    for role, index in targets:
        view = views[st.task_key(role, index)]  # a finished one too: the new group needs it (restart_targets)
        if view.pod is not None:
            view.stale.append(view.pod)
            view.pod = None
        view.attempt += 1
        view.state = WAITING
    _store_tasks(status, views)
    if not disrupted:
        status["restartAfter"] = st.format_time(d.now + policy.backoff_seconds(job, restarts["failures"]))
    restarted = ", ".join(builders.pod_name(api.name(job), r, i) for r, i in targets)
    reason = "Disrupted" if disrupted else "Failed"
    d.transition(st.RESTARTING, reason, f"{name} {decision.reason}; restarting {restarted}", "Warning")
    return True


def _restart_targets(
    d: _Decision, views: dict[str, TaskView], ended: list[tuple[TaskView, Termination]], everything: bool
) -> list[policy.Task]:
    """Every task restarted with one that ended (policy.restart_targets); with `everything`, every task not finished
    (Kueue stops the whole job at once), whose pods' deletions, seen in later reconciles, are not counted again."""
    rest = [v for v in views.values() if v.state != COMPLETED] if everything else []
    targets: list[policy.Task] = []
    for view in [v for v, _ in ended] + rest:
        targets += [t for t in policy.restart_targets(d.job, view.role, view.index) if t not in targets]
    return targets


def _suspend(d: _Decision, pods: list[Pod]) -> None:
    """Suspend deletes every pod and keeps the counters; tasks not finished start over on resume. The time it stays
    suspended does not count (kubetf.core.timers)."""
    job, status = d.job, d.status
    timers.account(status, Clock.STOPPED, d.now)
    if status.get("phase") != st.SUSPENDED:
        views, _ = st.observe(job, pods)
        for view in views.values():
            if view.state != COMPLETED:
                view.attempt += 1
                view.state = WAITING
        _store_tasks(status, views)
        d.plan.persist_first = True
    d.plan.delete += [p for p in pods if not st.is_deleting(p)]
    status.pop("restartAfter", None)
    _store_tasks(status, st.observe(dict(job, status=status), [])[0])  # no pod counts as active or ready
    d.transition(st.SUSPENDED, "Suspended", "Job suspended: pods deleted, counters kept")


def _finish(d: _Decision, pods: list[Pod]) -> None:
    d.status.setdefault("completionTime", st.format_time(d.now))
    timers.account(d.status, Clock.STOPPED, d.now)
    d.status.pop("restartAfter", None)
    d.plan.persist_first = True
    d.create = []
    _finished(d, pods)


def _finished(d: _Decision, pods: list[Pod]) -> None:
    """Stop what the cleanPodPolicy says, then wait for the TTL. A succeeded job's evaluator, a sidecar that may
    still be evaluating the last checkpoint, gets evaluatorGraceSeconds to finish on its own first."""
    clean = api.run_policy(d.job)["cleanPodPolicy"]
    grace = timers.evaluator_grace_due(d.job, d.status)
    for pod in pods:
        if st.is_deleting(pod) or clean == "None" or any(pod is p for p in d.plan.delete):
            continue
        if grace is not None and d.now < grace and _is_running_evaluator(pod):
            d.plan.wake_at(grace)
            continue
        if clean == "All" or not st.is_finished(pod):
            d.plan.delete.append(pod)
    # The counts of a finished job are those of the pods it keeps: none active once cleaned up.
    kept = [p for p in pods if not any(p is q for q in d.plan.delete) and not st.is_deleting(p)]
    _store_tasks(d.status, st.observe(dict(d.job, status=d.status), kept)[0])
    due = timers.ttl_due(d.job, d.status)
    d.plan.delete_job = due is not None and d.now >= due
    d.plan.wake_at(due if not d.plan.delete_job else None)


def _is_running_evaluator(pod: Pod) -> bool:
    task = st.pod_task(pod)
    return task is not None and task[0] == "evaluator" and not st.is_finished(pod)


def _store_tasks(status: dict[str, Any], views: dict[str, TaskView]) -> None:
    status["tasks"] = {key: {"attempt": v.attempt, "state": v.state} for key, v in views.items()}
    status["replicaStatuses"] = st.replica_statuses(views)
    status["ready"] = f"{_ready(views)}/{len(views)}"


def _ready(views: dict[str, TaskView]) -> int:
    return sum(1 for v in views.values() if v.pod is not None and st.is_ready(v.pod))


def _derive_phase(d: _Decision, views: dict[str, TaskView], previous: str | None) -> None:
    job, status, admission = d.job, d.status, d.plan.admission
    _store_tasks(status, views)
    running = st.all_running(views)
    if kueue.waits_for_admission(admission):
        reason, message = admission.waiting(job) if admission else ("Queued", "waiting for Kueue to admit the pods")
        d.transition(st.QUEUED, reason, message, "Normal" if reason == "Queued" else "Warning")
        return
    if running:
        d.transition(st.RUNNING, "AllPodsRunning", _running_message(views))
        return
    started = st.parse_time(status.get("activeSince"))
    reason, message = st.waiting_message(views, api.name(job), d.now, started, d.patience)
    if d.plan.names_taken:
        reason, message = "PodNameInUse", _name_taken_message(d.plan.names_taken)
    elif d.plan.gang_waiting is not None:
        reason, message = d.plan.gang_waiting
    event_type = "Normal" if reason in EXPECTED_WAITS else "Warning"
    if any(status.get(wait) for wait in refusals.WAITS):
        return  # a refused create's condition stays until the creates go through (`after_creates`)
    current = st.current_condition(status) or {}
    # While a restart's old pods terminate and its new ones start, keep the restart's own reason visible until a
    # wait needs explaining (an old pod stuck terminating, a new one unschedulable).
    if (
        previous == st.RESTARTING
        and reason in EXPECTED_WAITS
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
    finished = f", {done} finished" if done else ""
    return f"{total - done}/{total} pods running{not_ready}{finished}"


def _names(objects: list[dict[str, Any]]) -> list[str]:
    return [o["metadata"]["name"] for o in objects]
