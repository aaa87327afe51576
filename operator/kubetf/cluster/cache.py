"""What the watches delivered: every TrainingJob, the pods of each job, Kueue's LocalQueues and the jobs' Workloads,
and the jobs' gang PodGroups, so reconciles read no API.

Objects are kept slim (only the fields the decisions read) and as compact JSON: at 10,000 jobs and 50,000 pods
parsed dicts would cost several hundred MiB, strings a fraction of that. A reconcile parses the few it needs.
An event older than what is stored (by resourceVersion) is ignored: a write's own response may arrive first.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from kubetf.core import api, gang, kueue, policy
from kubetf.core import status as st

Key = tuple[str, str]  # (namespace, name)
Obj = dict[str, Any]

_DROPPED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)


def resource_version(obj: Mapping[str, Any]) -> int:
    """etcd's revision: resourceVersions are opaque by contract, integers in every API server that exists."""
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


def slim_job(job: Mapping[str, Any]) -> Obj:
    meta = {k: v for k, v in (job.get("metadata") or {}).items() if k != "managedFields"}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in _DROPPED_ANNOTATIONS}
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    return {"apiVersion": job.get("apiVersion"), "kind": job.get("kind"), "metadata": meta, **_rest(job)}


def changed_besides_status(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    """Whether `after` (a newer version of the job) differs from `before` in more than its status: what a user or
    another controller changed (spec, labels, annotations, deletion) between the two."""

    def unversioned(job: Mapping[str, Any]) -> Obj:
        slim = slim_job(job)
        slim.pop("status", None)
        slim["metadata"] = {k: v for k, v in slim["metadata"].items() if k not in ("resourceVersion", "generation")}
        return slim

    return unversioned(before) != unversioned(after)


def _rest(job: Mapping[str, Any]) -> Obj:
    rest = {k: job[k] for k in ("spec", "status") if k in job}
    progress = (rest.get("status") or {}).get("progress")
    if isinstance(progress, dict) and "history" in progress:  # the curve: the bulk of a job, read by no decision
        rest["status"] = {**rest["status"], "progress": {k: v for k, v in progress.items() if k != "history"}}
    return rest


def slim_pod(pod: Mapping[str, Any]) -> Obj:
    """The fields status.py, policy.py, sigterm.py and gang.py read: identity, labels, the deletion, the containers'
    names, the gang's PodGroup, the status."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    kept_meta = ("name", "namespace", "uid", "resourceVersion", "labels", "creationTimestamp", "deletionTimestamp")
    slim_meta = {k: meta[k] for k in (*kept_meta, "deletionGracePeriodSeconds") if k in meta}
    controller = [
        {"apiVersion": o.get("apiVersion"), "kind": o.get("kind"), "name": o.get("name"), "uid": o.get("uid"),
         "controller": True}
        for o in meta.get("ownerReferences") or [] if o.get("controller")
    ]  # fmt: skip
    if controller:
        slim_meta["ownerReferences"] = controller[:1]  # whose it is: this job's, a previous one's, or another's
    # Finalizers: Kueue's pod integration's (kubetf.core.kueue.legacy_held), and whether a forced deletion removes
    # the pod at once (executor).
    if meta.get("finalizers"):
        slim_meta["finalizers"] = list(meta["finalizers"])
    # The gang's PodGroup the pod is in (gang.pod_group): an older generation's is deleted once no pod is in it.
    group = (meta.get("annotations") or {}).get(gang.VOLCANO_GROUP_ANNOTATION)
    if group:
        slim_meta["annotations"] = {gang.VOLCANO_GROUP_ANNOTATION: group}
    slim_spec: Obj = {"containers": [{"name": c.get("name")} for c in spec.get("containers") or []]}
    for name in ("nodeName", "schedulingGroup"):
        if spec.get(name):
            slim_spec[name] = spec[name]
    slim_status = {
        k: status[k]
        for k in ("phase", "reason", "message", "conditions", "containerStatuses", "initContainerStatuses")
        if k in status
    }
    for key in ("containerStatuses", "initContainerStatuses"):
        if key in slim_status:
            slim_status[key] = [{k: c[k] for k in ("name", "ready", "state") if k in c} for c in slim_status[key] or []]
    if "conditions" in slim_status:
        kept = ("type", "status", "reason", "message", "lastTransitionTime")
        slim_status["conditions"] = [{k: c[k] for k in kept if k in c} for c in slim_status["conditions"] or []]
    return {"metadata": slim_meta, "spec": slim_spec, "status": slim_status}


def slim_workload(workload: Mapping[str, Any]) -> Obj:
    """What kubetf.core.kueue reads of a Workload: identity, owners, labels and finalizers; its activation, queue
    and PodSets (names, counts, topology requests); its conditions (all of them: a status write sends the whole
    list back), admission (flavors, topology) and admission checks. Not its resourceVersion: the store keeps it
    apart, so an update that changes nothing read compares equal."""
    meta = workload.get("metadata") or {}
    kept_meta = ("name", "namespace", "uid", "generation", "deletionTimestamp", "finalizers", "ownerReferences")
    slim_meta: Obj = {k: meta[k] for k in kept_meta if k in meta}
    slim_meta["labels"] = {
        k: v for k, v in (meta.get("labels") or {}).items() if k in (api.LABEL_JOB, kueue.ORIGIN_LABEL)
    }
    spec_hash = (meta.get("annotations") or {}).get(kueue.SPEC_HASH_ANNOTATION)
    if spec_hash:
        slim_meta["annotations"] = {kueue.SPEC_HASH_ANNOTATION: spec_hash}
    spec = workload.get("spec") or {}
    pod_sets = []
    for pod_set in spec.get("podSets") or []:
        annotations = ((pod_set.get("template") or {}).get("metadata") or {}).get("annotations") or {}
        topology = {k: v for k, v in annotations.items() if k.startswith("kueue.x-k8s.io/podset-")}
        slim_set: Obj = {"name": pod_set.get("name"), "count": pod_set.get("count")}
        if topology:
            slim_set["template"] = {"metadata": {"annotations": topology}}
        pod_sets.append(slim_set)
    slim_spec = {k: spec[k] for k in ("active", "queueName") if k in spec} | {"podSets": pod_sets}
    status = workload.get("status") or {}
    slim_status: Obj = {"conditions": list(status.get("conditions") or [])}
    assignments = (status.get("admission") or {}).get("podSetAssignments")
    if assignments is not None:
        slim_status["admission"] = {
            "podSetAssignments": [
                {k: a[k] for k in ("name", "flavors", "count", "topologyAssignment") if k in a} for a in assignments
            ]
        }
    if status.get("admissionChecks"):
        slim_status["admissionChecks"] = status["admissionChecks"]
    return {"metadata": slim_meta, "spec": slim_spec, "status": slim_status}


def slim_pod_group(group: Mapping[str, Any]) -> Obj:
    """What kubetf.core.gang reads of a gang's PodGroup (either scheduler's): identity, its owner, what the scheduler
    wrote on it."""
    meta = group.get("metadata") or {}
    kept = ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp")
    slim_meta: Obj = {k: meta[k] for k in kept if k in meta}
    owners = [
        {"uid": o.get("uid"), "controller": True} for o in meta.get("ownerReferences") or [] if o.get("controller")
    ]
    if owners:
        slim_meta["ownerReferences"] = owners[:1]
    status = group.get("status") or {}
    conditions = [
        {k: c[k] for k in ("type", "status", "reason", "message", "lastTransitionTime") if k in c}
        for c in status.get("conditions") or []
    ]
    slim_status: Obj = {"conditions": conditions}
    if "phase" in status:  # Volcano's
        slim_status["phase"] = status["phase"]
    return {"apiVersion": group.get("apiVersion"), "kind": "PodGroup", "metadata": slim_meta, "status": slim_status}


def pod_signature(pod: Obj) -> tuple[Any, ...]:
    """What the decisions read of a pod: an event that leaves it unchanged needs no reconcile."""
    status = pod.get("status") or {}
    return (
        status.get("phase"),
        st.is_deleting(pod),
        st.is_ready(pod),
        st.pending_reason(pod),
        policy.disruption_reason(pod),
        (pod.get("metadata") or {}).get("finalizers"),
    )


def _encode(obj: Obj) -> str:
    return json.dumps(obj, separators=(",", ":"))


class Store:
    """Thread-safe: the watch handlers write, the reconcile workers read."""

    def __init__(self, tombstone_seconds: float) -> None:
        """`tombstone_seconds`: how long the uid of a deleted object is remembered, so that a list taken before the
        deletion but stored after it cannot bring the object back (lists are a few seconds old when stored)."""
        self.tombstone_seconds = tombstone_seconds
        self.lock = threading.Lock()
        self.jobs: dict[Key, tuple[int, str]] = {}
        # job -> pod name -> (resourceVersion, slim JSON, signature, uid)
        self.pods: dict[Key, dict[str, tuple[int, str, tuple[Any, ...], str]]] = {}
        self.tombstones: OrderedDict[str, float] = OrderedDict()  # uid of a deleted object -> when
        self.cached_pods = 0  # kept as pods come and go: counting them would cost a pass over every job
        self.pod_uids: dict[str, tuple[Key, str]] = {}  # a pod's uid -> (its job, its name)
        # Kueue (kubetf.core.kueue): LocalQueue -> its ClusterQueue; the jobs' Workloads, by job (their job label)
        # and name: (resourceVersion, slim JSON); which LocalQueue a job names, so that a LocalQueue's event finds
        # its jobs without parsing every job.
        self.local_queues: dict[Key, str] = {}
        self.workloads: dict[Key, dict[str, tuple[int, str]]] = {}
        self.job_queues: dict[Key, Key] = {}  # job -> (namespace, LocalQueue)
        # The jobs' gang PodGroups (kubetf.core.gang), by job and name: (resourceVersion, slim JSON).
        self.pod_groups: dict[Key, dict[str, tuple[int, str]]] = {}

    def _bury(self, uid: str) -> None:
        now = time.monotonic()
        self.tombstones[uid] = now
        while self.tombstones and next(iter(self.tombstones.values())) < now - self.tombstone_seconds:
            self.tombstones.popitem(last=False)

    def _buried(self, obj: Mapping[str, Any]) -> bool:
        return (obj.get("metadata") or {}).get("uid") in self.tombstones

    # ------------------------------------------------------------------ jobs

    def put_job(self, job: Obj) -> bool:
        """Store a job unless a version as new is stored; True when it changed what is stored."""
        key = (api.namespace(job), api.name(job))
        version = resource_version(job)
        queue = kueue.queue_name(job)
        with self.lock:
            current = self.jobs.get(key)
            if self._buried(job) or (current is not None and version and current[0] >= version):
                return False
            self.jobs[key] = (version, _encode(slim_job(job)))
            if queue is not None:
                self.job_queues[key] = (key[0], queue)
            else:
                self.job_queues.pop(key, None)
            return True

    def job(self, key: Key) -> Obj | None:
        with self.lock:
            entry = self.jobs.get(key)
        return json.loads(entry[1]) if entry else None

    def remove_job(self, key: Key, uid: str) -> None:
        with self.lock:
            self.jobs.pop(key, None)
            self.job_queues.pop(key, None)
            self._bury(uid)

    def prune_jobs(self, namespace: str, listed: set[Key], list_version: int) -> list[Key]:
        """Drop the jobs of `namespace` ("": all) missing from a list taken at `list_version` (a watch gap hid their
        deletion), unless stored with a newer version; returns them."""
        with self.lock:
            gone = _missing(self.jobs, namespace, listed, list_version)
            for key in gone:
                del self.jobs[key]
                self.job_queues.pop(key, None)
        return gone

    def job_keys(self) -> list[Key]:
        with self.lock:
            return list(self.jobs)

    def job_count(self) -> int:
        with self.lock:
            return len(self.jobs)

    # ------------------------------------------------------------------ pods

    def put_pod(self, job: Key, pod: Mapping[str, Any]) -> bool:
        """Store a pod of `job`; True when what the decisions read of it changed (or it is new)."""
        slim = slim_pod(pod)
        name = slim["metadata"]["name"]
        version = resource_version(slim)
        signature = pod_signature(slim)
        with self.lock:
            if self._buried(slim):
                return False
            pods = self.pods.setdefault(job, {})
            current = pods.get(name)
            if current is not None and version and current[0] >= version:
                return False
            uid = slim["metadata"].get("uid", "")
            pods[name] = (version, _encode(slim), signature, uid)
            self.cached_pods += current is None
            if current is not None and current[3] != uid:
                self.pod_uids.pop(current[3], None)
            if uid:
                self.pod_uids[uid] = (job, name)
            return current is None or current[2] != signature

    def remove_pod(self, job: Key, name: str, uid: str) -> bool:
        with self.lock:
            self._bury(uid)
            pods = self.pods.get(job)
            entry = pods.get(name) if pods is not None else None
            # Only that pod: a late DELETED event of an old pod must not take the new pod of the same name along.
            if pods is None or entry is None or (uid and entry[3] != uid):
                return False
            del pods[name]
            self.pod_uids.pop(entry[3], None)
            self.cached_pods -= 1
            if not pods:
                del self.pods[job]
            return True

    def job_pods(self, job: Key) -> list[Obj]:
        with self.lock:
            entries = list((self.pods.get(job) or {}).values())
        return [json.loads(entry[1]) for entry in entries]

    def replace_pods(self, job: Key, pods: list[Obj], list_version: int) -> bool:
        """Reconcile the job's pods with a fresh list from the API, taken at `list_version`: newer versions are
        stored, and pods stored with an older version and missing from it are gone (a watch gap hid their
        deletion). True when that changed what the decisions read."""
        changed = [self.put_pod(job, pod) for pod in pods]
        listed = {(pod.get("metadata") or {}).get("name", "") for pod in pods}
        return self.prune_pods(job, listed, list_version) or any(changed)

    def prune_pods(self, job: Key, listed: set[str], list_version: int) -> bool:
        """Drop the job's pods missing from a list taken at `list_version` (a watch gap hid their deletion), unless
        stored with a newer version. True when any was dropped."""
        with self.lock:
            pods = self.pods.get(job) or {}
            gone = [name for name, entry in pods.items() if name not in listed and entry[0] <= list_version]
            for name in gone:
                self.pod_uids.pop(pods.pop(name)[3], None)
            self.cached_pods -= len(gone)
            if not pods:
                self.pods.pop(job, None)
        return bool(gone)

    def still_there(self, job: Key, name: str, uid: str) -> bool:
        """The pod of that uid is stored and not being deleted."""
        with self.lock:
            entry = (self.pods.get(job) or {}).get(name)
        return entry is not None and entry[3] == uid and not entry[2][1]

    def pod_by_uid(self, uid: str) -> tuple[Key, Obj] | None:
        """The pod of that uid and the job it is cached under (by its job label: its owner is the caller's check)."""
        with self.lock:
            found = self.pod_uids.get(uid)
            entry = (self.pods.get(found[0]) or {}).get(found[1]) if found else None
        if found is None or entry is None:
            return None
        return found[0], json.loads(entry[1])

    def knows_pod(self, uid: str) -> bool:
        """A pod of that uid is cached and not being deleted."""
        with self.lock:
            found = self.pod_uids.get(uid)
            entry = (self.pods.get(found[0]) or {}).get(found[1]) if found else None
        return entry is not None and not entry[2][1]

    def pod_jobs(self) -> list[Key]:
        with self.lock:
            return list(self.pods)

    def pod_count(self) -> int:
        with self.lock:
            return self.cached_pods

    # ------------------------------------------------------------------ Kueue

    def put_local_queue(self, queue: Mapping[str, Any]) -> bool:
        """Store a LocalQueue's ClusterQueue; True when that changed (its status, which Kueue updates all the time,
        is not read)."""
        meta = queue.get("metadata") or {}
        key = (meta.get("namespace") or "", meta.get("name") or "")
        cluster_queue = str((queue.get("spec") or {}).get("clusterQueue") or "")
        with self.lock:
            before = self.local_queues.get(key)
            self.local_queues[key] = cluster_queue
        return before != cluster_queue

    def remove_local_queue(self, namespace: str, name: str) -> bool:
        with self.lock:
            return self.local_queues.pop((namespace, name), None) is not None

    def local_queue(self, namespace: str, name: str) -> str | None:
        """The LocalQueue's ClusterQueue as the watch showed it; None when the watch has not shown the queue."""
        with self.lock:
            return self.local_queues.get((namespace, name)) or None

    def jobs_of_queue(self, namespace: str, name: str) -> list[Key]:
        with self.lock:
            return [job for job, queue in self.job_queues.items() if queue == (namespace, name)]

    def put_workload(self, workload: Mapping[str, Any]) -> Key | None:
        """Store a Workload under its job (the operator's job label: the watch selects only the operator's
        Workloads); the job when what the decisions read of it changed."""
        meta = workload.get("metadata") or {}
        job_name = (meta.get("labels") or {}).get(api.LABEL_JOB)
        if not job_name:
            return None
        key = (meta.get("namespace") or "", job_name)
        version = resource_version(workload)
        encoded = _encode(slim_workload(workload))
        with self.lock:
            if self._buried(workload):
                return None
            workloads = self.workloads.setdefault(key, {})
            current = workloads.get(meta.get("name") or "")
            if current is not None and version and current[0] >= version:
                return None
            workloads[meta.get("name") or ""] = (version, encoded)
        return key if current is None or current[1] != encoded else None

    def remove_workload(self, workload: Mapping[str, Any]) -> Key | None:
        meta = workload.get("metadata") or {}
        key = (meta.get("namespace") or "", (meta.get("labels") or {}).get(api.LABEL_JOB) or "")
        name, uid = meta.get("name") or "", meta.get("uid") or ""
        with self.lock:
            self._bury(uid)
            workloads = self.workloads.get(key)
            entry = workloads.get(name) if workloads is not None else None
            # Only that one: a late DELETED event must not take a newer Workload of the same name along.
            if workloads is None or entry is None or (uid and json.loads(entry[1])["metadata"].get("uid") != uid):
                return None
            del workloads[name]
            if not workloads:
                del self.workloads[key]
        return key

    def prune_workloads(self, namespace: str, listed: set[tuple[Key, str]], list_version: int) -> list[Key]:
        """Drop the Workloads of `namespace` ("": all) missing from a list taken at `list_version`; returns their
        jobs."""
        changed = []
        with self.lock:
            for key, workloads in list(self.workloads.items()):
                if namespace and key[0] != namespace:
                    continue
                for name, (stored, _) in list(workloads.items()):
                    if (key, name) not in listed and stored <= list_version:
                        del workloads[name]
                        changed.append(key)
                if not workloads:
                    del self.workloads[key]
        return changed

    def workloads_of(self, key: Key) -> list[Obj]:
        """The Workloads labelled for the job's name (its own, and a previous job's of that name), each with its
        resourceVersion: a write of it goes against the version read."""
        with self.lock:
            entries = list((self.workloads.get(key) or {}).values())
        found = []
        for version, encoded in entries:
            workload = json.loads(encoded)
            workload["metadata"]["resourceVersion"] = str(version)
            found.append(workload)
        return found

    # ------------------------------------------------------------------ gangs (kubetf.core.gang)

    def put_pod_group(self, group: Mapping[str, Any]) -> Key | None:
        """Store a gang's PodGroup under its job (its job label); the job when what the decisions read changed."""
        meta = group.get("metadata") or {}
        job_name = (meta.get("labels") or {}).get(api.LABEL_JOB)
        if not job_name:
            return None
        key = (meta.get("namespace") or "", job_name)
        slim = slim_pod_group(group)
        version = resource_version(slim)
        slim["metadata"].pop("resourceVersion", None)
        encoded = _encode(slim)
        with self.lock:
            groups = self.pod_groups.setdefault(key, {})
            current = groups.get(meta.get("name") or "")
            if self._buried(group) or (current is not None and version and current[0] >= version):
                return None
            groups[meta.get("name") or ""] = (version, encoded)
        return key if current is None or current[1] != encoded else None

    def remove_pod_group(self, group: Mapping[str, Any], key: Key | None = None) -> Key | None:
        """Forget a PodGroup and ignore its later events; `key`: its job's, for a group as the cache holds it
        (slim, without its labels)."""
        meta = group.get("metadata") or {}
        key = key or (meta.get("namespace") or "", (meta.get("labels") or {}).get(api.LABEL_JOB) or "")
        with self.lock:
            self._bury(meta.get("uid") or "")
            groups = self.pod_groups.get(key)
            if groups is None or groups.pop(meta.get("name") or "", None) is None:
                return None
            if not groups:
                del self.pod_groups[key]
        return key

    def pod_groups_of(self, key: Key) -> list[Obj]:
        with self.lock:
            entries = list((self.pod_groups.get(key) or {}).values())
        return [json.loads(encoded) for _, encoded in entries]

    def prune_pod_groups(
        self, namespace: str, api_version: str, listed: set[tuple[Key, str]], version: int
    ) -> list[Key]:
        """Drop the PodGroups of `api_version` in `namespace` ("": all) missing from a list taken at `version`."""
        changed = []
        with self.lock:
            for key, groups in list(self.pod_groups.items()):
                if namespace and key[0] != namespace:
                    continue
                for name, (stored, encoded) in list(groups.items()):
                    if (
                        (key, name) not in listed
                        and stored <= version
                        and json.loads(encoded)["apiVersion"] == api_version
                    ):
                        del groups[name]
                        changed.append(key)
                if not groups:
                    del self.pod_groups[key]
        return changed


def _missing(entries: dict[Key, tuple[int, str]], namespace: str, listed: set[Key], list_version: int) -> list[Key]:
    """The stored keys of `namespace` ("": all) that a list taken at `list_version` lacks, unless stored newer."""
    return [
        key
        for key, (version, _) in entries.items()
        if (not namespace or key[0] == namespace) and key not in listed and version <= list_version
    ]
