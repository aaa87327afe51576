"""Gang scheduling without Kueue, pure: all of a job's training tasks (chief, workers, ps) placed together or none of
them, by Kubernetes' own Workload API (scheduling.k8s.io/v1beta1, 1.37 with the GenericWorkload gate) or by
Volcano (scheduling.volcano.sh/v1beta1). The evaluator is never part of the gang: it does not hold the others back.

The job asks for it in `spec.runPolicy.schedulingPolicy` (docs/gang-scheduling.md):

- which scheduler (`gangScheduler`): Auto is Kueue when the job is queued (Kueue admits its pods together), else
  none for a job of one training task, else Volcano when its pods name `schedulerName: volcano`, else Kubernetes'
  own where the cluster serves it and the pods are the default scheduler's, else none;
- how many training tasks must be placed together (`minAvailable`, default all of them);
- how long a gang may wait to be placed once its pods could start (`scheduleTimeoutSeconds`), and what then
  (`onScheduleTimeout`: Fail, or Wait on and say so).

A gang is a PodGroup of the job, one per *generation*: the lowest attempt among the training tasks. A restart of the
whole group (MultiWorkerMirrored, a suspension, Kueue's preemption) moves every task to a new attempt, so a new
PodGroup is gang-scheduled from scratch (Kubernetes' PodGroup never unlearns that it was scheduled, and a restart's
old pods must not count toward its quorum); a lone task's replacement (a ParameterServer worker, a ps and its chief)
joins the current PodGroup, whose running members count toward its quorum in both schedulers, so it is placed alone.
A PodGroup of an older generation is deleted once none of the job's pods uses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubetf.core import api, kueue
from kubetf.core import status as st
from kubetf.core.api import Job

KUEUE, KUBERNETES, VOLCANO = "Kueue", "Kubernetes", "Volcano"
NATIVE_GROUP, NATIVE_VERSION = "scheduling.k8s.io", "v1beta1"
VOLCANO_GROUP, VOLCANO_VERSION = "scheduling.volcano.sh", "v1beta1"
VOLCANO_SCHEDULER = "volcano"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"  # the one annotation vc-scheduler groups pods by
TEMPLATE = "training"  # the Workload's pod group template

Pod = dict[str, Any]


@dataclass(frozen=True)
class Served:
    """Which gang schedulers' APIs the cluster serves (API discovery)."""

    kubernetes: bool = False
    volcano: bool = False


@dataclass(frozen=True)
class Placement:
    """Where a pod goes: the scheduler and its PodGroup (None: the pod is not in any, as the evaluator)."""

    scheduler: str
    group: str | None


def policy(job: Job) -> dict[str, Any]:
    return dict(api.run_policy(job).get("schedulingPolicy") or {})


def training_tasks(job: Job) -> list[tuple[str, int]]:
    return [(role, index) for role, index in api.tasks(job) if role in api.TRAINING_ROLES]


def min_available(job: Job) -> int:
    return int(policy(job).get("minAvailable") or len(training_tasks(job)))


def _scheduler_names(job: Job) -> set[str]:
    """The schedulers the training pods' templates name ("default-scheduler" when they name none)."""
    return {
        (spec["template"].get("spec") or {}).get("schedulerName") or "default-scheduler"
        for role, spec in api.replica_specs(job).items()
        if role in api.TRAINING_ROLES
    }


def _names_volcano(job: Job) -> bool:
    return VOLCANO_SCHEDULER in _scheduler_names(job)


def scheduler(job: Job, served: Served) -> tuple[str | None, str | None]:
    """(the job's gang scheduler, or None for none; why it cannot have the one it asks for, or None)."""
    asked = policy(job).get("gangScheduler") or "Auto"
    field = "spec.runPolicy.schedulingPolicy.gangScheduler"
    queued = kueue.queue_name(job) is not None
    if asked == "None":
        return None, None
    if asked == "Auto" and not queued and min_available(job) < 2:
        return None, None  # one training task: nothing to place together
    if asked == KUEUE:
        if queued:
            return KUEUE, None
        return None, f"{field}: Kueue admits only a queued job: add the label {kueue.QUEUE_LABEL} naming a LocalQueue"
    # Auto takes Kubernetes' own only for pods of the default scheduler: its gang plugin is that scheduler's.
    default = _scheduler_names(job) == {"default-scheduler"}
    if asked == KUBERNETES or (asked == "Auto" and not queued and default and served.kubernetes):
        if served.kubernetes:
            return KUBERNETES, None
        return None, (
            f"{field}: Kubernetes: the cluster does not serve {NATIVE_GROUP}/{NATIVE_VERSION} PodGroups (Kubernetes "
            "1.37 or newer, with the GenericWorkload feature gate on the API server, scheduler and controller manager "
            f"and --runtime-config={NATIVE_GROUP}/{NATIVE_VERSION}=true): ask your cluster's admin, or use Auto"
        )
    if asked == VOLCANO or (asked == "Auto" and not queued and _names_volcano(job)):
        if served.volcano:
            return VOLCANO, None
        return None, (
            f"{field}: Volcano: the cluster does not serve {VOLCANO_GROUP}/{VOLCANO_VERSION} PodGroups (Volcano is not "
            "installed): install Volcano, or use Auto"
        )
    return (KUEUE, None) if queued else (None, None)


def generation(job: Job, status: dict[str, Any]) -> int:
    """The gang's generation: the lowest attempt among the training tasks (status.tasks, after this plan's
    restart decisions)."""
    records = status.get("tasks") or {}
    attempts = [int((records.get(st.task_key(r, i)) or {}).get("attempt", 0)) for r, i in training_tasks(job)]
    return min(attempts, default=0)


def group_name(job: Job, generation_: int) -> str:
    return f"{api.name(job)}-gang-{generation_}"


def evaluator_group(job: Job) -> str:
    """Volcano schedules only pods in a PodGroup: the evaluator has one of its own, of one member."""
    return f"{api.name(job)}-evaluator"


def placement(job: Job, gang_scheduler: str | None, status: dict[str, Any], role: str) -> Placement | None:
    """Where a pod of `role` goes; None: it is placed as its template says (no gang, or Kueue's)."""
    if gang_scheduler not in (KUBERNETES, VOLCANO):
        return None
    if role not in api.TRAINING_ROLES:
        return Placement(gang_scheduler, evaluator_group(job) if gang_scheduler == VOLCANO else None)
    return Placement(gang_scheduler, group_name(job, generation(job, status)))


def join(pod: Pod, where: Placement | None) -> None:
    """Put a pod (as builders made it) into its PodGroup."""
    if where is None:
        return
    spec, meta = pod["spec"], pod["metadata"]
    if where.scheduler == KUBERNETES and where.group is not None:
        spec["schedulingGroup"] = {"podGroupName": where.group}
    elif where.scheduler == VOLCANO:
        spec["schedulerName"] = VOLCANO_SCHEDULER
        if where.group is not None:
            meta["annotations"] = {**(meta.get("annotations") or {}), VOLCANO_GROUP_ANNOTATION: where.group}


def pod_group(pod: Pod) -> str | None:
    """The PodGroup a pod is in, in either scheduler."""
    spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
    native = (spec.get("schedulingGroup") or {}).get("podGroupName")
    return native or (meta.get("annotations") or {}).get(VOLCANO_GROUP_ANNOTATION)


def _requests(job: Job, role: str) -> dict[str, str]:
    """What one pod of the role asks of a node: its containers' requests (else limits), as Volcano sums them."""
    total: dict[str, float] = {}
    pod_spec = job["spec"]["replicaSpecs"][role]["template"]["spec"]
    gpus = job["spec"]["replicaSpecs"][role].get("gpus")
    for index, container in enumerate(pod_spec.get("containers") or []):
        resources = container.get("resources") or {}
        wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        if gpus and index == api.training_container_index(pod_spec):
            wanted.setdefault(api.GPU_RESOURCE, gpus)
        for name, value in wanted.items():
            total[name] = total.get(name, 0.0) + api.quantity(value)
    return {name: api.format_quantity(name, value) for name, value in sorted(total.items())}


def min_resources(job: Job) -> dict[str, str]:
    """The resources of the `minAvailable` training pods Volcano must find at once (the chief and the ps first, as
    Kubeflow's operator counted them), so a gang that cannot fit is never enqueued."""
    order = sorted(training_tasks(job), key=lambda t: ("chief", "ps", "worker").index(t[0]))[: min_available(job)]
    total: dict[str, float] = {}
    for role, _ in order:
        for name, value in _requests(job, role).items():
            total[name] = total.get(name, 0.0) + api.quantity(value)
    return {name: api.format_quantity(name, value) for name, value in sorted(total.items())}


def _meta(job: Job, name: str) -> dict[str, Any]:
    uid = job["metadata"].get("uid")
    meta: dict[str, Any] = {
        "name": name,
        "namespace": api.namespace(job),
        "labels": {api.LABEL_MANAGED_BY: api.MANAGER, api.LABEL_JOB: api.name(job)},
    }
    if uid:
        owner = {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": api.name(job), "uid": uid}
        meta["ownerReferences"] = [{**owner, "controller": True, "blockOwnerDeletion": True}]
    return meta


def desired_objects(job: Job, gang_scheduler: str | None, status: dict[str, Any]) -> list[dict[str, Any]]:
    """The gang objects the job's pods need before they are created: for Kubernetes, the job's Workload and the
    current generation's PodGroup; for Volcano, that PodGroup and the evaluator's own. All owned by the job."""
    if gang_scheduler not in (KUBERNETES, VOLCANO):
        return []
    name = group_name(job, generation(job, status))
    priority = job["spec"].get("priorityClassName")
    if gang_scheduler == KUBERNETES:
        gang = {"gang": {"minCount": min_available(job)}}
        template: dict[str, Any] = {"name": TEMPLATE, "schedulingPolicy": gang}
        reference = {"workloadName": api.name(job), "templateName": TEMPLATE}
        group_spec: dict[str, Any] = {"workloadRef": reference, "schedulingPolicy": gang}
        if priority:  # every pod of a group must have the group's priority, or the scheduler refuses the group
            template["priorityClassName"] = group_spec["priorityClassName"] = priority
        controller = {"apiGroup": api.GROUP, "kind": api.KIND, "name": api.name(job)}
        workload_spec = {"controllerRef": controller, "podGroupTemplates": [template]}
        workload = _object(NATIVE_GROUP, "Workload", _meta(job, api.name(job)), workload_spec)
        return [workload, _object(NATIVE_GROUP, "PodGroup", _meta(job, name), group_spec)]
    spec: dict[str, Any] = {"minMember": min_available(job), "minResources": min_resources(job)}
    queue = policy(job).get("queue")
    if queue:
        spec["queue"] = queue
    if priority:
        spec["priorityClassName"] = priority
    objects = [_object(VOLCANO_GROUP, "PodGroup", _meta(job, name), spec)]
    if "evaluator" in api.replica_specs(job):
        alone: dict[str, Any] = {"minMember": 1, **({"queue": queue} if queue else {})}
        if priority:
            alone["priorityClassName"] = priority
        objects.append(_object(VOLCANO_GROUP, "PodGroup", _meta(job, evaluator_group(job)), alone))
    return objects


def _object(group: str, kind: str, metadata: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    version = NATIVE_VERSION if group == NATIVE_GROUP else VOLCANO_VERSION
    return {"apiVersion": f"{group}/{version}", "kind": kind, "metadata": metadata, "spec": spec}


# ---------------------------------------------------------------------- whether the gang is placed, and what the
# scheduler says while it is not


def placed(job: Job, views: dict[str, st.TaskView]) -> bool:
    """At least minAvailable training tasks are on a node (bound) or done."""
    done = 0
    for view in views.values():
        if view.role not in api.TRAINING_ROLES:
            continue
        if view.state == st.COMPLETED or (view.pod is not None and (view.pod.get("spec") or {}).get("nodeName")):
            done += 1
    return done >= min_available(job)


def scheduler_words(groups: list[dict[str, Any]], name: str) -> str | None:
    """What the scheduler wrote on the PodGroup `name` while it cannot place it (Kubernetes:
    PodGroupInitiallyScheduled False; Volcano: Unschedulable True, unless a Scheduled True came since: Volcano never
    turns Unschedulable back to False), else None."""
    group = next((g for g in groups if (g.get("metadata") or {}).get("name") == name), None)
    conditions = ((group or {}).get("status") or {}).get("conditions") or []
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


VOLCANO_FITS = "Schedulable"  # Volcano's reason on a pod that would fit, "once minAvailable is satisfied"
GROUP_ECHO = "pod group is"  # how both schedulers begin a pod's message that repeats its PodGroup's state


def waiting_words(pods: list[Pod], groups: list[dict[str, Any]], name: str) -> tuple[str | None, bool]:
    """Why the gang `name` is not placed, in the scheduler's words: a pod's own first (the first unplaced pod it found
    no room for: `0/5 nodes are available: 1 Insufficient nvidia.com/gpu, ...`), then the PodGroup's. Not a pod's
    words that only say it would fit (Volcano's `Schedulable: ... can possibly be assigned to NODE, once minAvailable
    is satisfied`), and a pod's echo of its group's state (`pod group is unschedulable, ...`) only when nothing
    better is said; words that the others already contain are not repeated.

    And whether the scheduler has said why it cannot place the gang (the job need not wait out the scheduling grace
    to say so): a pod found no room, or Kubernetes' PodGroup says it tried (`PodGroupInitiallyScheduled` False).
    Volcano's PodGroup alone does not: it also says `Unschedulable` (`pod group is not ready, 4 Pending, 4
    minAvailable`, no task's own reason) in its first sessions of a gang it places a moment later (seen on the
    1.37 cluster under load)."""
    said = [why for pod in pods if (why := st.pending_reason(pod)) and not why.startswith(f"{VOLCANO_FITS}:")]
    own = [why for why in said if not _message(why).startswith(GROUP_ECHO)]
    pod_words = next(iter(own or said), None)
    group_words = scheduler_words(groups, name)
    if pod_words and group_words:
        if _message(pod_words) in group_words:
            pod_words = None
        elif _message(group_words) in pod_words:
            group_words = None
    group = next((g for g in groups if (g.get("metadata") or {}).get("name") == name), None)
    tried = any(
        c.get("type") == "PodGroupInitiallyScheduled" and c.get("status") == "False"
        for c in ((group or {}).get("status") or {}).get("conditions") or []
    )
    return "; ".join(w for w in (pod_words, group_words) if w) or None, bool(own) or tried


def _message(words: str) -> str:
    """The message of "Reason: message"."""
    return words.split(": ", 1)[-1]


def stale_groups(job: Job, groups: list[dict[str, Any]], pods: list[Pod], current: str | None) -> list[dict[str, Any]]:
    """The job's PodGroups of older generations that none of its pods uses any more: deleted (by uid)."""
    uid = job["metadata"].get("uid")
    used = {pod_group(p) for p in pods}
    keep = {current, evaluator_group(job)}
    stale = []
    for group in groups:
        meta = group.get("metadata") or {}
        owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller")]
        ours = bool(owners) and owners[0].get("uid") == uid
        if ours and meta.get("name") not in keep and meta.get("name") not in used and not meta.get("deletionTimestamp"):
            stale.append(group)
    return stale
