"""What the watches delivered: every TrainingJob, the pods of each job, Kueue's LocalQueues, and the objects the
scheduler integrations make for the jobs (kubetf.core.scheduling: PodGroups, Workloads), so reconciles read no API.

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

from kubetf.core import api, inplace, policy, scheduling
from kubetf.core import status as st
from kubetf.core.scheduling import workload
from kubetf.core.types import Resource

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
    """The fields status.py, policy.py, sigterm.py and the gangs read: identity, labels, the deletion, the
    containers' names, the gang's PodGroup, the status."""
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
    # Finalizers: Kueue's pod integration's (kubetf.core.scheduling.kueue.legacy_held), and whether a forced deletion
    # removes the pod at once (executor).
    if meta.get("finalizers"):
        slim_meta["finalizers"] = list(meta["finalizers"])
    # What the schedulers read of a pod (Volcano's PodGroup it is in: an older generation's goes once no pod is in
    # it), and whether it was given restart rules (kubetf.core.inplace.ignored).
    kept_annotations = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k in (*scheduling.POD_ANNOTATIONS, inplace.ASKED)
    }
    if kept_annotations:
        slim_meta["annotations"] = kept_annotations
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
            # restartCount and lastState: an exit restarted in place (kubetf.core.inplace)
            kept = ("name", "ready", "state", "restartCount", "lastState")
            slim_status[key] = [{k: c[k] for k in kept if k in c} for c in slim_status[key] or []]
    if "conditions" in slim_status:
        kept = ("type", "status", "reason", "message", "lastTransitionTime")
        slim_status["conditions"] = [{k: c[k] for k in kept if k in c} for c in slim_status["conditions"] or []]
    return {"metadata": slim_meta, "spec": slim_spec, "status": slim_status}


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
        inplace.exits(pod)[0],  # an exit restarted in place
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
        # Kueue: LocalQueue -> its ClusterQueue; which LocalQueue a job names, so that a LocalQueue's event finds its
        # jobs without parsing every job.
        self.local_queues: dict[Key, str] = {}
        self.job_queues: dict[Key, Key] = {}  # job -> (namespace, LocalQueue)
        # What the scheduler integrations made for the jobs (kubetf.core.scheduling.RESOURCES), by job (their job
        # label) and (apiVersion, kind, name): (resourceVersion, uid, slim JSON).
        self.owned: dict[Key, dict[tuple[str, str, str], tuple[int, str, str]]] = {}

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
        queue = workload.queue_name(job)
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

    def job_versions(self) -> list[tuple[Key, int, str]]:
        """Every job as stored: (key, resourceVersion, slim JSON), unparsed (a reader parses the ones it needs)."""
        with self.lock:
            return [(key, version, encoded) for key, (version, encoded) in self.jobs.items()]

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

    def owned_jobs(self) -> list[Key]:
        """The jobs (by key) that own an object in the cache besides pods (a Workload, a PodGroup)."""
        with self.lock:
            return list(self.owned)

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

    # ------------------------------------------------------------------ the jobs' objects but pods

    def put_owned(self, obj: Mapping[str, Any]) -> Key | None:
        """Store an object a scheduler integration made (kubetf.core.scheduling.RESOURCES) under its job (its job
        label: the watches select only the operator's); the job when what the decisions read of it changed."""
        meta = obj.get("metadata") or {}
        job_name = (meta.get("labels") or {}).get(api.LABEL_JOB)
        resource = _resource(obj)
        if not job_name or resource is None:
            return None
        key = (meta.get("namespace") or "", job_name)
        version = resource_version(obj)
        encoded = _encode(resource.slim(dict(obj)))
        ident = (resource.api_version, resource.kind, meta.get("name") or "")
        with self.lock:
            if self._buried(obj):
                return None
            objects = self.owned.setdefault(key, {})
            current = objects.get(ident)
            if current is not None and version and current[0] >= version:
                return None
            objects[ident] = (version, meta.get("uid") or "", encoded)
        return key if current is None or current[2] != encoded else None

    def remove_owned(self, obj: Mapping[str, Any], key: Key | None = None) -> Key | None:
        """Forget that object, that incarnation only (its uid: a late DELETED event of an older one of the same name
        must not take the current one along), and ignore its later events. `key`: its job's, for an object as the
        cache holds it (slim, without its labels)."""
        meta = obj.get("metadata") or {}
        key = key or (meta.get("namespace") or "", (meta.get("labels") or {}).get(api.LABEL_JOB) or "")
        resource = _resource(obj)
        uid = meta.get("uid") or ""
        if resource is None:
            return None
        ident = (resource.api_version, resource.kind, meta.get("name") or "")
        with self.lock:
            self._bury(uid)
            objects = self.owned.get(key)
            entry = objects.get(ident) if objects is not None else None
            if objects is None or entry is None or (uid and entry[1] != uid):
                return None
            del objects[ident]
            if not objects:
                del self.owned[key]
        return key

    def owned_of(self, key: Key) -> list[Obj]:
        """The objects labelled for the job's name (its own, an earlier job's, anyone's: their controller reference
        says whose), each with its resourceVersion: a write of it goes against the version read."""
        with self.lock:
            entries = list((self.owned.get(key) or {}).values())
        found = []
        for version, _, encoded in entries:
            obj = json.loads(encoded)
            obj["metadata"]["resourceVersion"] = str(version)
            found.append(obj)
        return found

    def prune_owned(self, namespace: str, resource: Resource, listed: set[tuple[Key, str]], version: int) -> list[Key]:
        """Drop the objects of `resource` in `namespace` ("": all) missing from a list of it taken at `version`."""
        changed = []
        with self.lock:
            for key, objects in list(self.owned.items()):
                if namespace and key[0] != namespace:
                    continue
                for ident, (stored, _, _) in list(objects.items()):
                    if ident[:2] == (resource.api_version, resource.kind) and (key, ident[2]) not in listed \
                            and stored <= version:  # fmt: skip
                        del objects[ident]
                        changed.append(key)
                if not objects:
                    del self.owned[key]
        return changed


def _resource(obj: Mapping[str, Any]) -> Resource | None:
    return next((r for r in scheduling.RESOURCES if r.holds(dict(obj))), None)


def _missing(entries: dict[Key, tuple[int, str]], namespace: str, listed: set[Key], list_version: int) -> list[Key]:
    """The stored keys of `namespace` ("": all) that a list taken at `list_version` lacks, unless stored newer."""
    return [
        key
        for key, (version, _) in entries.items()
        if (not namespace or key[0] == namespace) and key not in listed and version <= list_version
    ]
