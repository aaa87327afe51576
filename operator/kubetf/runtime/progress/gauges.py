"""Each job's Prometheus series: its progress, steps per second, the latest value of each metric it reports and its
training health. Every series of a job is known by its labels (never found by scanning the registry), so a job's
end removes exactly its own, in time proportional to them; a job has at most `MAX_METRICS` metric series, those
its progress still holds (a name it stopped reporting goes).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from kubetf.cluster import metrics
from kubetf.cluster.cache import Key
from kubetf.core.progress.health import HEALTH_REASONS
from kubetf.core.progress.protocol import MAX_METRICS, number


class JobSeries:
    """The series of every job, and which metric names each has."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.names: dict[Key, set[str]] = {}

    def publish(self, key: Key, progress: dict[str, Any]) -> None:
        """Set the job's series from its `status.progress`; remove the metric series it no longer has."""
        namespace, job = key
        percent = progress.get("percent")
        if isinstance(percent, (int, float)):
            metrics.JOB_PROGRESS.labels(namespace, job).set(percent / 100)
        rate = progress.get("stepsPerSecond")
        if isinstance(rate, (int, float)):
            metrics.JOB_STEPS_PER_SECOND.labels(namespace, job).set(rate)
        values = {
            name: value for name, raw in (progress.get("metrics") or {}).items() if (value := number(raw)) is not None
        }
        names = set(list(values)[:MAX_METRICS])
        with self.lock:
            before = self.names.get(key, set())
            self.names[key] = names
        for name in before - names:
            with contextlib.suppress(KeyError):
                metrics.JOB_METRIC.remove(namespace, job, name)
        for name in names:
            metrics.JOB_METRIC.labels(namespace, job, name).set(values[name])

    def health(self, key: Key, unhealthy: str | None) -> None:
        """kubetf_job_training_unhealthy: 1 for the reason of a True TrainingUnhealthy condition, gone otherwise."""
        for reason in HEALTH_REASONS:
            if reason == unhealthy:
                metrics.JOB_HEALTH.labels(*key, reason).set(1)
            else:
                with contextlib.suppress(KeyError):
                    metrics.JOB_HEALTH.remove(*key, reason)

    def remove(self, key: Key) -> None:
        """Every series of the job."""
        with self.lock:
            names = self.names.pop(key, set())
        for gauge in (metrics.JOB_PROGRESS, metrics.JOB_STEPS_PER_SECOND):
            with contextlib.suppress(KeyError):
                gauge.remove(*key)
        for name in names:
            with contextlib.suppress(KeyError):
                metrics.JOB_METRIC.remove(*key, name)
        self.health(key, None)
