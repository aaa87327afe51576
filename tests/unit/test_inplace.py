"""Restarts in place (kubetf.core.inplace) through the real reconcile shell on the fake API, the test playing the
kubelet: a program that fails restarts in its own pod, counted and limited as any failure; a MultiWorkerMirrored
group restarts in place as one restart; a member that never exits is recreated; a cluster without the feature
recreates pods and says so."""

import pytest

from kubetf.core import status as st

from .test_reconcile import Sim, mwms_job, ps_job

pytestmark = pytest.mark.unit


def exits_in_place(sim, name, code, message=""):
    """The kubelet's view of a training container that exited while its pod lives on; `restarted`: and is running
    again (its restart count moved)."""
    pod = sim.pods[name]
    statuses = pod["status"].setdefault("containerStatuses", [{"name": "tensorflow", "restartCount": 0}])
    container = statuses[0]
    container["state"] = {"terminated": {"exitCode": code, "message": message, "finishedAt": st.format_time(sim.now)}}
    sim.api.update_pod(name)


def restarted(sim, name):
    pod = sim.pods[name]
    container = pod["status"]["containerStatuses"][0]
    container["lastState"] = container.pop("state")
    container["restartCount"] = int(container.get("restartCount", 0)) + 1
    container["state"] = {"running": {"startedAt": st.format_time(sim.now)}}
    sim.api.update_pod(name)


def running(sim):
    sim.run()
    for pod in sim.pods.values():
        pod["status"].setdefault("containerStatuses", [{"name": "tensorflow", "restartCount": 0,
                                                         "state": {"running": {}}}])  # fmt: skip
    for name in sim.pods:
        sim.api.update_pod(name)
    sim.step()
    assert sim.status["phase"] == "Running"


def uids(sim):
    return {n: p["metadata"]["uid"] for n, p in sim.pods.items()}


def test_the_training_container_gets_restart_rules_of_its_restart_policy():
    sim = Sim(ps_job())
    sim.step()
    container = sim.pods["mnist-worker-0"]["spec"]["containers"][0]
    assert container["restartPolicy"] == "Never" and sim.pods["mnist-worker-0"]["spec"]["restartPolicy"] == "Never"
    assert container["restartPolicyRules"] == [
        {"action": "Restart", "exitCodes": {"operator": "NotIn", "values": [0, 42]}}
    ]
    assert sim.status["restarts"]["inPlace"] == "Enabled"


def test_a_parameter_server_worker_that_fails_restarts_in_its_own_pod_counted_as_a_failure():
    sim = Sim(ps_job())
    sim.step()
    running(sim)
    before = uids(sim)
    exits_in_place(sim, "mnist-worker-1", 1, "Traceback...\nValueError: boom")
    plan = sim.step()
    assert plan.delete == [] and plan.create == []  # the same pods
    assert sim.status["restarts"]["failures"] == 1 and "ValueError: boom" in sim.status["restarts"]["lastReason"]
    assert (sim.status["phase"], sim.status["reason"]) == ("Restarting", "Failed")
    assert sim.condition()["message"].endswith("restarting mnist-worker-1 in place")
    assert "restartAfter" not in sim.status  # the kubelet's crash-loop back-off times it
    restarted(sim, "mnist-worker-1")
    sim.step()
    assert sim.status["phase"] == "Running" and uids(sim) == before
    assert sim.status["restarts"]["failures"] == 1  # counted once


def test_backoff_limit_still_ends_a_job_whose_program_keeps_failing_in_place():
    sim = Sim(ps_job(backoffLimit=2))
    sim.step()
    running(sim)
    for _ in range(2):
        exits_in_place(sim, "mnist-worker-0", 1)
        sim.step()
        restarted(sim, "mnist-worker-0")
        sim.step(advance=60)
    exits_in_place(sim, "mnist-worker-0", 1)
    plan = sim.step()
    assert (sim.status["phase"], sim.status["reason"]) == ("Failed", "BackoffLimitExceeded")
    assert {p["metadata"]["name"] for p in plan.delete} >= {"mnist-worker-0", "mnist-worker-1", "mnist-ps-0"}


def test_a_multi_worker_mirrored_group_restarts_in_place_as_one_restart():
    sim = Sim(mwms_job())
    sim.step()
    running(sim)
    before = uids(sim)
    exits_in_place(sim, "mnist-worker-1", 1)
    sim.step()
    assert sim.condition()["message"].endswith("restarting mnist-chief-0, mnist-worker-0, mnist-worker-1 in place")
    restarted(sim, "mnist-worker-1")
    sim.step(advance=3)
    for peer in ("mnist-chief-0", "mnist-worker-0"):  # their collectives fail: they exit, and restart in place
        exits_in_place(sim, peer, 1)
        sim.step(advance=1)
        restarted(sim, peer)
        sim.step()
    exits_in_place(sim, "mnist-worker-1", 1)  # it met its peers' old programs: part of the same restart
    sim.step()
    restarted(sim, "mnist-worker-1")
    sim.step()
    assert sim.status["restarts"]["failures"] == 1 and uids(sim) == before
    assert sim.status["phase"] == "Running"
    sim.step(advance=31)  # the window closes: every member exited, nothing is recreated
    assert uids(sim) == before and sim.status["restarts"]["total"] == 1
    exits_in_place(sim, "mnist-worker-0", 1)  # a new failure after it: counted
    sim.step()
    assert sim.status["restarts"]["failures"] == 2


def test_a_member_that_never_exits_within_the_window_is_recreated():
    sim = Sim(mwms_job())
    sim.step()
    running(sim)
    exits_in_place(sim, "mnist-worker-1", 1)
    sim.step()
    restarted(sim, "mnist-worker-1")
    exits_in_place(sim, "mnist-worker-0", 1)
    sim.step()
    restarted(sim, "mnist-worker-0")
    plan = sim.step(advance=30)  # the chief hangs in its old program
    assert [p["metadata"]["name"] for p in plan.delete] == ["mnist-chief-0"]
    assert sim.status["restarts"]["total"] == 1


def test_a_cluster_that_drops_restart_rules_recreates_pods_and_says_so():
    sim = Sim(ps_job())
    sim.api.drop_restart_rules = True
    sim.step()
    assert sim.status["restarts"]["inPlace"] == "Unsupported"
    running(sim)
    sim.exit("mnist-worker-1", 1)  # without rules the kubelet ends the pod
    sim.step(advance=20)
    sim.gone()
    plan = sim.step(advance=20)
    assert [p["metadata"]["name"] for p in plan.create] == ["mnist-worker-1"]
    assert "restartPolicyRules" not in plan.create[0]["spec"]["containers"][0]


def test_a_job_that_asks_for_no_restarts_in_place_gets_no_rules():
    sim = Sim(ps_job(restartInPlace=False))
    sim.step()
    assert "restartPolicyRules" not in sim.pods["mnist-worker-0"]["spec"]["containers"][0]
    assert sim.status["restarts"]["inPlace"] == "Disabled"


def test_a_kubelet_that_ignores_the_rules_ends_the_pod_which_is_recreated_and_the_job_says_so():
    sim = Sim(ps_job())
    sim.step()
    running(sim)
    sim.exit("mnist-worker-1", 1)  # a kubelet older than 1.34 ends the pod although it has restart rules
    sim.step()
    assert sim.status["restarts"]["inPlace"] == "Unsupported" and sim.status["restarts"]["failures"] == 1
    sim.gone()
    plan = sim.step(advance=20)
    assert [p["metadata"]["name"] for p in plan.create] == ["mnist-worker-1"]
    assert "restartPolicyRules" not in plan.create[0]["spec"]["containers"][0]


def test_a_recreated_task_whose_old_pod_restarted_in_place_has_its_first_exit_in_place_counted():
    """The exits counted of a pod are its own: the replacement's container starts from none, and its first exit in
    place is a failure of its own, not hidden by the old pod's count."""
    sim = Sim(ps_job(backoffLimit=10))
    sim.step()
    running(sim)
    for _ in range(2):
        exits_in_place(sim, "mnist-worker-1", 1)
        sim.step()
        restarted(sim, "mnist-worker-1")
        sim.step()
    assert sim.status["restarts"]["failures"] == 2
    sim.evict("mnist-worker-1")  # its node drained: the pod is recreated
    sim.step()
    sim.gone()
    sim.step()
    assert sim.attempt("mnist-worker-1") == "1"
    running(sim)
    sim.pods["mnist-worker-1"]["status"]["containerStatuses"] = [{"name": "tensorflow", "restartCount": 0}]
    exits_in_place(sim, "mnist-worker-1", 1, "Traceback...\nValueError: again")
    sim.step()
    assert sim.status["restarts"]["failures"] == 3 and "ValueError: again" in sim.status["restarts"]["lastReason"]


def test_a_task_whose_program_exited_0_is_a_success_only_once_its_pod_says_so():
    """The kubelet may report the training container's exit 0 before the pod's phase: the task runs on until the pod
    is Succeeded, and the job's end then keeps that pod (cleanPodPolicy Running) with its log."""
    sim = Sim(mwms_job())
    sim.step()
    running(sim)
    exits_in_place(sim, "mnist-chief-0", 0)  # the pod still Running
    plan = sim.step()
    assert sim.status["phase"] == "Running" and plan.delete == [] and sim.status["restarts"]["failures"] == 0
    sim.exit("mnist-chief-0", 0)
    sim.step()
    assert sim.status["phase"] == "Succeeded" and "mnist-chief-0" in sim.pods
    assert "deletionTimestamp" not in sim.pods["mnist-chief-0"]["metadata"]


def test_a_worker_that_exited_0_as_the_job_succeeded_keeps_its_pod_though_the_pod_still_says_running():
    """cleanPodPolicy Running deletes what still runs when the job ends, not a worker whose program exited 0 a moment
    before its pod says Succeeded (the kubelet reports the container first): its log stays, as a finished pod's."""
    sim = Sim(mwms_job())
    sim.step()
    running(sim)
    exits_in_place(sim, "mnist-worker-1", 0)  # its pod still Running
    sim.exit("mnist-chief-0", 0)
    plan = sim.step()
    assert sim.status["phase"] == "Succeeded"
    assert sorted(p["metadata"]["name"] for p in plan.delete) == ["mnist-worker-0"]  # the one still running
