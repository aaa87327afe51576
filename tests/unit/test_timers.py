"""Time rules (kubetf.core.timers) on the real reconcile shell: what counts against a job, from when, and that nothing
counts while it waits in a queue or is suspended. Each rule is run past its timeout, with the job queued, preempted
or suspended meanwhile."""

import pytest

from kubetf.core import status as st
from kubetf.core import timers
from kubetf.core.config import DEFAULTS

from .test_kueue import admit, kueue_evicts, kueue_sim, queued, run
from .test_reconcile import T0, mwms_job, started

pytestmark = pytest.mark.unit

HOUR = 3600


def queued_job(**run_policy):
    return queued(mwms_job(**run_policy))


def admitted_after(sim, waited):
    """The job waited `waited` seconds in its queue; Kueue admits it then."""
    sim.step(advance=waited)
    admit(sim)
    sim.step()


def test_a_job_queued_for_hours_never_fails_for_time_and_sets_no_timer():
    sim = kueue_sim(queued_job(startupTimeoutSeconds=30, activeDeadlineSeconds=60))
    plan = sim.step()
    for _ in range(5):
        assert sim.status["phase"] == "Queued", sim.condition()
        assert plan.requeue_at is None, "a queued job has nothing to time"
        plan = sim.step(advance=HOUR)
    assert sim.status["queuedSince"] == st.format_time(T0)
    assert "startTime" not in sim.status and "activeSince" not in sim.status  # it has not started


def test_time_counts_from_the_admission_kueue_reports_not_from_when_the_operator_saw_it():
    sim = kueue_sim(queued_job(startupTimeoutSeconds=30, activeDeadlineSeconds=600))
    sim.step()
    sim.step(advance=HOUR)
    admit(sim, at=sim.now - 10)  # admitted 10 s before this reconcile (the operator was busy)
    plan = sim.step()
    assert sim.status["phase"] == "Pending"
    started_at = T0 + HOUR - 10
    assert sim.status["startTime"] == sim.status["activeSince"] == st.format_time(started_at)
    assert "queuedSince" not in sim.status
    # The active time counts from the admission; a pod's startup timeout from its creation (it exists only since).
    assert plan.requeue_at == sim.now + 30
    sim.step(advance=29)
    assert sim.status["phase"] == "Pending"
    sim.step(advance=1)
    assert (sim.status["phase"], sim.status["reason"]) == ("Failed", "StartupTimeout")
    assert "not running startupTimeoutSeconds=30 after it could start" in sim.condition()["message"]


def test_the_deadline_counts_only_admitted_time_across_a_preemption():
    sim = kueue_sim(queued_job(activeDeadlineSeconds=100))
    sim.step()
    admitted_after(sim, HOUR)
    run(sim)
    sim.step(advance=60)
    assert sim.status["phase"] == "Running"
    kueue_evicts(sim)  # 60 s of the 100 used
    sim.step()
    assert sim.status["phase"] == "Queued", "preempted by Kueue: queued at once"
    assert sim.status["activeSeconds"] == 60 and "activeSince" not in sim.status
    sim.gone()
    for _ in range(2):
        sim.step()
    sim.step(advance=5 * HOUR)  # queued far past the deadline: nothing fires
    assert sim.status["phase"] == "Queued"
    admit(sim)
    plan = sim.step()
    assert plan.requeue_at == sim.now + 40  # what is left of the deadline
    run(sim)
    sim.step(advance=39)
    assert sim.status["phase"] == "Running"
    sim.step(advance=1)
    assert (sim.status["phase"], sim.status["reason"]) == ("Failed", "DeadlineExceeded")
    assert sim.status["startTime"] == st.format_time(T0 + HOUR)  # when it first started


def test_a_preempted_job_waiting_past_its_startup_timeout_is_readmitted_and_times_its_new_pods_from_then():
    sim = kueue_sim(queued_job(startupTimeoutSeconds=30))
    sim.step()
    admitted_after(sim, 60)
    run(sim)
    sim.step()
    kueue_evicts(sim)
    sim.step()
    sim.gone()
    for _ in range(2):
        sim.step()
    assert sim.pods == {}
    sim.step(advance=10 * 30)  # queued for ten startup timeouts
    assert sim.status["phase"] == "Queued"
    admit(sim)
    plan = sim.step()
    assert sim.status["phase"] == "Pending"
    assert plan.requeue_at == sim.now + 30
    run(sim)
    sim.step()
    assert sim.status["phase"] == "Running"
    assert sim.status["restarts"]["disruptions"] == 1


def test_a_scheduling_wait_after_a_long_queue_is_warned_about_only_after_its_grace():
    sim = kueue_sim(queued_job())
    sim.step()
    sim.step(advance=HOUR)
    admit(sim)
    sim.step()
    unschedulable_since = st.format_time(sim.now)
    for name, pod in sim.pods.items():  # no node fits
        pod["status"]["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
                "lastTransitionTime": unschedulable_since,
            }
        ]
        sim.api.update_pod(name)
    sim.step(advance=1)
    assert sim.condition()["reason"] == "PodsStarting"
    assert not [r for t, r, _ in sim.api.recorded if t == "Warning"]
    sim.step(advance=DEFAULTS.scheduling_grace)
    assert sim.condition()["reason"] == "Unschedulable"


def test_an_evicted_workload_still_admitted_is_queued_not_restarting():
    sim = kueue_sim(queued_job())
    sim.step()
    admit(sim)
    sim.step()
    run(sim)
    sim.step()
    kueue_evicts(sim)  # Kueue's eviction: the Workload still says Admitted until its quota is given back
    sim.step()
    assert sim.status["phase"] == "Queued"
    assert "evicted: Preempted to accommodate" in sim.condition()["message"]
    sim.gone()
    for _ in range(4):
        sim.step()
        assert sim.status["phase"] == "Queued"
    assert sim.pods == {}


def test_time_suspended_does_not_count_against_the_deadline():
    sim = started(mwms_job(activeDeadlineSeconds=100))
    sim.step(advance=30)
    sim.job["spec"]["runPolicy"]["suspend"] = True
    sim.api.update_job(sim.key)
    sim.step()
    sim.gone()
    sim.step(advance=HOUR)
    assert sim.status["phase"] == "Suspended" and sim.status["activeSeconds"] == 30
    sim.job["spec"]["runPolicy"]["suspend"] = False
    sim.api.update_job(sim.key)
    plan = sim.step()
    assert plan.requeue_at == sim.now + 70
    assert sim.status["startTime"] == st.format_time(T0)


def test_a_job_without_kueue_starts_its_clock_at_its_first_reconcile():
    sim = started(mwms_job(activeDeadlineSeconds=30))
    assert sim.status["startTime"] == sim.status["activeSince"] == st.format_time(T0)
    assert timers.active_seconds(sim.status, T0 + 12) == 12
