"""Kubernetes' own gang scheduling (KEP-4671, the Workload API: `scheduling.k8s.io/v1beta1`, Kubernetes 1.37 with the
GenericWorkload gate), pure: the job's `Workload` (one pod group template, `training`, whose gang needs minAvailable
pods), a `PodGroup` per generation of the gang (kubetf.core.scheduling.gangs), and each training pod in it through
`spec.schedulingGroup`. kube-scheduler's gang plugin is the default scheduler's: the pods must be that scheduler's,
and every pod of a group must have one priority (the scheduler refuses a group whose pods differ).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from kubetf.core import api
from kubetf.core import status as st
from kubetf.core.scheduling import gangs
from kubetf.core.scheduling.seam import Placing, Remains, Situation
from kubetf.core.types import Job, Obj, Pod, Resource, Write

NAME = "Kubernetes"
GROUP, VERSION = "scheduling.k8s.io", "v1beta1"
TEMPLATE = "training"  # the Workload's pod group template
RUNS_PODS = True
POD_ANNOTATIONS: tuple[str, ...] = ()


def _slim_group(group: Obj) -> Obj:
    """What the decisions read of a PodGroup: identity, owner, what the scheduler wrote on it."""
    meta = group.get("metadata") or {}
    kept = {k: meta[k] for k in ("name", "namespace", "uid", "deletionTimestamp", "ownerReferences") if k in meta}
    conditions = [
        {k: c[k] for k in ("type", "status", "reason", "message", "lastTransitionTime") if k in c}
        for c in (group.get("status") or {}).get("conditions") or []
    ]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PodGroup",
        "metadata": kept,
        "status": {"conditions": conditions},
    }


def _slim_workload(workload: Obj) -> Obj:
    meta = workload.get("metadata") or {}
    kept = {k: meta[k] for k in ("name", "namespace", "uid", "deletionTimestamp", "ownerReferences") if k in meta}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Workload", "metadata": kept}


POD_GROUPS = Resource(GROUP, VERSION, "podgroups", "PodGroup", _slim_group)
WORKLOADS = Resource(GROUP, VERSION, "workloads", "Workload", _slim_workload)
RESOURCES: tuple[Resource, ...] = (POD_GROUPS, WORKLOADS)


def unfit(job: Job) -> str | None:
    """Why this gang cannot place the job's pods: they name another scheduler, or differ in priority."""
    field_ = "spec.runPolicy.schedulingPolicy.gangScheduler"
    others = gangs.scheduler_names(job) - {gangs.DEFAULT_SCHEDULER}
    if others:
        return (
            f"{field_}: Kubernetes: the training pods name schedulerName {sorted(others)[0]!r}, and Kubernetes' gang "
            "plugin is the default scheduler's: remove schedulerName from the templates, or use that scheduler's gang"
        )
    classes = gangs.priority_classes(job)
    if len(classes) > 1:
        named = ", ".join(repr(c or "none") for c in sorted(classes))
        return (
            f"{field_}: Kubernetes: the training pods' templates name different priorityClassName ({named}), and "
            "every pod of a gang must have one priority: set spec.priorityClassName (every pod gets it)"
        )
    return None


def unavailable(job: Job) -> str:
    return unfit(job) or (
        f"spec.runPolicy.schedulingPolicy.gangScheduler: Kubernetes: the cluster does not serve {GROUP}/{VERSION} "
        "PodGroups (Kubernetes 1.37 or newer, with the GenericWorkload feature gate on the API server, scheduler and "
        f"controller manager and --runtime-config={GROUP}/{VERSION}=true): ask your cluster's admin, or use Auto"
    )


def workload_name(job: Job) -> str:
    """The job's Workload: named for this job (its uid), never for the name alone, which another's may hold."""
    return f"{api.name(job)}{gangs.suffix(job)}"


def desired(job: Job, gang: dict[str, Any]) -> list[Obj]:
    """The job's Workload and the current generation's PodGroup, owned by the job."""
    policy: dict[str, Any] = {"gang": {"minCount": gangs.min_available(job)}}
    template: dict[str, Any] = {"name": TEMPLATE, "schedulingPolicy": policy}
    group_spec: dict[str, Any] = {
        "workloadRef": {"workloadName": workload_name(job), "templateName": TEMPLATE},
        "schedulingPolicy": policy,
    }
    priority = gangs.group_priority(job)
    if priority:  # the pods' own: the scheduler refuses a group whose pods' priority differs from it
        template["priorityClassName"] = group_spec["priorityClassName"] = priority
    controller = {"apiGroup": api.GROUP, "kind": api.KIND, "name": api.name(job)}
    workload = {
        "apiVersion": WORKLOADS.api_version, "kind": "Workload", "metadata": gangs.meta(job, workload_name(job)),
        "spec": {"controllerRef": controller, "podGroupTemplates": [template]},
    }  # fmt: skip
    group = {
        "apiVersion": POD_GROUPS.api_version, "kind": "PodGroup", "metadata": gangs.meta(job, gang["podGroup"]),
        "spec": group_spec,
    }  # fmt: skip
    return [workload, group]


# ---------------------------------------------------------------------- the seam (kubetf.core.scheduling)


def gate(s: Situation) -> None:
    return None  # it places pods; it never keeps them out


def regroup(s: Situation, restarted: set[tuple[str, int]]) -> None:
    gangs.regroup(s.job, s.status, s.views, restarted)


def join(s: Situation, pod: Pod, role: str) -> None:
    if role in api.TRAINING_ROLES:
        pod["spec"]["schedulingGroup"] = {"podGroupName": s.status["gang"]["podGroup"]}


def place(s: Situation) -> Placing:
    """The Workload and the generation's PodGroup exist before the pods that use it, made as soon as a restart of the
    whole gang is decided (a PodGroup without pods holds nothing here), so the replacements wait on nothing else once
    the old pods are gone; an older generation's PodGroup goes once no pod uses it; the wait said as it is."""
    gang = s.status["gang"] = gangs.record(s.status, NAME, s.job)
    if s.status.get("phase") == st.SUSPENDED:  # nothing to place: its old groups go once their pods are gone
        return Placing(writes=gangs.stale(s.job, s.owned, s.pods, {gang["podGroup"]}, "no pod of the job uses it"))
    waiting_pods = any(
        v.role in api.TRAINING_ROLES and v.state == st.WAITING and v.pod is None for v in s.views.values()
    )
    return gangs.place(s, NAME, desired(s.job, gang), s.creating or waiting_pods, {gang["podGroup"]})


def finish(s: Situation) -> list[Write]:
    return []  # its objects hold nothing once the pods are gone, and go with the job


def release(pods: list[Pod], lost_nodes: Collection[str]) -> list[Pod]:
    return []


def farewell(r: Remains) -> list[Write]:
    return []  # an earlier job's objects go with it (their owner reference), and their names are never this job's
