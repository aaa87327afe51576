"""Each job's series read from its status, as the operator's cache holds it: its phase, what it waits for and since
when, its restarts, when its activeDeadlineSeconds runs out and when it is expected to finish (the shipped dashboard
and alert rules read them: docs/operating.md).

They are made when /metrics is read, from the cached jobs, by the operator that acts only: a standby's cache is
empty, and a leader that lost its lease keeps its cache, whose series would repeat the new leader's. A job is parsed
again only when its resourceVersion changed since the last read: what a read derived of each job is kept (a few
numbers), so a scrape of 10,000 unchanged jobs parses none of them.

Times are Unix timestamps (`*_timestamp_seconds`), not durations: a duration is stale between two scrapes, a
timestamp is not (`time() - kubetf_job_waiting_since_timestamp_seconds` is how long, at any instant).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kubetf.cluster.cache import Key
from kubetf.core import status as st
from kubetf.core import timers

JOB = ["namespace", "job"]

# What a job that does not train waits for (label `cause`): the same words as the goodput accounting's lost time
# (kubetf_job_lost_seconds{cause}).
QUEUED, GANG, STARTING, RESTARTING = "queued", "gangWaiting", "starting", "restarting"


@dataclass(frozen=True, slots=True)
class Derived:
    """What the series say of one job."""

    phase: str | None
    wait: tuple[str, float] | None  # (cause, since when)
    failures: int
    disruptions: int
    deadline: float | None  # when activeDeadlineSeconds runs out, while the job is active
    completion: float | None  # when a running job is expected to finish: its last report's time plus its ETA


def derive(job: dict[str, Any]) -> Derived:
    status = job.get("status") or {}
    phase = status.get("phase")
    restarts = status.get("restarts") or {}
    return Derived(
        phase=phase if isinstance(phase, str) else None,
        wait=_wait(status),
        failures=_count(restarts.get("failures")),
        disruptions=_count(restarts.get("disruptions")),
        deadline=timers.deadline(job, status) if job.get("spec") else None,
        completion=_completion(status),
    )


def _wait(status: dict[str, Any]) -> tuple[str, float] | None:
    """What the job waits for and since when: Kueue's admission, its gang's placement, its pods' start (new, or the
    replacements of a restart). A gang's wait is told apart from its pods' start: the gang may wait for room for
    hours, a pod starts in seconds."""
    phase = status.get("phase")
    condition = st.current_condition(status) or {}
    since = _time(condition.get("lastTransitionTime"))
    gang = _time((status.get("gang") or {}).get("waitingSince"))
    if phase == st.QUEUED:
        since = _time(status.get("queuedSince")) or since
        return (QUEUED, since) if since is not None else None
    if phase in (st.PENDING, st.RESTARTING) and gang is not None:
        return GANG, gang
    cause = STARTING if phase == st.PENDING else RESTARTING if phase == st.RESTARTING else None
    return (cause, since) if cause is not None and since is not None else None


def _completion(status: dict[str, Any]) -> float | None:
    progress = status.get("progress") or {}
    eta, reported = progress.get("etaSeconds"), _time(progress.get("lastReportTime"))
    if status.get("phase") != st.RUNNING or not isinstance(eta, int | float) or reported is None:
        return None
    return reported + eta


def _time(value: Any) -> float | None:
    try:
        return st.parse_time(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _count(value: Any) -> int:
    return value if isinstance(value, int) else 0


class StatusSeries(Collector):
    """The collector of every cached job's status series. `jobs`: the cache's jobs as (key, resourceVersion, slim
    JSON) (cluster.cache.Store.job_versions); `acting`: whether this operator acts (the leader, its cache primed)."""

    def __init__(self, jobs: Callable[[], list[tuple[Key, int, str]]], acting: Callable[[], bool]) -> None:
        self.jobs, self.acting = jobs, acting
        self.lock = threading.Lock()  # the metrics port answers two scrapes at once
        self.known: dict[Key, tuple[int, Derived]] = {}

    def describe(self) -> list[Metric]:
        return list(_families())

    def collect(self) -> Iterator[Metric]:
        phase, waiting, restarts, deadline, completion = families = _families()
        if not self.acting():
            with self.lock:
                self.known.clear()
            yield from families
            return
        with self.lock:
            current = self._current()
        for (namespace, name), job in current:
            if job.phase is not None:
                phase.add_metric([namespace, name, job.phase], 1)
            if job.wait is not None:
                waiting.add_metric([namespace, name, job.wait[0]], job.wait[1])
            restarts.add_metric([namespace, name, "failure"], job.failures)
            restarts.add_metric([namespace, name, "disruption"], job.disruptions)
            if job.deadline is not None:
                deadline.add_metric([namespace, name], job.deadline)
            if job.completion is not None:
                completion.add_metric([namespace, name], job.completion)
        yield from families

    def _current(self) -> list[tuple[Key, Derived]]:
        known: dict[Key, tuple[int, Derived]] = {}
        for key, version, encoded in self.jobs():
            seen = self.known.get(key)
            known[key] = seen if seen is not None and seen[0] == version else (version, derive(json.loads(encoded)))
        self.known = known  # a job gone from the cache goes from here too
        return [(key, derived) for key, (_, derived) in known.items()]


def _families() -> tuple[
    GaugeMetricFamily, GaugeMetricFamily, CounterMetricFamily, GaugeMetricFamily, GaugeMetricFamily
]:
    return (
        GaugeMetricFamily(
            "kubetf_job_status_phase", "1 for a TrainingJob's current phase (status.phase)", labels=[*JOB, "phase"]
        ),
        GaugeMetricFamily(
            "kubetf_job_waiting_since_timestamp_seconds",
            "Since when a job waits, by cause: queued (Kueue's admission), gangWaiting (its gang's placement), "
            "starting (its pods' start), restarting (a restart's replacements)",
            labels=[*JOB, "cause"],
        ),
        CounterMetricFamily(
            "kubetf_job_restarts",
            "A job's restarts by kind (failure, disruption): status.restarts",
            labels=[*JOB, "kind"],
        ),
        GaugeMetricFamily(
            "kubetf_job_deadline_timestamp_seconds",
            "When an active job's activeDeadlineSeconds runs out if it stays active (time queued or suspended not "
            "counted)",
            labels=JOB,
        ),
        GaugeMetricFamily(
            "kubetf_job_estimated_completion_timestamp_seconds",
            "When a running job is expected to finish: its last progress report's time plus its ETA",
            labels=JOB,
        ),
    )
