"""What a reconcile sees (`Observed`) and what it decides (`Plan`, or `Bookkeeping` for a job that runs no pod here):
the two ends of the pure decision.

The shell (kubetf.runtime) fills an `Observed` from its cache and the API, calls `reconcile.decide`, and carries the
plan out in a fixed order without deciding anything itself: store the status decided so far (when
`persist_first`), delete, force-delete, create batch by batch (what the scheduler integrations need first, then the
pods), write the objects the job owns (`writes`: its PodGroups, its Workload), then store the final status
`reconcile.after_creates` derives from what was created, and post the events.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubetf.core.failing import Failing
from kubetf.core.progress.merge import Held
from kubetf.core.scheduling import Gate, Served
from kubetf.core.scheduling.workload import Admission
from kubetf.core.sigterm import LogRead, Watched
from kubetf.core.types import Event, Job, Obj, Pod, Write

__all__ = ["Bookkeeping", "Event", "Observed", "Plan"]


@dataclass(frozen=True)
class Observed:
    """Everything a reconcile of one job reads, at one instant."""

    job: Job | None  # None: deleted; its pods go with it
    pods: list[Pod]  # the pods of TrainingJobs of its name: its own, and a previous job's of the same name
    now: float
    # The nodes of the job's pods that stopped reporting (NotReady, Unknown, gone): since when, as far as known.
    lost_nodes: Mapping[str, float] = field(default_factory=dict)
    admission: Admission | None = None  # what Kueue says of a queued job
    # A MultiWorkerMirrored group restart (kubetf.core.sigterm): what earlier reconciles found in the logs of the
    # pods sent SIGTERM (by uid), and the logs read for this one (None: the log could not be read).
    sigterm: Mapping[str, Watched] = field(default_factory=dict)
    logs: Mapping[str, str | None] = field(default_factory=dict)
    # The objects but pods labelled for its name (PodGroups, Workloads): its own, an earlier job's of that name, and
    # anyone else's; which are whose is their controller reference's to say (kubetf.core.types.owned_by).
    owned: list[Obj] = field(default_factory=list)
    # The job's progress as the operator holds it, newer than its status until written (kubetf.core.progress)
    progress: Held | None = None
    failing: Failing | None = None  # its reconciles that failed in a row (kubetf.core.failing)
    # Pods that carry the job's labels but are not a TrainingJob's of its name (status.split_pods): never touched;
    # one that holds a task's pod name keeps that task waiting.
    foreign: list[Pod] = field(default_factory=list)
    served: Served = field(default_factory=Served)  # the gang schedulers' APIs the cluster serves
    key: tuple[str, str] = ("", "")  # the job's (namespace, name), whether it exists or not


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
    trial: list[Obj] = field(default_factory=list)
    batches: list[list[Obj]] = field(default_factory=list)
    more_to_create: bool = False
    # Deleted pods whose scheduler integration's finalizer goes (they run nothing); the writes of the objects the job
    # owns, in order, after the creates (kubetf.core.types.Write).
    release: list[Pod] = field(default_factory=list)
    writes: list[Write] = field(default_factory=list)
    requeue_at: float | None = None
    delete_job: bool = False
    admission: Admission | None = None
    # The held progress (Observed.progress): `status` carries it when its write is due (`Held.release`); else it goes
    # with any status write this plan makes (`progress_along`), so the write that says a job ended says how far it got.
    progress: Held | None = None
    progress_along: dict[str, Any] | None = None
    names_taken: list[tuple[str, Pod]] = field(default_factory=list)  # tasks' pod names another's pod holds
    waiting: tuple[str, str, bool] | None = None  # (reason, message, timed out: a Warning) of a scheduler's wait
    gate: Gate | None = None  # the job's pods may not be here now: why (kubetf.core.scheduling.Gate)

    def wake_at(self, when: float | None) -> None:
        if when is not None and (self.requeue_at is None or when < self.requeue_at):
            self.requeue_at = when

    @property
    def queue_place(self) -> Admission | None:
        """While the job is Queued: the admission its place in the queue is followed by (runtime.positions)."""
        return self.admission if self.status.get("phase") == "Queued" else None

    @property
    def create(self) -> list[Obj]:
        """The pods this plan creates."""
        return [o for batch in self.batches for o in batch if o["kind"] == "Pod"]


@dataclass
class Bookkeeping:
    """The plan of a job that runs no pod here: one that is gone (its Workloads let go, pods Kueue's pod integration
    still holds released), or one MultiKueue runs on another cluster (its Workload made and followed; its status
    written only to say it can never be dispatched, before anything was)."""

    create: list[Obj] = field(default_factory=list)
    writes: list[Write] = field(default_factory=list)
    release: list[Pod] = field(default_factory=list)
    status: dict[str, Any] | None = None  # None: the job's status is not this operator's to write
    events: list[Event] = field(default_factory=list)
    read_logs: list[LogRead] = field(default_factory=list)  # none: bookkeeping decides nothing on a log
