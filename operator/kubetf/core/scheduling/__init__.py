"""The seam between a TrainingJob and whatever decides where and when its pods run, pure.

kubetf is the job; each scheduler integration is a module of pure functions over values (`Integration`), in the
shape of Kueue's `jobframework.GenericJob` turned around:

| module | what it is |
|---|---|
| `native` | Kubernetes' own gang scheduling (the Workload API, `scheduling.k8s.io`) |
| `volcano` | Volcano's gang scheduling (`scheduling.volcano.sh` PodGroups) |
| `kueue` | Kueue's job framework: a Workload per job, pods only once Kueue admits it |
| `multikueue` | MultiKueue's manager: the job runs on another cluster, here only its Workload |

Each answers the same questions: which objects the job needs now (`place`), how a pod joins (`join`), whether pods
may exist at all (`gate`: admitted, equivalent), what a restart does to the group (`regroup`), what the job's end
gives back (`finish`), and what is left of an earlier job of its name (`farewell`). Which objects are the job's is
never a name or a label: `kubetf.core.types.owned_by`, its uid in their controller reference.

A job has at most two: one that admits it (a queue: Kueue, MultiKueue), one that places it (a gang: native,
Volcano), chosen here (`of`) and nowhere else. The placing one is chosen once, when the job first runs, and kept in
`status.gang.scheduler` (the cluster's APIs may come and go; a job never changes how its pods are placed); the
admitting one follows the job's labels, which the chart's admission policy keeps fixed while the job runs.
Adding an integration (Kubernetes 1.38's `scheduling.k8s.io/v1`, another batch scheduler) is one module
implementing `Integration`, a line in `_BY_NAME`, and its tests (docs/development.md).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from kubetf.core import api
from kubetf.core.scheduling import gangs, kueue, multikueue, native, volcano
from kubetf.core.scheduling.seam import Gate, Integration, Placing, Remains, Served, Situation, Task
from kubetf.core.types import Job, Pod, Resource, Write

__all__ = ["Gate", "Integration", "Placing", "Remains", "Served", "Situation", "Task"]
NONE = "None"


_BY_NAME: dict[str, Integration] = {
    native.NAME: native,
    volcano.NAME: volcano,
    kueue.NAME: kueue,
    multikueue.NAME: multikueue,
}
ALL: tuple[Integration, ...] = tuple(_BY_NAME.values())
RESOURCES: tuple[Resource, ...] = tuple(dict.fromkeys(r for i in ALL for r in i.RESOURCES))
POD_ANNOTATIONS: tuple[str, ...] = tuple(dict.fromkeys(a for i in ALL for a in i.POD_ANNOTATIONS))


def of(job: Job, status: Mapping[str, Any]) -> list[Integration]:
    """The integrations of a job, the one that admits it first: the only place that says which."""
    found: list[Integration] = []
    if multikueue.dispatched(job):
        return [multikueue]
    if kueue.queue_name(job) is not None:
        found.append(kueue)
    placing = _BY_NAME.get((status.get("gang") or {}).get("scheduler") or NONE)
    if placing is not None and placing is not kueue:
        found.append(placing)
    return found


def runs_here(job: Job | None) -> bool:
    """The job exists, is not being deleted, and its pods run on this cluster."""
    return (
        job is not None
        and not job["metadata"].get("deletionTimestamp")
        and all(i.RUNS_PODS for i in of(job, job.get("status") or {}))
    )


def choose(job: Job, served: Served) -> tuple[str, str | None]:
    """The scheduler that places the job's training tasks together (its name; `None`: nobody), and why the one it
    asks for cannot be had (then nothing is created)."""
    asked = gangs.policy(job).get("gangScheduler") or "Auto"
    field_ = "spec.runPolicy.schedulingPolicy.gangScheduler"
    queued = kueue.queue_name(job) is not None
    if asked == NONE or (asked == "Auto" and not queued and gangs.min_available(job) < 2):
        return NONE, None  # one training task: nothing to place together
    if asked == kueue.NAME:
        if queued:
            return kueue.NAME, None
        return NONE, f"{field_}: Kueue admits only a queued job: add the label {api.QUEUE_LABEL} naming a LocalQueue"
    if asked == native.NAME:
        return (native.NAME, None) if served.kubernetes and not native.unfit(job) else (NONE, native.unavailable(job))
    if asked == volcano.NAME:
        if volcano.unfit(job):
            return NONE, volcano.unfit(job)
        return (volcano.NAME, None) if served.volcano else (NONE, volcano.unavailable())
    if queued:
        return kueue.NAME, None  # Auto: Kueue admits all of a queued job's pods at once
    if volcano.asked_by_pods(job):
        return (volcano.NAME, None) if served.volcano else (NONE, volcano.unavailable())
    if served.kubernetes and native.unfit(job) is None:
        return native.NAME, None
    return NONE, None


def placing(integrations: list[Integration], s: Situation) -> Placing:
    found = Placing()
    for integration in integrations:
        found.add(integration.place(s))
    return found


def gate(integrations: list[Integration], s: Situation) -> Gate | None:
    return next((g for i in integrations if (g := i.gate(s)) is not None), None)


def farewell(remains: Remains) -> list[Write]:
    """What is left around a job's name that is no longer any job's: an earlier job's objects, the job's own that it
    no longer uses (every integration looks: a job's labels may have changed which ones it has now)."""
    return [w for integration in ALL for w in integration.farewell(remains)]


def released(pods: list[Pod], lost_nodes: Collection[str]) -> list[Pod]:
    """Deleted pods that run nothing and that only a scheduler integration's own finalizer still holds: it goes."""
    found: list[Pod] = []
    for integration in ALL:
        found += [p for p in integration.release(pods, lost_nodes) if not any(p is f for f in found)]
    return found
