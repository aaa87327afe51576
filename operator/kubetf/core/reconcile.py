"""The reconcile decision, pure: from what a reconcile observed, everything the shell does (kubetf.core.plan).

This module puts the policies in order; each lives in its own file: what ends a task and who restarts with it
(policy), timers, create refusals (refusals), lost nodes (node_loss), the schedulers a job has (scheduling: its gang,
its queue), an MWMS group's SIGTERM (sigterm), the training's health (progress), the job's state from its pods
(status), a suspension and the job's end (lifecycle). Restart counts and attempts are decided before any pod is
touched (`Plan.persist_first`): a restart is never lost nor counted twice.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from kubetf.core import (
    api,
    builders,
    failing,
    goodput,
    inplace,
    node_loss,
    policy,
    refusals,
    scheduling,
    sigterm,
    timers,
)
from kubetf.core import status as st
from kubetf.core.config import OperatorConfig
from kubetf.core.lifecycle import Decision, derive_phase, finish, finished, store_tasks, suspend
from kubetf.core.plan import Bookkeeping, Event, Observed, Plan
from kubetf.core.policy import Outcome, Termination
from kubetf.core.progress import health, identity
from kubetf.core.refusals import Refusal
from kubetf.core.status import COMPLETED, CREATED, WAITING, Pod, TaskView


def decide(seen: Observed, config: OperatorConfig) -> Plan | Bookkeeping:
    """The plan of a job that runs here; the bookkeeping of one that runs elsewhere, or is gone."""
    if scheduling.runs_here(seen.job):
        return plan(seen, config)
    if seen.job is not None and not seen.job["metadata"].get("deletionTimestamp"):
        return elsewhere(seen, config)
    return farewell(seen)


def farewell(seen: Observed) -> Bookkeeping:
    """A job that is gone, or being deleted: what its schedulers still hold of it let go (its Workloads finished,
    pods an older integration still holds released)."""
    remains = scheduling.Remains(seen.owned, seen.pods, None, seen.key[1], seen.now, lost_nodes=seen.lost_nodes)
    return Bookkeeping(writes=scheduling.farewell(remains), release=scheduling.released(seen.pods, seen.lost_nodes))


def elsewhere(seen: Observed, config: OperatorConfig) -> Bookkeeping:
    """A job whose pods run on another cluster (MultiKueue): what its schedulers make and write here. Its status is
    the other cluster's, never written here, but to say why it can never be dispatched (before anything was)."""
    assert seen.job is not None
    job = api.with_defaults(seen.job)
    stored = job.get("status") or {}
    status = copy.deepcopy(stored)
    integrations = scheduling.of(job, stored)
    situation = scheduling.Situation(job, status, [], {}, seen.owned, seen.now, config, seen.admission)
    ended = status.get("phase") in st.FINISHED
    remains = scheduling.Remains(seen.owned, seen.pods, job, api.name(job), seen.now, ended, seen.lost_nodes)
    if ended:
        writes = [w for i in integrations for w in i.finish(situation)]
        return Bookkeeping(writes=writes + scheduling.farewell(remains))
    placing = scheduling.placing(integrations, situation)
    book = Bookkeeping(create=placing.create, writes=scheduling.farewell(remains) + placing.writes)
    gate = scheduling.gate(integrations, situation)
    if gate is not None and gate.warning:
        before = st.current_condition(status) or {}
        st.set_phase(status, st.PENDING, gate.reason, gate.message, seen.now, job["metadata"].get("generation"))
        if (before.get("reason"), before.get("message")) != (gate.reason, gate.message):
            book.events.append(Event("Warning", gate.reason, gate.message))
        book.status = status
    return book


def plan(seen: Observed, config: OperatorConfig) -> Plan:
    """Everything to do for a job that exists (`seen.job`), in the order the shell does it (kubetf.core.plan)."""
    assert seen.job is not None and scheduling.runs_here(seen.job), "a job that does not run here has no plan"
    status: dict[str, Any] = copy.deepcopy(seen.job.get("status") or {})
    result = Plan(job=api.with_defaults(seen.job), status=status, admission=seen.admission)
    # The events a decision stored with its status and an operator that stopped did not post (kubetf.runtime
    # .executor): posted first now, under their own names (one posted already is not posted again).
    result.events += [Event(e["type"], e["reason"], e["message"], str(e.get("basis") or ""))
                      for e in status.pop("pendingEvents", None) or []
                      if isinstance(e, dict) and {"type", "reason", "message"} <= set(e)]  # fmt: skip
    status.setdefault("restarts", {"failures": 0, "disruptions": 0, "total": 0})
    generation = seen.job["metadata"].get("generation")
    if generation is not None:
        status["observedGeneration"] = generation
    decision = Decision(result.job, status, seen.now, result, config, owned=seen.owned, pods=seen.pods,
                        lost_nodes=dict(seen.lost_nodes))  # fmt: skip
    stale, objects = _decide(decision, seen)
    ended = status.get("phase") in st.FINISHED
    remains = scheduling.Remains(seen.owned, seen.pods, result.job, api.name(result.job), seen.now, ended,
                                 seen.lost_nodes)  # fmt: skip
    result.writes = scheduling.farewell(remains) + result.writes
    _training(result, seen, config)
    if seen.failing is None:  # its failures' condition, cleared (it is set where they happen: runtime.controller)
        failing.mark(status, None, config.reconcile_error_after, seen.now)
    _deletions(result, seen, stale, config)
    _creations(result, decision.create, config, objects)
    _goodput(result, seen.job.get("status") or {}, seen.now)  # with a decision stored first
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


def _decide(d: Decision, seen: Observed) -> tuple[list[Pod], list[dict[str, Any]]]:
    """Decide the job's status and what to create; returns the old pods of a restart to delete (staged later) and
    the objects its schedulers need before its pods."""
    phase = d.status.get("phase")
    d.integrations = scheduling.of(d.job, d.status)
    if phase in st.FINISHED:
        finished(d, seen.pods)
        return [], []
    # The API server enforced the CRD's schema and CEL rules at create time; what is left is the operator's.
    problems = api.operator_problems(d.job)
    if problems:
        d.fail("InvalidSpec", "; ".join(str(p) for p in problems), seen.pods)
        return [], []
    refused = _choose(d, seen)
    if refused:
        d.fail("GangSchedulerUnavailable", refused, seen.pods)
        return [], []
    if api.run_policy(d.job).get("suspend"):
        suspend(d, seen.pods)
        placing = scheduling.placing(d.integrations, d.situation(st.observe(d.job, seen.pods)[0]))
        d.plan.writes += placing.writes  # a suspended job's scheduler objects follow (a Workload deactivated)
        return [], []
    if phase == st.SUSPENDED:
        d.plan.events.append(Event("Normal", "Resumed", "Job resumed: creating its pods"))
    return _live(d, seen)


def _choose(d: Decision, seen: Observed) -> str | None:
    """The scheduler that places the job's gang, chosen once and kept in status.gang for the job's life (the
    cluster's APIs may come and go; a job never changes how its pods are placed); why the one it asks for cannot be
    had."""
    if (d.status.get("gang") or {}).get("scheduler"):
        return None
    if d.status.get("startTime"):  # started before the operator placed gangs (an upgrade): as it started
        d.status["gang"] = {"scheduler": scheduling.NONE}
        return None
    found, refused = scheduling.choose(d.job, seen.served)
    if refused is None:
        d.status["gang"] = {"scheduler": found}
        d.integrations = scheduling.of(d.job, d.status)
    return refused


def _live(d: Decision, seen: Observed) -> tuple[list[Pod], list[dict[str, Any]]]:
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
        return [], []
    _settle_in_place(d, views)
    ended = policy.ended(job, views)
    store_tasks(status, views)
    if policy.succeeded(job, {(v.role, v.index) for v in views.values() if v.state == COMPLETED}):
        who = ", ".join(builders.pod_name(api.name(job), r, i) for r, i in policy.success_tasks(job))
        d.transition(st.SUCCEEDED, "Succeeded", f"{who} exited 0")
        finish(d, pods)
        return [], []
    result.gate = gate = scheduling.gate(d.integrations, d.situation(views))
    live = [v for v in views.values() if v.state != COMPLETED and v.pod is not None and not st.is_deleting(v.pod)]
    stop = gate.stop if gate is not None else None
    everything = bool(stop and live)
    if stop and live:  # the whole job stops: the scheduler's word (Kueue's eviction) is the one cause
        ended = [(live[0], Termination(Outcome.DISRUPTED, stop))]
    restarted: set[tuple[str, int]] = set()
    if ended:
        targets = _restart(d, views, ended, everything)
        if targets is None:
            finish(d, pods)
            return [], []
        restarted = set(targets)
        phase = st.RESTARTING
    elif phase == st.RESTARTING and (recount := node_loss.caused_restart(views, status, seen.lost_nodes)):
        d.transition(st.RESTARTING, "NodeLost", recount, "Warning")
        result.persist_first = True
    d.regroup(views, restarted)
    taken = _replace(d, views, seen) if gate is None else []
    admission = result.admission
    timers.account_job(status, gate is not None and gate.queued, admission.position if admission else None,
                       st.parse_time(admission.admitted_at) if admission else None, d.now)  # fmt: skip
    placing = scheduling.placing(d.integrations, d.situation(views))
    result.writes += placing.writes
    result.events += placing.events
    result.wake_at(placing.wake_at)
    stale = [p for v in views.values() for p in v.stale if not st.is_deleting(p)]
    if placing.waiting is not None and placing.waiting.fail:
        result.delete += stale
        d.fail(placing.waiting.reason, placing.waiting.message, pods)
        return [], []
    result.wake_at(timers.warnings_due(views, status, d.now, d.patience))
    failure, due = timers.startup_timeout(job, views, status, gate is not None, d.now, placing.holding,
                                          placing.placed_at)  # fmt: skip
    result.wake_at(due)
    if failure is None and d.create:
        failure, due = refusals.create_timeout(job, status, d.now)
        result.wake_at(due)
    if failure is not None:
        result.delete += stale
        d.fail("StartupTimeout", failure, pods)
        return [], []
    result.names_taken = taken
    if placing.waiting is not None:
        result.waiting = (placing.waiting.reason, placing.waiting.message, placing.waiting.timed_out)
    derive_phase(d, views, phase)
    result.wake_at(timers.deadline(job, status))
    return stale, placing.create


def _settle_in_place(d: Decision, views: dict[str, TaskView]) -> None:
    """The members of a group restarting in place (kubetf.core.inplace): their exits within its window are that one
    restart's, never counted again; when it closes, a member that never left its old program is recreated."""
    for view in views.values():
        if view.in_place_by is None:
            continue
        pod = view.pod
        alive = pod is not None and not st.is_deleting(pod) and not st.is_finished(pod)
        exits = inplace.exits(pod)[0] if pod is not None and alive else view.exits
        view.exits = max(view.exits, exits)
        if d.now < view.in_place_by and alive:
            d.plan.wake_at(view.in_place_by)
            continue
        stayed = alive and view.exits <= (view.exits_at or 0)
        view.in_place_by = view.exits_at = None
        if stayed and pod is not None:  # its program never exited: replaced as before
            view.replace()
            d.plan.persist_first = True


def _replace(d: Decision, views: dict[str, TaskView], seen: Observed) -> list[tuple[str, Pod]]:
    """Create the tasks that have no pod, each joined to what its schedulers say. A task's replacement is created
    only once its old pod is gone (the name is free) and no old pod of a task it restarts together with
    (policy.barrier) may still run; one that runs nothing and is only held by a scheduler's finalizer
    (scheduling.released) runs no old program. Returns the tasks' pod names that another's pod holds (they wait)."""
    job, status = d.job, d.status
    restart_after = st.parse_time(status.get("restartAfter"))
    released = scheduling.released(seen.pods, seen.lost_nodes)
    terminating = {(v.role, v.index) for v in views.values() if any(not any(p is r for r in released) for p in v.stale)}
    taken: list[tuple[str, Pod]] = []
    situation = d.situation(views)
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
        pod = builders.desired_pod(job, view.role, view.index, view.attempt, d.config.progress_url)
        if inplace.enabled(job, status):
            inplace.apply(pod, job, view.role)
        for integration in d.integrations:
            integration.join(situation, pod, view.role)
        d.create.append(pod)
    if restart_after is not None and d.now >= restart_after:
        status.pop("restartAfter", None)
    return taken


def _deletions(result: Plan, seen: Observed, stale: list[Pod], config: OperatorConfig) -> None:
    """How the decided deletions go: forced on lost nodes (node_loss), a group restart's staged (sigterm); pods a
    scheduler's finalizer still holds, released (scheduling.released)."""
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
    result.release = scheduling.released(seen.pods, lost)


def _creations(result: Plan, pods: list[dict[str, Any]], config: OperatorConfig, objects: list[dict[str, Any]]) -> None:
    """The PVC and what the schedulers need first (a PodGroup, a Workload), so the scheduler never sees a pod without
    its claim or its group; the Service with the pods' first batch; batches that double (the Job controller's slow
    start), at most `creates_per_reconcile` pods a turn, so a 1,000-worker job does not hold a worker while other jobs
    wait."""
    if not pods:
        result.batches = [objects] if objects else []  # made before their pods are (a restart's next gang, a Workload)
        return
    now_, result.more_to_create = pods[: config.creates_per_reconcile], len(pods) > config.creates_per_reconcile
    claim, service = builders.desired_pvc(result.job), builders.desired_service(result.job)
    batch = [service, *now_] if service is not None else now_
    start, size = 0, config.first_batch + (service is not None)
    first = ([claim] if claim is not None else []) + objects
    result.batches = [first] if first else []
    while start < len(batch):
        result.batches.append(batch[start : start + size])
        start, size = start + size, size * 2
    result.trial = refusals.trial(result.status, result.batches)


def first_report_may_wait(stored: dict[str, Any], final: Plan, created: list[dict[str, Any]],
                          refusal: Refusal | None) -> bool:  # fmt: skip
    """Whether the status of a plan that created pods could be left to the job's next reconcile: it is the job's
    first (never reported before), Pending, nothing refused, and it records no decision that reconcile could not make
    again. Pods the status does not record are taken for created (`_live`); a gang's scheduler, once chosen, is kept
    in the status for the job's life (`_choose`): a job with one is never left (its pods carry none without one, and a
    choice made again differs only if the cluster's gang APIs came meanwhile, as after an operator that stopped
    between its creates and its status write)."""
    chosen = (final.status.get("gang") or {}).get("scheduler")
    in_place = (final.status.get("restarts") or {}).get("inPlace")
    return (
        not stored.get("phase")
        and final.status.get("phase") == st.PENDING
        and bool(created)
        and refusal is None
        and chosen in (None, scheduling.NONE)
        and in_place == inplace.mode(final.job, {})  # what the API server said of restart rules is kept
    )


def after_creates(
    plan_: Plan, pods: list[Pod], created: list[dict[str, Any]], refusal: Refusal | None, now: float,
    config: OperatorConfig, stored: dict[str, Any] | None = None,
) -> Plan:  # fmt: skip
    """The plan once its creates were made: `created` pods exist beside `pods`, their tasks are Created and the
    phase follows; a refused create (the trial's or a real one) says why (kubetf.core.refusals). None refused:
    any wait for refused creates is over. Its goodput follows the final status (kubetf.core.goodput), counted up to
    now when the status differs from `stored` anyway (a status write is due: it costs nothing more)."""
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
    if created:  # which way its failures restart, now that the API server said whether it keeps restart rules
        restarts = status.setdefault("restarts", {})
        restarts["inPlace"] = inplace.mode(final.job, status)
        if inplace.dropped(created):
            restarts["inPlace"] = inplace.UNSUPPORTED
    if status.get("phase") not in (*st.FINISHED, st.SUSPENDED):
        views, _ = st.observe(dict(final.job, status=status), [*pods, *created])
        decision = Decision(final.job, status, now, final, config, announce=False)
        admission, gate = final.admission, final.gate
        timers.account_job(status, gate is not None and gate.queued, admission.position if admission else None,
                           st.parse_time(admission.admitted_at) if admission else None, now)  # fmt: skip
        derive_phase(decision, views, status.get("phase"))
        # Their timers too: their ADDED events carry nothing the creates did not return, so they bring no reconcile.
        final.wake_at(timers.warnings_due(views, status, now, decision.patience))
        final.wake_at(timers.startup_timeout(final.job, views, status, gate is not None, now)[1])
    if refusal is not None:
        refusals.record(final, st.current_condition(plan_.status) or {}, refusal, now)
    _goodput(final, stored or {}, now)
    return final


def _goodput(plan_: Plan, stored: dict[str, Any], now: float) -> None:
    """The job's goodput follows its status and the freshest progress the operator holds (kubetf.core.goodput),
    counted up to now when the status is written anyway (it differs from `stored`): a job that trains quietly costs
    no write for it."""
    status = plan_.status
    changed = {k: v for k, v in status.items() if k != "goodput"} != {k: v for k, v in stored.items() if k != "goodput"}
    progress = plan_.progress.progress if plan_.progress is not None else status.get("progress")
    created = st.parse_time(plan_.job["metadata"].get("creationTimestamp"))
    goodput.account(status, created, now, refresh=changed, progress=progress)


def _restart(
    d: Decision, views: dict[str, TaskView], ended: list[tuple[TaskView, Termination]], everything: bool = False
) -> list[policy.Task] | None:
    """Count one restart for everything that ended together and bump the attempts to replace (`everything`: every
    task not finished, as a scheduler stops the whole job at once, which never fails it). Returns the tasks
    restarted; None: the job failed.

    When several tasks end at once (an MWMS peer dies and the others crash waiting for it), the disruption, if
    any, is the cause: it is counted, the crashes are not.
    """
    job, status, restarts = d.job, d.status, d.status["restarts"]
    ended.sort(key=lambda e: (e[1].outcome is not Outcome.DISRUPTED, e[1].outcome is not Outcome.PERMANENT))
    cause_view, cause = ended[0]
    decision = policy.decide(job, cause_view.role, cause, restarts.get("failures", 0), restarts.get("disruptions", 0),
                             capped=not everything)  # fmt: skip
    name = builders.pod_name(api.name(job), cause_view.role, cause_view.index)
    d.plan.persist_first = True
    if not decision.restart:
        reason, _, detail = decision.reason.partition(": ")
        d.transition(st.FAILED, reason, f"{name}: {detail}", "Warning")
        return None
    disrupted = cause.outcome is Outcome.DISRUPTED
    if not cause.in_place and inplace.ignored(cause_view.pod, job, cause_view.role, cause.exit_code):
        restarts["inPlace"] = inplace.UNSUPPORTED  # its kubelet ignored the rules: recreated, as every next one
    kind = "disruptions" if disrupted else "failures"
    restarts[kind] = restarts.get(kind, 0) + 1
    restarts["total"] = restarts.get("failures", 0) + restarts.get("disruptions", 0)
    restarts["lastReason"] = f"{name} {decision.reason}"
    restarts["lastKind"] = "Disruption" if disrupted else "Failure"
    restarts["lastTime"] = st.format_time(d.now)
    targets = _restart_targets(d, views, ended, everything)
    # The cause restarted in its own pod (kubetf.core.inplace): so does the rest of its group, each exiting by itself
    # within the window (a member that does not is recreated when it closes).
    in_place = cause.in_place and inplace.enabled(job, status)
    window = d.now + d.config.in_place_grace if in_place and len(targets) > 1 else None
    for role, index in targets:
        view = views[st.task_key(role, index)]  # a finished one too: the new group needs it (restart_targets)
        exits = inplace.exits(view.pod)[0] if view.pod is not None else 0
        if in_place and view.pod is not None and not st.is_deleting(view.pod) and not st.is_finished(view.pod):
            view.exits_at = view.exits if window is not None else None
            view.exits, view.in_place_by = max(view.exits, exits), window
            continue
        view.replace()
    store_tasks(status, views)
    if not disrupted and not in_place:  # in place, the kubelet's crash-loop back-off times the restart
        status["restartAfter"] = st.format_time(d.now + policy.backoff_seconds(job, restarts["failures"]))
    restarted = ", ".join(builders.pod_name(api.name(job), r, i) for r, i in targets)
    reason = "Disrupted" if disrupted else "Failed"
    how = " in place" if in_place else ""
    d.transition(st.RESTARTING, reason, f"{name} {decision.reason}; restarting {restarted}{how}", "Warning")
    return targets


def _restart_targets(
    d: Decision, views: dict[str, TaskView], ended: list[tuple[TaskView, Termination]], everything: bool
) -> list[policy.Task]:
    """Every task restarted with one that ended (policy.restart_targets); with `everything`, every task not finished,
    whose pods' deletions, seen in later reconciles, are not counted again."""
    rest = [v for v in views.values() if v.state != COMPLETED] if everything else []
    targets: list[policy.Task] = []
    for view in [v for v, _ in ended] + rest:
        targets += [t for t in policy.restart_targets(d.job, view.role, view.index) if t not in targets]
    return targets


def _names(objects: list[dict[str, Any]]) -> list[str]:
    return [o["metadata"]["name"] for o in objects]
