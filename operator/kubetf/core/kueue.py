"""Kueue's plain-pod groups: what a queued job's pods carry, what Kueue's marks on them mean, and how the
operator's restarts keep the job's admission. Pure functions.

Kueue (kueue.x-k8s.io, checked against v0.19's pkg/controller/jobs/pod) admits pods another controller creates
when they carry a LocalQueue and a group: its webhook gates each pod, builds one Workload for the group once all
of its pods exist, and ungates them when the Workload is admitted; pods created later while it stays admitted are
ungated too. The protocol the operator follows (docs/kueue.md, "How it works"):

- every pod of a job labelled with a LocalQueue carries the queue, the job's group (its name and uid: stable
  across restarts, never shared with a previous job of the same name) and the group's size, every replica of
  every role; `spec.priorityClassName` becomes the pods' PriorityClass, the label `kueue.x-k8s.io/priority-class`
  (a WorkloadPriorityClass) is copied;
- Kueue preempts or evicts by marking every pod `TerminationTarget` and deleting them: a disruption of the whole
  job, which is then Queued again with new (gated) pods in the same group;
- Kueue keeps its finalizer on a finished pod until a replacement exists, but a replacement of the same name can
  exist only once the old pod is gone: the operator removes that finalizer from its own deleted pods once they
  run nothing, as Kueue's StatefulSet integration does. It keeps one while no other pod of the group exists: the
  group's Workload, and so its admission, lives as long as one of its pods does;
- at the end (success, failure, suspension, deletion) every pod gets `retriable-in-group: "false"`: Kueue then
  finishes the Workload and releases its quota as soon as no pod runs.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from kubetf.core import api
from kubetf.core import status as st
from kubetf.core.api import Job

Pod = dict[str, Any]

QUEUE_LABEL = api.QUEUE_LABEL
GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
RETRIABLE_ANNOTATION = "kueue.x-k8s.io/retriable-in-group"
FINALIZER = "kueue.x-k8s.io/managed"
GATE = "kueue.x-k8s.io/admission"
GROUP_WORKLOAD_ANNOTATION = "kueue.x-k8s.io/is-group-workload"  # "true" on the Workload of a plain-pod group
TERMINATION_TARGET = "TerminationTarget"  # the pod condition Kueue sets on every pod it stops
GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
GROUP_UID_CHARS = 8  # of the job's uid in its group's name
VISIBILITY_GROUP, VISIBILITY_VERSION = "visibility.kueue.x-k8s.io", "v1beta2"  # Kueue's pendingworkloads

# spec.managedBy: unset or ours means this operator; MultiKueue dispatches the job to a worker cluster instead.
MANAGED_BY_OPERATOR = "kubetf.io/operator"
MANAGED_BY_MULTIKUEUE = "kueue.x-k8s.io/multikueue"


def queue_name(job: Job) -> str | None:
    return ((job.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL) or None


def managed_here(job: Job) -> bool:
    return (job.get("spec") or {}).get("managedBy") in (None, "", MANAGED_BY_OPERATOR)


def group_name(job: Job) -> str:
    """The job's pod group, which names its Workload: the job's name and the start of its uid (a label value)."""
    return group_name_for(api.name(job), job["metadata"].get("uid", ""))


def group_name_for(job_name: str, job_uid: str) -> str:
    """The pod group of the job of that name and uid (`group_name`)."""
    uid = job_uid[:GROUP_UID_CHARS]
    return f"{job_name[: 62 - len(uid)]}-{uid}"


def pod_group(pod: Pod) -> str | None:
    """The group a pod of ours carries, when it is the group of the job that owns the pod (its controller's uid):
    never a group the pod names for anything else."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    group, job_name = labels.get(GROUP_LABEL), labels.get(api.LABEL_JOB)
    owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller")]
    if not group or not job_name or not owners:
        return None
    return group if group == group_name_for(job_name, owners[0].get("uid") or "") else None


def group_size(job: Job) -> int:
    return len(api.tasks(job))


def pod_metadata(job: Job) -> tuple[dict[str, str], dict[str, str]]:
    """Labels and annotations that put a queued job's pod in its group; nothing for a job without a queue."""
    queue = queue_name(job)
    if queue is None:
        return {}, {}
    labels = {QUEUE_LABEL: queue, GROUP_LABEL: group_name(job)}
    priority = (job["metadata"].get("labels") or {}).get(PRIORITY_LABEL)
    if priority:
        labels[PRIORITY_LABEL] = priority
    return labels, {TOTAL_ANNOTATION: str(group_size(job))}


def is_gated(pod: Pod) -> bool:
    return any(g.get("name") == GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def termination_target(pod: Pod) -> str | None:
    """Why Kueue is stopping the pod (preempted, evicted, its Workload deleted), or None."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == TERMINATION_TARGET and condition.get("status") == "True":
            reason = condition.get("reason") or "Stopped"
            return f"{reason} by Kueue: {condition.get('message', '')}".rstrip(": ")
    return None


def _finalized_by_kueue(pod: Pod) -> bool:
    return FINALIZER in ((pod.get("metadata") or {}).get("finalizers") or [])


def held(pod: Pod, lost_nodes: Collection[str]) -> bool:
    """Deleted, running nothing (finished, never placed on a node, or on a node that is gone), and kept only for
    Kueue's bookkeeping by its finalizer."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if not meta.get("deletionTimestamp") or not _finalized_by_kueue(pod):
        return False
    node = (pod.get("spec") or {}).get("nodeName")
    return status.get("phase") in ("Succeeded", "Failed") or not node or node in lost_nodes


def to_release(
    pods: list[Pod],
    lost_nodes: Collection[str],
    ending: bool,
    staying: list[Pod] | None = None,
    workload: dict[str, Any] | None = None,
) -> list[Pod]:
    """The held pods whose finalizer the operator removes, so that their names are free for replacements.

    While the job goes on, the group's Workload must outlive the restart. It is owned by the group's pods (Kueue
    adds each new pod as an owner) and garbage-collected once no owner is left. `staying`: the pods that stay (of
    the tasks' current attempts, not being deleted); one held pod that owns the Workload is kept until a staying
    pod does, or, before Kueue made a Workload, until a staying pod exists."""
    releasable = sorted((p for p in pods if held(p, lost_nodes)), key=lambda p: p["metadata"]["name"])
    if ending or not releasable:
        return releasable
    staying = staying or []
    if workload is None:
        return releasable if staying else releasable[1:]
    owners = {o.get("uid") for o in workload["metadata"].get("ownerReferences") or []}
    if any(p["metadata"].get("uid") in owners for p in staying):
        return releasable
    keep = next((p for p in releasable if p["metadata"].get("uid") in owners), releasable[0])
    return [p for p in releasable if p is not keep]


def needs_unretriable(pods: list[Pod]) -> list[Pod]:
    """Pods of an ending job still without `retriable-in-group: "false"`: with it Kueue finishes the group's
    Workload once no pod runs, rather than waiting for replacements that will never come."""
    return [
        p
        for p in pods
        if _finalized_by_kueue(p) and ((p["metadata"].get("annotations") or {}).get(RETRIABLE_ANNOTATION) != "false")
    ]


def bookkeeping(
    job: Job,
    status: dict[str, Any],
    pods: list[Pod],
    deleting: list[Pod],
    lost_nodes: Collection[str],
    ending: bool,
    workload: dict[str, Any] | None,
) -> tuple[list[Pod], list[Pod]]:
    """Kueue's side of a plan: (the pods to mark not to be replaced, those whose finalizer to remove). A job that
    ends (`ending`) marks its pods, so Kueue finishes its Workload and releases the quota; deleted pods that run
    nothing are released, so their names are free for replacements and an ending job's pods are gone at once.
    `deleting`: the pods the plan deletes now."""
    if not any(_finalized_by_kueue(p) for p in pods):
        return [], []  # no pod of the job is Kueue's
    group = group_name(job)
    ours = [p for p in pods if ((p.get("metadata") or {}).get("labels") or {}).get(GROUP_LABEL) == group]
    others = [p for p in pods if p not in ours]  # a previous job's of the same name: its group has ended
    views, _ = st.observe(dict(job, status=status), ours)
    staying = [v.pod for v in views.values() if v.pod is not None and not st.is_deleting(v.pod)]
    staying = [p for p in staying if not any(p is d for d in deleting)]
    release = to_release(ours, lost_nodes, ending, staying, workload) + to_release(others, lost_nodes, ending=True)
    return (needs_unretriable(pods) if ending else []), release


def orphaned(workloads: list[dict[str, Any]], pods: list[Pod]) -> list[dict[str, Any]]:
    """The Workloads of an ended job's pod groups (deleted, suspended, finished) that no pod of it owns any more and
    Kueue has not finished: they would hold their quota until the garbage collector notices they have no owner,
    in its own time. The operator deletes them at once (Kueue lets a deleted Workload go, and its quota with it).

    `workloads`: those named exactly for the job's own groups (its uid's, and those its own pods carry: the cache
    finds them by name, never by a prefix); one owned by anything but a pod is not a pod group's, whatever its
    name, and stays."""
    uids = {p["metadata"].get("uid") for p in pods}
    return [
        w
        for w in workloads
        if _condition(w, "Finished") != "True"
        and all(o.get("kind") == "Pod" and o.get("uid") not in uids for o in w["metadata"].get("ownerReferences") or [])
    ]


def farewell(pods: list[Pod], lost_nodes: Collection[str]) -> tuple[list[Pod], list[Pod]]:
    """A deleted job's pods go with it (garbage collection): with Kueue's finalizer they would stay, and hold the
    quota, until Kueue finishes their group. (To mark not to be replaced, to release.)"""
    pods = [p for p in pods if _finalized_by_kueue(p)]
    return needs_unretriable(pods), to_release(pods, lost_nodes, ending=True)


def waits_for_admission(views: dict[str, st.TaskView], admission: Admission | None) -> bool:
    """The job cannot run until Kueue admits its group: its LocalQueue is missing, or its group is not admitted and
    its pods are gated (or, none left, will be when created). A restart under an admitted group never waits: Kueue
    ungates the replacements at once."""
    if admission is None or not admission.installed or st.all_running(views):
        return False
    if admission.cluster_queue is None:
        return True  # Kueue cannot admit it: say why, whatever the pods show
    if admission.admitted:
        return False
    current = [v.pod for v in views.values() if v.pod is not None and not st.is_deleting(v.pod)]
    return not current or any(is_gated(p) for p in current)


def previous_runs_workload(admission: Admission | None, pods: list[Pod]) -> bool:
    """A resumed job's group still names the finished Workload of its run before the suspension until Kueue's
    pods are gone and it is garbage-collected: pods created meanwhile would join a finished Workload, never to
    be admitted."""
    return admission is not None and admission.finished and not pods


# ---------------------------------------------------------------------- admission, as the operator reads it


@dataclass(frozen=True)
class Admission:
    """What the cluster says of a queued job's admission: its LocalQueue and its group's Workload, read from the
    operator's watches, and its place in the ClusterQueue from Kueue's visibility API (where served)."""

    local_queue: str
    cluster_queue: str | None  # None: no such LocalQueue in the job's namespace
    installed: bool = True  # False: the cluster has no Kueue API at all
    workload: dict[str, Any] | None = None  # the group's Workload; None: not created (yet)
    position: int | None = None  # Kueue's positionInClusterQueue (0: next); None: not known
    stopped: bool = False  # Kueue is stopping the job's pods (TerminationTarget): whatever the Workload still says

    @property
    def admitted(self) -> bool:
        """Admitted, and not being evicted: an evicted Workload stays Admitted until its pods are gone."""
        return (
            _condition(self.workload, "Admitted") == "True"
            and _condition(self.workload, "Evicted") != "True"
            and not self.finished
            and not self.stopped
        )

    @property
    def admitted_at(self) -> str | None:
        """When Kueue admitted the Workload (its Admitted condition's lastTransitionTime), while it is admitted."""
        return _condition(self.workload, "Admitted", "lastTransitionTime") if self.admitted else None

    @property
    def finished(self) -> bool:
        return _condition(self.workload, "Finished") == "True"

    def waiting(self, job: Job) -> tuple[str, str]:
        """(reason, message) of a job whose pods wait for admission."""
        queue = f"LocalQueue {self.local_queue}"
        if not self.installed:
            return "KueueNotInstalled", (
                f"the label {QUEUE_LABEL} asks for Kueue, but the cluster has no Kueue API ({GROUP}): "
                "install Kueue or remove the label"
            )
        if self.cluster_queue is None:
            return "LocalQueueNotFound", (
                f"{queue} does not exist in namespace {api.namespace(job)}: create it, or fix the label "
                f"{QUEUE_LABEL} (kubectl get localqueues -n {api.namespace(job)})"
            )
        where = f"{queue} (ClusterQueue {self.cluster_queue})"
        size = group_size(job)
        place = ""
        if self.position is not None:
            place = (
                "; next in its ClusterQueue" if self.position == 0 else f"; {self.position} ahead in its ClusterQueue"
            )
        if self.workload is None:
            return "Queued", f"waiting in {where} for Kueue to admit all {size} pods{place}"
        words = _kueue_words(self.workload)
        name = self.workload["metadata"]["name"]
        return "Queued", f"waiting in {where} for Kueue to admit all {size} pods (Workload {name}){place}{words}"


def _condition(obj: dict[str, Any] | None, type_: str, field: str = "status") -> str | None:
    for condition in ((obj or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == type_:
            return str(condition.get(field) or "")
    return None


def _kueue_words(workload: dict[str, Any]) -> str:
    """Kueue's own explanation: why it was evicted, and why it is not admitted yet."""
    parts = []
    if _condition(workload, "Evicted") == "True":
        parts.append(f"evicted: {_condition(workload, 'Evicted', 'message')}")
    if _condition(workload, "QuotaReserved") == "False":
        parts.append(_condition(workload, "QuotaReserved", "message") or "")
    if _condition(workload, "Requeued") == "False":
        parts.append(f"requeue: {_condition(workload, 'Requeued', 'message')}")
    parts = [p for p in parts if p]
    return ": " + "; ".join(parts) if parts else ""
