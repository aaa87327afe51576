"""Goodput (kubetf.core.goodput) through the real reconcile shell on the fake API: a job's wall time split into
training and what was lost by cause, adding up to the wall time, in its status, and costing no status write of its
own while it trains."""

import pytest

from kubetf.cluster import metrics
from kubetf.core import goodput
from kubetf.core import status as st
from kubetf.core.progress.protocol import parse_report

from .test_inplace import exits_in_place, restarted, running
from .test_kueue import admit, kueue_evicts, kueue_sim, queued, run
from .test_reconcile import Sim, mwms_job, ps_job

pytestmark = pytest.mark.unit


def report(sim, step, rate=10.0, role="chief"):
    """A task reports its step (as its pod would, through the progress endpoint): the chief by default."""
    body = f'{{"step": {step}, "steps": 100000, "stepsPerSecond": {rate}}}'.encode()
    job = sim.job
    stored = (job.get("status") or {}).get("progress")
    sim.controller.book.report(sim.key, job["metadata"]["uid"], stored, parse_report(body), role, 0, True)


def seconds(sim):
    view = goodput.live(sim.status, st.parse_time(sim.job["metadata"]["creationTimestamp"]), sim.now)
    return view


def test_a_job_queued_preempted_once_and_failed_once_accounts_its_wall_time_by_cause():
    """Issue 47's done-when: the parts add up to the wall time within 1%, in the status and as the reader sees it."""
    sim = kueue_sim(queued(mwms_job()))
    sim.job["metadata"]["creationTimestamp"] = st.format_time(sim.now)
    sim.step()
    assert sim.status["goodput"]["state"] == "queued"
    sim.now += 100  # queued 100 s
    admit(sim)
    sim.step()
    run(sim)
    sim.step(advance=20)  # its pods start: 20 s starting
    report(sim, 10)
    sim.step(advance=1)
    assert sim.status["goodput"]["state"] == "training"
    for step in range(20, 600, 10):  # trains 59 s at 10 steps/s, to step 590
        report(sim, step)
        sim.step(advance=1)
    kueue_evicts(sim)  # preempted: queued again
    sim.step()
    sim.gone()
    sim.step(advance=50)  # 50 s queued
    admit(sim)
    sim.step()
    run(sim)
    sim.step(advance=10)
    report(sim, 500)  # resumed from the checkpoint at step 500: 90 steps (9 s) redone
    sim.step(advance=1)
    for step in range(510, 800, 10):
        report(sim, step)
        sim.step(advance=1)
    sim.exit("mnist-worker-0", 1)  # a failure: the group restarts
    sim.step()
    sim.gone()
    sim.step(advance=12)
    run(sim)
    sim.step(advance=3)
    report(sim, 780)
    sim.step(advance=1)
    sim.exit("mnist-chief-0", 0)
    sim.step(advance=5)
    assert sim.status["phase"] == "Succeeded"
    view = seconds(sim)
    wall = st.parse_time(sim.status["completionTime"]) - st.parse_time(sim.job["metadata"]["creationTimestamp"])
    assert view.wall == pytest.approx(wall)
    assert view.training + sum(view.lost.values()) == pytest.approx(wall, rel=0.01)
    assert view.lost["queued"] >= 150 and view.lost["redone"] >= 8
    assert view.lost["restarting"] > 0 and view.lost["starting"] > 0
    stored = sim.status["goodput"]
    assert stored["ratio"] == pytest.approx(view.ratio, abs=0.01) and stored["state"] == "ended"
    assert stored["summary"].startswith(f"{view.ratio:.0%}")


def test_a_job_that_trains_quietly_costs_no_status_write_for_its_goodput():
    sim = kueue_sim(queued(mwms_job()))
    sim.step()
    admit(sim)
    sim.step()
    run(sim)
    sim.step()
    report(sim, 10)
    sim.step(advance=1)
    writes = sim.writes
    for _ in range(5):
        sim.step(advance=60)  # no report, no change: a reconcile (a timer) writes nothing
    assert sim.writes == writes


def test_the_wait_for_a_gang_is_its_own_cause():
    from .test_gang import cluster, mwms, place

    sim = cluster(mwms(), native=True)
    sim.job["metadata"]["creationTimestamp"] = st.format_time(sim.now)
    sim.step()
    sim.step(advance=2)
    assert sim.status["goodput"]["state"] == "gangWaiting"
    sim.now += 40  # the gang waits 40 s
    place(sim)
    sim.step()
    report(sim, 10)
    sim.step(advance=5)
    view = seconds(sim)
    assert view.lost["gangWaiting"] == pytest.approx(40, abs=1)
    assert view.training + sum(view.lost.values()) == pytest.approx(view.wall, rel=0.01)


def test_accounting_at_fractions_of_seconds_never_counts_a_moment_twice():
    """The status keeps times to the second: a job reconciled many times within a second (its writes made anyway)
    must not count the part of a second it rounded `since` down by again each time (seen: 34 s of a job's 18)."""
    from kubetf.core.goodput import account, live

    status = {"phase": "Queued", "queuedSince": st.format_time(1000.0)}
    now = 1000.0
    for _ in range(200):
        now += 0.37
        account(status, 1000.0, now, refresh=True)
    view = live(status, 1000.0, now)
    assert view.training + sum(view.lost.values()) == pytest.approx(now - 1000.0, abs=1.0)
    assert view.wall == pytest.approx(now - 1000.0)


def resumed(cause):
    """How many times to resume kubetf_job_time_to_resume_seconds holds for that cause, and their sum."""
    found = {s.name.rsplit("_", 1)[1]: s.value for m in metrics.TIME_TO_RESUME.collect() for s in m.samples
             if s.labels.get("cause") == cause and s.name.endswith(("_count", "_sum"))}  # fmt: skip
    return found.get("count", 0.0), found.get("sum", 0.0)


def test_a_restart_in_place_is_resumed_once_its_first_step_comes_observed_once():
    sim = Sim(ps_job())
    sim.job["metadata"]["creationTimestamp"] = st.format_time(sim.now)
    sim.step()
    running(sim)
    for step in range(10, 100, 10):
        report(sim, step, role="worker")
        sim.step(advance=1)
    count, total = resumed("failure")
    exits_in_place(sim, "mnist-worker-1", 1)
    sim.step()
    restarted(sim, "mnist-worker-1")
    sim.step(advance=3)
    assert sim.status["goodput"]["state"] == "restarting" and resumed("failure") == (count, total)
    sim.now += 2
    report(sim, 100, role="worker")  # the first step after the restart, 5 s after it
    for _ in range(3):
        sim.step(advance=1)
    assert resumed("failure") == (count + 1, pytest.approx(total + 5, abs=1))
    assert 0 < sim.status["goodput"]["ratio"] < 1
