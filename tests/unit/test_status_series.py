"""The series the shipped dashboard and alert rules read of each job's status (runtime.status_series) and of the
operator's own memory limit (runtime.memory_limit), as a scrape of /metrics shows them."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.utils import floatToGoString

from kubetf.cluster.cache import Store
from kubetf.core import status as st
from kubetf.runtime.memory_limit import MemoryLimit, memory_limit
from kubetf.runtime.status_series import StatusSeries
from tests.unit.jobs import job, replica

pytestmark = pytest.mark.unit

T0 = 1_800_000_000  # a moment in 2027


def at(seconds: float) -> str:
    return st.format_time(T0 + seconds)


def stored(store: Store, name: str, version: int, status: dict, **run_policy) -> None:
    document = job(name, worker=replica(2))
    document["metadata"]["resourceVersion"] = str(version)
    document["spec"]["runPolicy"] = run_policy
    document["status"] = status
    store.put_job(document)


def condition(phase: str, since: float) -> dict:
    return {"type": phase, "status": "True", "reason": "Whatever", "lastTransitionTime": at(since)}


def scrape(collector) -> list[str]:
    registry = CollectorRegistry()
    registry.register(collector)
    return [line for line in generate_latest(registry).decode().splitlines() if not line.startswith("#")]


def series(name: str, value: float, **labels: str) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted({"namespace": "team-a", **labels}.items()))
    return f"{name}{{{inner}}} {floatToGoString(value)}"


@pytest.fixture
def store() -> Store:
    return Store(tombstone_seconds=60)


def test_each_job_shows_its_phase_its_restarts_and_what_it_waits_for_since_when(store):
    stored(store, "queued", 1, {"phase": "Queued", "queuedSince": at(5), "conditions": [condition("Queued", 6)]})
    stored(
        store, "gang", 2, {"phase": "Pending", "gang": {"waitingSince": at(7)}, "conditions": [condition("Pending", 3)]}
    )
    stored(store, "starting", 3, {"phase": "Pending", "conditions": [condition("Pending", 8)]})
    restarted = {"failures": 2, "disruptions": 1, "total": 3}
    stored(
        store,
        "restarting",
        4,
        {"phase": "Restarting", "restarts": restarted, "conditions": [condition("Restarting", 9)]},
    )
    stored(store, "done", 5, {"phase": "Succeeded", "conditions": [condition("Succeeded", 10)]})
    lines = scrape(StatusSeries(store.job_versions, lambda: True))

    phases = {
        "queued": "Queued",
        "gang": "Pending",
        "starting": "Pending",
        "restarting": "Restarting",
        "done": "Succeeded",
    }
    for name, phase in phases.items():
        assert series("kubetf_job_status_phase", 1, job=name, phase=phase) in lines
    waits = [line for line in lines if line.startswith("kubetf_job_waiting_since_timestamp_seconds")]
    assert sorted(waits) == sorted([
        series("kubetf_job_waiting_since_timestamp_seconds", T0 + 5, job="queued", cause="queued"),
        series("kubetf_job_waiting_since_timestamp_seconds", T0 + 7, job="gang", cause="gangWaiting"),
        series("kubetf_job_waiting_since_timestamp_seconds", T0 + 8, job="starting", cause="starting"),
        series("kubetf_job_waiting_since_timestamp_seconds", T0 + 9, job="restarting", cause="restarting"),
    ])  # fmt: skip
    assert series("kubetf_job_restarts_total", 2, job="restarting", kind="failure") in lines
    assert series("kubetf_job_restarts_total", 1, job="restarting", kind="disruption") in lines
    # a job that never restarted counts 0, so that its first restart is an increase
    assert series("kubetf_job_restarts_total", 0, job="done", kind="failure") in lines


def test_a_running_job_shows_when_its_deadline_runs_out_and_when_it_should_finish(store):
    progress = {"step": 100, "steps": 1000, "etaSeconds": 900, "lastReportTime": at(50)}
    running = {"phase": "Running", "activeSince": at(20), "activeSeconds": 300, "progress": progress,
               "conditions": [condition("Running", 20)]}  # fmt: skip
    stored(store, "mnist", 1, running, activeDeadlineSeconds=3600)
    lines = scrape(StatusSeries(store.job_versions, lambda: True))
    # active for 300 s before this period began: 3,300 s of the deadline left from then
    assert series("kubetf_job_deadline_timestamp_seconds", T0 + 20 + 3300, job="mnist") in lines
    assert series("kubetf_job_estimated_completion_timestamp_seconds", T0 + 50 + 900, job="mnist") in lines
    assert not [line for line in lines if line.startswith("kubetf_job_waiting_since")]

    # queued again (Kueue preempted it): no longer active, nothing counts toward its deadline, no ETA
    stored(store, "mnist", 2, {**running, "phase": "Queued", "activeSince": None, "queuedSince": at(60)},
           activeDeadlineSeconds=3600)  # fmt: skip
    lines = scrape(StatusSeries(store.job_versions, lambda: True))
    assert not [line for line in lines if "deadline" in line or "completion" in line]
    assert series("kubetf_job_waiting_since_timestamp_seconds", T0 + 60, job="mnist", cause="queued") in lines


def test_a_changed_job_shows_its_new_state_and_a_deleted_one_goes(store):
    collector = StatusSeries(store.job_versions, lambda: True)
    stored(store, "a", 1, {"phase": "Pending", "conditions": [condition("Pending", 1)]})
    stored(store, "b", 2, {"phase": "Running", "conditions": [condition("Running", 1)]})
    assert series("kubetf_job_status_phase", 1, job="a", phase="Pending") in scrape(collector)
    stored(store, "a", 3, {"phase": "Running", "conditions": [condition("Running", 2)]})
    store.remove_job(("team-a", "b"), "1234-uid")
    phases = [line for line in scrape(collector) if line.startswith("kubetf_job_status_phase")]
    assert phases == [series("kubetf_job_status_phase", 1, job="a", phase="Running")]


def test_an_operator_that_does_not_act_shows_no_job(store):
    stored(store, "a", 1, {"phase": "Running", "conditions": [condition("Running", 1)]})
    acting = [False]
    collector = StatusSeries(store.job_versions, lambda: acting[0])
    assert not [line for line in scrape(collector) if line.startswith("kubetf_job_")]
    acting[0] = True
    assert series("kubetf_job_status_phase", 1, job="a", phase="Running") in scrape(collector)


@pytest.mark.parametrize(
    ("v2", "v1", "limit"),
    [
        ("536870912\n", None, 536870912),  # cgroup v2, 512Mi
        ("max\n", None, None),  # v2 without a limit
        (None, "536870912\n", 536870912),  # cgroup v1
        (None, "9223372036854771712\n", None),  # v1 without a limit
        (None, None, None),  # not in a container's cgroup
    ],
)
def test_the_memory_limit_is_the_containers_and_absent_without_one(tmp_path: Path, v2, v1, limit):
    files = (tmp_path / "memory.max", tmp_path / "memory" / "memory.limit_in_bytes")
    for path, text in zip(files, (v2, v1), strict=True):
        if text is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    assert memory_limit(files) == limit
    lines = scrape(MemoryLimit(files))
    assert lines == ([f"kubetf_memory_limit_bytes {floatToGoString(limit)}"] if limit else [])
