"""The one module that talks to the Kubernetes API (the official client, called from threads only).

Objects go in and come out as plain dicts, the shape the builders and the status code use. Every write is
idempotent: creating what exists is success (names are deterministic), deleting what is gone is success. A create
the API server refuses is classified (`refusal`) so the job can say why instead of retrying blindly.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from kubetf.cluster import metrics
from kubetf.cluster.kube_api import (
    Conflict,
    Creation,
    Deletion,
    Expired,
    LogUnreadable,
    NotLeader,
    NotServed,
    Refused,
)
from kubetf.core import api, scheduling
from kubetf.core.refusals import DENIED, INVALID, NAME_IN_USE, UNAVAILABLE, Refusal
from kubetf.core.scheduling import workload as kueue
from kubetf.core.types import Resource, Write

log = logging.getLogger("kubetf.cluster.kube")

Obj = dict[str, Any]

# Every write is the leader's alone but these: the election's own Lease, and the progress endpoint's TokenReviews
# (a question to the API server, not a change).
UNGUARDED_RESOURCES = {"leases", "tokenreviews"}
# Cluster-scoped objects the operator reads for a job's Workload: (group, version, plural) by kind.
CLUSTER_OBJECTS = {
    "WorkloadPriorityClass": (kueue.GROUP, kueue.VERSION, "workloadpriorityclasses"),
    "ResourceFlavor": (kueue.GROUP, kueue.VERSION, "resourceflavors"),
    "PriorityClass": ("scheduling.k8s.io", "v1", "priorityclasses"),
}
READS = ("get", "list", "watch")
PAGE_SIZE = 500


def refusal(obj: Obj, error: Exception) -> Refusal | None:
    """What the API server's refusal to create `obj` means; None when it is not about the object (an error of the
    operator's own, raised as it is)."""
    kind, name = obj["kind"], obj["metadata"]["name"]
    if is_transient(error):  # a server error, a webhook it cannot call, a timeout: the cluster's, for now
        return Refusal(UNAVAILABLE, kind, name, _message(error) if isinstance(error, ApiException) else _short(error))
    if not isinstance(error, ApiException):
        return None
    message = _message(error)
    admission = "admission webhook" in message or "denied request" in message  # a webhook or a policy said no
    if error.status in (400, 422) and not admission:  # BadRequest: not even decodable (a quantity like 4GB)
        return Refusal(INVALID, kind, name, message)
    if error.status in (400, 403, 422):  # quota, LimitRange, PodSecurity, a webhook or a policy
        return Refusal(DENIED, kind, name, message)
    return None


def is_transient(error: BaseException) -> bool:
    """An error of the cluster that goes away by itself: the API server unreachable or overloaded (5xx, 429, a
    timeout, a connection refused), or an admission webhook it cannot call (a 500 that names it)."""
    if isinstance(error, ApiException):
        return error.status == 429 or (error.status or 0) >= 500 or error.status == 0
    return isinstance(error, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError)


def unchecked(method: Any) -> Any:
    """A generated API method without the client's own check of its arguments. Since client 37 each method checks
    them against its models first (pydantic): a pod with a number for a quantity (`nvidia.com/gpu: 1`, which the
    API server takes), a field newer than the client's models, or no read timeout for a followed log raised a
    ValidationError before anything was sent, one without a status code, so neither classified nor reported. The
    API server is the judge of an object, as it was for every client before 37."""
    raw = getattr(getattr(method, "__func__", None), "__wrapped__", None)
    return functools.partial(raw, method.__self__) if raw is not None else method


def _message(error: ApiException) -> str:
    try:
        return str(json.loads(error.body or "")["message"])
    except (TypeError, ValueError, KeyError):
        return str(error.reason or error.status)


def describe(error: BaseException) -> str:
    """One line for an error of the API or the network: the API server's own message, with its status code."""
    if isinstance(error, ApiException):
        return f"{error.status} {_message(error)}"[:300]
    return _short(error)


def _short(error: BaseException) -> str:
    """One line for a transient error: urllib3's own strings repeat the pool and the URL."""
    reason = getattr(error, "reason", None)
    return str(reason or error).splitlines()[0][:300]


def _namespace_terminating(error: ApiException) -> bool:
    return error.status == 403 and "NamespaceTerminating" in str(error.body)


@contextlib.contextmanager
def _measured(verb: str, resource: str) -> Iterator[None]:
    """One request, counted (kubetf_api_requests_total, and kubetf_api_errors_total when the API server answers with
    an error) and timed from sending it to its answer read (kubetf_api_request_seconds), errors too."""
    metrics.API_REQUESTS.labels(verb=verb, resource=resource).inc()
    sent = time.monotonic()
    try:
        yield
    except ApiException as error:
        metrics.API_ERRORS.labels(verb=verb, resource=resource, code=str(error.status)).inc()
        raise
    finally:
        metrics.API_SECONDS.labels(verb=verb, resource=resource).observe(time.monotonic() - sent)


class RateLimiter:
    """Client-side token bucket (like client-go's QPS/burst), so a burst of jobs cannot flood the API server."""

    def __init__(self, qps: float, burst: int) -> None:
        self.qps, self.burst = qps, burst
        self.tokens = float(burst)
        self.stamp = time.monotonic()
        self.lock = threading.Lock()

    def _take(self) -> float:
        """Take a token if one is there (0.0); else how long until one is, taking nothing."""
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.qps)
            self.stamp = now
            if self.tokens >= 1:
                self.tokens -= 1
                return 0.0
            return (1 - self.tokens) / self.qps

    def try_acquire(self) -> bool:
        """Take a token if one is there now; never waits."""
        return self._take() == 0.0

    def acquire(self) -> None:
        while (wait := self._take()) > 0:
            time.sleep(wait)


def load_config(kubeconfig: str | None = None) -> None:
    """In-cluster config inside a pod, else the kubeconfig (KUBECONFIG or ~/.kube/config)."""
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
    else:
        config.load_kube_config(config_file=kubeconfig)


PARALLEL_CALLS = 32  # a reconcile's creates, deletes and dry runs in parallel, for all reconciles together
URGENT_PARALLEL_CALLS = 8  # the same for urgent reconciles (Kube.urgent)
# The longest a write waits for urgent reconciles to end (UrgentFirst): new jobs are delayed by a storm of
# disruptions, never starved by one.
URGENT_HOLD_SECONDS = 5.0


class UrgentFirst:
    """While an urgent reconcile runs (a restart's event, status, deletes and replacements), the other writes wait
    for it to end, at most `hold` seconds each. The API server answers every call in turn: behind a burst of new
    jobs, each of a restart's steps waited for the 32 creates in flight beside it (bench-scale, 2,000 jobs running
    and 200 applied: eviction -> replacements p50 5.1 s; with the wait, 1.3 s). Reads and the writes that are not
    the job's (the lease, the progress endpoint's TokenReviews) never wait."""

    def __init__(self, hold: float) -> None:
        self.hold = hold
        self.running = 0  # urgent reconciles in progress
        self.idle = threading.Condition()
        self.lane = threading.local()  # .urgent: this thread works for an urgent reconcile

    @contextlib.contextmanager
    def section(self) -> Iterator[None]:
        """An urgent reconcile, on this thread."""
        self.lane.urgent = True
        with self.idle:
            self.running += 1
        try:
            yield
        finally:
            self.lane.urgent = False
            with self.idle:
                self.running -= 1
                if not self.running:
                    self.idle.notify_all()

    def mark_urgent(self) -> None:
        """This thread only ever works for urgent reconciles (the urgent pool's)."""
        self.lane.urgent = True

    def is_urgent(self) -> bool:
        return bool(getattr(self.lane, "urgent", False))

    def wait_turn(self) -> None:
        """Return when no urgent reconcile runs, or `hold` seconds from now; at once on an urgent thread."""
        if self.is_urgent():
            return
        with self.idle:
            if not self.running:
                return
            start = time.monotonic()
            self.idle.wait_for(lambda: not self.running, timeout=self.hold)
        metrics.API_WRITES_HELD.inc(time.monotonic() - start)


class Kube:
    def __init__(
        self,
        qps: float,
        burst: int,
        timeout: tuple[float, float] = (5, 30),
        may_write: Callable[[], bool] | None = None,
        instance: str | None = None,
        log_timeout: tuple[float, float] = (2, 4),
    ) -> None:
        configuration = client.Configuration.get_default_copy()
        # A connection for each thread that may call at once (the two pools, and the reconcile workers and other
        # threads that call on their own): beyond it urllib3 opens one more and discards it after the call, a TLS
        # handshake each time ("Connection pool is full" in the log, 4-13 times per bench-scale run at 32).
        configuration.connection_pool_maxsize = PARALLEL_CALLS + URGENT_PARALLEL_CALLS + 24
        self.api_client = client.ApiClient(configuration)
        self.core = client.CoreV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)
        self.coordination = client.CoordinationV1Api(self.api_client)
        self.authentication = client.AuthenticationV1Api(self.api_client)
        self.limiter = RateLimiter(qps, burst)
        self.timeout, self.log_timeout = timeout, log_timeout
        self.may_write = may_write
        self.pool = ThreadPoolExecutor(max_workers=PARALLEL_CALLS, thread_name_prefix="kubetf-api")
        # The parallel calls of an urgent reconcile (a restart's deletes and replacements) go on a pool of their
        # own: on the shared one they queued behind other reconciles' batches of new jobs' creates.
        self.first = UrgentFirst(URGENT_HOLD_SECONDS)
        self.urgent_pool = ThreadPoolExecutor(
            URGENT_PARALLEL_CALLS, thread_name_prefix="kubetf-api-urgent", initializer=self.first.mark_urgent
        )
        self.instance = instance or socket.gethostname()

    def urgent(self) -> contextlib.AbstractContextManager[None]:
        """Meanwhile, the parallel calls this thread makes go on the urgent pool, and other writes wait."""
        return self.first.section()

    def _parallel(self) -> ThreadPoolExecutor:
        return self.urgent_pool if self.first.is_urgent() else self.pool

    def _call(self, verb: str, resource: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        guarded = verb not in READS and resource not in UNGUARDED_RESOURCES
        if guarded:
            self.first.wait_turn()
        self.limiter.acquire()
        # After the limiter's wait, which may be long: a write leaves only while the lease is held (cluster.leader).
        if guarded and self.may_write is not None and not self.may_write():
            raise NotLeader(f"{verb} {resource}: this operator does not hold the leader lease")
        with _measured(verb, resource):
            data = unchecked(fn)(*args, _preload_content=False, _request_timeout=self.timeout, **kwargs).data
        return json.loads(data) if data else None

    def _get(self, resource: str, fn: Any, *args: Any) -> Obj | None:
        """Read one object; None when it does not exist."""
        try:
            found: Obj = self._call("get", resource, fn, *args)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return found

    # ------------------------------------------------------------------ TrainingJobs

    def get_job(self, namespace: str, name: str) -> Obj | None:
        return self._get(
            api.PLURAL, self.custom.get_namespaced_custom_object, api.GROUP, api.VERSION, namespace, api.PLURAL, name
        )

    def patch_job_status(self, job: Obj, patch: Obj) -> Obj | None:
        """Merge-patch the status subresource; None when the job is gone."""
        meta = job["metadata"]
        try:
            updated: Obj = self._call(
                "patch", f"{api.PLURAL}/status", self.custom.patch_namespaced_custom_object_status,
                api.GROUP, api.VERSION, meta["namespace"], api.PLURAL, meta["name"], {"status": patch},
            )  # fmt: skip
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return updated

    def delete_job(self, namespace: str, name: str, uid: str | None = None) -> bool:
        """Delete a job (its children go with it); with `uid`, only that incarnation. False when not there."""
        body: Obj = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self._call(
                "delete", api.PLURAL, self.custom.delete_namespaced_custom_object,
                api.GROUP, api.VERSION, namespace, api.PLURAL, name, body=body,
            )  # fmt: skip
        except ApiException as error:
            if error.status in (404, 409):  # gone, or another incarnation (the uid precondition failed)
                return False
            raise
        return True

    def create_job(self, job: Obj) -> Obj:
        namespace = job["metadata"].get("namespace") or "default"
        created: Obj = self._call(
            "create", api.PLURAL, self.custom.create_namespaced_custom_object,
            api.GROUP, api.VERSION, namespace, api.PLURAL, job,
        )  # fmt: skip
        return created

    # ------------------------------------------------------------------ children

    def list_pods(self, namespace: str, job_name: str) -> tuple[list[Obj], int]:
        """The job's pods and the list's resourceVersion."""
        result = self._call(
            "list", "pods", self.core.list_namespaced_pod, namespace, label_selector=f"{api.LABEL_JOB}={job_name}"
        )
        items: list[Obj] = result["items"]
        return items, int(result["metadata"].get("resourceVersion") or 0)

    def list_paged(
        self, resource: str, namespaces: Iterable[str], label_selector: str = "", api_version: str = api.API_VERSION
    ) -> Iterator[Obj]:
        """Every pod, or custom object (its plural and `api_version`), in `namespaces` (none: all), page by page."""
        for namespace in list(namespaces) or [""]:
            for items, _version in self.pages(resource, namespace, label_selector, api_version):
                yield from items

    def pages(
        self, resource: str, namespace: str, label_selector: str = "", api_version: str = api.API_VERSION
    ) -> Iterator[tuple[list[Obj], int]]:
        """One list (namespace "": all), page by page, each with the list's resourceVersion."""
        token = None
        version = 0
        while True:
            kwargs: dict[str, Any] = {"limit": PAGE_SIZE, "label_selector": label_selector}
            if token:
                kwargs["_continue"] = token
            fn, args = self._lister(resource, namespace, api_version)
            page = self._call("list", resource, fn, *args, **kwargs)
            metadata = page.get("metadata") or {}
            version = version or int(metadata.get("resourceVersion") or 0)
            yield page["items"], version
            token = metadata.get("continue")
            if not token:
                break

    def watch_pods(self, namespace: str, version: int, seconds: int) -> Iterator[Obj]:
        """The events of a watch of the operator's pods (namespace "": all) from `version`, with bookmarks, each
        parsed as it arrives, until the API server ends the watch after `seconds`. Raises `Expired` when it no longer
        has that version. (Not the client's `Watch`: it parses each pod into its models, and without that it reads an
        ERROR event's `raw_object`, a key the raw event lacks.)"""
        fn, args = self._lister("pods", namespace, api.API_VERSION)
        self.limiter.acquire()
        metrics.API_REQUESTS.labels(verb="watch", resource="pods").inc()
        response = unchecked(fn)(
            *args, watch=True, resource_version=str(version), allow_watch_bookmarks=True, timeout_seconds=seconds,
            label_selector=api.MANAGED_PODS_SELECTOR, _preload_content=False,
            _request_timeout=(self.timeout[0], seconds + 30),
        )  # fmt: skip
        try:
            for line in iter_resp_lines(response):
                if not line:
                    continue
                event: Obj = json.loads(line)
                if event.get("type") == "ERROR":  # the API server's Status, in the stream
                    status = event.get("object") or {}
                    if status.get("code") == 410:
                        raise Expired(status.get("message") or "too old resource version")
                    raise ApiException(status=status.get("code"), reason=status.get("message"))
                yield event
        finally:
            response.close()  # a watch left before its end: its connection is not reused with events unread
            response.release_conn()

    def _lister(self, resource: str, namespace: str, api_version: str) -> tuple[Any, tuple[str, ...]]:
        if resource == "pods":
            if namespace:
                return self.core.list_namespaced_pod, (namespace,)
            return self.core.list_pod_for_all_namespaces, ()
        group, version = api_version.split("/")
        if namespace:
            return self.custom.list_namespaced_custom_object, (group, version, namespace, resource)
        return self.custom.list_cluster_custom_object, (group, version, resource)

    def _create_call(self, obj: Obj, **kwargs: Any) -> Any:
        """Create (or with dry_run="All", try) a job's object: a Pod, Service, PVC, or a gang's PodGroup or Workload."""
        kind, namespace = obj["kind"], obj["metadata"]["namespace"]
        core = {
            "Pod": self.core.create_namespaced_pod,
            "Service": self.core.create_namespaced_service,
            "PersistentVolumeClaim": self.core.create_namespaced_persistent_volume_claim,
        }.get(kind)
        if core is not None:
            return self._call("create", kind.lower(), core, namespace, obj, **kwargs)
        resource = resource_of(obj)
        return self._call(
            "create", resource.plural, self.custom.create_namespaced_custom_object, resource.group, resource.version,
            namespace, resource.plural, obj, **kwargs,
        )  # fmt: skip

    def create(self, obj: Obj) -> Obj | None:
        """Create one of a job's objects. Returns the object, or None when one of that name already exists.
        Raises `Refused` when the API server refuses the object itself (invalid, denied by quota or admission)."""
        try:
            created: Obj = self._create_call(obj)
        except (ApiException, urllib3.exceptions.HTTPError) as error:
            if isinstance(error, ApiException) and (error.status == 409 or _namespace_terminating(error)):
                return None  # the namespace going away takes the job with it
            found = refusal(obj, error)
            if found is None:
                raise
            raise Refused(found) from error
        return created

    def dry_run(self, objects: list[Obj], owner_uid: str) -> Refusal | None:
        """Server-side dry run of creating `objects` (validation and admission, nothing stored), in parallel:
        the worst refusal (invalid, then name in use, then denied), None when all may be created."""
        found = [r for r in self._parallel().map(lambda o: self._trial(o, owner_uid), objects) if r is not None]
        order = (INVALID, NAME_IN_USE, DENIED, UNAVAILABLE)
        return min(found, key=lambda r: order.index(r.cause)) if found else None

    def create_first(self, obj: Obj, owner_uid: str) -> Refusal | None:
        """Create `obj` as its own trial, before anything else of its job (core.refusals.service_first): a refusal
        as `dry_run` gives it, an existing object of its name included (None: it is the job's to use)."""
        return self._trial(obj, owner_uid, dry_run=False)

    def _trial(self, obj: Obj, owner_uid: str, dry_run: bool = True) -> Refusal | None:
        kind = obj["kind"]
        try:
            self._create_call(obj, **({"dry_run": "All"} if dry_run else {}))
        except (ApiException, urllib3.exceptions.HTTPError) as error:
            if isinstance(error, ApiException) and _namespace_terminating(error):
                return None
            if isinstance(error, ApiException) and error.status == 409:  # valid and admitted: whose name is it?
                return None if kind == "Pod" else self._name_in_use(obj, owner_uid)
            found = refusal(obj, error)
            if found is None:
                raise
            if "does not support dry run" in found.message:
                return None  # a webhook with side effects: the real create will tell
            return found
        return None

    def _name_in_use(self, obj: Obj, owner_uid: str) -> Refusal | None:
        """The object of that name, unless it is this job's to use: one owned by this job, or a retained
        checkpoint PVC (no owner on purpose: a job re-created under its name resumes from it), not being deleted.
        Anything else (a previous job's, being garbage-collected) the job waits for to go."""
        kind, name, namespace = obj["kind"], obj["metadata"]["name"], obj["metadata"]["namespace"]
        core = self.core
        if kind in ("Service", "PersistentVolumeClaim"):
            read = core.read_namespaced_service if kind == "Service" else core.read_namespaced_persistent_volume_claim
            existing = self._get(kind.lower(), read, name, namespace)
        else:
            existing = self.get_owned(resource_of(obj), namespace, name)
        if existing is None:
            return None  # gone meanwhile: the create makes it
        meta = existing["metadata"]
        owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller")]
        ours = any(o.get("uid") == owner_uid for o in owners)
        if meta.get("deletionTimestamp"):
            whose = "" if ours or not owners else " of a previous job"
            return Refusal(NAME_IN_USE, kind, name, f"{kind} {name}{whose} is still being deleted")
        if ours or (not owners and kind == "PersistentVolumeClaim"):
            return None
        whose = f"{owners[0].get('kind')} {owners[0].get('name')} uid {owners[0].get('uid')}" if owners else "no owner"
        return Refusal(NAME_IN_USE, kind, name, f"{kind} {name} exists and is not this job's ({whose})")

    def create_batches(self, batches: list[list[Obj]]) -> Creation:
        """Create each batch in parallel, one after the other; stop after a batch with an error, so an object the
        API server refuses costs a few calls, not one per replica (the Job controller's slow start)."""
        result = Creation()
        for done, batch in enumerate(batches):
            outcomes = list(self._parallel().map(self._create_outcome, batch))
            for obj, outcome in zip(batch, outcomes, strict=True):
                if isinstance(outcome, Exception):
                    result.skipped.append(obj["metadata"]["name"])
                    result.error = result.error or outcome
                elif outcome is not None:
                    result.created.append(outcome)
            if result.error is not None:
                result.skipped += [o["metadata"]["name"] for later in batches[done + 1 :] for o in later]
                break
        if isinstance(result.error, Refused):
            result.refusal, result.error = result.error.refusal, None
        return result

    def _create_outcome(self, obj: Obj) -> Obj | Exception | None:
        try:
            return self.create(obj)
        except Exception as error:  # reported by create_batches, raised by its caller
            return error

    def delete_pods(self, pods: list[Obj], grace_seconds: int | None = None) -> Deletion:
        """Delete these pods, in parallel; one that fails does not stop the others."""
        result = Deletion()
        for pod, outcome in zip(
            pods, self._parallel().map(lambda p: self._delete_outcome(p, grace_seconds), pods), strict=True
        ):
            if isinstance(outcome, Exception):
                result.failed.append((pod, outcome))
            elif not outcome:
                result.gone.append(pod)
        return result

    def _delete_outcome(self, pod: Obj, grace_seconds: int | None) -> bool | Exception:
        try:
            return self.delete_pod(pod, grace_seconds)
        except Exception as error:  # reported by delete_pods, raised by its caller
            return error

    def delete_pod(self, pod: Obj, grace_seconds: int | None = None) -> bool:
        """Delete exactly this pod (uid precondition), with its own grace period so it can save a checkpoint unless
        `grace_seconds` shortens it (0: at once, for a pod on a lost node that will never confirm). False when it
        was already gone."""
        meta = pod["metadata"]
        body: Obj = {"preconditions": {"uid": meta["uid"]}} if meta.get("uid") else {}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        try:
            self._call("delete", "pods", self.core.delete_namespaced_pod, meta["name"], meta["namespace"], body=body)
        except ApiException as error:
            if error.status in (404, 409):  # gone, or already replaced by a newer pod of that name
                return False
            raise
        return True

    # ------------------------------------------------------------------ Kueue (kubetf.core.scheduling.kueue)

    def get_owned(self, resource: Resource, namespace: str, name: str) -> Obj | None:
        """One object of a kind a scheduler integration makes (kubetf.core.scheduling.RESOURCES); None when it does
        not exist, or the cluster does not serve its API."""
        try:
            found = self._get(
                resource.plural, self.custom.get_namespaced_custom_object, resource.group, resource.version, namespace,
                resource.plural, name,
            )  # fmt: skip
        except ApiException as error:
            if error.status in (403, 404):
                return None
            raise
        return found

    def get_cluster_object(self, kind: str, name: str) -> Obj | None:
        """A WorkloadPriorityClass, PriorityClass or ResourceFlavor; None when it does not exist."""
        group, version, plural = CLUSTER_OBJECTS[kind]
        return self._get(plural, self.custom.get_cluster_custom_object, group, version, plural, name)

    def write(self, write: Write, resource_version: str) -> Obj | None:
        """One write of an object a job owns (kubetf.core.types.Write) against `resource_version`: a merge patch of it
        or of its status subresource, a finalizer removed (a JSON patch testing the version and the finalizer's
        place), or its deletion (that incarnation only: its uid as a precondition). Returns the object as written;
        None when it is gone (or deleted). Raises `Conflict` when it changed since that version (its watch brings the
        newer one)."""
        resource = resource_of(write.obj)
        meta = write.obj["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        where = (resource.group, resource.version, namespace, resource.plural, name)
        if write.verb == "delete":
            body = {"preconditions": {"uid": meta["uid"]}, "propagationPolicy": "Background"}
            try:
                self._call("delete", resource.plural, self.custom.delete_namespaced_custom_object, *where, body=body)
            except ApiException as error:
                if error.status not in (404, 409):  # gone, or another incarnation (the uid precondition failed)
                    raise
            return None
        content_type = None
        if write.verb == "unfinalize":
            finalizers = list(meta.get("finalizers") or [])
            if write.finalizer not in finalizers:
                return write.obj
            at = finalizers.index(write.finalizer)
            patch: Any = [
                {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
                {"op": "test", "path": f"/metadata/finalizers/{at}", "value": write.finalizer},
                {"op": "remove", "path": f"/metadata/finalizers/{at}"},
            ]
            content_type = "application/json-patch+json"
        else:
            meta_patch = {**write.patch.get("metadata", {}), "resourceVersion": resource_version}
            patch = {**write.patch, "metadata": meta_patch}
        status = write.verb == "status"
        custom = self.custom
        method = custom.patch_namespaced_custom_object_status if status else custom.patch_namespaced_custom_object
        try:
            written: Obj = self._call(
                "patch", f"{resource.plural}/status" if status else resource.plural, method, *where, patch,
                _content_type=content_type,
            )  # fmt: skip
        except ApiException as error:
            if error.status == 404:
                return None
            if error.status == 409 or (error.status == 422 and write.verb == "unfinalize"):  # (422: a test failed)
                what = f"{write.obj['kind']} {namespace}/{name}"
                raise Conflict(f"{what} changed since version {resource_version}") from error
            raise
        return written

    def served_resources(self, group_version: str) -> set[str] | None:
        """The resources the API server serves in `group_version` (API discovery); None when it serves no such
        group version."""
        try:
            found = self._call("get", "discovery", self._get_path, f"/apis/{group_version}", [])
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return {r.get("name") for r in (found or {}).get("resources") or [] if r.get("name")}

    def release_pods(self, pods: list[Obj]) -> None:
        """Remove Kueue's pod-integration finalizer from these deleted pods (they run nothing any more:
        kubetf.core.scheduling.kueue.legacy_held), and end their deletion at once: the kubelet would confirm it only
        once it has cleaned up after the containers, most of a second that the replacement of the same name would
        wait for."""
        list(self._parallel().map(self._release, pods))

    def _release(self, pod: Obj) -> None:
        meta = pod["metadata"]
        for _attempt in range(3):
            finalizers = meta.get("finalizers") or []
            if kueue.POD_FINALIZER not in finalizers:
                return
            at = finalizers.index(kueue.POD_FINALIZER)
            # The uid and the finalizer's place are tested: never another pod of that name, never another entry.
            patch = [
                {"op": "test", "path": "/metadata/uid", "value": meta["uid"]},
                {"op": "test", "path": f"/metadata/finalizers/{at}", "value": kueue.POD_FINALIZER},
                {"op": "remove", "path": f"/metadata/finalizers/{at}"},
            ]
            try:
                self._patch_pod(pod, patch)
                self.delete_pod(pod, grace_seconds=0)
                return
            except ApiException as error:
                if error.status not in (409, 422):  # 422: a test failed: the list changed, read it again
                    raise
            fresh = self.get_pod(meta["namespace"], meta["name"])
            if fresh is None or fresh["metadata"].get("uid") != meta["uid"]:
                return
            meta = fresh["metadata"]

    def _patch_pod(self, pod: Obj, patch: Any) -> None:
        meta = pod["metadata"]
        try:
            self._call("patch", "pods", self.core.patch_namespaced_pod, meta["name"], meta["namespace"], patch)
        except ApiException as error:
            if error.status != 404:
                raise

    def local_queue(self, namespace: str, name: str) -> tuple[bool, str | None]:
        """(whether the cluster has Kueue's API, the LocalQueue's ClusterQueue or None when there is no such queue)."""
        try:
            queue = self._call(
                "get", "localqueues", self.custom.get_namespaced_custom_object,
                kueue.GROUP, kueue.VERSION, namespace, "localqueues", name,
            )  # fmt: skip
        except ApiException as error:
            if error.status != 404:
                raise
            # A missing object is a Status naming it; a missing API is a bare "404 page not found".
            try:
                details = json.loads(error.body or "{}").get("details")
            except ValueError:
                details = None
            return bool(details), None
        return True, str((queue.get("spec") or {}).get("clusterQueue") or "") or None

    def pending_workloads(self, path: str, offset: int, limit: int) -> list[Obj]:
        """Kueue's visibility API: the pending Workloads of a ClusterQueue (`clusterqueues/NAME`) or a LocalQueue
        (`namespaces/NS/localqueues/NAME`), from `offset`, in queue order, each with its positionInClusterQueue.
        Raises `NotServed` where the cluster does not serve it to the operator."""
        try:
            result = self._call(
                "get", "pendingworkloads", self._get_path,
                f"/apis/{kueue.VISIBILITY_GROUP}/{kueue.VISIBILITY_VERSION}/{path}/pendingworkloads",
                [("offset", offset), ("limit", limit)],
            )  # fmt: skip
        except ApiException as error:
            if error.status in (403, 404, 503):
                raise NotServed(error.status, _message(error)) from error
            raise
        items: list[Obj] = (result or {}).get("items") or []
        return items

    def _get_path(self, path: str, query: list[tuple[str, Any]], _preload_content: bool, _request_timeout: Any) -> Any:
        """GET a path no generated method has (API discovery, an aggregated API): the raw response, as `_call` expects
        it. (The client's call_api takes a serialized request since 37, and returns any status.)"""
        request = self.api_client.param_serialize(
            "GET", path, query_params=query, header_params={"Accept": "application/json"}, auth_settings=["BearerToken"]
        )
        response = self.api_client.call_api(*request, _request_timeout=_request_timeout)
        response.read()
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        return response

    def owned_pages(self, namespace: str, resource: Resource) -> Iterator[tuple[list[Obj], int]]:
        """The operator's own objects of a kind a scheduler integration makes (namespace "": all), page by page, each
        with its apiVersion and kind (a built-in API's list items lack them); none where the cluster does not serve
        that API, or the operator may not read it."""
        selector = f"{api.LABEL_MANAGED_BY}={api.MANAGER}"
        try:
            for items, version in self.pages(resource.plural, namespace, selector, resource.api_version):
                yield [{**item, "apiVersion": resource.api_version, "kind": resource.kind} for item in items], version
        except ApiException as error:
            if error.status not in (403, 404):
                raise

    def local_queue_pages(self, namespace: str) -> Iterator[tuple[list[Obj], int]]:
        """Kueue's LocalQueues (namespace "": all), page by page; none where Kueue is not installed or not readable."""
        return self._kueue_pages("localqueues", namespace)

    def _kueue_pages(self, resource: str, namespace: str, selector: str = "") -> Iterator[tuple[list[Obj], int]]:
        try:
            yield from self.pages(resource, namespace, selector, f"{kueue.GROUP}/{kueue.VERSION}")
        except ApiException as error:
            if error.status not in (403, 404):
                raise

    def review_token(self, token: str, audience: str) -> Obj:
        """The API server's TokenReview of `token` for `audience`: its status (authenticated, user, audiences)."""
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": token, "audiences": [audience]}}  # fmt: skip
        review: Obj = self._call("create", "tokenreviews", self.authentication.create_token_review, body)
        return review.get("status") or {}

    def get_node(self, name: str) -> Obj | None:
        return self._get("nodes", self.core.read_node, name)

    def get_pod(self, namespace: str, name: str) -> Obj | None:
        return self._get("pods", self.core.read_namespaced_pod, name, namespace)

    def pod_log(self, namespace: str, name: str, follow: bool = False, container: str | None = None) -> Any:
        """The pod's log as a stream of bytes lines (follow: until the container ends)."""
        self.limiter.acquire()
        # Followed, no read timeout: the log may be quiet for as long as the program is (the client's own types
        # do not say a None read timeout, which urllib3 takes).
        timeout: Any = (self.timeout[0], None) if follow else self.timeout
        return unchecked(self.core.read_namespaced_pod_log)(
            name, namespace, container=container, follow=follow, _preload_content=False, _request_timeout=timeout
        )

    def pod_log_tail(self, pod: Obj, container: str, since_seconds: int, limit_bytes: int) -> str:
        """What the container printed in the last `since_seconds` (at most `limit_bytes`); "" when there is no
        log to read (the pod or its container is gone). Raises `LogUnreadable` when its node did not give it."""
        meta = pod["metadata"]
        self.limiter.acquire()
        try:
            with _measured("get", "pods/log"):
                # not preloaded: the raw urllib3 response, whatever the client's types say
                response: Any = self.core.read_namespaced_pod_log(
                    meta["name"], meta["namespace"], container=container, since_seconds=since_seconds,
                    limit_bytes=limit_bytes, _preload_content=False, _request_timeout=self.log_timeout,
                )  # fmt: skip
                data = bytes(response.data or b"")
        except ApiException as error:
            if error.status in (400, 404):
                return ""
            raise LogUnreadable(f"{error.status}: {_message(error)}") from error
        return data.decode("utf-8", "replace")

    def list_events(self, namespace: str, name: str, uid: str | None = None) -> list[Obj]:
        """The Events of the object of that name; with `uid`, of that incarnation only."""
        selector = f"involvedObject.name={name}" + (f",involvedObject.uid={uid}" if uid else "")
        result = self._call("list", "events", self.core.list_namespaced_event, namespace, field_selector=selector)
        items: list[Obj] = result["items"]
        return items

    # ------------------------------------------------------------------ leader election

    def get_lease(self, namespace: str, name: str) -> Obj | None:
        return self._get("leases", self.coordination.read_namespaced_lease, name, namespace)

    def create_lease(self, namespace: str, body: Obj) -> Obj:
        created: Obj = self._call("create", "leases", self.coordination.create_namespaced_lease, namespace, body)
        return created

    def replace_lease(self, namespace: str, name: str, body: Obj) -> Obj:
        """Write the lease; the body's resourceVersion makes it fail (409) if someone wrote it meanwhile."""
        replaced: Obj = self._call(
            "update", "leases", self.coordination.replace_namespaced_lease, name, namespace, body
        )
        return replaced

    # ------------------------------------------------------------------ events

    def event(self, job: Obj, type_: str, reason: str, message: str, name: str | None = None) -> None:
        """Post an Event on the job; with `name`, once: an Event of that name already there is this one."""
        meta = job["metadata"]
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        identity = {"name": name} if name else {"generateName": f"{meta['name']}."}
        body = {
            "metadata": {**identity, "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": api.API_VERSION,
                "kind": api.KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "source": {"component": "kubetf-operator"},
            "reportingComponent": "kubetf.io/operator",
            "reportingInstance": self.instance,
        }
        try:
            self._call("create", "events", self.core.create_namespaced_event, meta["namespace"], body)
        except ApiException as error:
            if error.status == 409 and name:
                return  # posted before (a retry, an operator that stopped after its post)
            if error.status in (409, 429) or (error.status or 0) >= 500:
                raise  # transient: the reconcile fails before the status records the decision, and posts it again
            # Refused for good (forbidden, invalid, namespace going away): never worth failing a reconcile for.
            level = logging.DEBUG if _namespace_terminating(error) else logging.WARNING
            log.log(level, "could not record event %s on %s/%s: %s %s", reason, meta["namespace"], meta["name"],
                    error.status, _message(error))  # fmt: skip


def resource_of(obj: Obj) -> Resource:
    """The kind of object a scheduler integration makes that `obj` is (kubetf.core.scheduling.RESOURCES)."""
    found = next((r for r in scheduling.RESOURCES if r.holds(obj)), None)
    if found is None:
        raise ValueError(f"{obj.get('apiVersion')} {obj.get('kind')} is not a kind the operator makes")
    return found
