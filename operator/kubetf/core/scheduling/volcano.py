"""Volcano's gang scheduling (`scheduling.volcano.sh/v1beta1`), pure: a Volcano `PodGroup` per generation of the gang
(kubetf.core.scheduling.gangs) with `minMember` and the `minResources` Volcano must find at once, and every pod
scheduled by Volcano (`schedulerName: volcano`) in its group (the annotation `scheduling.k8s.io/group-name`, the one
vc-scheduler groups pods by; without it Volcano makes a group of one per pod). The evaluator, outside the gang, has a
group of one of its own: Volcano schedules only pods in a PodGroup.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from kubetf.core import api
from kubetf.core import status as st
from kubetf.core.scheduling import gangs
from kubetf.core.scheduling.seam import Placing, Remains, Situation
from kubetf.core.types import Job, Obj, Pod, Resource, Write

NAME = "Volcano"
GROUP, VERSION = "scheduling.volcano.sh", "v1beta1"
SCHEDULER = "volcano"
GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
RUNS_PODS = True
POD_ANNOTATIONS: tuple[str, ...] = (GROUP_ANNOTATION,)  # the PodGroup a pod is in


def _slim_group(group: Obj) -> Obj:
    """What the decisions read of a PodGroup: identity, owner, what the scheduler wrote on it."""
    meta = group.get("metadata") or {}
    kept = {k: meta[k] for k in ("name", "namespace", "uid", "deletionTimestamp", "ownerReferences") if k in meta}
    status = group.get("status") or {}
    conditions = [
        {k: c[k] for k in ("type", "status", "reason", "message", "lastTransitionTime") if k in c}
        for c in status.get("conditions") or []
    ]
    slim: Obj = {"conditions": conditions}
    if "phase" in status:
        slim["phase"] = status["phase"]
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": kept, "status": slim}


POD_GROUPS = Resource(GROUP, VERSION, "podgroups", "PodGroup", _slim_group)
RESOURCES: tuple[Resource, ...] = (POD_GROUPS,)


def asked_by_pods(job: Job) -> bool:
    """The training pods' templates name Volcano's scheduler: Auto gives them Volcano's gang."""
    return SCHEDULER in gangs.scheduler_names(job)


def unfit(job: Job) -> str | None:
    """Why Volcano's gang cannot place the job's pods: a training template names another scheduler (every pod is
    Volcano's here). The CRD refuses such a job at apply; one stored before that rule is refused here."""
    others = gangs.scheduler_names(job) - {gangs.DEFAULT_SCHEDULER, SCHEDULER}
    if others:
        return (
            f"spec.runPolicy.schedulingPolicy.gangScheduler: Volcano: the training pods name schedulerName "
            f"{sorted(others)[0]!r}, and Volcano's gang needs its own scheduler: remove schedulerName from the "
            "templates, or name volcano"
        )
    return None


def unavailable() -> str:
    return (
        f"spec.runPolicy.schedulingPolicy.gangScheduler: Volcano: the cluster does not serve {GROUP}/{VERSION} "
        "PodGroups (Volcano is not installed): install Volcano, or use Auto"
    )


def evaluator_group(job: Job) -> str:
    return f"{api.name(job)}-evaluator{gangs.suffix(job)}"


def _requests(job: Job, role: str) -> dict[str, float]:
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
    return total


def min_resources(job: Job) -> dict[str, str]:
    """The resources of the `minAvailable` training pods Volcano must find at once (the chief and the ps first, as
    Kubeflow's operator counted them), so a gang that cannot fit is never enqueued."""
    first = sorted(gangs.training_tasks(job), key=lambda t: ("chief", "ps", "worker").index(t[0]))
    total: dict[str, float] = {}
    for role, _ in first[: gangs.min_available(job)]:
        for name, value in _requests(job, role).items():
            total[name] = total.get(name, 0.0) + value
    return {name: api.format_quantity(name, value) for name, value in sorted(total.items())}


def desired(job: Job, gang: dict[str, Any]) -> list[Obj]:
    """The generation's PodGroup, and the evaluator's own; owned by the job."""
    queue = gangs.policy(job).get("queue")
    priority = gangs.group_priority(job) or job["spec"].get("priorityClassName")
    extra: dict[str, Any] = {
        **({"queue": queue} if queue else {}),
        **({"priorityClassName": priority} if priority else {}),
    }
    spec = {"minMember": gangs.min_available(job), "minResources": min_resources(job), **extra}
    objects = [{"apiVersion": POD_GROUPS.api_version, "kind": "PodGroup",
                "metadata": gangs.meta(job, gang["podGroup"]), "spec": spec}]  # fmt: skip
    if "evaluator" in api.replica_specs(job):
        alone = {"minMember": 1, **extra}
        objects.append({"apiVersion": POD_GROUPS.api_version, "kind": "PodGroup",
                        "metadata": gangs.meta(job, evaluator_group(job)), "spec": alone})  # fmt: skip
    return objects


# ---------------------------------------------------------------------- the seam (kubetf.core.scheduling)


def gate(s: Situation) -> None:
    return None


def regroup(s: Situation, restarted: set[tuple[str, int]]) -> None:
    gangs.regroup(s.job, s.status, s.views, restarted)


def join(s: Situation, pod: Pod, role: str) -> None:
    pod["spec"]["schedulerName"] = SCHEDULER
    group = s.status["gang"]["podGroup"] if role in api.TRAINING_ROLES else evaluator_group(s.job)
    meta = pod["metadata"]
    meta["annotations"] = {**(meta.get("annotations") or {}), GROUP_ANNOTATION: group}


def place(s: Situation) -> Placing:
    """The PodGroups are made with the pods that use them (a Volcano PodGroup holds its queue's quota, beside the old
    pods' while a restart's old pods go); an older generation's goes once no pod uses it; the wait said as it is."""
    gang = s.status["gang"] = gangs.record(s.status, NAME, s.job)
    if s.status.get("phase") == st.SUSPENDED:  # nothing to place: its old groups go once their pods are gone
        return Placing(writes=gangs.stale(s.job, s.owned, s.pods, {gang["podGroup"]}, "no pod of the job uses it"))
    keep = {gang["podGroup"], evaluator_group(s.job)}
    return gangs.place(s, NAME, desired(s.job, gang), s.creating, keep)


def finish(s: Situation) -> list[Write]:
    return []  # a PodGroup whose pods are gone holds no quota, and goes with the job


def release(pods: list[Pod], lost_nodes: Collection[str]) -> list[Pod]:
    return []


def farewell(r: Remains) -> list[Write]:
    return []
