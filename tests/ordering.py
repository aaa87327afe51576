"""Longest tests first. Each run records how long every test took (~/.cache/kubetf/test-durations.json, merged
over runs) and the next run starts the longest first, so that a stage's xdist workers do not end waiting on one
long test that happened to be collected last (the e2e day-one test, collected near the end, was the e2e stage's
tail). Only the order changes, never what runs. A test the record does not know (new, or a fresh machine) goes first:
it may be long. The tests of one xdist_group run on one worker: they stay together, placed by their sum. Tests
marked `tensorflow` (their pods train: CPU-bound) alternate with the others (see `interleave`); tests marked `last`
go after all others.

xdist requires every worker to collect the same tests in the same order: its controller reads the record once and
hands the same durations to every worker, so a record written meanwhile (the trainer tier ends beside another stage)
cannot split them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
from pathlib import Path

import pytest

RECORD = Path(os.environ.get("KUBETF_CACHE", str(Path.home() / ".cache" / "kubetf"))) / "test-durations.json"
WORKER_INPUT = "kubetf_test_durations"


def test_key(nodeid: str) -> str:
    """A test's name in the record: its node id without the @group suffix xdist's loadgroup adds."""
    head, _, tail = nodeid.rpartition("@")
    return head if head and "]" not in tail and "::" not in tail else nodeid


def read_record() -> dict[str, float]:
    with contextlib.suppress(OSError, ValueError):
        record = json.loads(RECORD.read_text())
        if isinstance(record, dict):
            return {k: float(v) for k, v in record.items() if isinstance(v, int | float)}
    return {}


def group_of(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("xdist_group")
    if marker is None:
        return None
    return str(marker.args[0] if marker.args else marker.kwargs.get("name", "default"))


def is_cpu_bound(item: pytest.Item) -> bool:
    return item.get_closest_marker("tensorflow") is not None


def interleave(units: list[tuple[float, bool]]) -> list[int]:
    """The order to run work units in, given each one's (duration, CPU-bound): longest first, and the CPU-bound ones
    (TensorFlow pods) alternating with the rest from the longest of all on, so that a stage's workers run about as
    many of each at once. Longest first alone ran the e2e stage's four longest tests together, three of them
    training on the two cores (the day-one test took 288 s instead of 119), and ended with the tests that wait
    (node controllers, timeouts) on idle cores."""
    by_length = sorted(range(len(units)), key=lambda i: (-units[i][0], i))
    bound = [i for i in by_length if units[i][1]]
    other = [i for i in by_length if not units[i][1]]
    ordered: list[int] = []
    take_bound = bool(by_length) and units[by_length[0]][1]
    while bound or other:
        queue = bound if (take_bound and bound) or not other else other
        ordered.append(queue.pop(0))
        take_bound = not take_bound
    return ordered


class Durations:
    """The plugin: orders the collection by the record, and (in the process that ends the run) adds this run's
    durations to it."""

    def __init__(self, config: pytest.Config) -> None:
        workerinput = getattr(config, "workerinput", None)
        self.worker = workerinput is not None
        self.known: dict[str, float] = workerinput[WORKER_INPUT] if self.worker else read_record()
        self.took: dict[str, float] = {}

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:  # xdist's controller, for each worker it starts
        node.workerinput[WORKER_INPUT] = self.known

    @pytest.hookimpl(trylast=True)  # after the tiers' own hooks have added their markers (xdist_group)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        grouped: dict[str, list[pytest.Item]] = {}
        for index, item in enumerate(items):
            group = group_of(item)
            grouped.setdefault(f"test {index}" if group is None else f"group {group}", []).append(item)
        units = list(grouped.values())
        ordered = interleave([(self.duration(unit), any(map(is_cpu_bound, unit))) for unit in units])
        items[:] = [item for index in ordered for item in units[index]]
        items.sort(key=lambda item: item.get_closest_marker("last") is not None)  # (stable: the rest keep their order)

    def duration(self, unit: list[pytest.Item]) -> float:
        return sum(self.known.get(test_key(item.nodeid), math.inf) for item in unit)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        key = test_key(report.nodeid)
        self.took[key] = self.took.get(key, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        if self.worker or not self.took:
            return
        with contextlib.suppress(OSError):
            RECORD.parent.mkdir(parents=True, exist_ok=True)
            with open(RECORD.with_suffix(".lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # two runs may end at once (make test's trainer tier and another)
                record = {**read_record(), **{k: round(v, 2) for k, v in self.took.items()}}
                temporary = RECORD.with_suffix(".tmp")
                temporary.write_text(json.dumps(record, indent=0, sort_keys=True))
                temporary.replace(RECORD)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(Durations(config), "kubetf-test-durations")
