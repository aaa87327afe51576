"""What the operator needs of the Kubernetes API, as a Protocol: `cluster.kube.Kube` implements it against a real
API server, the unit tests' `FakeApi` in memory, and mypy checks both against it (`make lint`). With the errors
and results that cross it.

Every write is idempotent: creating what exists is success (names are deterministic), deleting what is gone is
success.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubetf.core.types import Refusal, Resource, Write

Obj = dict[str, Any]


class KubeApi(Protocol):
    def urgent(self) -> AbstractContextManager[None]: ...  # meanwhile, this thread's parallel calls go first
    # ---- reads (the cache is filled from the lists; the rest is read when a reconcile needs it)
    def list_paged(
        self, resource: str, namespaces: Iterable[str], label_selector: str = ..., api_version: str = ...
    ) -> Iterator[Obj]: ...
    def pages(
        self, resource: str, namespace: str, label_selector: str = ..., api_version: str = ...
    ) -> Iterator[tuple[list[Obj], int]]: ...
    def local_queue_pages(self, namespace: str) -> Iterator[tuple[list[Obj], int]]: ...
    def owned_pages(self, namespace: str, resource: Resource) -> Iterator[tuple[list[Obj], int]]: ...
    def local_queue(self, namespace: str, name: str) -> tuple[bool, str | None]: ...
    def pending_workloads(self, path: str, offset: int, limit: int) -> list[Obj]: ...
    def get_node(self, name: str) -> Obj | None: ...
    def get_job(self, namespace: str, name: str) -> Obj | None: ...
    def review_token(self, token: str, audience: str) -> Obj: ...
    def pod_log_tail(self, pod: Obj, container: str, since_seconds: int, limit_bytes: int) -> str: ...
    def served_resources(self, group_version: str) -> set[str] | None: ...
    def watch_pods(self, namespace: str, version: int, seconds: int) -> Iterator[Obj]: ...
    def get_owned(self, resource: Resource, namespace: str, name: str) -> Obj | None: ...
    def get_cluster_object(self, kind: str, name: str) -> Obj | None: ...

    # ---- writes (the leader's alone: `NotLeader` otherwise)
    def dry_run(self, objects: list[Obj], owner_uid: str) -> Refusal | None: ...
    def create_first(self, obj: Obj, owner_uid: str) -> Refusal | None: ...
    def create_batches(self, batches: list[list[Obj]]) -> Creation: ...
    def delete_pods(self, pods: list[Obj], grace_seconds: int | None = None) -> Deletion: ...
    def release_pods(self, pods: list[Obj]) -> None: ...
    def patch_job_status(self, job: Obj, patch: Obj) -> Obj | None: ...
    def delete_job(self, namespace: str, name: str, uid: str | None = None) -> bool: ...
    def write(self, write: Write, resource_version: str) -> Obj | None: ...
    def event(self, job: Obj, type_: str, reason: str, message: str, name: str | None = None) -> None: ...


class NotLeader(Exception):
    """A write refused because this operator does not hold the leader lease (any more)."""


class Expired(Exception):
    """A watch's resourceVersion is older than the API server keeps (410 Gone): list again, then watch from there."""


class Conflict(Exception):
    """A write made against a resourceVersion that is no longer the object's: it changed since it was read."""


class Refused(Exception):
    """The API server would not create one of a job's objects; `refusal` says why, classified."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(f"{refusal.kind} {refusal.name}: {refusal.message}")
        self.refusal = refusal


class NotServed(Exception):
    """The cluster does not serve this API to the operator: not installed (404), no RBAC for it (403), or its
    aggregated API server unavailable (503)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class LogUnreadable(Exception):
    """The API server could not get a pod's log from its node (the status and the server's own words)."""


@dataclass
class Creation:
    """What a creation in batches did: created objects, names not created, and why: a refusal (the job's status
    says it) or another error (a name already taken is neither: the watch shows that object)."""

    created: list[Obj] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    refusal: Refusal | None = None
    error: Exception | None = None


@dataclass
class Deletion:
    """What deleting pods did: those already gone, and those whose delete failed (with why: the others went on)."""

    gone: list[Obj] = field(default_factory=list)
    failed: list[tuple[Obj, Exception]] = field(default_factory=list)
