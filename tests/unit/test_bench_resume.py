"""How `make bench-resume` reads a restart (tests/bench/resume.py): the trainer's lines split into runs, the phases
of a group as the last of its tasks, the pods' side of a restart in place and of a recreated one."""

from __future__ import annotations

import threading

import pytest

from tests.bench import resume

pytestmark = pytest.mark.unit


def phase(task: str, name: str, at: float, **fields) -> dict:
    role, index = task.split("-")
    return {"kubetf": "phase", "role": role, "index": int(index), "phase": name, "time": at, **fields}


def run_of(lines: resume.Lines, source: str, task: str, start: float, step: int) -> None:
    for name, at in (("started", 0), ("imported", 2), ("cluster", 3), ("restored", 3.5), ("first_step", 4)):
        lines.feed(source, phase(task, name, start + at, **({"step": step} if name == "first_step" else {})), 0)


def test_a_restart_is_timed_by_the_last_task_of_its_group_from_the_processes_started_after_the_cause():
    lines = resume.Lines()
    run_of(lines, "job-worker-0", "worker-0", 100, 1)
    run_of(lines, "job-worker-1", "worker-1", 100, 1)
    lines.feed("job-worker-1", {"kubetf": "failing", "role": "worker", "index": 1, "time": 110.0}, 110.2)
    run_of(lines, "job-worker-1", "worker-1", 110.5, 21)  # in its pod, at once
    run_of(lines, "job-worker-0", "worker-0", 114.0, 21)  # once its collectives failed
    assert [r.failing for r in lines.runs if r.task == "worker-1"] == [110.0, None]
    phases, step = resume.trainer_phases(lines, 110.0, ["worker-0", "worker-1"], "first_step")
    assert phases == {"started": 114.0, "imported": 116.0, "cluster": 117.0, "restored": 117.5, "first_step": 118.0}
    assert step == 21
    row = resume.row("mwms", "failure", "in place", 110.0, phases, step)
    assert row.at["first_step"] == 8.0 and resume.longest(row.at) == "started 4.0s"


def test_a_task_that_failed_again_on_its_way_counts_from_its_first_start_to_the_run_that_trained():
    lines = resume.Lines()
    lines.feed("p", phase("chief-0", "started", 10.0), 0)
    lines.feed("p", phase("chief-0", "imported", 12.0), 0)  # ... and died
    run_of(lines, "p", "chief-0", 30.0, 41)
    phases, step = resume.trainer_phases(lines, 5.0, ["chief-0"], "first_step")
    assert (phases["started"], phases["imported"], phases["first_step"], step) == (10.0, 12.0, 34.0, 41)


def test_the_pods_side_of_a_restart_in_place_and_of_a_recreated_pod():
    watched = resume.Watched.__new__(resume.Watched)  # its records only: no watch, no API
    watched.job, watched.job_updates = "job", [(5.0, {"restarts": {"total": 0}}), (11.0, {"restarts": {"total": 1}})]
    watched.lock = threading.Lock()
    in_place = resume.PodLife("job-worker-0", "a", added=1.0, restarts=1, exited={0: 12.0}, running={0: 2.0, 1: 13.0})
    old = resume.PodLife("job-worker-1", "b", added=1.0, deleted=14.0)
    new = resume.PodLife("job-worker-1", "c", added=14.5)
    watched.pods = {life.uid: life for life in (in_place, old, new)}
    before = resume.Snapshot(restarts=0, counts={"a": 0, "b": 0})
    assert resume.pod_phases(watched, 10.0, before, ["worker-0"]) == {"noticed": 11.0, "gone": 12.0, "created": 13.0}
    assert resume.pod_phases(watched, 10.0, before, ["worker-1"]) == {"noticed": 11.0, "gone": 14.0, "created": 14.5}
    both = resume.pod_phases(watched, 10.0, before, ["worker-0", "worker-1"])
    assert (both["gone"], both["created"]) == (14.0, 14.5)  # the last of the group


def test_rows_of_several_rounds_are_summed_up_by_their_medians():
    rows = [resume.Row("mwms", "failure", "in place", {"started": s, "first_step": f}, 21) for s, f in
            ((1.0, 8.0), (3.0, 9.0), (2.0, 20.0))]  # fmt: skip
    assert resume.median_row(rows).at == {"started": 2.0, "first_step": 9.0}
