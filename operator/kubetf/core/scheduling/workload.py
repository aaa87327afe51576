"""Kueue's Workload, as kubetf makes and writes it for a TrainingJob (the protocol of Kueue's `pkg/controller/
jobframework`, v0.19; docs/kueue.md), pure: its name, its PodSets and priority, what Kueue says of it (`Admission`),
and the job's writes of its status. The integration that uses it is kubetf.core.scheduling.kueue.

The Workload's status is written as Kueue's own job controllers write it with `WorkloadRequestUseMergePatch`: a merge
patch of the status subresource with the resourceVersion read (the whole list of conditions: a merge patch replaces
lists), conditions set as metav1's SetStatusCondition sets them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from kubetf.core import api
from kubetf.core.status import format_time
from kubetf.core.types import Job, Obj, Pod, Resource, Write, controller_of, owned_by, uid_of

Workload = dict[str, Any]

GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
VISIBILITY_GROUP, VISIBILITY_VERSION = "visibility.kueue.x-k8s.io", "v1beta2"  # Kueue's pendingworkloads
QUEUE_LABEL = api.QUEUE_LABEL
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
PREBUILT = "kueue.x-k8s.io/prebuilt-workload-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
ORIGIN_LABEL = "kueue.x-k8s.io/multikueue-origin"
FINALIZER = "kueue.x-k8s.io/resource-in-use"
PODSET_LABEL = "kueue.x-k8s.io/podset"
WORKLOAD_ANNOTATION = "kueue.x-k8s.io/workload"
TOPOLOGY_GATE = "kueue.x-k8s.io/topology"
UNCONSTRAINED_TOPOLOGY = "kueue.x-k8s.io/podset-unconstrained-topology"
LOCAL_QUEUE_LABEL, CLUSTER_QUEUE_LABEL = "kueue.x-k8s.io/local-queue-name", "kueue.x-k8s.io/cluster-queue-name"
WORKER_POD_LABEL = "kueue.x-k8s.io/multikueue-worker-workload-pod"
# What the operator asked of the Workload's spec (its queue and PodSets), so a changed job is seen without comparing
# templates the API server has defaulted.
SPEC_HASH_ANNOTATION = "kubetf.io/workload-spec-hash"
SHAPE_ANNOTATION = "kubetf.io/job-shape"
# Kueue's pod integration's finalizer, on pods the operator created before it followed the job framework (docs/kueue.md,
# "Moving from the pod integration"): removed from such a pod once it is deleted and runs nothing.
POD_FINALIZER = "kueue.x-k8s.io/managed"
MAX_MESSAGE = 32 * 1024


def queue_name(job: Job) -> str | None:
    return ((job.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL) or None


def prebuilt_name(job: Job) -> str | None:
    """The Workload Kueue made for this job (MultiKueue's copy on a worker): the annotation, else the label."""
    meta = job.get("metadata") or {}
    return (meta.get("annotations") or {}).get(PREBUILT) or (meta.get("labels") or {}).get(PREBUILT) or None


def workload_name(job: Job) -> str:
    """The job's Workload: the prebuilt one, else named as Kueue names its own jobs' (GetWorkloadNameForOwnerWithGVK:
    `trainingjob-<name>-<5 hex of sha1(kind, group, name, uid)>`)."""
    return prebuilt_name(job) or workload_name_for(api.name(job), str(job["metadata"].get("uid") or ""))


def workload_name_for(name: str, uid: str, kind: str = api.KIND, group: str = api.GROUP) -> str:
    """Kueue's GenerateWorkloadNameWithExtra without an extra, its ShortWorkloadNames gate off (the default)."""
    digest = hashlib.sha1(f"{kind}\n{group}\n{name}\n{uid}".encode()).hexdigest()[:5]
    return f"{(kind.lower() + '-' + name)[: 253 - 1 - 5]}-{digest}"


# ---------------------------------------------------------------------- the Workload the operator makes


@dataclass(frozen=True)
class Priority:
    """The job's priority as Kueue reads it: the class it comes from (a WorkloadPriorityClass or a PriorityClass)
    and its value. `problem`: why it could not be read (no Workload is made until it can)."""

    ref: dict[str, str] | None = None
    value: int = 0
    problem: str | None = None


def priority_source(job: Job) -> tuple[str, str] | None:
    """What to read for the job's priority: ("WorkloadPriorityClass" | "PriorityClass", name), in Kueue's order."""
    wpc = ((job.get("metadata") or {}).get("labels") or {}).get(PRIORITY_LABEL)
    if wpc:
        return "WorkloadPriorityClass", wpc
    pc = (job.get("spec") or {}).get("priorityClassName")
    return ("PriorityClass", pc) if pc else None


def priority_of(source: tuple[str, str] | None, found: dict[str, Any] | None) -> Priority:
    """The Priority from the class read (`found`; None: it does not exist)."""
    if source is None:
        return Priority()
    kind, name = source
    if found is None:
        where = f"the label {PRIORITY_LABEL}" if kind == "WorkloadPriorityClass" else "spec.priorityClassName"
        return Priority(problem=f"{kind} {name} (from {where}) does not exist: create it or fix {where}")
    group = GROUP if kind == "WorkloadPriorityClass" else "scheduling.k8s.io"
    return Priority({"group": group, "kind": kind, "name": name}, int(found.get("value") or 0))


def pod_sets(job: Job, templates: dict[str, Pod]) -> list[dict[str, Any]]:
    """One PodSet per role, in TF_CONFIG's order, never changed (the admission's assignments pair with them by
    index): its count and the template of its pods (`templates`: a pod of each role as the operator creates it)."""
    sets = []
    for role, spec in api.replica_specs(job).items():
        pod = templates[role]
        meta = {k: v for k, v in (pod.get("metadata") or {}).items() if k in ("labels", "annotations")}
        sets.append({"name": role, "count": spec["replicas"], "template": {"metadata": meta, "spec": pod["spec"]}})
    return sets


def _spec_hash(spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def shape(job: Job) -> str:
    """What of the job its admission depends on, as the user wrote it: its queue and, per role, its replicas, GPUs and
    containers' resources. The Workload records it when made and when it follows the job (`SHAPE_ANNOTATION`); an
    admitted Workload of another shape no longer matches the job (Kueue's EquivalentToWorkload). Read from the job,
    never from the pods the operator builds, so an operator that builds its pods differently (an upgrade: another
    variable, another label) leaves every admitted job running."""
    roles = []
    for role, spec in api.replica_specs(job).items():
        pod_spec = (spec.get("template") or {}).get("spec") or {}
        containers = [c for key in ("initContainers", "containers") for c in pod_spec.get(key) or []]
        resources = [(c.get("name"), c.get("resources") or {}) for c in containers]
        roles.append({"name": role, "replicas": spec.get("replicas"), "gpus": spec.get("gpus"), "resources": resources})
    return _spec_hash({"queueName": queue_name(job), "roles": roles})


def desired_workload(job: Job, templates: dict[str, Pod], priority: Priority) -> Workload:
    """The job's Workload, as Kueue's jobframework builds one for its own job types (ConstructWorkload), with the
    operator's labels (its watch selects them) and the hash of the spec it asked for."""
    meta = job["metadata"]
    owner = {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": api.name(job), "uid": meta.get("uid")}
    spec: dict[str, Any] = {"queueName": queue_name(job), "podSets": pod_sets(job, templates)}
    labels = {api.LABEL_MANAGED_BY: api.MANAGER, api.LABEL_JOB: api.name(job), JOB_UID_LABEL: str(meta.get("uid"))}
    workload = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Workload",
        "metadata": {
            "name": workload_name(job),
            "namespace": api.namespace(job),
            "labels": labels,
            "annotations": {SPEC_HASH_ANNOTATION: _spec_hash(spec), SHAPE_ANNOTATION: shape(job)},
            "finalizers": [FINALIZER],
            "ownerReferences": [{**owner, "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": spec,
    }
    if priority.ref is not None:
        spec["priorityClassRef"] = priority.ref
        spec["priority"] = priority.value
    return workload


def spec_update(workload: Workload, job: Job, templates: dict[str, Pod]) -> dict[str, Any] | None:
    """A job changed while its Workload holds no quota (its queue label, its replicas or templates): the Workload's
    queue and PodSets follow (updateWorkloadToMatchJob). Under a reservation they are immutable: the running job
    keeps what it was admitted with, and the change reaches the Workload once the reservation is given back."""
    if condition(workload, "QuotaReserved") == "True":
        return None
    spec = {"queueName": queue_name(job), "podSets": pod_sets(job, templates)}
    digest = _spec_hash(spec)
    if ((workload.get("metadata") or {}).get("annotations") or {}).get(SPEC_HASH_ANNOTATION) == digest:
        return None
    return {"metadata": {"annotations": {SPEC_HASH_ANNOTATION: digest, SHAPE_ANNOTATION: shape(job)}}, "spec": spec}


def adoption(workload: Workload, job: Job) -> dict[str, Any] | None:
    """A prebuilt Workload (MultiKueue's on a worker) made the job's own, as Kueue's EnsurePrebuiltWorkloadOwnership:
    a merge patch of its metadata; None when it is the job's already or another's (`adoptable`)."""
    if controller_of(workload) is not None:
        return None
    meta = job["metadata"]
    owner = {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": api.name(job), "uid": meta.get("uid"),
             "controller": True, "blockOwnerDeletion": True}  # fmt: skip
    others = list((workload.get("metadata") or {}).get("ownerReferences") or [])
    labels = {
        JOB_UID_LABEL: str(meta.get("uid") or ""),
        api.LABEL_MANAGED_BY: api.MANAGER,
        api.LABEL_JOB: api.name(job),
    }
    return {"metadata": {"labels": labels, "ownerReferences": [*others, owner]}}


def adoptable(workload: Workload, job: Job) -> bool:
    """The job's prebuilt Workload, not another object's."""
    owner = controller_of(workload)
    return workload["metadata"].get("name") == prebuilt_name(job) and (owner is None or owned_by(workload, uid_of(job)))


# ---------------------------------------------------------------------- what Kueue says of it


def condition(obj: dict[str, Any] | None, type_: str, key: str = "status") -> str | None:
    for found in ((obj or {}).get("status") or {}).get("conditions") or []:
        if found.get("type") == type_:
            return str(found.get(key) or "")
    return None


@dataclass(frozen=True)
class Admission:
    """What the cluster says of a queued job: its LocalQueue (and ClusterQueue) and its Workload, from the operator's
    watches, and its place in the ClusterQueue from Kueue's visibility API (where served)."""

    local_queue: str
    cluster_queue: str | None  # None: no such LocalQueue in the job's namespace
    installed: bool = True  # False: the cluster has no Kueue API at all
    workload: Workload | None = None  # the job's Workload; None: not made (yet)
    position: int | None = None  # Kueue's positionInClusterQueue (0: next); None: not known
    # For a job without its Workload: its priority, read from its class; for an admitted one: the ResourceFlavors its
    # admission assigned (their node labels and tolerations go on its pods), by name.
    priority: Priority | None = None
    flavors: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def quota_reserved(self) -> bool:
        return condition(self.workload, "QuotaReserved") == "True"

    @property
    def evicted(self) -> bool:
        return condition(self.workload, "Evicted") == "True"

    @property
    def finished(self) -> bool:
        return condition(self.workload, "Finished") == "True"

    @property
    def deleting(self) -> bool:
        return bool(((self.workload or {}).get("metadata") or {}).get("deletionTimestamp"))

    @property
    def admitted(self) -> bool:
        """Its pods may run: admitted (quota reserved, every admission check ready), and not being evicted, finished
        or deleted."""
        return (
            condition(self.workload, "Admitted") == "True"
            and not self.evicted
            and not self.finished
            and not self.deleting
        )

    @property
    def admitted_at(self) -> str | None:
        """When Kueue admitted the Workload (its Admitted condition's lastTransitionTime), while it is admitted."""
        return condition(self.workload, "Admitted", "lastTransitionTime") if self.admitted else None

    @property
    def active(self) -> bool:
        return ((self.workload or {}).get("spec") or {}).get("active", True) is not False

    def eviction(self) -> str:
        """Why the job's pods are stopped: Kueue's Evicted condition, or its Workload deleted or not admitted."""
        if self.evicted:
            reason = condition(self.workload, "Evicted", "reason") or "Evicted"
            message = condition(self.workload, "Evicted", "message") or ""
            return f"{reason} by Kueue: {message}".rstrip(": ")
        if self.workload is None:
            return (
                "NoWorkload: the pods of a queued job without a Workload of its own (made under Kueue's pod "
                "integration: docs/kueue.md)"
            )
        name = self.workload["metadata"]["name"]
        if self.deleting:
            return f"WorkloadDeleted: its Workload {name} was deleted"
        return f"NotAdmitted: its Workload {name} is not admitted by Kueue"

    def waiting(self, job: Job) -> tuple[str, str]:
        """(reason, message) of a job that waits for Kueue."""
        queue = f"LocalQueue {self.local_queue}"
        if not self.installed:
            return "KueueNotInstalled", (
                f"the label {QUEUE_LABEL} asks for Kueue, but the cluster has no Kueue API ({GROUP}): "
                "install Kueue or remove the label"
            )
        if self.workload is None and self.cluster_queue is None:
            return "LocalQueueNotFound", (
                f"{queue} does not exist in namespace {api.namespace(job)}: create it, or fix the label "
                f"{QUEUE_LABEL} (kubectl get localqueues -n {api.namespace(job)})"
            )
        if self.workload is None and self.priority is not None and self.priority.problem:
            return "PriorityClassNotFound", f"its Workload cannot be made: {self.priority.problem}"
        prebuilt = prebuilt_name(job)
        if self.workload is None and prebuilt:
            return "Queued", f"waiting for Workload {prebuilt}, which Kueue made for this job (MultiKueue)"
        where = f"{queue} (ClusterQueue {self.cluster_queue})" if self.cluster_queue else queue
        size = len(api.tasks(job))
        place = ""
        if self.position is not None:
            place = (
                "; next in its ClusterQueue" if self.position == 0 else f"; {self.position} ahead in its ClusterQueue"
            )
        if self.workload is None:
            return "Queued", f"waiting in {where} for Kueue to admit all {size} pods{place}"
        name = self.workload["metadata"]["name"]
        return "Queued", f"waiting in {where} for Kueue to admit all {size} pods (Workload {name}){place}{_words(self)}"


def _words(admission: Admission) -> str:
    """Kueue's own explanation: why it was evicted, and why it is not admitted yet."""
    workload = admission.workload
    parts = []
    if not admission.active:
        parts.append("the Workload is deactivated (spec.active: false): Kueue admits it once it is active again")
    if admission.evicted:
        parts.append(f"evicted: {condition(workload, 'Evicted', 'message')}")
    if condition(workload, "QuotaReserved") == "False":
        parts.append(condition(workload, "QuotaReserved", "message") or "")
    if condition(workload, "Requeued") == "False":
        parts.append(f"requeue: {condition(workload, 'Requeued', 'message')}")
    checks = [c for c in (workload or {}).get("status", {}).get("admissionChecks") or [] if c.get("state") != "Ready"]
    parts += [f"admission check {c.get('name')}: {c.get('state')} {c.get('message') or ''}".strip() for c in checks]
    parts = [p for p in parts if p]
    return ": " + "; ".join(parts) if parts else ""


def _set(conditions: list[dict[str, Any]], new: dict[str, Any], now: float, generation: int | None) -> None:
    """metav1's SetStatusCondition: lastTransitionTime moves only when the status does."""
    new = {**new, "message": str(new.get("message") or "")[:MAX_MESSAGE]}
    if generation is not None:
        new["observedGeneration"] = generation
    for found in conditions:
        if found.get("type") == new["type"]:
            if found.get("status") != new["status"]:
                found["lastTransitionTime"] = format_time(now)
            found.update(new)
            return
    conditions.append({**new, "lastTransitionTime": format_time(now)})


class StatusWrite:
    """The job's changes to its Workload's status in one reconcile, made on a copy and written as one merge patch
    (`patch`): several writes with the same resourceVersion would conflict with each other."""

    def __init__(self, workload: Workload, now: float) -> None:
        self.before = workload
        self.conditions = [dict(c) for c in (workload.get("status") or {}).get("conditions") or []]
        self.clear_admission = False
        self.now = now
        self.generation = workload["metadata"].get("generation")

    def _has(self, type_: str, key: str = "status") -> str | None:
        found = next((c for c in self.conditions if c.get("type") == type_), None)
        return None if found is None else str(found.get(key) or "")

    def _set(self, new: dict[str, Any]) -> None:
        _set(self.conditions, new, self.now, self.generation)

    def pods_ready(self, admitted: bool, ready: bool) -> None:
        """The PodsReady condition (generatePodsReadyCondition): True (Started, or Recovered after a recovery) when
        all of the job's pods run and are ready; False WaitForStart before and while not admitted, WaitForRecovery
        once an admitted job lost one. Written only when its status or reason changes, and not before the first
        admission: Kueue reads no condition as WaitForStart (a write per new Workload saved)."""
        before_status, before_reason = self._has("PodsReady"), self._has("PodsReady", "reason")
        if not admitted and before_status is None:
            return
        if admitted and ready:
            reason = "Recovered" if before_reason in ("WaitForRecovery", "Recovered") else "Started"
            new = {"type": "PodsReady", "status": "True", "reason": reason,
                   "message": "All pods reached readiness and the workload is running"}  # fmt: skip
        elif admitted and (before_status == "True" or before_reason == "WaitForRecovery"):
            new = {"type": "PodsReady", "status": "False", "reason": "WaitForRecovery",
                   "message": "At least one pod has failed, waiting for recovery"}  # fmt: skip
        else:
            new = {"type": "PodsReady", "status": "False", "reason": "WaitForStart",
                   "message": "Not all pods are ready or succeeded"}  # fmt: skip
        if (before_status, before_reason) != (new["status"], new["reason"]):
            self._set(new)

    def release(self) -> None:
        """An evicted job's quota given back once none of its pods runs (UnsetQuotaReservationWithCondition): no
        admission, QuotaReserved and Admitted False; Requeued True after a preemption (back in line at once), False
        otherwise (Kueue requeues it after its backoff, or once reactivated)."""
        reason = self._has("Evicted", "reason") or "Pending"
        message = self._has("Evicted", "message") or ""
        requeued = "True" if reason in ("Preempted", "NodeFailures") else "False"
        self._set({"type": "Requeued", "status": requeued, "reason": reason, "message": message})
        self._set({"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": message})
        self._set({"type": "Admitted", "status": "False", "reason": "NoReservation",
                   "message": "The workload has no reservation"})  # fmt: skip
        self.clear_admission = True

    def finish(self, reason: str, message: str) -> None:
        """Finished (Succeeded, Failed, OwnerNotFound): Kueue releases the quota at once."""
        if self._has("Finished") != "True":
            self._set({"type": "Finished", "status": "True", "reason": reason, "message": message})

    def summary(self) -> str:
        """What the write changes, for the operator's log."""
        before = {c.get("type"): (c.get("status"), c.get("reason")) for c in (self.before.get("status") or {}).get(
            "conditions") or []}  # fmt: skip
        changed = [f"{c['type']}={c['status']} ({c.get('reason')})" for c in self.conditions
                   if before.get(c["type"]) != (c.get("status"), c.get("reason"))]  # fmt: skip
        if self.clear_admission:
            changed.append("admission cleared (quota given back)")
        return ", ".join(changed)

    @property
    def patch(self) -> dict[str, Any] | None:
        """The merge patch of the status subresource; None when nothing changed."""
        before = (self.before.get("status") or {}).get("conditions") or []
        admission = (self.before.get("status") or {}).get("admission")
        clear = self.clear_admission and admission is not None
        if self.conditions == before and not clear:
            return None
        status: dict[str, Any] = {"conditions": self.conditions}
        if clear:
            status["admission"] = None
        return {"status": status}


def activation(workload: Workload, active: bool) -> dict[str, Any] | None:
    """A suspended job's Workload deactivated (Kueue evicts it and it waits outside the queue), a resumed one's
    active again; None when it is so already."""
    if ((workload.get("spec") or {}).get("active", True) is not False) == active:
        return None
    return {"spec": {"active": active}}


def finalized(workload: Workload) -> bool:
    return FINALIZER in ((workload.get("metadata") or {}).get("finalizers") or [])


def goodbye(workload: Workload, reason: str, message: str, now: float) -> list[Write]:
    """A Workload whose job is done with it: finished (its quota released), then its finalizer removed."""
    writes = []
    status = StatusWrite(workload, now)
    status.finish(reason, message)
    if status.patch is not None:
        writes.append(Write(workload, "status", status.patch, why=f"Finished: {reason}"))
    if finalized(workload):
        writes.append(Write(workload, "unfinalize", finalizer=FINALIZER, why="its job is done with it"))
    return writes


def slim(workload: Obj) -> Obj:
    """What the decisions read of a Workload: identity, owners, labels and finalizers; its activation, queue and
    PodSets (names, counts, topology requests); its conditions (all of them: a status write sends the whole list
    back), admission (flavors, topology), admission checks and the cluster MultiKueue dispatched it to."""
    meta = workload.get("metadata") or {}
    kept_meta = ("name", "namespace", "uid", "generation", "deletionTimestamp", "finalizers", "ownerReferences")
    slim_meta: Obj = {k: meta[k] for k in kept_meta if k in meta}
    slim_meta["labels"] = {k: v for k, v in (meta.get("labels") or {}).items() if k in (api.LABEL_JOB, ORIGIN_LABEL)}
    kept_annotations = (SPEC_HASH_ANNOTATION, SHAPE_ANNOTATION)
    recorded = {k: v for k, v in (meta.get("annotations") or {}).items() if k in kept_annotations}
    if recorded:
        slim_meta["annotations"] = recorded
    spec = workload.get("spec") or {}
    pod_sets_ = []
    for pod_set in spec.get("podSets") or []:
        annotations = ((pod_set.get("template") or {}).get("metadata") or {}).get("annotations") or {}
        topology = {k: v for k, v in annotations.items() if k.startswith("kueue.x-k8s.io/podset-")}
        slim_set: Obj = {"name": pod_set.get("name"), "count": pod_set.get("count")}
        if topology:
            slim_set["template"] = {"metadata": {"annotations": topology}}
        pod_sets_.append(slim_set)
    slim_spec = {k: spec[k] for k in ("active", "queueName") if k in spec} | {"podSets": pod_sets_}
    status = workload.get("status") or {}
    slim_status: Obj = {"conditions": list(status.get("conditions") or [])}
    assignments = (status.get("admission") or {}).get("podSetAssignments")
    if assignments is not None:
        slim_status["admission"] = {
            "podSetAssignments": [
                {k: a[k] for k in ("name", "flavors", "count", "topologyAssignment") if k in a} for a in assignments
            ]
        }
    for key in ("admissionChecks", "clusterName"):
        if status.get(key):
            slim_status[key] = status[key]
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Workload", "metadata": slim_meta, "spec": slim_spec,
            "status": slim_status}  # fmt: skip


WORKLOADS = Resource(GROUP, VERSION, "workloads", "Workload", slim, urgent=True)


def previous(workloads: list[Obj], job: Job | None, name: str) -> list[Obj]:
    """Workloads of a TrainingJob of this name that is gone (`job` None, or another incarnation now): Kueue's
    FinalizeOrphanedWorkload finishes them (OwnerNotFound, their quota released) and drops their finalizer. Only
    those whose controller is provably such a job: a TrainingJob of this name, of another uid. One owned by nothing
    or by anything else is never touched, whatever its labels."""
    uid = uid_of(job) if job is not None else None
    found = []
    for workload in workloads:
        owner = controller_of(workload) or {}
        if (
            workload.get("kind") == "Workload"
            and str(workload.get("apiVersion", "")).startswith(f"{GROUP}/")
            and owner.get("kind") == api.KIND
            and owner.get("name") == name
            and str(owner.get("apiVersion", "")).startswith(f"{api.GROUP}/")
            and owner.get("uid")
            and owner.get("uid") != uid
        ):
            found.append(workload)
    return found
