"""Goodput (kubetf.core.goodput) through the real reconcile shell on the fake API: a job's wall time split into
training and what was lost by cause, adding up to the wall time, in its status, and costing no status write of its
own while it trains."""

import pytest

from kubetf.cluster import metrics
from kubetf.core import goodput
from kubetf.core import status as st
from kubetf.core.progress.protocol import parse_report

from .test_gang import cluster, place, ps
from .test_inplace import exits_in_place, restarted, running
from .test_kueue import admit, kueue_evicts, kueue_sim, queued, run
from .test_reconcile import Sim, mwms_job, ps_job

pytestmark = pytest.mark.unit


def report(sim, step, rate=10.0, role="chief"):
    """A task reports its step (as its pod would, through the progress endpoint): the chief by default."""
    body = f'{{"step": {step}, "steps": 100000, "stepsPerSecond": {rate}}}'.encode()
    job = sim.job
    stored = (job.get("status") or {}).get("progress")
    run_began = goodput.run_began(job.get("status") or {})  # as the endpoint passes it, from the cached status
    sim.controller.book.report(sim.key, job["metadata"]["uid"], stored, parse_report(body), role, 0, True, run_began)


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


def trained(sim, steps, advance=1):
    for step in steps:
        report(sim, step)
        sim.step(advance=advance)


def fails_and_restarts(sim, seconds_to_start=12):
    sim.exit("mnist-worker-0", 1)
    sim.step()
    sim.gone()
    sim.step(advance=seconds_to_start)
    sim.run()
    sim.step()


def test_a_restart_is_resumed_when_its_first_step_was_reported_not_when_the_status_is_next_written():
    sim = Sim(mwms_job())
    sim.job["metadata"]["creationTimestamp"] = st.format_time(sim.now)
    sim.step()
    sim.run()
    sim.step()
    trained(sim, range(10, 100, 10))
    count, total = resumed("failure")
    fails_and_restarts(sim)
    sim.now += 2
    report(sim, 100)  # 14 s after the restart; steps went on from there (no checkpoint behind)
    sim.now += 30  # and the reconcile that writes it comes 30 s later (the held progress's write)
    sim.step()
    assert sim.status["goodput"]["state"] == "training"
    assert resumed("failure") == (count + 1, pytest.approx(total + 14, abs=1))
    assert seconds(sim).lost["restarting"] == pytest.approx(14, abs=1)


def test_a_run_that_trained_and_failed_before_any_reconcile_saw_it_train_is_resumed_and_its_training_counted():
    """The integration tier's case: the first steps after a restart are held (their write is not due yet) when the
    next failure comes; the reconcile that counts the failure sees both. The run between went through training."""
    sim = Sim(mwms_job())
    sim.job["metadata"]["creationTimestamp"] = st.format_time(sim.now)
    sim.step()
    sim.run()
    sim.step()
    trained(sim, range(10, 100, 10))
    count, total = resumed("failure")
    fails_and_restarts(sim)
    sim.now += 2
    report(sim, 100)  # the first step, 14 s after the restart
    training_before = seconds(sim).training
    for step in range(110, 150, 10):
        sim.now += 1
        report(sim, step)  # held: no reconcile meanwhile
    sim.now += 1
    sim.exit("mnist-worker-1", 1)  # 5 s after the first step, the next failure
    sim.step()
    assert sim.status["restarts"]["failures"] == 2 and sim.status["goodput"]["state"] == "restarting"
    assert resumed("failure") == (count + 1, pytest.approx(total + 14, abs=1))
    assert seconds(sim).training - training_before == pytest.approx(5, abs=1)
    sim.gone()
    sim.step(advance=10)
    assert resumed("failure") == (count + 1, pytest.approx(total + 14, abs=1))  # the second is not resumed yet


def test_a_suspension_after_a_restart_that_was_resumed_is_no_restart_of_its_own():
    """An hour's suspension after a failure the job trained past: its start after the resume is `starting`, and no
    time to resume of an hour is told."""
    sim = Sim(mwms_job())
    sim.job["metadata"]["creationTimestamp"] = st.format_time(sim.now)
    sim.step()
    sim.run()
    sim.step()
    trained(sim, range(10, 50, 10))
    fails_and_restarts(sim)
    trained(sim, range(50, 100, 10))
    count = resumed("failure")
    sim.job["spec"]["runPolicy"]["suspend"] = True
    sim.api.update_job(sim.key)
    sim.step()
    sim.gone()
    sim.step()
    sim.now += 3600
    sim.job["spec"]["runPolicy"]["suspend"] = False
    sim.api.update_job(sim.key)
    sim.step()
    sim.run()
    sim.step(advance=10)
    assert sim.status["goodput"]["state"] == "starting"
    trained(sim, range(100, 130, 10))
    assert sim.status["goodput"]["state"] == "training" and resumed("failure") == count
    view = seconds(sim)
    assert view.lost["suspended"] >= 3600 and view.lost["starting"] >= 10


def test_a_parameter_server_job_trains_while_a_lone_worker_waits_for_its_gang():
    sim = cluster(ps(), native=True)
    sim.job["metadata"]["creationTimestamp"] = st.format_time(sim.now)
    sim.step()
    place(sim)
    sim.step()
    trained(sim, range(10, 50, 10))
    sim.evict("mnist-worker-1")
    sim.step()
    sim.gone()
    sim.step(advance=1)
    trained(sim, range(50, 650, 10))  # the chief trains for a minute while the replacement waits for a node
    assert sim.status["gang"].get("waitingSince")
    view = seconds(sim)
    assert view.training >= 60 and view.lost["gangWaiting"] <= 2


def test_a_leader_whose_clock_is_behind_never_counts_a_moment_twice():
    created = 1_800_000_000.0
    first_step = st.format_time(created + 1)
    status = {"phase": "Running", "activeSince": st.format_time(created),
              "progress": {"lastProgressTime": first_step, "runStartTime": first_step}}  # fmt: skip
    goodput.account(status, created, created + 100, refresh=True)  # one leader
    status["phase"], status["restarts"] = "Restarting", {"lastTime": st.format_time(created + 95)}
    goodput.account(status, created, created + 95, refresh=True)  # the next, its clock 5 s behind
    status["phase"], status["completionTime"] = "Succeeded", st.format_time(created + 120)
    goodput.account(status, created, created + 120, refresh=True)
    view = goodput.live(status, created, created + 120)
    assert view.training + sum(view.lost.values()) == pytest.approx(120)
