"""An in-memory stand-in for `kube.Kube` (unit tier only), with a watch whose delivery the test controls.

It implements `cluster.kube_api.KubeApi`, and mypy checks that it does (`make lint`). Writes change the objects at
once, as the API server does; the watch events they cause wait in `events` until `deliver()` hands them to the
controller, so a test can reconcile before the watch has shown the writes.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from kubetf.cluster.kube_api import Conflict, Creation, Deletion, KubeApi, LogUnreadable, NotServed, Refused
from kubetf.core import api, refusals, scheduling
from kubetf.core import status as st
from kubetf.core.scheduling import workload as kueue
from kubetf.core.types import Refusal, Resource, Write

Obj = dict[str, Any]


class FakeApi:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.jobs: dict[tuple[str, str], dict] = {}
        self.pods: dict[str, dict] = {}  # name -> pod (one namespace)
        self.others: dict[tuple[str, str], dict] = {}  # (kind, name) -> Service/PVC
        self.lost_nodes: dict[str, float] = {}  # nodes that stopped reporting, and since when
        self.tokens: dict[str, tuple[str, str, str, str]] = {}  # token -> (namespace, service account, pod, uid)
        self.token_audience = "kubetf.io/progress"
        self.events: list[tuple[str, str, dict]] = []  # (resource, type, object) not yet delivered
        self.recorded: list[tuple[str, str, str]] = []  # Kubernetes Events: (type, reason, message)
        self.calls: list[str] = []
        self.refuse: dict[str, Exception] = {}  # pod name -> error its create raises
        self.refuse_delete: dict[str, Exception] = {}  # pod name -> error its delete raises
        self.refuse_write: dict[str, Exception] = {}  # name of an object but a pod -> error its writes raise
        self.drop_restart_rules = False  # an API server without container restart rules drops them from pods
        self.event_names: set[str] = set()  # the Events posted, by name
        self.refuse_events: list[Exception | None] = []  # what the next Event posts raise, one each (None: nothing)
        self.refuse_status: list[Exception] = []  # what the next status writes of a job raise, one each
        self.invalid: dict[str, str] = {}  # role -> the API server's message refusing its pods (dry runs too)
        self.logs: dict[str, str] = {}  # pod name -> what its training container printed
        self.unreadable_logs = False  # no kubelet gives a log (kwok's fake nodes, a partitioned node)
        self.version = itertools.count(1)
        self.urgent_calls = 0
        self.uids = itertools.count(1)
        # Kueue: None when the cluster has none; else its LocalQueues (name -> ClusterQueue), Workloads (by name, as
        # stored), its cluster-scoped objects ("classes": (kind, name) -> WorkloadPriorityClass, PriorityClass or
        # ResourceFlavor) and what its visibility API serves ("pending": ClusterQueue -> [Workload name, ...] in
        # queue order; absent: not served). The tests play its controller (admission, eviction). The watch delivers
        # their changes: `deliver` compares them with what it delivered before.
        self.kueue: dict[str, Any] | None = None
        self.kueue_seen: dict[tuple[str, str], tuple[str, dict]] = {}  # (kind, name) -> what was last delivered
        self.served: dict[str, set[str]] = {}  # API discovery: group/version -> its resources (absent: not served)
        # The pod watch (kubetf.cluster.podwatch): what each watch does in turn, its events or the error it raises;
        # `watched_from`, the version each started from.
        self.pod_watches: list[list[Obj] | Exception] = []
        self.watched_from: list[int] = []

    @contextlib.contextmanager
    def urgent(self) -> Iterator[None]:
        self.urgent_calls += 1  # the reconciles run on the urgent lane
        yield

    # --------------------------------------------------------------- watch

    def _emit(self, resource: str, type_: str, obj: dict) -> None:
        self.events.append((resource, type_, copy.deepcopy(obj)))

    def deliver(self, controller) -> None:
        self._kueue_changes()
        events, self.events = self.events, []
        handlers = {
            "jobs": controller.job_event,
            "pods": controller.pod_event,
            "localqueues": controller.local_queue_event,
        }
        for resource, type_, obj in events:
            if resource in handlers:
                handlers[resource](type_, obj)
            elif resource == "workloads":  # Kueue's, changed by the test playing Kueue or by the operator
                controller.owned_event(type_, obj, kueue.WORKLOADS)
            else:  # what a scheduler integration made: its kind's own watch
                kind = next(r for r in scheduling.RESOURCES if r.holds(obj))
                controller.owned_event(type_, obj, kind)

    def _kueue_changes(self) -> None:
        """A watch event for each of Kueue's objects that changed since the last delivery (the operator's Workloads
        only: its watch selects its label)."""
        current: dict[tuple[str, str], dict] = {}
        for name, cluster_queue in (self.kueue or {}).get("queues", {}).items():
            meta = {"name": name, "namespace": self.namespace, "resourceVersion": "1"}
            current[("localqueues", name)] = {"metadata": meta, "spec": {"clusterQueue": cluster_queue}}
        for name, workload in (self.kueue or {}).get("workloads", {}).items():
            if workload["metadata"].get("labels", {}).get(api.LABEL_MANAGED_BY) == api.MANAGER:
                current[("workloads", name)] = copy.deepcopy(workload)
        for (kind, name), obj in current.items():
            encoded = repr(obj)
            if self.kueue_seen.get((kind, name), ("", {}))[0] != encoded:
                type_ = "MODIFIED" if (kind, name) in self.kueue_seen else "ADDED"
                self.kueue_seen[(kind, name)] = (encoded, obj)
                self._emit(kind, type_, obj)
        for kind, name in [k for k in self.kueue_seen if k not in current]:
            self._emit(kind, "DELETED", self.kueue_seen.pop((kind, name))[1])

    @property
    def namespace(self) -> str:
        return next((key[0] for key in self.jobs), "team-a")

    def workload(self, name: str | None = None) -> dict:
        """The stored Workload of that name (the only one when None), to read or to change as Kueue does (then
        `kueue_wrote`)."""
        assert self.kueue is not None
        workloads = self.kueue["workloads"]
        if name is None:
            assert len(workloads) == 1, list(workloads)
            name = next(iter(workloads))
        return workloads[name]

    def kueue_wrote(self, workload: dict) -> None:
        """Kueue changed a stored Workload in place: its version moves; once deleted and without finalizers, it is
        gone."""
        self._bump(workload)
        meta = workload["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            assert self.kueue is not None
            del self.kueue["workloads"][meta["name"]]

    def _bump(self, obj: dict) -> None:
        obj["metadata"]["resourceVersion"] = str(next(self.version))

    # --------------------------------------------------------------- what users and kubelets do

    def add_job(self, document: dict) -> dict:
        job = copy.deepcopy(document)
        job["metadata"].setdefault("namespace", "default")
        job["metadata"].setdefault("generation", 1)
        # Shaped like the API server's: a group name keeps the uid's first 8 characters (kubetf.core.scheduling.gangs)
        job["metadata"]["uid"] = f"{next(self.uids):08x}-4a1b-4c2d-8e3f-job000000000"
        self._bump(job)
        self.jobs[(job["metadata"]["namespace"], job["metadata"]["name"])] = job
        self._emit("jobs", "ADDED", job)
        return job

    def update_job(self, key: tuple[str, str]) -> None:
        """Record a change made to self.jobs[key] in place (by a user: the generation moves)."""
        job = self.jobs[key]
        job["metadata"]["generation"] += 1
        self._bump(job)
        self._emit("jobs", "MODIFIED", job)

    def update_pod(self, name: str) -> None:
        """Record a change made to self.pods[name] in place."""
        self._bump(self.pods[name])
        self._emit("pods", "MODIFIED", self.pods[name])

    def remove_pod(self, name: str) -> None:
        pod = self.pods.pop(name)
        self._emit("pods", "DELETED", pod)

    # --------------------------------------------------------------- Kube's interface

    def review_token(self, token: str, audience: str) -> Obj:
        """`tokens`: token -> (namespace, service account, pod, uid) of the pod it is bound to, for `token_audience`."""
        self.calls.append("create TokenReview")
        bound = self.tokens.get(token) if audience == self.token_audience else None
        if bound is None:
            return {"authenticated": False, "error": "invalid bearer token"}
        namespace, account, pod, uid = bound
        extra = {"authentication.kubernetes.io/pod-name": [pod], "authentication.kubernetes.io/pod-uid": [uid]}
        return {"authenticated": True, "user": {"username": f"system:serviceaccount:{namespace}:{account}",
                                               "extra": extra}, "audiences": [audience]}  # fmt: skip

    def get_job(self, namespace: str, name: str) -> Obj | None:
        self.calls.append("get job")
        job = self.jobs.get((namespace, name))
        return copy.deepcopy(job) if job else None

    def patch_job_status(self, job: Obj, patch: Obj) -> Obj | None:
        self.calls.append("patch status")
        if self.refuse_status:
            raise self.refuse_status.pop(0)
        stored = self.jobs.get((api.namespace(job), api.name(job)))
        if stored is None:
            return None
        stored["status"] = _apply(stored.get("status") or {}, patch)
        self._bump(stored)
        self._emit("jobs", "MODIFIED", stored)
        return copy.deepcopy(stored)

    def delete_job(self, namespace: str, name: str, uid: str | None = None) -> bool:
        self.calls.append("delete job")
        job = self.jobs.pop((namespace, name), None)
        if job is not None:
            self._emit("jobs", "DELETED", job)
        return job is not None

    def get_owned(self, resource: Resource, namespace: str, name: str) -> Obj | None:
        self.calls.append(f"get {resource.kind}")
        if resource == kueue.WORKLOADS:
            found = (self.kueue or {}).get("workloads", {}).get(name)
        else:
            found = self.others.get((resource.kind, name))
            found = found if found is not None and resource.holds(found) else None
        return copy.deepcopy(found) if found is not None else None

    def get_cluster_object(self, kind: str, name: str) -> Obj | None:
        self.calls.append(f"get {kind}")
        found = (self.kueue or {}).get("classes", {}).get((kind, name))
        return copy.deepcopy(found) if found is not None else None

    def write(self, write: Write, resource_version: str) -> Obj | None:
        meta = write.obj["metadata"]
        self.calls.append(f"write {write.obj['kind']} {write.verb}" if write.verb != "delete" else
                          f"delete {write.obj['kind']} {meta['name']}")  # fmt: skip
        if meta["name"] in self.refuse_write:
            raise self.refuse_write[meta["name"]]
        if not kueue.WORKLOADS.holds(write.obj):
            stored = self.others.get((write.obj["kind"], meta["name"]))
            if stored is None or stored["metadata"].get("uid") != meta.get("uid"):
                return None
            assert write.verb == "delete", "the operator only deletes its gang's objects"
            del self.others[(write.obj["kind"], meta["name"])]
            self._emit("owned", "DELETED", stored)
            return None
        stored = (self.kueue or {}).get("workloads", {}).get(meta["name"])
        if stored is None or stored["metadata"]["uid"] != meta["uid"]:
            return None
        if stored["metadata"]["resourceVersion"] != resource_version:
            raise Conflict(f"Workload {meta['name']} changed since version {resource_version}")
        if write.verb == "unfinalize":
            stored["metadata"]["finalizers"] = [f for f in stored["metadata"].get("finalizers") or []
                                                if f != write.finalizer]  # fmt: skip
        else:
            patch = copy.deepcopy(write.patch)
            patch.get("metadata", {}).pop("resourceVersion", None)
            if write.verb == "status":
                stored["status"] = _apply(stored.get("status") or {}, patch["status"])
            else:
                for part in ("metadata", "spec"):
                    if part in patch:
                        stored[part] = _apply(stored.get(part) or {}, patch[part])
        written = copy.deepcopy(stored)
        self.kueue_wrote(stored)
        written["metadata"]["resourceVersion"] = stored["metadata"]["resourceVersion"]
        return written

    def served_resources(self, group_version: str) -> set[str] | None:
        self.calls.append(f"discover {group_version}")
        return self.served.get(group_version)

    def watch_pods(self, namespace: str, version: int, seconds: int) -> Iterator[Obj]:
        self.calls.append(f"watch pods from {version}")
        self.watched_from.append(version)
        turn = self.pod_watches.pop(0)
        if isinstance(turn, Exception):
            raise turn
        yield from turn

    def owned_pages(self, namespace: str, resource: Resource) -> Iterator[tuple[list[Obj], int]]:
        self.calls.append(f"list {resource.plural} {resource.api_version}")
        if resource == kueue.WORKLOADS:
            if self.kueue is not None:
                ours = [
                    copy.deepcopy(w) for w in self.kueue["workloads"].values()
                    if w["metadata"].get("labels", {}).get(api.LABEL_MANAGED_BY) == api.MANAGER
                ]  # fmt: skip
                yield ours, next(self.version)
            return
        if resource.api_version in self.served:
            yield [copy.deepcopy(o) for o in self.others.values() if resource.holds(o)], next(self.version)

    def list_pods(self, namespace: str, job_name: str) -> tuple[list[dict], int]:
        self.calls.append("list pods")
        pods = [copy.deepcopy(p) for p in self.pods.values() if p["metadata"]["labels"][api.LABEL_JOB] == job_name]
        return pods, next(self.version)

    def list_paged(
        self, resource: str, namespaces: Iterable[str], label_selector: str = "", api_version: str = ""
    ) -> Iterator[Obj]:
        self.calls.append(f"list {resource}")
        source = self.pods.values() if resource == "pods" else self.jobs.values()
        return iter([copy.deepcopy(o) for o in source])

    def pages(
        self, resource: str, namespace: str, label_selector: str = "", api_version: str = ""
    ) -> Iterator[tuple[list[Obj], int]]:
        self.calls.append(f"list {resource}")
        source = self.pods.values() if resource == "pods" else self.jobs.values()
        yield [copy.deepcopy(o) for o in source], next(self.version)

    def local_queue_pages(self, namespace: str) -> Iterator[tuple[list[Obj], int]]:
        self.calls.append("list localqueues")
        if self.kueue is not None:
            queues = self.kueue["queues"].items()
            yield (
                [
                    {"metadata": {"name": n, "namespace": self.namespace}, "spec": {"clusterQueue": q}}
                    for n, q in queues
                ],
                1,
            )

    def pending_workloads(self, path: str, offset: int, limit: int) -> list[dict]:
        self.calls.append(f"get {path}/pendingworkloads")
        pending = (self.kueue or {}).get("pending")
        if pending is None:
            raise NotServed(404, "the server could not find the requested resource")
        names = pending.get(path.rpartition("/")[2], [])
        return [
            {"metadata": {"name": n, "namespace": self.namespace}, "positionInClusterQueue": offset + i}
            for i, n in enumerate(names[offset : offset + limit])
        ]

    def dry_run(self, objects: list[Obj], owner_uid: str) -> Refusal | None:
        found = []
        for obj in objects:
            self.calls.append(f"dry-run {obj['kind']}")
            name = obj["metadata"]["name"]
            role = obj["metadata"]["labels"].get(api.LABEL_ROLE)
            if obj["kind"] == "Pod" and role in self.invalid:
                found.append(Refusal(refusals.INVALID, "Pod", name, self.invalid[role]))
            existing = self.others.get((obj["kind"], name))
            meta = (existing or {}).get("metadata") or {}
            owners = {o["uid"] for o in meta.get("ownerReferences") or []}
            live = {j["metadata"]["uid"] for j in self.jobs.values()}
            if existing is not None and owners and not owners & live and not meta.get("deletionTimestamp"):
                del self.others[(obj["kind"], name)]  # the garbage collector, at once, unless a finalizer holds it
            elif existing is not None and (meta.get("deletionTimestamp") or (owners and owner_uid not in owners)):
                message = f"{obj['kind']} {name} of a previous job is still being deleted"
                found.append(Refusal(refusals.NAME_IN_USE, obj["kind"], name, message))
        return found[0] if found else None

    def create_first(self, obj: Obj, owner_uid: str) -> Refusal | None:
        refusal = self.dry_run([obj], owner_uid)
        self.calls[-1] = f"create {obj['kind']} first"
        if refusal is None and (obj["kind"], obj["metadata"]["name"]) not in self.others:
            stored = copy.deepcopy(obj)
            stored["metadata"]["uid"] = f"uid-{next(self.uids)}"
            self._bump(stored)
            self.others[(obj["kind"], obj["metadata"]["name"])] = stored
        return refusal

    def create_batches(self, batches: list[list[Obj]]) -> Creation:
        result = Creation()
        objects = [o for batch in batches for o in batch]
        for i, obj in enumerate(objects):
            name = obj["metadata"]["name"]
            self.calls.append(f"create {obj['kind']}")
            if kueue.WORKLOADS.holds(obj):
                assert self.kueue is not None, "no Kueue API: the create would fail"
                if name not in self.kueue["workloads"]:
                    stored = copy.deepcopy(obj)
                    stored["metadata"]["uid"] = f"uid-{next(self.uids)}"
                    stored["metadata"]["generation"] = 1
                    stored["metadata"]["creationTimestamp"] = st.format_time(self.clock())
                    stored["spec"].setdefault("active", True)
                    self._bump(stored)
                    self.kueue["workloads"][name] = stored
                    result.created.append(copy.deepcopy(stored))
                continue
            if obj["kind"] != "Pod":
                if (obj["kind"], name) not in self.others:
                    stored = copy.deepcopy(obj)
                    stored["metadata"]["uid"] = f"uid-{next(self.uids)}"
                    self._bump(stored)
                    self.others[(obj["kind"], name)] = stored
                    result.created.append(copy.deepcopy(stored))
                    if any(r.holds(obj) for r in scheduling.RESOURCES):  # the operator watches them
                        self._emit("owned", "ADDED", stored)
                continue
            role = obj["metadata"]["labels"][api.LABEL_ROLE]
            error = self.refuse.get(name)
            if error is None and role in self.invalid:
                error = Refused(Refusal(refusals.INVALID, "Pod", name, self.invalid[role]))
            if error is not None:
                result.skipped += [o["metadata"]["name"] for o in objects[i:]]
                if isinstance(error, Refused):
                    result.refusal = error.refusal
                else:
                    result.error = error
                break
            if name not in self.pods:
                result.created.append(self._create_pod(obj))
        return result

    def _create_pod(self, obj: Obj) -> Obj:
        pod = copy.deepcopy(obj)
        if self.drop_restart_rules:
            for container in pod["spec"]["containers"]:
                container.pop("restartPolicyRules", None)
                container.pop("restartPolicy", None)
        pod["metadata"]["uid"] = f"uid-{next(self.uids)}"
        pod["metadata"]["creationTimestamp"] = st.format_time(self.clock())
        pod["status"] = {"phase": "Pending"}
        self._bump(pod)
        self.pods[pod["metadata"]["name"]] = pod
        self._emit("pods", "ADDED", pod)
        return copy.deepcopy(pod)

    def delete_pods(self, pods: list[Obj], grace_seconds: int | None = None) -> Deletion:
        result = Deletion()
        for pod in pods:
            self.calls.append("delete Pod" if grace_seconds is None else f"delete Pod grace {grace_seconds}")
            refused = self.refuse_delete.get(pod["metadata"]["name"])
            if refused is not None:
                result.failed.append((pod, refused))
                continue
            current = self.pods.get(pod["metadata"]["name"])
            if current is None or current["metadata"]["uid"] != pod["metadata"]["uid"]:
                result.gone.append(pod)
                continue
            if grace_seconds == 0 and not current["metadata"].get("finalizers"):  # a lost node's pod: gone at once
                self.remove_pod(current["metadata"]["name"])
                continue
            # As the API server does: the deadline for the kubelet's SIGKILL, and the grace period it came from.
            grace = current["spec"].get("terminationGracePeriodSeconds", 30) if grace_seconds is None else grace_seconds
            current["metadata"]["deletionTimestamp"] = st.format_time(self.clock() + grace)
            current["metadata"]["deletionGracePeriodSeconds"] = grace
            self.update_pod(current["metadata"]["name"])
        return result

    def delete_pod(self, pod: dict, grace_seconds: int | None = None) -> bool:
        result = self.delete_pods([pod], grace_seconds)
        if result.failed:
            raise result.failed[0][1]
        return not result.gone

    def release_pods(self, pods: list[Obj]) -> None:
        for pod in pods:
            self.calls.append("release")
            current = self.pods.get(pod["metadata"]["name"])
            if current is None or current["metadata"]["uid"] != pod["metadata"]["uid"]:
                continue
            current["metadata"]["finalizers"] = [
                f for f in current["metadata"]["finalizers"] if f != kueue.POD_FINALIZER
            ]
            if current["metadata"].get("deletionTimestamp") and not current["metadata"]["finalizers"]:
                self.remove_pod(current["metadata"]["name"])
            else:
                self.update_pod(current["metadata"]["name"])

    def local_queue(self, namespace: str, name: str) -> tuple[bool, str | None]:
        self.calls.append("get LocalQueue")
        if self.kueue is None:
            return False, None
        return True, self.kueue["queues"].get(name)

    def get_node(self, name: str) -> Obj | None:
        """A Ready node, or one whose kubelet said NotReady when it stopped reporting (`lost_nodes`)."""
        self.calls.append("get Node")
        since = self.lost_nodes.get(name)
        ready = {"type": "Ready", "status": "True" if since is None else "False"}
        if since is not None:
            ready["lastTransitionTime"] = st.format_time(since)
        return {"metadata": {"name": name}, "status": {"conditions": [ready]}}

    def pod_log_tail(self, pod: Obj, container: str, since_seconds: int, limit_bytes: int) -> str:
        self.calls.append(f"read log {pod['metadata']['name']}")
        if self.unreadable_logs:
            raise LogUnreadable("500: no preferred addresses found; known addresses: []")
        return self.logs.get(pod["metadata"]["name"], "")

    def event(self, job: Obj, type_: str, reason: str, message: str, name: str | None = None) -> None:
        self.calls.append("create Event")
        if name is not None and name in self.event_names:
            return  # AlreadyExists: posted before
        if self.refuse_events and (error := self.refuse_events.pop(0)) is not None:
            raise error
        self.event_names.add(name or f"generated-{len(self.recorded)}")
        self.recorded.append((type_, reason, message))


def _implements(fake: FakeApi) -> KubeApi:
    return fake  # mypy checks here that the fake implements every method the operator uses, with its signature


def _apply(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _apply(result.get(key), value)
    return result
