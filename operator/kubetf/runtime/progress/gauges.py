"""Each job's Prometheus series: its progress, steps per second, the latest value of each metric it reports and its
training health. They are held as plain values per job and made into samples only when /metrics is read: a job's
end drops its own entry, and a job has at most `MAX_METRICS` metric series, those its progress still holds (a name
it stopped reporting goes).

Why not a prometheus_client Gauge child per series: at 10,000 jobs reporting 20 metrics each those were 200,000
objects of several parts each, 170-245 MiB of the operator's memory, and every full pass of Python's garbage
collector walked them (about 0.3 s, during which kopf's event loop stood still: `make bench-progress`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kubetf.cluster.cache import Key
from kubetf.core import goodput
from kubetf.core.progress.protocol import MAX_METRICS, number
from kubetf.runtime.pages import checkpoint

JOB = ["namespace", "job"]


@dataclass
class _Values:
    progress: float | None = None  # 0 to 1
    rate: float | None = None  # steps per second
    metrics: dict[str, float] = field(default_factory=dict)
    unhealthy: str | None = None  # the reason of a True TrainingUnhealthy condition
    # The job's goodput as its status last said it (kubetf.core.goodput), counted up to the scrape: (the status's
    # fields it reads, its creation time)
    goodput: tuple[dict[str, Any], float | None] | None = None

    def empty(self) -> bool:
        return (
            self.progress is None and self.rate is None and not self.metrics and self.unhealthy is None
            and self.goodput is None
        )  # fmt: skip


class _JobsCollector(Collector):
    """The one collector of every job's series in the operator's registry."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.jobs: dict[Key, _Values] = {}

    def describe(self) -> list[GaugeMetricFamily]:
        return list(_families())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self.lock:
            jobs = [
                (key, v.progress, v.rate, list(v.metrics.items()), v.unhealthy, v.goodput)
                for key, v in self.jobs.items()
            ]
        progress, rate, metric, health, ratio_, training, lost = _families()
        now = time.time()
        for n, ((namespace, job), ratio, steps, values, unhealthy, kept) in enumerate(jobs):
            if n % 1000 == 999:
                checkpoint()  # a /metrics page nobody waits for any more stops here (kubetf.runtime.pages)
            if kept is not None:  # counted up to now: a job that trains quietly writes no status for it
                view = goodput.live(kept[0], kept[1], now)
                ratio_.add_metric([namespace, job], view.ratio)
                training.add_metric([namespace, job], view.training)
                for cause, seconds in view.lost.items():
                    lost.add_metric([namespace, job, cause], seconds)
            if ratio is not None:
                progress.add_metric([namespace, job], ratio)
            if steps is not None:
                rate.add_metric([namespace, job], steps)
            for name, value in values:
                metric.add_metric([namespace, job, name], value)
            if unhealthy is not None:
                health.add_metric([namespace, job, unhealthy], 1)
        yield from (progress, rate, metric, health, ratio_, training, lost)


def _families() -> tuple[GaugeMetricFamily, ...]:
    return (
        GaugeMetricFamily("kubetf_job_progress_ratio", "A job's training progress, 0 to 1", labels=JOB),
        GaugeMetricFamily("kubetf_job_steps_per_second", "A job's training steps per second", labels=JOB),
        GaugeMetricFamily("kubetf_job_metric", "The latest value of a metric a job reports", labels=[*JOB, "metric"]),
        GaugeMetricFamily(
            "kubetf_job_training_unhealthy",
            "1 while a running job's training is unhealthy, by reason",
            labels=[*JOB, "reason"],
        ),
        GaugeMetricFamily("kubetf_job_goodput_ratio", "The share of a job's wall time that trained (0-1)", labels=JOB),
        GaugeMetricFamily("kubetf_job_training_seconds", "Seconds of a job's wall time that trained", labels=JOB),
        GaugeMetricFamily(
            "kubetf_job_lost_seconds",
            "Seconds of a job's wall time lost, by cause: queued, gangWaiting, starting, restarting, redone, suspended",
            labels=[*JOB, "cause"],
        ),
    )


_COLLECTOR = _JobsCollector()
REGISTRY.register(_COLLECTOR)


class JobSeries:
    """The series of every job (one set per operator process, as the registry is)."""

    def publish(self, key: Key, progress: dict[str, Any]) -> None:
        """Set the job's series from its `status.progress`; drop the metric series it no longer has."""
        percent, rate = progress.get("percent"), progress.get("stepsPerSecond")
        values = {
            name: value for name, raw in (progress.get("metrics") or {}).items() if (value := number(raw)) is not None
        }
        with _COLLECTOR.lock:
            job = _COLLECTOR.jobs.setdefault(key, _Values())
            if isinstance(percent, (int, float)):
                job.progress = percent / 100
            if isinstance(rate, (int, float)):
                job.rate = rate
            job.metrics = dict(list(values.items())[:MAX_METRICS])

    def health(self, key: Key, unhealthy: str | None) -> None:
        """kubetf_job_training_unhealthy: 1 for the reason of a True TrainingUnhealthy condition, gone otherwise."""
        with _COLLECTOR.lock:
            job = _COLLECTOR.jobs.get(key)
            if job is None and unhealthy is None:
                return  # every reconcile asks: no entry for a job that has nothing to show
            if job is None:
                job = _COLLECTOR.jobs[key] = _Values()
            job.unhealthy = unhealthy
            if job.empty():
                del _COLLECTOR.jobs[key]

    def goodput(self, key: Key, status: dict[str, Any], created: float | None) -> None:
        """The job's goodput series, from its status (kubetf.core.goodput); none for a job that keeps none."""
        kept: dict[str, Any] = {k: status[k] for k in ("goodput", "phase", "completionTime") if k in status}
        with _COLLECTOR.lock:
            job = _COLLECTOR.jobs.get(key)
            if "goodput" not in kept:
                if job is not None:
                    job.goodput = None
                    if job.empty():
                        del _COLLECTOR.jobs[key]
                return
            if job is None:
                job = _COLLECTOR.jobs[key] = _Values()
            job.goodput = (kept, created)

    def remove(self, key: Key) -> None:
        """Every series of the job."""
        with _COLLECTOR.lock:
            _COLLECTOR.jobs.pop(key, None)
