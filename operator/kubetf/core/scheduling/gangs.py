"""What the two gang schedulers (Kubernetes' own, `native`; Volcano, `volcano`) share, pure: all of a job's training
tasks (chief, workers, ps) placed together or none of them. The evaluator is never part of the gang: it does not hold
the others back.

The job asks for it in `spec.runPolicy.schedulingPolicy` (docs/gang-scheduling.md): `gangScheduler`, how many
training tasks must be placed together (`minAvailable`, default all of them), how long a gang may wait once its pods
could start (`scheduleTimeoutSeconds`) and what then (`onScheduleTimeout`: Fail, or Wait on and say so).

A gang is a PodGroup of the job, one per *generation*, kept in `status.gang` (`generation`, `podGroup`). A restart
after which no training pod of the job still runs (MultiWorkerMirrored's group, a suspension, Kueue's eviction) starts
a new generation: a new PodGroup, gang-scheduled from scratch (Kubernetes' PodGroup never unlearns that it was
scheduled, and a restart's old pods must not count toward its quorum). Any other restart (a ParameterServer worker, a
ps and its chief) keeps the generation: the replacements join the PodGroup their running peers are in, whose running
members count toward its quorum in both schedulers, so they are placed beside them. A PodGroup's name carries the
job's uid: a job deleted and created again under its name never meets the old job's groups, which may outlive it for
a while (their pods terminating). A group of an older generation is deleted once none of the job's pods uses it.
"""

from __future__ import annotations

from typing import Any

from kubetf.core import api
from kubetf.core import status as st
from kubetf.core.scheduling.seam import Placing, Situation, Waiting
from kubetf.core.types import Job, Obj, Pod, Write, owned_by, uid_of

DEFAULT_SCHEDULER = "default-scheduler"
# A transient failure of the scheduler itself (a plugin erring on one cycle): no reason to say the gang waits.
SCHEDULER_ERROR = "SchedulerError"
VOLCANO_FITS = "Schedulable"  # Volcano's reason on a pod that would fit, "once minAvailable is satisfied"
GROUP_ECHO = "pod group is"  # how both schedulers begin a pod's message that repeats its PodGroup's state


def policy(job: Job) -> dict[str, Any]:
    return dict(api.run_policy(job).get("schedulingPolicy") or {})


def training_tasks(job: Job) -> list[tuple[str, int]]:
    return [(role, index) for role, index in api.tasks(job) if role in api.TRAINING_ROLES]


def min_available(job: Job) -> int:
    return int(policy(job).get("minAvailable") or len(training_tasks(job)))


def scheduler_names(job: Job) -> set[str]:
    """The schedulers the training pods' templates name (default-scheduler when they name none)."""
    return {
        (spec["template"].get("spec") or {}).get("schedulerName") or DEFAULT_SCHEDULER
        for role, spec in api.replica_specs(job).items()
        if role in api.TRAINING_ROLES
    }


def priority_classes(job: Job) -> set[str]:
    """The PriorityClasses the training pods get: the job's `spec.priorityClassName` (which every pod gets), else each
    training template's own ("" for none)."""
    if job["spec"].get("priorityClassName"):
        return {job["spec"]["priorityClassName"]}
    return {
        (spec["template"].get("spec") or {}).get("priorityClassName") or ""
        for role, spec in api.replica_specs(job).items()
        if role in api.TRAINING_ROLES
    }


def group_priority(job: Job) -> str | None:
    """The gang's PriorityClass: the one its training pods share (None: none, or they differ)."""
    classes = priority_classes(job)
    return next(iter(classes)) or None if len(classes) == 1 else None


def suffix(job: Job) -> str:
    """What tells this job's gang objects from those of an earlier job of its name."""
    uid = uid_of(job)
    return f"-{uid[:8]}" if uid else ""


def group_name(job: Job, generation: int) -> str:
    return f"{api.name(job)}-gang-{generation}{suffix(job)}"


def meta(job: Job, name: str) -> dict[str, Any]:
    """An object of the job's: its labels (the operator's watch selects them) and its controller reference."""
    found: dict[str, Any] = {
        "name": name,
        "namespace": api.namespace(job),
        "labels": {api.LABEL_MANAGED_BY: api.MANAGER, api.LABEL_JOB: api.name(job)},
    }
    if uid_of(job):
        owner = {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": api.name(job), "uid": uid_of(job)}
        found["ownerReferences"] = [{**owner, "controller": True, "blockOwnerDeletion": True}]
    return found


# ---------------------------------------------------------------------- generations


def record(status: dict[str, Any], scheduler: str, job: Job) -> dict[str, Any]:
    """status.gang, with the current generation's PodGroup (jobs from before generations were recorded: the lowest
    attempt among the training tasks, as their PodGroups were named then)."""
    found = dict(status.get("gang") or {})
    found["scheduler"] = scheduler
    if "generation" not in found:
        tasks = status.get("tasks") or {}
        attempts = [int((tasks.get(st.task_key(r, i)) or {}).get("attempt", 0)) for r, i in training_tasks(job)]
        found["generation"] = min(attempts, default=0)
    found.setdefault("podGroup", group_name(job, int(found["generation"])))
    return found


def regroup(job: Job, status: dict[str, Any], views: dict[str, st.TaskView], restarted: set[tuple[str, int]]) -> None:
    """A restart was decided for `restarted`: when no training task of the job keeps a pod that runs, the next pods
    are a new gang (a new generation, a new PodGroup); else the replacements join their running peers' group."""
    if not (status.get("gang") or {}).get("scheduler"):
        return
    gang = status["gang"] = record(status, status["gang"]["scheduler"], job)
    survivors = [
        v
        for v in views.values()
        if v.role in api.TRAINING_ROLES and v.state != st.COMPLETED and (v.role, v.index) not in restarted
    ]
    if survivors:
        return
    generation = int(gang["generation"]) + 1
    status["gang"] = {"scheduler": gang["scheduler"], "generation": generation, "podGroup": group_name(job, generation)}


# ---------------------------------------------------------------------- whether the gang is placed


def placed(job: Job, views: dict[str, st.TaskView]) -> bool:
    """At least minAvailable training tasks are on a node (bound) or done."""
    done = 0
    for view in views.values():
        if view.role not in api.TRAINING_ROLES:
            continue
        if view.state == st.COMPLETED or (view.pod is not None and (view.pod.get("spec") or {}).get("nodeName")):
            done += 1
    return done >= min_available(job)


def pod_group_of(pod: Pod) -> str | None:
    """The PodGroup a pod is in, in either scheduler."""
    spec, meta_ = pod.get("spec") or {}, pod.get("metadata") or {}
    native = (spec.get("schedulingGroup") or {}).get("podGroupName")
    return native or (meta_.get("annotations") or {}).get("scheduling.k8s.io/group-name")


def _conditions(group: Obj | None) -> list[dict[str, Any]]:
    return [
        c for c in ((group or {}).get("status") or {}).get("conditions") or [] if c.get("reason") != SCHEDULER_ERROR
    ]


def group_words(group: Obj | None) -> str | None:
    """What the scheduler wrote on the PodGroup while it cannot place it (Kubernetes: PodGroupInitiallyScheduled
    False; Volcano: Unschedulable True, unless a Scheduled True came since: Volcano never turns Unschedulable back to
    False), else None. A transient error of the scheduler (SchedulerError) is no reason."""
    conditions = _conditions(group)
    scheduled = max((c.get("lastTransitionTime") or "" for c in conditions if c.get("type") == "Scheduled"
                     and c.get("status") == "True"), default=None)  # fmt: skip
    for condition in conditions:
        kind, state = condition.get("type"), condition.get("status")
        native = kind == "PodGroupInitiallyScheduled" and state == "False"
        volcano = kind == "Unschedulable" and state == "True"
        if volcano and scheduled is not None and scheduled >= (condition.get("lastTransitionTime") or ""):
            continue
        if native or volcano:
            reason, message = condition.get("reason") or "Unschedulable", condition.get("message") or ""
            return f"{reason}: {message}".rstrip(": ")
    return None


def waiting_words(pods: list[Pod], group: Obj | None) -> tuple[str | None, bool]:
    """Why the gang is not placed, in the scheduler's words: a pod's own first (the first unplaced pod it found no room
    for: `0/5 nodes are available: 1 Insufficient nvidia.com/gpu, ...`), then the PodGroup's. Not a pod's words that
    only say it would fit (Volcano's `Schedulable: ... once minAvailable is satisfied`), not a transient error of the
    scheduler's, and a pod's echo of its group's state (`pod group is unschedulable, ...`) only when nothing better
    is said; words the others already contain are not repeated.

    And whether the scheduler has said why it cannot place the gang (the job need not wait out the scheduling grace to
    say so): a pod found no room, or Kubernetes' PodGroup says it tried (`PodGroupInitiallyScheduled` False). Not
    Volcano's PodGroup alone: it also says `Unschedulable` (`pod group is not ready, 4 Pending, 4 minAvailable`) in its
    first sessions of a gang it places a moment later (seen on the 1.37 cluster under load)."""
    said = [
        why
        for pod in pods
        if (why := st.pending_reason(pod)) and not why.startswith((f"{VOLCANO_FITS}:", f"{SCHEDULER_ERROR}:"))
    ]
    own = [why for why in said if not _message(why).startswith(GROUP_ECHO)]
    pod_words = next(iter(own or said), None)
    words = group_words(group)
    if pod_words and words:
        if _message(pod_words) in words:
            pod_words = None
        elif _message(words) in pod_words:
            words = None
    tried = any(
        c.get("type") == "PodGroupInitiallyScheduled" and c.get("status") == "False" for c in _conditions(group)
    )
    return "; ".join(w for w in (pod_words, words) if w) or None, bool(own) or tried


def _message(words: str) -> str:
    """The message of "Reason: message"."""
    return words.split(": ", 1)[-1]


def wait(
    job: Job, views: dict[str, st.TaskView], gang: dict[str, Any], group: Obj | None, scheduler: str, now: float,
    grace: float,
) -> tuple[Waiting | None, float | None]:  # fmt: skip
    """Whether the gang waits in a way worth saying (and why, or past its schedule timeout), and when to look again.
    `gang` is status.gang, kept current here (`waitingSince` while the pods could start and the gang is not placed,
    `placedAt` once it is). Only time the job may run counts: never Kueue's queue nor a suspension (no pods then)."""
    training = [v for v in views.values() if v.role in api.TRAINING_ROLES and v.state != st.COMPLETED]
    if placed(job, views):
        gang.pop("waitingSince", None)
        gang.setdefault("placedAt", st.format_time(now))
        return None, None
    gang.pop("placedAt", None)
    if not any(v.pod is not None for v in training):
        gang.pop("waitingSince", None)
        return None, None
    gang.setdefault("waitingSince", st.format_time(now))
    since = st.parse_time(gang["waitingSince"]) or now
    unbound = [v for v in training if not (v.pod is not None and (v.pod.get("spec") or {}).get("nodeName"))]
    words, said_why = waiting_words([v.pod for v in unbound if v.pod is not None], group)
    message = (
        f"waiting for {min_available(job)} training pods to be placed together by {scheduler} (PodGroup "
        f"{gang['podGroup']}) since {gang['waitingSince']}: {len(unbound)} not placed yet"
    )
    if words:
        message += f"; the scheduler: {words}"
    timeout = policy(job).get("scheduleTimeoutSeconds")
    if timeout and now >= since + timeout:
        if policy(job).get("onScheduleTimeout") == "Fail":
            return Waiting("GangScheduleTimeout", f"not placed within scheduleTimeoutSeconds={timeout}: {message}",
                           True, True), None  # fmt: skip
        return Waiting(
            "GangScheduleTimeout", f"past scheduleTimeoutSeconds={timeout}, waiting on: {message}", True
        ), None
    wake = since + timeout if timeout else None
    if not said_why and now < since + grace:  # a gang placed within seconds is the usual start: nothing more to say
        return None, min(since + grace, wake) if wake else since + grace
    return Waiting("GangWaiting", message), wake


def stale(job: Job, owned: list[Obj], pods: list[Pod], keep: set[str], why: str) -> list[Write]:
    """The job's PodGroups (by its uid) that none of its pods uses any more and that are not `keep`: deleted."""
    used = {pod_group_of(p) for p in pods}
    return [
        Write(group, "delete", why=why)
        for group in owned
        if group.get("kind") == "PodGroup"
        and owned_by(group, uid_of(job))
        and group["metadata"].get("name") not in keep | used
        and not group["metadata"].get("deletionTimestamp")
    ]


def named(job: Job, owned: list[Obj], kind: str, name: str) -> Obj | None:
    """The job's own object of that kind and name (one of that name that is not its own is never its)."""
    return next(
        (o for o in owned if o.get("kind") == kind and o["metadata"].get("name") == name and owned_by(o, uid_of(job))),
        None,
    )


def place(s: Situation, scheduler: str, objects: list[Obj], make: bool, keep: set[str]) -> Placing:
    """What either gang needs this reconcile: its `objects` made when `make` and missing (by name, the job's own),
    the job's PodGroups no pod uses any more but `keep` deleted, and the wait said as it is (`wait`)."""
    gang = s.status["gang"]
    found = Placing()
    if make:
        found.create = [o for o in objects if named(s.job, s.owned, o["kind"], o["metadata"]["name"]) is None]
    found.writes = stale(s.job, s.owned, s.pods, keep, "no pod of the job uses it")
    group = named(s.job, s.owned, "PodGroup", gang["podGroup"])
    found.waiting, found.wake_at = wait(s.job, s.views, gang, group, scheduler, s.now, s.config.scheduling_grace)
    found.holding = not placed(s.job, s.views)
    found.placed_at = st.parse_time(gang.get("placedAt"))
    return found
