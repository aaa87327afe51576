"""What a reconcile sees (`Observed`) and what it decides (`Plan`): the two ends of the pure decision.

The shell (kubetf.runtime) fills an `Observed` from its cache and the API, calls `reconcile.plan`, and carries the
`Plan` out in a fixed order without deciding anything itself: post the events and store the status decided so far
(when `persist_first`), delete, force-delete, release, create batch by batch, delete the PodGroups no pod uses,
write the job's Workload (Kueue), then store the final status `reconcile.after_creates` derives from what was
created.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubetf.core.api import Job
from kubetf.core.failing import Failing
from kubetf.core.gang import Served
from kubetf.core.kueue import Admission, WorkloadWrite, managed_here
from kubetf.core.progress.merge import Held
from kubetf.core.sigterm import LogRead, Watched

Pod = dict[str, Any]


@dataclass(frozen=True)
class Observed:
    """Everything a reconcile of one job reads, at one instant."""

    job: Job | None  # None: deleted; its pods go with it
    pods: list[Pod]  # the pods of TrainingJobs of its name: its own, and a previous job's of the same name
    now: float
    # The nodes of the job's pods that stopped reporting (NotReady, Unknown, gone): since when, as far as known.
    lost_nodes: Mapping[str, float] = field(default_factory=dict)
    admission: Admission | None = None  # a queued job's admission by Kueue
    # A MultiWorkerMirrored group restart (kubetf.core.sigterm): what earlier reconciles found in the logs of the
    # pods sent SIGTERM (by uid), and the logs read for this one (None: the log could not be read).
    sigterm: Mapping[str, Watched] = field(default_factory=dict)
    logs: Mapping[str, str | None] = field(default_factory=dict)
    # The Workloads of TrainingJobs of its name but its own (a previous job's: kueue.orphans)
    workloads: list[dict[str, Any]] = field(default_factory=list)
    # The job's progress as the operator holds it, newer than its status until written (kubetf.core.progress)
    progress: Held | None = None
    failing: Failing | None = None  # its reconciles that failed in a row (kubetf.core.failing)
    # Pods that carry the job's labels but are not a TrainingJob's of its name (status.split_pods): never touched;
    # one that holds a task's pod name keeps that task waiting.
    foreign: list[Pod] = field(default_factory=list)
    # Gang scheduling (kubetf.core.gang): the schedulers' APIs the cluster serves, and the job's PodGroups.
    served: Served = field(default_factory=Served)
    pod_groups: list[dict[str, Any]] = field(default_factory=list)
    key: tuple[str, str] = ("", "")  # the job's (namespace, name), whether it exists or not


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Plan:
    job: Job  # the job with the CRD's defaults applied
    status: dict[str, Any]
    persist_first: bool = False  # the status holds decisions that must be stored before pods are touched
    events: list[Event] = field(default_factory=list)
    # Deletions: now, with `grace` (None: the pods' own grace period); on a lost node at once (no kubelet will
    # confirm); `held` until `hold_until`, when the reconcile comes again (kubetf.core.sigterm).
    delete: list[Pod] = field(default_factory=list)
    grace: int | None = None
    force_delete: list[Pod] = field(default_factory=list)
    held: list[Pod] = field(default_factory=list)
    hold_until: float | None = None
    # Logs to read before this plan is final: the shell reads them and plans again (kubetf.core.sigterm).
    read_logs: list[LogRead] = field(default_factory=list)
    sigterm: dict[str, Watched] = field(default_factory=dict)  # what to remember for the next reconcile
    # Creation: `trial` is dry-run first (nothing is created unless all of it would be); then the batches, each
    # created in parallel, stopping after a batch with an error. `more_to_create`: pods left for a later turn.
    trial: list[dict[str, Any]] = field(default_factory=list)
    batches: list[list[dict[str, Any]]] = field(default_factory=list)
    more_to_create: bool = False
    # Kueue (kubetf.core.kueue): deleted pods whose pod-integration finalizer goes; the writes of the job's
    # Workloads, in order (a Workload to make is created as pods are: `batches`).
    release: list[Pod] = field(default_factory=list)
    workload_writes: list[WorkloadWrite] = field(default_factory=list)
    requeue_at: float | None = None
    delete_job: bool = False
    admission: Admission | None = None
    # The held progress (Observed.progress): `status` carries it when its write is due (`Held.release`); else it goes
    # with any status write this plan makes (`progress_along`), so the write that says a job ended says how far it got.
    progress: Held | None = None
    progress_along: dict[str, Any] | None = None
    names_taken: list[tuple[str, Pod]] = field(default_factory=list)  # tasks' pod names another's pod holds
    gang_waiting: tuple[str, str] | None = None  # (reason, message) while the job's gang waits to be placed
    delete_objects: list[dict[str, Any]] = field(default_factory=list)  # the job's PodGroups no pod uses any more

    def wake_at(self, when: float | None) -> None:
        if when is not None and (self.requeue_at is None or when < self.requeue_at):
            self.requeue_at = when

    @property
    def queue_place(self) -> Admission | None:
        """While the job is Queued: the admission its place in the queue is followed by (runtime.positions)."""
        return self.admission if self.status.get("phase") == "Queued" else None

    @property
    def create(self) -> list[dict[str, Any]]:
        """The pods this plan creates."""
        return [o for batch in self.batches for o in batch if o["kind"] == "Pod"]


@dataclass(frozen=True)
class Farewell:
    """A deleted job's plan: its pods go with it (garbage collection); its Workloads are finished and let go, and
    pods Kueue's pod integration still holds are released."""

    writes: list[WorkloadWrite]
    release: list[Pod]
    read_logs: list[LogRead] = field(default_factory=list)  # none: a farewell decides nothing on a log


@dataclass
class Dispatch:
    """The plan of a job MultiKueue runs on another cluster (kubetf.core.kueue.dispatched): its Workload only."""

    create: dict[str, Any] | None = None
    writes: list[WorkloadWrite] = field(default_factory=list)
    read_logs: list[LogRead] = field(default_factory=list)  # none


def runs_here(job: Job | None) -> bool:
    """The job exists, is not being deleted, and this operator runs it (not MultiKueue: spec.managedBy)."""
    return job is not None and not job["metadata"].get("deletionTimestamp") and managed_here(job)
