"""Kueue's job framework, as kubetf follows it: a TrainingJob is one of Kueue's external frameworks (the protocol of
Kueue's `pkg/controller/jobframework`, v0.19; docs/kueue.md). Pure; the Workload itself is
kubetf.core.scheduling.workload.

- A job labelled with a LocalQueue (`kueue.x-k8s.io/queue-name`) gets one Workload, made by the operator and owned by
  the job. No pod exists until Kueue admits it (`Admitted=True`), and none while the admitted Workload no longer
  matches the job (Kueue's `EquivalentToWorkload`: its PodSets, its queue): then the quota goes back, the Workload
  follows the job, and Kueue admits it again.
- Admitted, its pods are created with what the admission assigned to each PodSet merged in (the flavors' node labels
  and tolerations, the admission checks' updates, Kueue's labels and annotations, a topology gate).
- Kueue evicts it (preemption, a PodsReady timeout, a deactivation, its Workload deleted): every pod goes, as one
  disruption that never fails the job; once none runs, the operator gives the quota back (the reservation cleared,
  `Requeued` set) and the job waits in its queue again. The operator's own restarts keep the admission.
- `PodsReady` says whether all of the job's pods run and are ready; the job's end finishes the Workload at once (its
  quota released), then its finalizer goes. So does any other Workload the job owns (one it made before its queue
  label was removed). A suspended job's Workload is deactivated (`spec.active`).
- MultiKueue's copy of a job on a worker names the Workload Kueue made for it (`kueue.x-k8s.io/prebuilt-workload-name`),
  which the operator adopts instead of making one.
"""

from __future__ import annotations

import copy
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from kubetf.core import api, builders
from kubetf.core import status as st
from kubetf.core.config import OperatorConfig
from kubetf.core.scheduling import workload as wl
from kubetf.core.scheduling.seam import Gate, Placing, Remains, Situation
from kubetf.core.scheduling.workload import Admission, condition
from kubetf.core.scheduling.workload import queue_name as queue_name  # the job's LocalQueue: it makes the job Kueue's
from kubetf.core.types import Event, Job, Obj, Pod, Resource, Write, owned_by, uid_of

NAME = "Kueue"
RESOURCES: tuple[Resource, ...] = (wl.WORKLOADS,)
RUNS_PODS = True
POD_ANNOTATIONS: tuple[str, ...] = ()


# ---------------------------------------------------------------------- the seam (kubetf.core.scheduling)


def gate(s: Situation) -> Gate | None:
    """Pods only while Kueue admits the job's Workload, and it matches the job. Running pods of a job that waits stop
    (evicted: preempted, a PodsReady timeout, deactivated; its Workload deleted or changed; pods older than it)."""
    admission = s.admission
    if admission is None or not admission.installed:
        return None
    differs = _differs(s.job, admission)
    if admission.admitted and differs is None:
        return None
    reason, message = admission.waiting(s.job)
    live = [v for v in s.views.values() if v.state != st.COMPLETED and v.pod is not None and not st.is_deleting(v.pod)]
    if admission.admitted and differs is not None:
        reason, message = "Queued", f"{differs}: its quota goes back, and Kueue admits the job as it is now"
    stop = (differs if admission.admitted else admission.eviction()) if live else None
    return Gate(reason, message, warning=reason != "Queued", stop=stop)


def regroup(s: Situation, restarted: set[tuple[str, int]]) -> None:
    return None  # the operator's own restarts keep the admission


def join(s: Situation, pod: Pod, role: str) -> None:
    """An admitted job's pod gets what its admission assigned to its PodSet (Kueue's RunWithPodSetsInfo)."""
    if s.admission is not None and s.admission.admitted:
        apply(pod, pod_set_infos(s.admission).get(role))


def place(s: Situation) -> Placing:
    """The job's part of Kueue's protocol while it may run: its Workload made while it has none (once no pod of it
    runs); a prebuilt one adopted; its queue and PodSets following the job while it holds no quota; deactivated while
    the job is suspended; PodsReady; the quota given back once no pod runs after an eviction, or when the Workload no
    longer matches the job. And what is left of an earlier job of its name, or of its own old queue, let go."""
    found = Placing()
    admission, job, phase = s.admission, s.job, s.status.get("phase")
    if admission is None:
        return found
    if not admission.installed:
        if s.creating and phase in (None, st.PENDING):
            reason, message = admission.waiting(job)
            found.events.append(Event("Warning", reason, message + "; its pods run without queueing"))
        return found
    workload = admission.workload
    inactive = is_inactive(s.pods, s.lost_nodes)
    suspended = bool(api.run_policy(job).get("suspend"))
    if workload is None:
        if admission.priority is not None and admission.priority.problem:
            found.wake_at = s.now + s.config.local_queue_recheck  # no watch shows the class: read it again then
        made = build(job, admission, s.config)
        if made is not None and not suspended and inactive:
            found.create.append(made)  # created as pods are: a refusal is the job's to say (refusals)
        return found
    if admission.deleting:  # deleted by someone: once the job's pods are gone, it goes (and a new one is made)
        if inactive and wl.finalized(workload):
            found.writes.append(Write(workload, "unfinalize", finalizer=wl.FINALIZER, why="deleted, no pod runs"))
        return found
    found.writes += follow(job, admission, s.config, suspended)
    release = (admission.evicted or _differs(job, admission) is not None) and inactive
    found.writes += status_writes(job, admission, s.now, s.status, release)
    return found


def finish(s: Situation) -> list[Write]:
    """The job ended: its Workload finished at once (Kueue releases the quota), then let go; so is any other the job
    owns."""
    message = (st.current_condition(s.status) or {}).get("message") or ""
    reason = "Succeeded" if s.status.get("phase") == st.SUCCEEDED else "Failed"
    current = s.admission.workload if s.admission is not None else None
    return wl.goodbye(current, reason, message, s.now) if current is not None else []


def farewell(r: Remains) -> list[Write]:
    """Workloads of a TrainingJob of this name that is gone: finished (OwnerNotFound) and let go (Kueue's
    FinalizeOrphanedWorkload). And the job's own that are no longer its Workload (made for a queue label since
    removed or changed): finished once no pod of the job runs, so no quota stays held for it."""
    writes = [
        w
        for workload in wl.previous(r.owned, r.job, r.name)
        for w in wl.goodbye(workload, "OwnerNotFound", "The workload's owner no longer exists", r.now)
    ]
    job = r.job
    if job is None or not (r.ended or is_inactive(r.pods, r.lost_nodes)):
        return writes
    current = wl.workload_name(job) if queue_name(job) is not None else None
    for workload in r.owned:
        meta = workload["metadata"]
        if (
            wl.WORKLOADS.holds(workload)
            and owned_by(workload, uid_of(job))
            and meta.get("name") != current
            and not meta.get("deletionTimestamp")
        ):
            writes += wl.goodbye(workload, "NotQueued", "The job no longer names this Workload's queue", r.now)
    return writes


def release(pods: list[Pod], lost_nodes: Collection[str]) -> list[Pod]:
    """Pods created under Kueue's pod integration (before this operator made Workloads), deleted and running nothing
    (finished, never placed, or on a node that is gone), kept only by that integration's finalizer: it goes."""
    return [p for p in pods if legacy_held(p, lost_nodes)]


# ---------------------------------------------------------------------- the job's Workloads


def _differs(job: Job, admission: Admission) -> str | None:
    """Why an admitted Workload no longer matches the job (its queue, replicas, GPUs or resources changed since it was
    made: `wl.shape`), or None. Made by an operator that recorded no shape: its queue and PodSets' names and counts
    are compared. A prebuilt one is Kueue's, made from the job on MultiKueue's manager: never compared."""
    workload = admission.workload
    if workload is None or wl.prebuilt_name(job) or not admission.quota_reserved:
        return None
    recorded = ((workload.get("metadata") or {}).get("annotations") or {}).get(wl.SHAPE_ANNOTATION)
    if recorded is not None:
        same = recorded == wl.shape(job)
    else:
        spec = workload.get("spec") or {}
        admitted = [(p.get("name"), p.get("count")) for p in spec.get("podSets") or []]
        wanted = [(role, s.get("replicas")) for role, s in api.replica_specs(job).items()]
        same = spec.get("queueName") == queue_name(job) and admitted == wanted
    if same:
        return None
    return (
        f"WorkloadChanged: the job's queue, replicas or resources changed since Kueue admitted its Workload "
        f"{workload['metadata']['name']}"
    )


def build(job: Job, admission: Admission, config: OperatorConfig) -> Obj | None:
    """The Workload to make for a job without one: none for MultiKueue's copy on a worker (Kueue made it: the job
    waits until it is seen), without a LocalQueue, or while its priority class cannot be read (its status says why)."""
    if wl.prebuilt_name(job) or admission.cluster_queue is None:
        return None
    if admission.priority is None or admission.priority.problem:
        return None
    return wl.desired_workload(job, templates(job, config), admission.priority)


def templates(job: Job, config: OperatorConfig) -> dict[str, Pod]:
    """A pod of each role as the operator creates it (its first task's): the Workload's PodSets' templates."""
    return {role: builders.desired_pod(job, role, 0, 0, config.progress_url) for role in api.replica_specs(job)}


def follow(job: Job, admission: Admission, config: OperatorConfig, suspended: bool) -> list[Write]:
    """The Workload's metadata and spec, as one merge patch: a prebuilt one adopted, its queue and PodSets following
    the job (not a prebuilt one's: Kueue made it), its activation following the job's suspension."""
    workload = admission.workload
    assert workload is not None
    if wl.prebuilt_name(job):
        parts = [wl.adoption(workload, job)]
    else:
        parts = [wl.spec_update(workload, job, templates(job, config))]
    parts.append(wl.activation(workload, not suspended))
    patch: dict[str, Any] = {}
    for part in parts:
        for key, value in (part or {}).items():
            patch[key] = {**patch.get(key, {}), **value}
    return [Write(workload, "patch", patch, why="follows the job")] if patch else []


def status_writes(job: Job, admission: Admission, now: float, status: dict[str, Any], release: bool) -> list[Write]:
    """PodsReady (from the job's status), and the quota given back (`release`): one status patch."""
    workload = admission.workload
    assert workload is not None
    write = wl.StatusWrite(workload, now)
    write.pods_ready(condition(workload, "Admitted") == "True", _all_ready(job, status))
    if release and admission.quota_reserved:
        write.release()
    return [Write(workload, "status", write.patch, why=write.summary())] if write.patch is not None else []


def _all_ready(job: Job, status: dict[str, Any]) -> bool:
    """Every task's pod ready, or its task finished (Kueue's PodsReady: `count` pods ready or succeeded), from the
    status alone (a MultiKueue manager has nothing else: Kueue's copy of the worker's)."""
    counts = (status.get("replicaStatuses") or {}).values()
    return sum(int(c.get("ready") or 0) + int(c.get("succeeded") or 0) for c in counts) >= len(api.tasks(job))


def is_inactive(pods: list[Pod], lost_nodes: Collection[str]) -> bool:
    """None of the job's pods runs (Kueue's `!job.IsActive()`): every one finished, never placed, or on a node that
    is gone."""
    for pod in pods:
        phase = (pod.get("status") or {}).get("phase")
        node = (pod.get("spec") or {}).get("nodeName")
        if phase not in ("Succeeded", "Failed") and node and node not in lost_nodes:
            return False
    return True


# ---------------------------------------------------------------------- admitted: what each pod gets


@dataclass
class PodSetInfo:
    """What an admission gives the pods of a PodSet (Kueue's podset.PodSetInfo, without Count and Affinity, which
    its Merge does not apply either)."""

    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    scheduling_gates: list[dict[str, str]] = field(default_factory=list)


def flavors_of(workload: Obj | None) -> set[str]:
    """The ResourceFlavors the admission assigned (their node labels and tolerations go on the pods)."""
    assignments = (((workload or {}).get("status") or {}).get("admission") or {}).get("podSetAssignments") or []
    return {name for a in assignments for name in (a.get("flavors") or {}).values()}


def pod_set_infos(admission: Admission) -> dict[str, PodSetInfo]:
    """Each role's PodSetInfo from the admission (getPodSetsInfoFromStatus): paired with the Workload's PodSets by
    index; the flavors' node labels and tolerations; Kueue's labels and annotations; the admission checks' updates."""
    workload = admission.workload or {}
    status, spec = workload.get("status") or {}, workload.get("spec") or {}
    assignments = (status.get("admission") or {}).get("podSetAssignments") or []
    infos: dict[str, PodSetInfo] = {}
    for pod_set, assignment in zip(spec.get("podSets") or [], assignments, strict=False):
        info = PodSetInfo()
        for name in sorted(set((assignment.get("flavors") or {}).values())):
            flavor = (admission.flavors.get(name) or {}).get("spec") or {}
            info.node_selector |= flavor.get("nodeLabels") or {}
            info.tolerations += [t for t in flavor.get("tolerations") or [] if t not in info.tolerations]
        if assignment.get("topologyAssignment") is not None:
            info.scheduling_gates.append({"name": wl.TOPOLOGY_GATE})
            if not _topology_requested(pod_set):
                info.annotations[wl.UNCONSTRAINED_TOPOLOGY] = "true"
        info.annotations[wl.WORKLOAD_ANNOTATION] = workload["metadata"]["name"]
        info.labels[wl.PODSET_LABEL] = pod_set["name"]
        if ((workload.get("metadata") or {}).get("labels") or {}).get(wl.ORIGIN_LABEL):
            info.labels[wl.WORKER_POD_LABEL] = "true"
        info.labels[wl.LOCAL_QUEUE_LABEL] = admission.local_queue
        if admission.cluster_queue and len(admission.cluster_queue) <= 63:
            info.labels[wl.CLUSTER_QUEUE_LABEL] = admission.cluster_queue
        for check in status.get("admissionChecks") or []:
            for update in check.get("podSetUpdates") or []:
                if update.get("name") == pod_set["name"]:
                    info.labels |= update.get("labels") or {}
                    info.annotations |= update.get("annotations") or {}
                    info.node_selector |= update.get("nodeSelector") or {}
                    info.tolerations += [t for t in update.get("tolerations") or [] if t not in info.tolerations]
        infos[pod_set["name"]] = info
    return infos


def _topology_requested(pod_set: dict[str, Any]) -> bool:
    annotations = ((pod_set.get("template") or {}).get("metadata") or {}).get("annotations") or {}
    return any(k.startswith("kueue.x-k8s.io/podset-") and k.endswith("-topology") for k in annotations)


def apply(pod: Pod, info: PodSetInfo | None) -> None:
    """Merge a PodSetInfo into a pod (podset.Merge): labels, annotations, node selector, tolerations, gates."""
    if info is None:
        return
    meta, spec = pod["metadata"], pod["spec"]
    meta["labels"] = {**(meta.get("labels") or {}), **info.labels}
    meta["annotations"] = {**(meta.get("annotations") or {}), **info.annotations}
    if info.node_selector:
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **info.node_selector}
    if info.tolerations:
        tolerations = spec.setdefault("tolerations", [])
        tolerations += [copy.deepcopy(t) for t in info.tolerations if t not in tolerations]
    if info.scheduling_gates:
        gates = spec.setdefault("schedulingGates", [])
        gates += [g for g in info.scheduling_gates if g not in gates]


def legacy_held(pod: Pod, lost_nodes: Collection[str]) -> bool:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if not meta.get("deletionTimestamp") or wl.POD_FINALIZER not in (meta.get("finalizers") or []):
        return False
    node = (pod.get("spec") or {}).get("nodeName")
    return status.get("phase") in ("Succeeded", "Failed") or not node or node in lost_nodes
