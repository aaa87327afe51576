"""The reconcile decisions, step by step, with pods driven the way the kubelet and the scheduler would."""

import pytest

from kubetf.core import status as st
from kubetf.core.config import DEFAULTS, OperatorConfig
from kubetf.runtime.controller import Controller

from .fake_api import FakeApi
from .jobs import job, replica

T0 = 1_800_000_000.0


class Sim:
    """The real reconcile shell (`Controller.reconcile`) on an in-memory API whose watch delivers every event
    before each step; the test plays the kubelet, the scheduler and users."""

    def __init__(self, document, now=T0):
        self.now = now
        self.api = FakeApi(clock=lambda: self.now)
        self.controller = Controller(self.api, OperatorConfig(), clock=lambda: self.now)
        created = self.api.add_job(document)
        self.key = (created["metadata"]["namespace"], created["metadata"]["name"])
        self.plans = []

    def step(self, advance=0.0):
        self.now += advance
        self.api.deliver(self.controller)
        writes = self.api.calls.count("patch status")
        plan = self.controller.reconcile(self.key)
        assert plan is not None, "the reconcile waited for watch events that were all delivered"
        self.plans.append(plan)
        self.writes += self.api.calls.count("patch status") - writes
        self.api.deliver(self.controller)
        return plan

    writes = 0

    def restart_operator(self):
        """A new operator process: an empty cache, primed from the API, and the watch starting afresh."""
        self.api.events.clear()
        self.controller = Controller(self.api, OperatorConfig(), clock=lambda: self.now)
        self.controller.prime()

    @property
    def job(self):
        return self.api.jobs[self.key]

    @property
    def pods(self):
        return self.api.pods

    # --- what the kubelet and others do
    def run(self, *names):
        for name in names or list(self.pods):
            pod = self.pods[name]
            if pod["status"]["phase"] == "Pending" and "deletionTimestamp" not in pod["metadata"]:
                pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
                self.api.update_pod(name)

    def exit(self, name, code, **terminated):
        self.pods[name]["status"] = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": [{"name": "tensorflow", "state": {"terminated": {"exitCode": code, **terminated}}}],
        }
        self.api.update_pod(name)

    def evict(self, name):
        pod = self.pods[name]
        pod["status"].setdefault("conditions", []).append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "EvictionByEvictionAPI",
                "message": "Eviction API: evicting",
            }
        )
        pod["metadata"]["deletionTimestamp"] = st.format_time(self.now)
        self.api.update_pod(name)

    def gone(self):
        """Pods being deleted finish terminating."""
        for name in [n for n, p in self.pods.items() if "deletionTimestamp" in p["metadata"]]:
            self.api.remove_pod(name)

    def attempt(self, name):
        return self.pods[name]["metadata"]["labels"]["kubetf.io/attempt"]

    @property
    def status(self):
        return self.job["status"]

    def condition(self):
        return st.current_condition(self.status)


def started(document, **kwargs):
    sim = Sim(document, **kwargs)
    sim.step()
    sim.run()
    sim.step()
    assert sim.status["phase"] == "Running", sim.status
    return sim


def ps_job(**run_policy):
    document = job(strategy="ParameterServer", chief=replica(1), worker=replica(2), ps=replica(1), evaluator=replica(1))
    document["spec"]["checkpoint"] = {"size": "1Gi"}
    document["spec"]["runPolicy"] = run_policy
    return document


def mwms_job(**run_policy):
    document = job(chief=replica(1), worker=replica(2))
    document["spec"]["runPolicy"] = {"backoffSeconds": 10, **run_policy}
    return document


def test_a_new_job_creates_exactly_its_children_and_reaches_running():
    sim = Sim(ps_job())
    plan = sim.step()
    assert sorted(p["metadata"]["name"] for p in plan.create) == [
        "mnist-chief-0",
        "mnist-evaluator-0",
        "mnist-ps-0",
        "mnist-worker-0",
        "mnist-worker-1",
    ]
    assert [o["kind"] for b in plan.batches for o in b if o["kind"] != "Pod"] == ["PersistentVolumeClaim", "Service"]
    assert sim.status["phase"] == "Pending"
    assert sim.status["tasks"]["worker-1"] == {"attempt": 0, "state": "Created"}
    assert sim.status["ready"] == "0/5"
    # Replaying the same reconcile creates nothing more.
    assert sim.step().create == []
    sim.run()
    sim.step()
    assert sim.status["phase"] == "Running"
    assert sim.condition()["type"] == "Running"
    assert sim.status["ready"] == "5/5"
    assert sim.status["replicaStatuses"]["worker"] == {"active": 2, "ready": 2, "succeeded": 0, "failed": 0}
    assert sim.status["startTime"] == st.format_time(T0)
    assert all(c["observedGeneration"] == 1 for c in sim.status["conditions"])


def test_a_job_at_rest_is_not_written():
    sim = started(ps_job())
    writes = sim.writes
    for _ in range(3):
        plan = sim.step(1)
        assert not plan.create and not plan.delete and not plan.events
    assert sim.writes == writes


def test_mwms_eviction_restarts_the_whole_group_as_a_disruption():
    sim = started(mwms_job(backoffLimit=0))
    sim.evict("mnist-worker-1")
    plan = sim.step()
    assert plan.persist_first
    assert sim.status["restarts"]["disruptions"] == 1
    assert sim.status["restarts"]["failures"] == 0
    assert sim.status["phase"] == "Restarting"
    assert "EvictionByEvictionAPI" in sim.condition()["message"]
    # The other group members are stopped; nothing is created while an old pod of a task exists.
    assert sorted(p["metadata"]["name"] for p in plan.delete) == ["mnist-chief-0", "mnist-worker-0"]
    assert plan.create == []
    # A barrier: no member of the new group starts while any member of the old one is still terminating, even
    # the tasks whose own old pod is gone (a new chief meeting an old worker would crash).
    sim.api.remove_pod("mnist-chief-0")
    sim.api.remove_pod("mnist-worker-1")
    plan = sim.step()
    assert plan.create == []
    assert "EvictionByEvictionAPI" in sim.condition()["message"]  # why it restarts stays visible meanwhile
    sim.gone()
    plan = sim.step()
    assert sorted(p["metadata"]["name"] for p in plan.create) == ["mnist-chief-0", "mnist-worker-0", "mnist-worker-1"]
    assert {sim.attempt(n) for n in sim.pods} == {"1"}
    sim.run()
    sim.step()
    assert sim.status["phase"] == "Running"
    assert sim.status["restarts"] == {
        "failures": 0,
        "disruptions": 1,
        "total": 1,
        "lastReason": sim.status["restarts"]["lastReason"],
        "lastKind": "Disruption",
        "lastTime": st.format_time(T0),
        "inPlace": "Enabled",  # failures restart in place; this disruption replaced the pods as always
    }


def test_crashes_of_peers_after_a_disruption_are_not_counted():
    sim = started(mwms_job())
    sim.evict("mnist-worker-1")
    sim.exit("mnist-worker-0", 1)  # the peer fails waiting for the evicted one
    sim.step()
    assert sim.status["restarts"]["disruptions"] == 1
    assert sim.status["restarts"]["failures"] == 0
    # Old pods failing later are stale: ignored.
    sim.exit("mnist-chief-0", 1)
    sim.step()
    assert sim.status["restarts"]["total"] == 1


def test_worker_failure_counts_and_backs_off_then_fails_past_the_limit():
    sim = started(mwms_job(backoffLimit=1))
    sim.exit("mnist-worker-0", 1)
    plan = sim.step()
    assert sim.status["restarts"]["failures"] == 1
    assert sim.status["restartAfter"] == st.format_time(sim.now + 10)
    sim.gone()
    plan = sim.step(1)
    assert plan.create == []
    assert plan.requeue_at == T0 + 10
    plan = sim.step(9)
    assert len(plan.create) == 3
    sim.run()
    sim.step()
    assert sim.status["phase"] == "Running"
    sim.exit("mnist-worker-1", 3)
    plan = sim.step()
    assert sim.status["phase"] == "Failed"
    assert sim.status["reason"] == "BackoffLimitExceeded"
    assert sim.condition()["message"] == "mnist-worker-1: exit code 3 after 1 restart(s)"
    # cleanPodPolicy Running: the still running pods are stopped, the failed one kept for its logs.
    assert sorted(p["metadata"]["name"] for p in plan.delete) == ["mnist-chief-0", "mnist-worker-0"]
    assert sim.status["completionTime"]


def test_ps_worker_deleted_is_recreated_alone_with_the_same_name():
    sim = started(ps_job())
    sim.api.remove_pod("mnist-worker-1")
    plan = sim.step()
    assert [p["metadata"]["name"] for p in plan.create] == ["mnist-worker-1"]
    assert plan.delete == []
    assert sim.status["restarts"]["disruptions"] == 1
    assert sim.attempt("mnist-worker-1") == "1"
    assert sim.attempt("mnist-worker-0") == "0"


def test_ps_failure_recreates_it_and_restarts_the_chief():
    sim = started(ps_job())
    sim.exit("mnist-ps-0", 1)
    plan = sim.step()
    assert sorted(p["metadata"]["name"] for p in plan.delete) == ["mnist-chief-0", "mnist-ps-0"]
    sim.gone()
    plan = sim.step(60)
    assert sorted(p["metadata"]["name"] for p in plan.create) == ["mnist-chief-0", "mnist-ps-0"]
    assert sim.attempt("mnist-worker-0") == "0"


def test_failed_pod_is_deleted_before_its_replacement():
    sim = started(ps_job())
    sim.exit("mnist-worker-0", 1)
    plan = sim.step()
    assert [p["metadata"]["name"] for p in plan.delete] == ["mnist-worker-0"]
    assert plan.create == []


# 137 with nobody deleting the pod: killed from inside (a liveness probe, the program): a retryable failure.
@pytest.mark.parametrize("code,phase,counter", [(2, "Failed", None), (137, "Restarting", "failures")])
def test_exit_code_policy(code, phase, counter):
    document = mwms_job()
    document["spec"]["replicaSpecs"]["worker"]["restartPolicy"] = "ExitCode"
    sim = started(document)
    sim.exit("mnist-worker-0", code)
    sim.step()
    assert sim.status["phase"] == phase
    if counter:
        assert sim.status["restarts"][counter] == 1
    else:
        assert sim.status["reason"] == "PermanentFailure"


def test_chief_success_stops_the_rest_and_never_reruns_completed_workers():
    sim = started(ps_job())
    sim.exit("mnist-worker-0", 0)
    sim.step()
    assert sim.status["tasks"]["worker-0"]["state"] == "Succeeded"
    sim.api.remove_pod("mnist-worker-0")
    assert sim.step().create == []
    sim.exit("mnist-chief-0", 0)
    plan = sim.step()
    assert sim.status["phase"] == "Succeeded"
    assert sim.condition()["message"] == "mnist-chief-0 exited 0"
    # The evaluator may still be evaluating the last checkpoint: it gets evaluatorGraceSeconds (test below).
    assert sorted(p["metadata"]["name"] for p in plan.delete) == ["mnist-ps-0", "mnist-worker-1"]
    sim.gone()
    sim.exit("mnist-evaluator-0", 0)
    plan = sim.step(100)
    assert plan.create == [] and plan.delete == []


def test_a_succeeded_jobs_evaluator_finishes_its_last_evaluation_within_its_grace_then_is_stopped():
    for ends_by_itself in (True, False):
        sim = started(ps_job(evaluatorGraceSeconds=60))
        sim.exit("mnist-chief-0", 0)
        plan = sim.step()
        assert sim.status["phase"] == "Succeeded"
        assert "mnist-evaluator-0" not in [p["metadata"]["name"] for p in plan.delete]
        assert plan.requeue_at == T0 + 60  # the grace's own timer
        assert sim.status["replicaStatuses"]["evaluator"]["active"] == 1
        sim.gone()
        if ends_by_itself:
            sim.exit("mnist-evaluator-0", 0)
        plan = sim.step(60)
        assert sim.status["phase"] == "Succeeded"
        stopped = [p["metadata"]["name"] for p in plan.delete]
        assert stopped == ([] if ends_by_itself else ["mnist-evaluator-0"])
        assert sim.status["replicaStatuses"]["evaluator"]["active"] == 0


def test_a_failed_jobs_evaluator_is_stopped_at_once():
    sim = started(ps_job(backoffLimit=0))
    sim.exit("mnist-chief-0", 1)
    plan = sim.step()
    assert sim.status["phase"] == "Failed"
    assert "mnist-evaluator-0" in [p["metadata"]["name"] for p in plan.delete]


def test_mwms_group_restart_reruns_a_worker_that_had_already_finished():
    document = mwms_job()
    document["spec"]["successPolicy"] = "AllWorkers"
    sim = started(document)
    sim.exit("mnist-worker-1", 0)
    sim.step()
    assert sim.status["tasks"]["worker-1"]["state"] == "Succeeded"
    sim.evict("mnist-chief-0")
    plan = sim.step()
    # The new group's collectives need every peer: the finished one runs again (and resumes from the checkpoint).
    assert sorted(p["metadata"]["name"] for p in plan.delete) == ["mnist-worker-0", "mnist-worker-1"]
    sim.gone()
    plan = sim.step()
    assert sorted(p["metadata"]["name"] for p in plan.create) == ["mnist-chief-0", "mnist-worker-0", "mnist-worker-1"]
    assert sim.status["tasks"]["worker-1"] == {"attempt": 1, "state": "Created"}


def test_a_finished_job_counts_only_the_pods_it_keeps():
    sim = started(ps_job())
    assert sim.status["ready"] == "5/5"
    sim.exit("mnist-chief-0", 0)
    sim.exit("mnist-evaluator-0", 0)
    sim.step()
    assert sim.status["phase"] == "Succeeded"
    # cleanPodPolicy Running deletes the ps and the workers: nothing is active or ready any more.
    assert sim.status["ready"] == "0/5"
    assert sim.status["replicaStatuses"]["worker"] == {"active": 0, "ready": 0, "succeeded": 0, "failed": 0}
    assert sim.status["replicaStatuses"]["chief"]["succeeded"] == 1


def test_a_suspended_job_counts_no_pod():
    sim = started(mwms_job())
    sim.job["spec"]["runPolicy"]["suspend"] = True
    sim.api.update_job(sim.key)
    sim.step()
    assert sim.status["phase"] == "Suspended"
    assert sim.status["ready"] == "0/3"
    assert all(counts["active"] == 0 for counts in sim.status["replicaStatuses"].values())


def test_running_message_and_ready_column_agree():
    sim = Sim(mwms_job())
    sim.step()
    for name, pod in sim.pods.items():
        ready = "True" if name == "mnist-chief-0" else "False"
        pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": ready}]}
        sim.api.update_pod(name)
    sim.step()
    assert sim.status["ready"] == "1/3"
    assert sim.condition()["message"] == "3/3 pods running, 2 not ready"


def test_a_recreated_job_never_adopts_the_previous_jobs_pods():
    sim = started(mwms_job(maxDisruptions=0))
    old_uid = sim.job["metadata"]["uid"]
    # kubectl delete tj mnist && kubectl apply -f mnist.yaml: the old pods are still terminating.
    for name in list(sim.pods):
        sim.pods[name]["metadata"]["deletionTimestamp"] = st.format_time(sim.now + 30)
        sim.api.update_pod(name)
    document = mwms_job(maxDisruptions=0)
    del sim.api.jobs[sim.key]
    sim.api.add_job(document)
    assert sim.job["metadata"]["uid"] != old_uid
    plan = sim.step()
    # Nothing counted, nothing failed, nothing created over the old pods' names until they are gone.
    assert sim.status["phase"] == "Pending"
    assert sim.status["restarts"]["total"] == 0
    assert plan.create == []
    assert "waiting for the old pod" in sim.condition()["message"]
    sim.gone()
    plan = sim.step()
    assert sorted(p["metadata"]["name"] for p in plan.create) == ["mnist-chief-0", "mnist-worker-0", "mnist-worker-1"]
    assert all(p["metadata"]["ownerReferences"][0]["uid"] == sim.job["metadata"]["uid"] for p in plan.create)


def test_an_old_pod_stuck_terminating_is_reported_with_its_node():
    sim = started(mwms_job())
    sim.pods["mnist-worker-1"]["spec"]["nodeName"] = "spot-7"
    sim.evict("mnist-worker-1")
    sim.step()
    sim.api.remove_pod("mnist-chief-0")
    sim.api.remove_pod("mnist-worker-0")
    plan = sim.step()
    assert plan.create == []
    assert sim.condition()["reason"] == "Disrupted"  # a few seconds of terminating are normal: no warning
    plan = sim.step(DEFAULTS.stuck_margin + 1)  # the eviction's deletionTimestamp was now: grace 0
    assert plan.create == []
    assert sim.condition()["reason"] == "PodStuckTerminating"
    assert "mnist-worker-1 is still terminating on node spot-7" in sim.condition()["message"]
    assert sim.api.recorded[-1][:2] == ("Warning", "PodStuckTerminating")


def place(sim, node, *names):
    for name in names:
        sim.pods[name]["spec"]["nodeName"] = node
        sim.api.update_pod(name)


def test_a_node_lost_after_the_peers_crashed_counts_one_disruption_and_no_failure():
    sim = started(mwms_job())
    place(sim, "spot-1", "mnist-worker-1")
    place(sim, "spot-2", "mnist-chief-0", "mnist-worker-0")
    silent_since = sim.now
    sim.now += 2  # spot-1 vanished: the MWMS peers crash on the lost collective long before it is marked NotReady
    sim.exit("mnist-chief-0", 1)
    sim.exit("mnist-worker-0", 1)
    sim.step()
    assert sim.status["restarts"]["failures"] == 1  # all the operator can know yet
    sim.api.remove_pod("mnist-chief-0")
    sim.api.remove_pod("mnist-worker-0")
    plan = sim.step()
    assert plan.create == [] and plan.requeue_at == sim.now + 10  # worker-1's node is looked at again
    sim.api.lost_nodes["spot-1"] = silent_since  # NotReady at last
    plan = sim.step(10)
    assert [p["metadata"]["name"] for p in plan.force_delete] == ["mnist-worker-1"]
    assert sim.status["restarts"]["failures"] == 0 and sim.status["restarts"]["disruptions"] == 1
    assert "NodeLost: node spot-1" in sim.status["restarts"]["lastReason"]
    assert "restartAfter" not in sim.status  # a disruption: no failure backoff
    plan = sim.step()
    assert sorted(p["metadata"]["name"] for p in plan.create) == ["mnist-chief-0", "mnist-worker-0", "mnist-worker-1"]


def test_a_programs_own_failure_stays_a_failure_when_a_node_is_lost_afterwards():
    sim = started(mwms_job(backoffLimit=1))
    place(sim, "spot-1", "mnist-worker-1")
    place(sim, "spot-2", "mnist-chief-0", "mnist-worker-0")
    sim.exit("mnist-chief-0", 1, message="Traceback ...\nValueError: bad learning rate")  # the program's own bug
    sim.step()
    assert sim.status["restarts"]["failures"] == 1
    sim.api.remove_pod("mnist-chief-0")
    sim.step()
    sim.api.lost_nodes["spot-1"] = sim.now + 5  # a node that goes silent after the failure did not cause it
    sim.step(10)
    assert sim.status["restarts"]["failures"] == 1 and sim.status["restarts"]["disruptions"] == 0
    assert "ValueError: bad learning rate" in sim.status["restarts"]["lastReason"]
    assert sim.status["restarts"]["lastKind"] == "Failure"  # it counts against backoffLimit
    assert "NodeLost" not in [reason for _, reason, _ in sim.api.recorded]


def test_a_ps_whose_node_is_lost_is_recreated_with_the_chief_only():
    sim = started(ps_job())
    place(sim, "spot-3", "mnist-ps-0")
    sim.api.lost_nodes["spot-3"] = sim.now - 60
    # The taint manager evicts the ps after nodeLossTimeoutSeconds; its kubelet never confirms.
    pod = sim.pods["mnist-ps-0"]
    pod["status"]["conditions"].append(
        {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager", "message": "Taint manager"}
    )
    pod["metadata"]["deletionTimestamp"] = st.format_time(sim.now + 120)
    sim.api.update_pod("mnist-ps-0")
    plan = sim.step()
    assert [p["metadata"]["name"] for p in plan.force_delete] == ["mnist-ps-0"]
    assert [p["metadata"]["name"] for p in plan.delete] == ["mnist-chief-0"]
    assert sim.status["restarts"]["disruptions"] == 1
    sim.gone()
    plan = sim.step()
    assert sorted(p["metadata"]["name"] for p in plan.create) == ["mnist-chief-0", "mnist-ps-0"]


def test_without_force_deletion_a_pod_on_a_lost_node_is_waited_for_and_reported():
    document = ps_job(forceDeleteOnNodeLoss=False)
    sim = started(document)
    place(sim, "spot-3", "mnist-ps-0")
    sim.api.lost_nodes["spot-3"] = sim.now - 60
    sim.evict("mnist-ps-0")
    plan = sim.step()
    assert plan.force_delete == []
    sim.api.remove_pod("mnist-chief-0")
    sim.step(DEFAULTS.stuck_margin + 1)
    assert sim.condition()["reason"] == "PodStuckTerminating"
    assert "on node spot-3" in sim.condition()["message"]


def test_pods_tolerate_a_lost_node_for_node_loss_timeout_seconds_only():
    sim = Sim(mwms_job(nodeLossTimeoutSeconds=45))
    plan = sim.step()
    tolerations = plan.create[0]["spec"]["tolerations"]
    assert {(t["key"], t["effect"], t["tolerationSeconds"]) for t in tolerations} == {
        ("node.kubernetes.io/not-ready", "NoExecute", 45),
        ("node.kubernetes.io/unreachable", "NoExecute", 45),
    }


def test_clean_pod_policy_none_and_all():
    for policy, expected in (
        ("None", []),
        ("All", ["mnist-chief-0", "mnist-evaluator-0", "mnist-ps-0", "mnist-worker-0", "mnist-worker-1"]),
    ):
        sim = started(ps_job(cleanPodPolicy=policy))
        sim.exit("mnist-chief-0", 0)
        sim.exit("mnist-evaluator-0", 0)  # done with the last checkpoint (else it gets its grace)
        plan = sim.step()
        assert sorted(p["metadata"]["name"] for p in plan.delete) == expected


def test_active_deadline_fires_by_its_own_timer():
    sim = started(mwms_job(activeDeadlineSeconds=30))
    plan = sim.step(1)
    assert plan.requeue_at == T0 + 30
    sim.step(29)
    assert sim.status["phase"] == "Failed"
    assert sim.status["reason"] == "DeadlineExceeded"


def test_stuck_pending_says_why_then_fails_after_the_startup_timeout():
    sim = Sim(mwms_job(startupTimeoutSeconds=60))
    sim.step()
    sim.run("mnist-chief-0", "mnist-worker-0")
    sim.pods["mnist-worker-1"]["status"] = {
        "phase": "Pending",
        "containerStatuses": [
            {
                "name": "tensorflow",
                "state": {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "nope:1"'}},
            }
        ],
    }
    sim.api.update_pod("mnist-worker-1")
    plan = sim.step(5)
    assert sim.status["phase"] == "Pending"
    assert sim.status["reason"] == "ImagePullBackOff"
    assert "mnist-worker-1: ImagePullBackOff: Back-off pulling image" in sim.condition()["message"]
    assert any(e.type == "Warning" and e.reason == "ImagePullBackOff" for e in plan.events)
    assert plan.requeue_at == T0 + 60
    sim.step(55)
    assert sim.status["phase"] == "Failed"
    assert sim.status["reason"] == "StartupTimeout"
    assert "ImagePullBackOff" in sim.condition()["message"]


def test_unschedulable_is_reported_in_the_schedulers_words_once_it_lasts():
    sim = Sim(mwms_job())
    sim.step()
    message = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    unschedulable = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": message,
        "lastTransitionTime": st.format_time(sim.now),
    }
    for name, pod in sim.pods.items():
        pod["status"] = {"phase": "Pending", "conditions": [unschedulable]}
        sim.api.update_pod(name)
    sim.step(1)
    # A claim being bound, a node being added: a wait that usually ends by itself is no Warning.
    assert sim.status["reason"] == "PodsStarting"
    assert [e for e in sim.api.recorded if e[0] == "Warning"] == []
    sim.step(DEFAULTS.scheduling_grace)
    assert sim.status["reason"] == "Unschedulable"
    assert message in sim.condition()["message"]
    assert [reason for type_, reason, _ in sim.api.recorded if type_ == "Warning"] == ["Unschedulable"]


def test_a_startup_timeout_shorter_than_the_scheduling_grace_fails_in_the_schedulers_words():
    sim = Sim(mwms_job(startupTimeoutSeconds=10))
    sim.step()
    message = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    for name, pod in sim.pods.items():
        pod["status"] = {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
                            "lastTransitionTime": st.format_time(sim.now)}],
        }  # fmt: skip
        sim.api.update_pod(name)
    sim.step(10)  # inside the 30 s in which an unschedulable pod is no warning yet
    assert (sim.status["phase"], sim.status["reason"]) == ("Failed", "StartupTimeout")
    assert f"Unschedulable: {message}" in sim.condition()["message"]
    assert "containers not started" not in sim.condition()["message"]


def test_ttl_deletes_the_finished_job():
    sim = started(mwms_job(ttlSecondsAfterFinished=100))
    sim.exit("mnist-chief-0", 0)
    sim.step()
    plan = sim.step(1)
    assert plan.requeue_at == T0 + 100 and not plan.delete_job
    assert sim.step(99).delete_job


def test_suspend_deletes_pods_keeps_counters_and_resume_recreates():
    sim = started(mwms_job())
    sim.evict("mnist-worker-0")
    sim.step()
    sim.gone()
    sim.step()
    sim.run()
    sim.step()
    sim.job["spec"]["runPolicy"]["suspend"] = True
    sim.api.update_job(sim.key)
    plan = sim.step()
    assert sim.status["phase"] == "Suspended"
    assert len(plan.delete) == 3
    sim.gone()
    assert sim.step().create == []
    assert sim.status["restarts"]["disruptions"] == 1
    sim.job["spec"]["runPolicy"]["suspend"] = False
    sim.api.update_job(sim.key)
    plan = sim.step()
    assert len(plan.create) == 3
    assert sim.status["restarts"]["disruptions"] == 1
    assert sim.status["phase"] == "Pending"


def test_invalid_job_fails_with_the_reason_and_no_pods():
    document = mwms_job()
    document["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["restartPolicy"] = "Always"
    sim = Sim(document)
    plan = sim.step()
    assert plan.batches == []
    assert sim.status["phase"] == "Failed"
    assert sim.status["reason"] == "InvalidSpec"
    assert "template.spec.restartPolicy" in sim.condition()["message"]


def test_max_disruptions():
    sim = started(mwms_job(maxDisruptions=0))
    sim.evict("mnist-worker-0")
    sim.step()
    assert sim.status["phase"] == "Failed"
    assert sim.status["reason"] == "MaxDisruptionsExceeded"


def test_phase_and_condition_always_agree():
    sim = started(ps_job())
    sim.exit("mnist-ps-0", 1)
    for advance in (0, 1, 60):
        sim.step(advance)
        sim.gone()
        assert sim.condition()["type"] == sim.status["phase"]
        assert sum(c["status"] == "True" for c in sim.status["conditions"]) == 1


def test_pods_created_by_an_operator_that_died_before_recording_them_are_adopted():
    sim = Sim(mwms_job())
    plan = sim.step()
    # The operator died after creating the pods, before recording them; a new one starts.
    sim.job["status"] = {}
    sim.api.update_job(sim.key)
    sim.restart_operator()
    plan = sim.step()
    assert plan.create == []
    assert {t["state"] for t in sim.status["tasks"].values()} == {"Created"}
    sim.api.remove_pod("mnist-worker-0")
    sim.step()
    assert sim.status["restarts"]["disruptions"] == 1
