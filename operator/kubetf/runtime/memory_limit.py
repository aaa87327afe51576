"""kubetf_memory_limit_bytes: the memory limit of the operator's container, read from its cgroup when /metrics is
read (a pod's limit can be resized in place), absent without one. With process_resident_memory_bytes it says how near
the OOM killer the operator runs, whatever installed it (the chart's `resources`, a kustomization, a resize)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# cgroup v2 (the container's own cgroup at the root of its cgroup namespace), then v1's memory controller.
LIMIT_FILES = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
# cgroup v1 says "no limit" as the largest page-aligned counter (9223372036854771712), v2 as "max".
UNLIMITED = 1 << 62


def memory_limit(files: tuple[Path, ...] = LIMIT_FILES) -> int | None:
    """The container's memory limit in bytes; None without one (or outside a container's cgroup)."""
    for path in files:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if not text.isdigit():
            return None  # "max"
        value = int(text)
        return value if value < UNLIMITED else None
    return None


class MemoryLimit(Collector):
    def __init__(self, files: tuple[Path, ...] = LIMIT_FILES) -> None:
        self.files = files

    def describe(self) -> list[GaugeMetricFamily]:
        return [_family()]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = _family()
        limit = memory_limit(self.files)
        if limit is not None:
            family.add_metric([], limit)
        yield family


def _family() -> GaugeMetricFamily:
    return GaugeMetricFamily(
        "kubetf_memory_limit_bytes", "The memory limit of the operator's container (its cgroup's); absent without one"
    )
