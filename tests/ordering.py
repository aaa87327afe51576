"""Longest tests first. Each run records how long every test took (~/.cache/kubetf/test-durations.json, merged
over runs) and the next run starts the longest first, so that a stage's xdist workers do not end waiting on one
long test that happened to be collected last (the e2e day-one test, collected near the end, was the e2e stage's
tail). Only the order changes, never what runs. A test the record does not know (new, or a fresh machine) goes first:
it may be long. The tests of one xdist_group run on one worker: they stay together, placed by their sum.

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
        def weight(item: pytest.Item) -> float:
            return self.known.get(test_key(item.nodeid), math.inf)

        groups: dict[str, float] = {}
        for item in items:
            if (group := group_of(item)) is not None:
                groups[group] = groups.get(group, 0.0) + weight(item)
        position = {id(item): index for index, item in enumerate(items)}

        def order(item: pytest.Item) -> tuple[float, str, int]:
            group = group_of(item)
            return (-(groups[group] if group is not None else weight(item)), group or "", position[id(item)])

        items.sort(key=order)

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
