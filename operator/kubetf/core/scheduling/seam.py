"""The seam's types (kubetf.core.scheduling): what an integration is given (`Situation`) and what it answers (`Gate`,
`Placing`), and the `Integration` protocol every scheduler module implements. A leaf of the package: the modules
import it, the registry (`__init__`) imports them."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubetf.core.config import OperatorConfig
from kubetf.core.scheduling.workload import Admission
from kubetf.core.status import TaskView
from kubetf.core.types import Event, Job, Obj, Pod, Resource, Write

Task = tuple[str, int]


@dataclass(frozen=True)
class Waiting:
    """A gang not placed yet: whether that is worth saying, and why (the scheduler's words), or past its timeout."""

    reason: str  # GangWaiting, or GangScheduleTimeout
    message: str
    timed_out: bool = False
    fail: bool = False  # past the timeout with onScheduleTimeout: Fail


@dataclass(frozen=True)
class Served:
    """Which gang schedulers' APIs the cluster serves (API discovery)."""

    kubernetes: bool = False
    volcano: bool = False


@dataclass
class Situation:
    """What an integration decides on: one reconcile's view of the job."""

    job: Job  # with the CRD's defaults
    status: dict[str, Any]  # as decided so far; an integration changes only its own record, status["gang"]
    pods: list[Pod]  # the pods of TrainingJobs of its name: its own, and an earlier job's of that name
    views: dict[str, TaskView]  # its tasks, after this reconcile's restart decisions
    owned: list[Obj]  # objects but pods labelled for its name: its own, earlier jobs' (by uid), anyone's
    now: float
    config: OperatorConfig
    admission: Admission | None = None  # what Kueue says of a queued job (runtime.observer)
    lost_nodes: Mapping[str, float] = field(default_factory=dict)
    creating: bool = False  # this reconcile creates pods


@dataclass(frozen=True)
class Gate:
    """The job's pods may not be here now: why (a condition), whether the job waits in a queue (its clock stops),
    and, when pods of it run, why they must stop (one disruption)."""

    reason: str
    message: str
    warning: bool = False
    queued: bool = True
    stop: str | None = None


@dataclass
class Placing:
    """What an integration needs done this reconcile."""

    create: list[Obj] = field(default_factory=list)  # to exist before the pods that use them (made when missing)
    writes: list[Write] = field(default_factory=list)  # after the creates
    waiting: Waiting | None = None  # a gang not placed, worth saying
    holding: bool = False  # the gang is not placed: its training pods' startup timeout does not run yet
    placed_at: float | None = None  # when the gang was placed: the startup timeout counts from then
    events: list[Event] = field(default_factory=list)
    wake_at: float | None = None

    def add(self, other: Placing) -> None:
        self.create += other.create
        self.writes += other.writes
        self.waiting = self.waiting or other.waiting
        self.holding = self.holding or other.holding
        self.placed_at = max((t for t in (self.placed_at, other.placed_at) if t is not None), default=None)
        self.events += other.events
        self.wake_at = min((t for t in (self.wake_at, other.wake_at) if t is not None), default=None)


@dataclass(frozen=True)
class Remains:
    """What is around a job's name at a reconcile: the objects labelled for it and its pods; the job (None: gone);
    whether it ended. An integration lets go of what is no longer any job's (`Integration.farewell`)."""

    owned: list[Obj]
    pods: list[Pod]
    job: Job | None
    name: str
    now: float
    ended: bool = True
    lost_nodes: Mapping[str, float] = field(default_factory=dict)


class Integration(Protocol):
    """A scheduler integration: a module of pure functions (each of `native`, `volcano`, `kueue`, `multikueue`)."""

    NAME: str
    RESOURCES: tuple[Resource, ...]  # what it makes for a job: watched, cached, written by the shell
    RUNS_PODS: bool  # False: the job's pods run on another cluster (MultiKueue's manager)
    POD_ANNOTATIONS: tuple[str, ...]  # the pods' annotations it reads: kept by the cache

    def gate(self, s: Situation) -> Gate | None: ...
    def regroup(self, s: Situation, restarted: set[Task]) -> None: ...
    def join(self, s: Situation, pod: Pod, role: str) -> None: ...
    def place(self, s: Situation) -> Placing: ...
    def finish(self, s: Situation) -> list[Write]: ...
    def farewell(self, r: Remains) -> list[Write]: ...
    def release(self, pods: list[Pod], lost_nodes: Collection[str]) -> list[Pod]: ...
