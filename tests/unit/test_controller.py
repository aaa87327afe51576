"""The reconcile shell (`Controller`) on an in-memory API: cache, expectations, priorities, batching, backoff."""

import dataclasses
import socket
import threading
import time

import pytest
from kubernetes import client

from kubetf.cluster.kube import Kube, NotLeader
from kubetf.core import reconcile
from kubetf.core.config import DEFAULTS, OperatorConfig
from kubetf.core.scheduling import workload as kueue
from kubetf.core.types import Write
from kubetf.runtime.controller import FOLLOW, NORMAL, REPORT, URGENT, Controller
from tests.cluster.fixture import wait_for

from .fake_api import FakeApi
from .jobs import job, replica

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0


class Shell:
    def __init__(self, document, **config):
        self.now = T0
        self.api = FakeApi(clock=lambda: self.now)
        self.controller = Controller(self.api, OperatorConfig(**config), clock=lambda: self.now)
        created = self.api.add_job(document)
        self.key = (created["metadata"]["namespace"], created["metadata"]["name"])
        self.api.deliver(self.controller)

    def queued(self):
        """What the queue would hand out now, in order (emptying it)."""
        out = []
        while len(self.controller.queue):
            key, priority = self.controller.queue.get()
            self.controller.queue.done(key)
            out.append((key, priority))
        return out

    def status(self):
        return self.api.jobs[self.key].get("status") or {}

    def running(self):
        """Reconcile until every pod was created and reported running."""
        self.controller.reconcile(self.key)
        self.api.deliver(self.controller)
        self.run_all()
        self.api.deliver(self.controller)
        self.controller.reconcile(self.key)
        return self

    def run_all(self):
        for name, pod in self.api.pods.items():
            pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
            self.api.update_pod(name)


def mwms(workers=2):
    return job(chief=replica(1), worker=replica(workers))


def test_reconciled_before_the_watch_showed_its_own_pods_it_creates_no_duplicate_and_counts_nothing():
    shell = Shell(mwms())
    shell.controller.reconcile(shell.key)
    assert len(shell.api.pods) == 3
    # Another trigger arrives before the watch delivered the three ADDED events: the cache has no pods yet.
    assert shell.controller.reconcile(shell.key) is None
    assert shell.api.calls.count("create Pod") == 3
    shell.api.deliver(shell.controller)
    plan = shell.controller.reconcile(shell.key)
    assert plan.create == []
    assert shell.status()["restarts"]["disruptions"] == 0
    assert shell.api.calls.count("create Pod") == 3


def test_the_event_that_ends_a_wait_for_the_watch_is_never_lost_between_the_check_and_the_wait():
    shell = Shell(mwms())
    shell.controller.reconcile(shell.key)  # creates three pods: the watch has not shown them yet
    shell.queued()
    expectations = shell.controller.expectations
    check = expectations.defer

    def check_then_the_watch_delivers(key, priority):
        until = check(key, priority)
        # The watch thread delivers the three ADDED events right after the check. While the check and the record
        # of the wait are one step, it waits for that step; it must not land in between.
        delivery = threading.Thread(target=shell.api.deliver, args=(shell.controller,))
        delivery.start()
        delivery.join(0.5)
        deliveries.append(delivery)
        return until

    deliveries: list[threading.Thread] = []
    expectations.defer = check_then_the_watch_delivers
    assert shell.controller.reconcile(shell.key, URGENT) is None  # a trigger while the pods are not shown yet
    deliveries[0].join(5)
    # The job is handed out again now, at the priority it came with, not after the 30 s expectation timeout.
    assert shell.queued() == [(shell.key, URGENT)]


def test_the_echo_of_its_own_status_write_costs_no_reconcile():
    shell = Shell(mwms())
    shell.queued()
    shell.controller.reconcile(shell.key)
    shell.api.deliver(shell.controller)  # the status write's echo and the pods' ADDED events
    assert shell.queued() == []


def test_a_change_made_while_the_reconcile_ran_is_decided_even_though_its_status_write_hid_the_event():
    """CI run 29: the status write's answer is stored in the cache, newer than the watch's copy, so the watch events
    up to it are ignored, among them a user's resume made after the reconcile read the suspended job."""
    shell = Shell(mwms()).running()
    shell.api.jobs[shell.key]["spec"]["runPolicy"] = {"suspend": True}
    shell.api.update_job(shell.key)
    shell.api.deliver(shell.controller)
    shell.controller.reconcile(shell.key)
    for name in list(shell.api.pods):  # the kubelet stops them
        shell.api.remove_pod(name)
    shell.api.deliver(shell.controller)
    shell.controller.reconcile(shell.key)
    shell.api.deliver(shell.controller)
    shell.queued()
    # Suspended: the user resizes it (the status then counts a third worker), then resumes it.
    shell.api.jobs[shell.key]["spec"]["replicaSpecs"]["worker"]["replicas"] = 3
    shell.api.update_job(shell.key)
    shell.api.deliver(shell.controller)
    assert shell.queued() == [(shell.key, NORMAL)]
    write = shell.api.patch_job_status

    def resumed_meanwhile(job, patch):
        shell.api.jobs[shell.key]["spec"]["runPolicy"] = {"suspend": False}
        shell.api.update_job(shell.key)
        shell.api.patch_job_status = write
        return write(job, patch)

    shell.api.patch_job_status = resumed_meanwhile
    shell.controller.reconcile(shell.key)  # counts the resized job, and writes that after the resume
    assert shell.status()["phase"] == "Suspended"
    shell.api.deliver(shell.controller)  # the resume's event: older than the stored answer, ignored
    assert shell.queued() == [(shell.key, NORMAL)]  # decided again all the same
    shell.controller.reconcile(shell.key)
    assert shell.status()["phase"] != "Suspended"
    assert sorted(shell.api.pods) == ["mnist-chief-0", "mnist-worker-0", "mnist-worker-1", "mnist-worker-2"]


def test_the_reconcile_that_creates_the_pods_sets_their_startup_timeout():
    document = mwms()
    document["spec"]["runPolicy"] = {"startupTimeoutSeconds": 3}
    shell = Shell(document)
    shell.queued()
    shell.controller.reconcile(shell.key)
    shell.api.deliver(shell.controller)  # the ADDED events carry what the creates returned: no reconcile for them
    assert shell.queued() == []
    assert shell.controller.queue.due[(shell.key, NORMAL)] == T0 + 3
    shell.now += 3
    shell.controller.reconcile(shell.key)
    assert (shell.status()["phase"], shell.status()["reason"]) == ("Failed", "StartupTimeout")


def test_reads_come_from_the_cache_not_the_api():
    shell = Shell(mwms())
    shell.running()
    assert shell.status()["phase"] == "Running"
    assert not [c for c in shell.api.calls if c.startswith(("get", "list"))]


def test_a_pod_that_ended_goes_ahead_of_a_pod_that_started_which_goes_ahead_of_new_jobs_and_reports():
    """A job's pods that started are followed by its status before new jobs are created (behind a burst of
    creations the statuses lagged their pods by a minute); a pod that ended goes first of all."""
    shell = Shell(mwms())
    started = ("default", "started")
    shell.api.add_job(dict(mwms(), metadata={"name": "started", "namespace": "default"}))
    shell.api.deliver(shell.controller)
    for key in (shell.key, started):
        shell.controller.reconcile(key)
    shell.api.deliver(shell.controller)
    shell.queued()
    shell.controller.queue.add(("default", "reported"), REPORT)
    shell.api.add_job(dict(mwms(), metadata={"name": "newcomer", "namespace": "default"}))
    shell.api.deliver(shell.controller)
    shell.api.pods["started-worker-0"]["status"] = {"phase": "Running"}
    shell.api.update_pod("started-worker-0")
    shell.api.pods["mnist-worker-1"]["status"] = {"phase": "Failed"}
    shell.api.update_pod("mnist-worker-1")
    shell.api.deliver(shell.controller)
    shell.now += shell.controller.config.pod_batch_seconds
    wait_for(lambda: started in shell.controller.queue.queued, 5, "the started pod's batched reconcile queued")
    assert shell.queued() == [
        (shell.key, URGENT),
        (started, FOLLOW),
        (("default", "newcomer"), NORMAL),
        (("default", "reported"), REPORT),
    ]


def burst_behind(shell, *names):
    """New jobs arrive behind the shell's: their creations wait in the queue."""
    shell.queued()
    for name in names:
        shell.api.add_job(dict(mwms(), metadata={"name": name, "namespace": "default"}))
    shell.api.deliver(shell.controller)


def test_a_new_jobs_first_status_waits_while_other_new_jobs_wait_for_their_pods():
    """In a burst the API server's CPU sets the pace, and the status write is a new job's dearest call: the pods of
    every job waiting are created first, then the statuses are written (with their CreatedPods events)."""
    shell = Shell(mwms())
    burst_behind(shell, "second")
    shell.controller.reconcile(shell.key)
    assert sorted(p for p in shell.api.pods if p.startswith("mnist-")) == ["mnist-chief-0", "mnist-worker-0",
                                                                          "mnist-worker-1"]  # fmt: skip
    assert shell.status() == {}
    assert shell.api.recorded == [] and "patch status" not in shell.api.calls
    second = ("default", "second")
    # In the line of new jobs at the latest 10 s later: a steady stream of them never starves it.
    due = shell.controller.config.first_status_within
    assert (T0 + due, shell.key, NORMAL) in [(when, key, p) for when, _, key, p in shell.controller.queue.timers]
    assert shell.queued() == [(second, NORMAL), (shell.key, REPORT)]

    shell.controller.reconcile(second)  # nothing else waits: its status is written at once
    assert shell.api.jobs[second]["status"]["phase"] == "Pending"
    assert shell.api.calls.count("patch status") == 1
    shell.api.deliver(shell.controller)
    shell.controller.reconcile(shell.key, REPORT)
    assert shell.api.recorded[-1] == ("Normal", "CreatedPods", "Created mnist-chief-0, mnist-worker-0, mnist-worker-1")
    status = shell.status()
    assert status["phase"] == "Pending"
    assert status["tasks"] == shell.api.jobs[second]["status"]["tasks"]
    assert {task["state"] for task in status["tasks"].values()} == {"Created"}
    assert shell.api.calls.count("patch status") == 2
    assert shell.api.calls.count("create Pod") == 6  # and nothing created twice
    # Reported: no reconcile 10 s later for nothing (the wakeups its plan needs are set again).
    assert shell.controller.queue.due.get((shell.key, NORMAL)) != T0 + due


def test_a_held_first_status_is_written_10_s_later_while_new_jobs_still_keep_coming():
    """A steady stream of new jobs never starves a held status: past `first_status_within` it takes its turn among
    them."""
    shell = Shell(mwms())
    burst_behind(shell, "second")
    shell.controller.reconcile(shell.key)
    shell.queued()  # the report is not handed out: new jobs keep coming (here: one added at each turn)
    shell.api.add_job(dict(mwms(), metadata={"name": "third", "namespace": "default"}))
    shell.api.deliver(shell.controller)
    shell.now += shell.controller.config.first_status_within
    queue = shell.controller.queue
    with queue.timer_cond:
        queue.timer_cond.notify()
    wait_for(lambda: shell.key in queue.queued, 5, "the held job back in the line of new jobs")
    assert shell.queued() == [(("default", "third"), NORMAL), (shell.key, NORMAL)]
    assert shell.status() == {}
    shell.api.deliver(shell.controller)
    shell.controller.reconcile(shell.key, NORMAL)
    assert shell.status()["phase"] == "Pending"
    assert [reason for _, reason, _ in shell.api.recorded] == ["CreatedPods"]


def test_a_held_first_status_is_superseded_by_the_one_its_running_pods_bring():
    shell = Shell(mwms())
    burst_behind(shell, "second")
    shell.controller.reconcile(shell.key)
    shell.api.deliver(shell.controller)
    shell.run_all()  # its pods start before the burst's creations are done
    shell.api.deliver(shell.controller)
    shell.controller.reconcile(shell.key, FOLLOW)
    assert shell.status()["phase"] == "Running"
    assert shell.api.calls.count("patch status") == 1  # one write: no Pending first
    assert [reason for _, reason, _ in shell.api.recorded] == ["CreatedPods"]


def test_a_held_event_the_api_server_did_not_take_is_posted_by_the_retry():
    shell = Shell(mwms())
    burst_behind(shell, "second")
    shell.controller.reconcile(shell.key)
    shell.api.deliver(shell.controller)
    post = shell.api.event

    def unavailable(*args):
        error = client.exceptions.ApiException(status=503, reason="the server is currently unable to handle it")
        raise error

    shell.api.event = unavailable
    with pytest.raises(client.exceptions.ApiException):
        shell.controller.reconcile(shell.key, REPORT)
    assert shell.status() == {}  # nothing recorded: the crash-equivalent
    shell.api.event = post
    shell.controller.reconcile(shell.key, REPORT)
    assert [reason for _, reason, _ in shell.api.recorded] == ["CreatedPods"]
    assert shell.status()["phase"] == "Pending"


def test_a_held_first_status_of_a_job_deleted_meanwhile_is_not_said_of_its_successor():
    shell = Shell(mwms())
    burst_behind(shell, "second")
    shell.controller.reconcile(shell.key)
    shell.api.delete_job(*shell.key)
    for name in list(shell.api.pods):
        if name.startswith("mnist-"):
            shell.api.remove_pod(name)
    shell.api.deliver(shell.controller)
    shell.controller.reconcile(shell.key)  # gone: its farewell
    shell.api.add_job(mwms())  # the same name again: a new job
    shell.api.deliver(shell.controller)
    shell.queued()
    shell.controller.reconcile(shell.key)
    assert [reason for _, reason, _ in shell.api.recorded] == ["CreatedPods"]
    assert shell.status()["phase"] == "Pending"


def test_a_restarts_reconcile_makes_its_parallel_calls_on_the_urgent_lane_and_a_new_jobs_does_not():
    """A restart's deletes and replacements must not queue behind other jobs' batches of creates (kube.Kube's
    urgent pool)."""
    shell = Shell(mwms())
    assert shell.controller.queue.get() == (shell.key, NORMAL)
    shell.controller.process(shell.key, NORMAL)  # the new job's creates
    assert len(shell.api.pods) == 3 and shell.api.urgent_calls == 0
    shell.api.deliver(shell.controller)
    shell.queued()
    shell.api.pods["mnist-worker-1"]["status"] = {"phase": "Failed"}
    shell.api.update_pod("mnist-worker-1")
    shell.api.deliver(shell.controller)
    assert shell.controller.queue.get() == (shell.key, URGENT)
    shell.controller.process(shell.key, URGENT)
    assert shell.api.urgent_calls == 1


def test_pods_that_start_together_cost_their_job_one_reconcile_and_one_status_write():
    """As the Job controller's batch period: a pod that started brings its job's reconcile pod_batch_seconds later,
    so its peers' starts within that time are decided with it; a pod taken away is acted on at once."""
    shell = Shell(mwms())
    shell.queued()
    shell.controller.reconcile(shell.key)
    shell.api.deliver(shell.controller)
    writes = shell.api.calls.count("patch status")
    shell.run_all()  # the chief and both workers start, one event each
    shell.api.deliver(shell.controller)
    assert shell.queued() == []  # nothing at once ...
    assert shell.controller.queue.due[(shell.key, FOLLOW)] == T0 + 0.5  # ... one reconcile for the three, then
    shell.now += 0.5
    wait_for(lambda: shell.controller.queue.queued, 5, "the batched reconcile queued")
    assert shell.queued() == [(shell.key, FOLLOW)]
    shell.controller.reconcile(shell.key)
    assert shell.status()["phase"] == "Running"
    assert shell.api.calls.count("patch status") == writes + 1
    shell.api.deliver(shell.controller)
    shell.api.pods["mnist-worker-1"]["status"]["conditions"].append(
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    )
    shell.api.update_pod("mnist-worker-1")
    shell.api.deliver(shell.controller)
    assert shell.queued() == [(shell.key, URGENT)]  # preemption first: no batch period


def test_a_decision_about_a_job_replaced_while_it_was_made_never_writes_the_new_jobs_status():
    """The status subresource takes no uid precondition: a reconcile of the old job that ends after the job was
    deleted and created again under its name must not write its status (its restart) onto the new one."""
    shell = Shell(mwms())
    shell.queued()
    shell.controller.reconcile(shell.key)
    shell.api.deliver(shell.controller)
    shell.api.pods["mnist-worker-0"]["metadata"]["deletionTimestamp"] = "2026-11-26T05:26:57Z"
    shell.api.update_pod("mnist-worker-0")
    shell.api.deliver(shell.controller)
    seen = shell.controller.observer.observe(shell.key, {})  # the old job, as the reconcile read it: a restart due
    old = shell.api.jobs[shell.key]
    shell.api.delete_job(*shell.key)
    shell.api.add_job({k: v for k, v in old.items() if k != "status"})
    shell.api.deliver(shell.controller)
    replaced = shell.api.jobs[shell.key]
    assert replaced["metadata"]["uid"] != old["metadata"]["uid"]
    writes = shell.api.calls.count("patch status")
    plan = reconcile.decide(seen, shell.controller.config)
    assert plan.status != (old.get("status") or {})  # it would write
    shell.controller.executor.carry_out(shell.key, seen, plan)
    assert shell.api.calls.count("patch status") == writes
    assert not replaced.get("status")


def test_a_large_job_is_created_in_turns_so_other_jobs_get_theirs_in_between():
    shell = Shell(mwms(workers=9), creates_per_reconcile=4)
    shell.queued()
    shell.controller.reconcile(shell.key)
    assert len(shell.api.pods) == 4
    assert shell.queued() == [(shell.key, NORMAL)]  # back of the line for the rest
    for expected in (8, 10):
        shell.api.deliver(shell.controller)
        shell.controller.reconcile(shell.key)
        assert len(shell.api.pods) == expected
    assert set(shell.status()["tasks"][t]["state"] for t in shell.status()["tasks"]) == {"Created"}


def test_a_refused_create_keeps_what_was_created_and_backs_off_per_job():
    shell = Shell(mwms())
    shell.api.refuse["mnist-worker-0"] = RuntimeError("admission webhook denied the request")
    with pytest.raises(RuntimeError, match="denied"):
        shell.controller.reconcile(shell.key)
    assert sorted(shell.api.pods) == ["mnist-chief-0"]
    assert shell.status()["tasks"]["chief-0"]["state"] == "Created"
    # Nothing waits for the refused creates: the retry is not held back by expectations.
    shell.api.deliver(shell.controller)
    assert shell.key not in shell.controller.expectations.pending
    del shell.api.refuse["mnist-worker-0"]
    shell.controller.reconcile(shell.key)
    assert sorted(shell.api.pods) == ["mnist-chief-0", "mnist-worker-0", "mnist-worker-1"]
    assert shell.status()["restarts"] == {"failures": 0, "disruptions": 0, "total": 0, "inPlace": "Enabled"}


def test_the_periodic_refresh_relists_and_acts_on_a_deletion_the_watch_missed():
    shell = Shell(mwms())
    shell.running()
    shell.api.pods.pop("mnist-worker-0")  # deleted during a watch gap: no event ever comes
    shell.controller.reconcile(shell.key)
    assert shell.status()["restarts"]["disruptions"] == 0  # the cache cannot know
    shell.queued()
    shell.controller.refresh()
    assert shell.queued() == [(shell.key, URGENT)]
    shell.controller.reconcile(shell.key)
    assert shell.status()["restarts"]["disruptions"] == 1
    assert shell.status()["phase"] == "Restarting"


def test_no_job_is_polled_on_its_own_only_its_exact_timers_are_set():
    """The safety net is one paged re-list of everything every resync_seconds (Controller.refresh), not a re-read
    per job: 5,000 queued jobs would cost 17 calls a second at one re-read each per 10 minutes."""
    document = mwms()
    document["spec"]["runPolicy"] = {"activeDeadlineSeconds": 86400, "startupTimeoutSeconds": 2 * 86400}
    shell = Shell(document)
    shell.controller.reconcile(shell.key)
    assert dict(shell.controller.queue.due) == {(shell.key, NORMAL): T0 + 86400}


def test_a_primed_operator_sees_every_pod_before_it_reconciles():
    shell = Shell(mwms())
    shell.controller.reconcile(shell.key)
    shell.api.events.clear()  # the old operator dies; the new one's watch starts later than its first reconcile
    restarted = Controller(shell.api, OperatorConfig(), clock=lambda: shell.now)
    restarted.prime()
    plan = restarted.reconcile(shell.key)
    assert plan.create == [] and plan.delete == []
    assert shell.status()["restarts"]["disruptions"] == 0


def test_writes_are_refused_without_the_lease_before_anything_is_sent():
    kube = Kube(qps=1, burst=1, may_write=lambda: False)
    pod = {"kind": "Pod", "metadata": {"name": "p", "namespace": "default"}}
    with pytest.raises(NotLeader):
        kube.create(pod)
    with pytest.raises(NotLeader):
        kube.delete_pod(dict(pod, metadata={**pod["metadata"], "uid": "u"}))


def test_a_write_whose_rate_limiter_wait_outlasts_the_lease_is_not_sent():
    # Leadership was checked before the limiter's wait: a write that waited longer than the lease's margin left
    # after another operator could have taken over. It is checked after the wait now.
    leading_until = time.monotonic() + 0.2
    kube = Kube(qps=2, burst=1, may_write=lambda: time.monotonic() < leading_until)
    sent = []
    kube.core.delete_namespaced_pod = lambda *args, **kwargs: sent.append(args)  # what would go out
    pod = {"kind": "Pod", "metadata": {"name": "p", "namespace": "default", "uid": "u"}}
    kube.limiter.acquire()  # the bucket is empty: the next write waits half a second for its token
    with pytest.raises(NotLeader):
        kube.delete_pod(pod)
    assert sent == []


def test_every_write_is_guarded_workload_writes_and_events_too():
    kube = Kube(qps=100, burst=100, may_write=lambda: False)
    workload = {"apiVersion": kueue.WORKLOADS.api_version, "kind": "Workload",
                "metadata": {"name": "trainingjob-mnist-12345", "namespace": "team-a", "uid": "u"}}  # fmt: skip
    with pytest.raises(NotLeader):
        kube.write(Write(workload, "status", {"status": {"conditions": []}}), "1")
    with pytest.raises(NotLeader):
        kube.event({"metadata": {"name": "mnist", "namespace": "team-a"}}, "Normal", "Test", "test")


def test_config_defaults_are_stated_once():
    from kubetf.cli import main as cli

    assert cli.operator_config(cli.build_parser().parse_args(["operator"])) == OperatorConfig()
    from kubetf.runtime.runner import where_it_runs

    assert where_it_runs(dataclasses.replace(OperatorConfig(), identity="x")).identity == "x"


def test_the_timing_an_operator_of_the_cluster_tunes_comes_from_flags(capsys):
    from kubetf.cli import main as cli

    parser = cli.build_parser()
    flags = ["operator", "--node-monitor-grace-period", "40", "--api-timeout", "3,10", "--scheduling-grace", "5"]
    config = cli.operator_config(parser.parse_args(flags))
    assert (config.node_monitor_grace, config.api_timeout, config.scheduling_grace) == (40.0, (3.0, 10.0), 5.0)
    with pytest.raises(SystemExit):
        parser.parse_args(["operator", "--log-timeout", "4"])
    assert "--log-timeout: expected CONNECT,READ seconds (like 5,30), got '4'" in capsys.readouterr().err
    assert "--api-timeout" in cli.operator_config(parser.parse_args(["operator", "--api-timeout", "0,1"])).problem()


def test_a_deletion_the_watch_showed_while_the_reconcile_ran_is_not_waited_for():
    shell = Shell(mwms())
    shell.running()
    shell.api.pods["mnist-worker-1"]["status"] = {"phase": "Failed"}
    shell.api.update_pod("mnist-worker-1")
    shell.api.deliver(shell.controller)
    store = shell.controller.store
    real_job_pods = store.job_pods

    def read_then_lose_the_chief(key):
        pods = real_job_pods(key)  # the reconcile's view still has the chief ...
        shell.api.remove_pod("mnist-chief-0")  # ... which someone deletes, and the watch shows it at once
        shell.api.deliver(shell.controller)
        return pods

    store.job_pods = read_then_lose_the_chief
    shell.controller.reconcile(shell.key)  # the group restart deletes the chief and worker-0
    store.job_pods = real_job_pods
    shell.api.deliver(shell.controller)
    assert shell.key not in shell.controller.expectations.pending


def test_the_refresh_after_the_start_acts_on_a_deletion_no_watch_showed():
    shell = Shell(mwms()).running()
    shell.queued()
    shell.api.pods.pop("mnist-worker-0")  # between the priming list and the watch's own: no event ever comes
    shell.controller.refresh()
    assert shell.queued() == [(shell.key, URGENT)]
    shell.controller.reconcile(shell.key)
    assert shell.status()["restarts"]["disruptions"] == 1


def test_the_refresh_after_the_start_acts_on_a_failure_no_watch_showed():
    shell = Shell(mwms()).running()
    shell.queued()
    failed = shell.api.pods["mnist-worker-0"]
    failed["status"] = {"phase": "Failed"}
    shell.api._bump(failed)  # changed while no watch ran: no event
    shell.controller.refresh()
    assert shell.queued() == [(shell.key, URGENT)]
    shell.controller.reconcile(shell.key)
    assert shell.status()["restarts"]["failures"] == 1


def test_a_relist_after_the_start_refreshes_so_a_deletion_it_cannot_show_is_acted_on():
    shell = Shell(mwms()).running()
    shell.queued()
    shell.controller.audit_on_list = True  # the audit after the start is done
    shell.api.pods.pop("mnist-worker-0")  # while the watch was down (an API server restart): no event ever comes
    shell.controller.pod_event(None, shell.api.pods["mnist-chief-0"])  # kopf lists again: type None
    deadline = time.monotonic() + 5
    while shell.controller.auditing and time.monotonic() < deadline:
        time.sleep(0.01)
    assert shell.queued() == [(shell.key, URGENT)]
    shell.controller.reconcile(shell.key)
    assert shell.status()["restarts"]["disruptions"] == 1


def _training(shell, *names):
    for name in names:
        pod = shell.api.pods[name]
        pod["status"]["containerStatuses"] = [{"name": "tensorflow", "state": {"running": {}}}]
        shell.api.update_pod(name)
    shell.api.deliver(shell.controller)


def _ended(shell, name, phase):
    shell.api.pods[name]["status"] = {"phase": phase}
    shell.api.update_pod(name)
    shell.api.deliver(shell.controller)


def _evicted(shell, name):
    """A group training, then `name` evicted (deleted with its own 120 s grace period) at T0."""
    _training(shell, *shell.api.pods)
    shell.api.delete_pod(shell.api.pods[name])
    shell.api.deliver(shell.controller)
    shell.api.calls.clear()


SWALLOWED = "W0000 00:00:1800000001.5 12 preemption_notifier.cc:90] SIGTERM caught at 2027-01-15T08:00:01+00:00\n"


def _deletions(shell):
    return [c for c in shell.api.calls if c.startswith("delete Pod")]


def test_an_evicted_member_whose_tensorflow_swallowed_the_sigterm_gets_the_rest_of_its_group_stopped_at_once():
    shell = Shell(mwms()).running()
    _evicted(shell, "mnist-worker-1")
    shell.controller.reconcile(shell.key)
    assert _deletions(shell) == []  # the group restart waits for the first look at worker-1's log ...
    assert (T0 + 2, shell.key) in [(when, key) for when, _, key, _ in shell.controller.queue.timers]
    shell.api.logs["mnist-worker-1"] = "Epoch: 3, accuracy: 0.9\n" + SWALLOWED
    shell.now = T0 + 2
    shell.controller.reconcile(shell.key)
    assert _deletions(shell) == ["delete Pod grace 1", "delete Pod grace 1"]  # ... then stops the chief and worker-0
    assert {n for n, p in shell.api.pods.items() if p["metadata"]["deletionGracePeriodSeconds"] == 1} == {
        "mnist-chief-0",
        "mnist-worker-0",
    }
    (message,) = [m for _, r, m in shell.api.recorded if r == "SigtermIgnored"]
    assert message.startswith("mnist-worker-1: TensorFlow took the SIGTERM")


def test_a_program_that_saves_on_sigterm_keeps_the_pods_own_grace_period():
    shell = Shell(mwms()).running()
    _evicted(shell, "mnist-worker-1")
    shell.api.logs["mnist-worker-1"] = "Member 2 has received termination notice.\n"  # PreemptionCheckpointHandler
    for seconds in (0, 2, 4):
        shell.now = T0 + seconds
        shell.controller.reconcile(shell.key)
        assert _deletions(shell) == []
    shell.now = T0 + 6
    shell.controller.reconcile(shell.key)
    assert _deletions(shell) == ["delete Pod", "delete Pod"]  # with their own grace period
    assert shell.api.calls.count("read log mnist-worker-1") == len(DEFAULTS.sigterm_checks)
    assert not [r for _, r, _ in shell.api.recorded if r == "SigtermIgnored"]


def test_when_the_log_cannot_be_read_the_group_is_deleted_at_once_with_its_own_grace_period():
    shell = Shell(mwms()).running()
    _evicted(shell, "mnist-worker-1")
    shell.api.unreadable_logs = True
    shell.controller.reconcile(shell.key)
    assert _deletions(shell) == ["delete Pod", "delete Pod"]  # no waiting for checks that cannot find the line
    assert shell.api.calls.count("read log mnist-worker-1") == 1


def test_a_member_whose_pod_is_already_gone_gets_the_rest_of_its_group_deleted_at_once():
    shell = Shell(mwms()).running()
    _training(shell, *shell.api.pods)
    shell.api.remove_pod("mnist-worker-1")  # a program that saved and exited on SIGTERM: its pod went at once
    shell.api.deliver(shell.controller)
    shell.api.calls.clear()
    shell.controller.reconcile(shell.key)
    assert _deletions(shell) == ["delete Pod", "delete Pod"]  # not one first: the others end by themselves
    assert not any(c.startswith("read log") for c in shell.api.calls)


def test_pods_deleted_at_the_end_go_at_once_and_have_their_logs_left_alone():
    shell = Shell(mwms()).running()
    _training(shell, *shell.api.pods)
    _ended(shell, "mnist-chief-0", "Succeeded")
    shell.controller.reconcile(shell.key)  # Succeeded: the workers still running are deleted (cleanPodPolicy)
    assert shell.status()["phase"] == "Succeeded" and _deletions(shell) == ["delete Pod", "delete Pod"]
    shell.api.deliver(shell.controller)
    shell.api.calls.clear()
    for seconds in (2, 4, 6, 8):  # both terminating, with nothing left to decide
        shell.now = T0 + seconds
        shell.controller.reconcile(shell.key)
    assert not any(c.startswith("read log") for c in shell.api.calls)


def test_suspending_deletes_every_pod_at_once_with_its_own_grace_period():
    for document in (mwms(), job(strategy="ParameterServer", chief=replica(1), worker=replica(2), ps=replica(1))):
        shell = Shell(document).running()
        _training(shell, *shell.api.pods)
        shell.api.jobs[shell.key]["spec"]["runPolicy"] = {"suspend": True}
        shell.api.update_job(shell.key)
        shell.api.deliver(shell.controller)
        shell.api.calls.clear()
        shell.controller.reconcile(shell.key)
        assert _deletions(shell) == ["delete Pod"] * len(shell.api.pods), document["spec"]["strategy"]
        assert not any(c.startswith("read log") for c in shell.api.calls)


def test_a_restart_after_a_failure_deletes_the_group_at_once():
    shell = Shell(mwms()).running()
    _training(shell, *shell.api.pods)
    _ended(shell, "mnist-worker-1", "Failed")
    shell.api.calls.clear()
    shell.controller.reconcile(shell.key)
    assert _deletions(shell) == ["delete Pod"] * 3  # the failed pod too, all with their own grace period
    assert not any(c.startswith("read log") for c in shell.api.calls)


def test_a_member_marked_for_eviction_is_sent_sigterm_first_and_the_rest_wait_for_what_its_program_does():
    shell = Shell(mwms()).running()
    _training(shell, *shell.api.pods)
    shell.api.pods["mnist-worker-1"]["status"]["conditions"].append(
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    )  # the Eviction API marks the pod before it deletes it
    shell.api.update_pod("mnist-worker-1")
    shell.api.deliver(shell.controller)
    shell.api.calls.clear()
    shell.controller.reconcile(shell.key)
    assert _deletions(shell) == ["delete Pod"]  # worker-1 alone, with its own grace period
    assert shell.api.pods["mnist-worker-1"]["metadata"]["deletionGracePeriodSeconds"] == 120
    shell.api.deliver(shell.controller)
    shell.api.logs["mnist-worker-1"] = SWALLOWED
    shell.now = T0 + 2
    shell.controller.reconcile(shell.key)
    assert _deletions(shell) == ["delete Pod", "delete Pod grace 1", "delete Pod grace 1"]


def test_a_decision_refused_for_want_of_the_lease_runs_again_once_it_is_held_from_a_fresh_read():
    shell = Shell(mwms())
    shell.running()
    shell.api.pods["mnist-worker-1"]["status"] = {"phase": "Failed"}
    shell.api.update_pod("mnist-worker-1")
    shell.api.deliver(shell.controller)
    shell.queued()
    shell.controller.leadership(False)  # the election lost the lease: writes are refused
    leading = {"now": False}
    original = shell.api.patch_job_status

    def patch_without_the_lease(*args):
        if not leading["now"]:
            raise NotLeader("patch trainingjobs/status: this operator does not hold the leader lease")
        return original(*args)

    shell.api.patch_job_status = patch_without_the_lease
    shell.controller.queue.add(shell.key, URGENT)
    shell.controller.start()
    try:
        wait_for(lambda: shell.key in shell.controller.refused, 5, "the refused decision kept")
        assert shell.controller.queue.due.get((shell.key, URGENT)) is None  # no spinning while not the leader
        shell.api.pods.pop("mnist-worker-0")  # deleted meanwhile, and the watch missed it
        leading["now"] = True
        shell.controller.leadership(True)
        wait_for(lambda: shell.status().get("restarts", {}).get("total") == 1, 5, "the restart decided")
    finally:
        shell.controller.stop()
    restarts = shell.status()["restarts"]
    assert (restarts["failures"], restarts["disruptions"]) == (0, 1), restarts  # the fresh read saw the deletion
    assert shell.controller.refused == {}


def test_namespace_patterns_list_everything_and_keep_only_what_they_match():
    config = OperatorConfig(namespaces=("it-gw0-*", "team-a"))
    assert config.list_scopes() == ("",)
    assert [config.serves(n) for n in ("it-gw0-1f2e", "team-a", "it-gw1-1f2e", "team-ab")] == [True, True, False, False]
    assert OperatorConfig(namespaces=("a", "b")).list_scopes() == ("a", "b")
    assert OperatorConfig().list_scopes() == ("",) and OperatorConfig().serves("anything")
    shell = Shell(mwms(), namespaces=("it-*",))  # the job is in namespace team-a: not served
    assert shell.controller.store.job_count() == 0 and shell.queued() == []  # its watch event is dropped
    restarted = Controller(shell.api, shell.controller.config, clock=lambda: shell.now)
    restarted.prime()
    assert restarted.store.job_count() == 0
    from kubetf.runtime.runner import kopf_scope

    # kopf watches every namespace for a pattern (it would miss one created while it lists them), named ones alone
    assert kopf_scope(config) == (True, []) and kopf_scope(OperatorConfig()) == (True, [])
    assert kopf_scope(OperatorConfig(namespaces=("a", "b"))) == (False, ["a", "b"])


def test_a_kubelet_that_does_not_answer_holds_a_reconcile_for_the_log_timeout_only():
    """Logs come through the pod's node: a silent kubelet (a partitioned node) must not hold one of the reconcile
    workers for the API's 30 s read timeout. The group restart then goes ahead as if the log were unreadable."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections, never answers
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{silent.getsockname()[1]}"
    before = client.Configuration.get_default_copy()
    client.Configuration.set_default(configuration)
    try:
        config = OperatorConfig(log_timeout=(0.5, 0.5))
        kube = Kube(config.qps, config.burst, config.api_timeout, log_timeout=config.log_timeout)
        pod = {"metadata": {"name": "mnist-worker-1", "namespace": "team-a", "uid": "u"}}
        started = time.monotonic()
        with pytest.raises(Exception):  # noqa: B017 - whichever way urllib3 reports the timeout
            kube.pod_log_tail(pod, "tensorflow", 5, 1024)
        assert time.monotonic() - started < 5
    finally:
        client.Configuration.set_default(before)
        silent.close()
    assert DEFAULTS.log_timeout[0] + DEFAULTS.log_timeout[1] <= 10  # a few seconds by default, not 30


def test_a_deleted_jobs_sigterm_watch_and_deferred_reconcile_are_dropped():
    shell = Shell(mwms()).running()
    _evicted(shell, "mnist-worker-1")
    shell.controller.reconcile(shell.key)  # holds the group restart while worker-1's log is looked at
    assert shell.key in shell.controller.executor.sigterm
    shell.controller.expectations.expect(shell.key, creations=["never-shown"])
    assert shell.controller.expectations.defer(shell.key, NORMAL) is not None
    shell.api.delete_job(*shell.key)
    shell.api.deliver(shell.controller)
    shell.controller.reconcile(shell.key)
    assert shell.key not in shell.controller.executor.sigterm
    assert shell.key not in shell.controller.expectations.deferred


def ps_on_a_lost_node() -> Shell:
    """A running ParameterServer job whose ps node stopped reporting and whose ps the taint manager evicts."""
    shell = Shell(job(strategy="ParameterServer", chief=replica(1), worker=replica(2), ps=replica(1))).running()
    shell.queued()
    ps = shell.api.pods["mnist-ps-0"]
    ps["spec"]["nodeName"] = "spot-3"
    shell.api.lost_nodes["spot-3"] = shell.now - 60
    ps["status"]["conditions"] = [
        {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager", "message": "Taint manager"}
    ]
    ps["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"  # its kubelet will never confirm
    shell.api.update_pod("mnist-ps-0")
    shell.api.deliver(shell.controller)
    return shell


def test_a_force_deleted_pod_leaves_the_cache_at_once_and_its_job_is_decided_again():
    """CI run 27: the ps on a lost node is force-deleted with the chief's graceful deletion; the chief's deletion
    was seen first and its reconcile still found the ps cached: it waited for the ps, and the ps's DELETED event,
    handled after the reconcile had removed it on a 404, brought nothing back. A forced pod is gone at once."""
    shell = ps_on_a_lost_node()
    plan = shell.controller.reconcile(shell.key)
    assert [p["metadata"]["name"] for p in plan.force_delete] == ["mnist-ps-0"]
    assert [p["metadata"]["name"] for p in plan.delete] == ["mnist-chief-0"]
    assert shell.queued() == [(shell.key, URGENT)]  # decided again without the ps
    events, shell.api.events = shell.api.events, []  # the ps's DELETED event is late
    shell.api.remove_pod("mnist-chief-0")  # the chief ends, and that is all the watch has shown so far
    shell.api.deliver(shell.controller)
    plan = shell.controller.reconcile(shell.key)
    assert sorted(p["metadata"]["name"] for p in plan.create) == ["mnist-chief-0", "mnist-ps-0"]
    shell.api.events = events + shell.api.events
    shell.api.deliver(shell.controller)
    shell.queued()
    assert shell.controller.reconcile(shell.key).create == []  # the late event changes nothing


def test_a_force_deleted_pod_with_a_finalizer_stays_cached_until_it_is_gone():
    shell = ps_on_a_lost_node()
    shell.api.pods["mnist-ps-0"]["metadata"]["finalizers"] = ["example.com/backup"]
    shell.api.update_pod("mnist-ps-0")
    shell.api.deliver(shell.controller)
    shell.queued()
    plan = shell.controller.reconcile(shell.key)
    assert [p["metadata"]["name"] for p in plan.force_delete] == ["mnist-ps-0"]
    assert "mnist-ps-0" in shell.api.pods and shell.queued() == []  # still there: its removal brings the job back


def test_a_pod_found_already_gone_when_deleted_brings_its_job_back():
    """A pod the plan deletes was gone already (its DELETED event not handled yet): the plan was made with it, and
    its event, once handled, finds nothing to remove, so the job is decided again at once."""
    shell = Shell(mwms()).running()
    shell.queued()
    shell.api.remove_pod("mnist-worker-1")  # a lost worker: the whole group restarts
    shell.api.deliver(shell.controller)
    shell.queued()
    shell.api.pods.pop("mnist-chief-0")  # gone meanwhile, its event not delivered
    plan = shell.controller.reconcile(shell.key)
    assert sorted(p["metadata"]["name"] for p in plan.delete) == ["mnist-chief-0", "mnist-worker-0"]
    assert shell.queued() == [(shell.key, URGENT)]


def test_a_failed_delete_is_retried_within_five_seconds_not_held_by_its_expectation():
    # Deletion expectations were raised before the delete and never lowered when it failed (a 503, a webhook): the
    # retry waited for a DELETED event that could not come, for the 30 s expectation timeout.
    shell = Shell(mwms()).running()
    shell.api.pods["mnist-worker-1"]["status"] = {"phase": "Failed", "containerStatuses": [
        {"name": "tensorflow", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}  # fmt: skip
    shell.api.update_pod("mnist-worker-1")
    shell.api.deliver(shell.controller)
    shell.queued()
    unavailable = client.ApiException(status=503, reason="Service Unavailable")
    shell.api.refuse_delete = {name: unavailable for name in shell.api.pods}
    with pytest.raises(client.ApiException):
        shell.controller.reconcile(shell.key)  # the group restart's deletes fail
    delay = shell.controller.queue.retry(shell.key, URGENT, shell.controller.config.transient_retry_cap)
    assert delay <= 5
    shell.api.refuse_delete = {}
    shell.now += delay
    plan = shell.controller.reconcile(shell.key)
    assert plan is not None, "the retry waited for deletions that never happened"
    assert {p["metadata"]["name"] for p in plan.delete} >= {"mnist-chief-0", "mnist-worker-0"}


def test_a_job_whose_reconciles_keep_failing_says_so_and_the_first_success_clears_it():
    shell = Shell(mwms(), reconcile_error_after=3).running()
    denied = client.ApiException(status=403, reason="Forbidden")
    denied.body = '{"message": "admission webhook \\"deny-deletes.example.com\\" denied the request: frozen"}'
    shell.api.refuse_delete = {"mnist-worker-0": denied, "mnist-worker-1": denied}
    shell.api.pods["mnist-chief-0"]["status"] = {"phase": "Failed", "containerStatuses": [
        {"name": "tensorflow", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}  # fmt: skip
    shell.api.update_pod("mnist-chief-0")
    shell.api.deliver(shell.controller)
    shell.queued()
    for _ in range(3):  # three attempts (the backoff's timers do not matter here: the test hands the job out)
        shell.controller.queue.add(shell.key, NORMAL)
        shell.controller.process(*shell.controller.queue.get())
        shell.api.deliver(shell.controller)
    condition = next(c for c in shell.status()["conditions"] if c["type"] == "ReconcileError")
    assert condition["status"] == "True" and "denied the request: frozen" in condition["message"]
    assert [r for _, r, _ in shell.api.recorded].count("ReconcileError") == 1
    assert shell.status()["phase"] == "Restarting"  # the phase condition is still the job's own
    shell.api.refuse_delete = {}
    for _ in range(2):  # the one that succeeds, then the one it asks for, which clears the condition
        shell.controller.queue.add(shell.key, NORMAL)
        shell.controller.process(*shell.controller.queue.get())
        shell.api.deliver(shell.controller)
    condition = next(c for c in shell.status()["conditions"] if c["type"] == "ReconcileError")
    assert (condition["status"], condition["reason"]) == ("False", "Reconciled")


def test_a_pod_with_the_jobs_labels_that_is_not_its_own_is_never_touched_and_its_task_says_why():
    # Only what is provably the job's own (its controller reference) is deleted, marked or counted: a pod someone
    # made by hand with the job's labels and a task's name, or another controller's, is left alone.
    shell = Shell(mwms())
    stranger = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "mnist-worker-1",
            "namespace": "team-a",
            "uid": "uid-of-someone-elses-pod",
            "labels": {
                "app.kubernetes.io/managed-by": "kubetf",
                "kubetf.io/job-name": "mnist",
                "kubetf.io/role": "worker",
                "kubetf.io/index": "1",
                "kubetf.io/attempt": "0",
            },
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "rs", "controller": True}
            ],
        },
        "spec": {"containers": [{"name": "tensorflow"}], "nodeName": "node-a"},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    shell.api.pods["mnist-worker-1"] = stranger
    shell.api.update_pod("mnist-worker-1")
    shell.api.deliver(shell.controller)
    shell.controller.reconcile(shell.key)
    shell.api.deliver(shell.controller)
    assert "mnist-chief-0" in shell.api.pods and "mnist-worker-0" in shell.api.pods
    assert shell.api.pods["mnist-worker-1"]["metadata"]["uid"] == "uid-of-someone-elses-pod"
    status = shell.status()
    assert (status["phase"], status["reason"]) == ("Pending", "PodNameInUse")
    assert status["replicaStatuses"]["worker"]["active"] == 1  # the stranger is not counted as the job's
    message = next(c["message"] for c in status["conditions"] if c["type"] == "Pending")
    assert "pod mnist-worker-1 exists and is not this job's (its controller: ReplicaSet web)" in message
    shell.job_document = shell.api.jobs[shell.key]
    shell.job_document["spec"]["runPolicy"] = {"suspend": True}
    shell.api.update_job(shell.key)
    shell.api.deliver(shell.controller)
    plan = shell.controller.reconcile(shell.key)  # suspended: every pod of the job goes, and only those
    assert "mnist-worker-1" not in {p["metadata"]["name"] for p in plan.delete}
    assert not shell.api.pods["mnist-worker-1"]["metadata"].get("deletionTimestamp")


def test_a_restarts_event_a_killed_operator_did_not_post_is_posted_once_by_the_next():
    """Issue 49: held events lived in memory only: an operator killed between the restart's status write and its
    post lost them. The decision stores them with it; the next operator posts them, under their own names."""
    from .test_reconcile import Sim, mwms_job

    sim = Sim(mwms_job())
    sim.step()
    sim.run()
    sim.step()
    sim.evict("mnist-worker-1")
    sim.api.deliver(sim.controller)
    sim.api.refuse_events.append(RuntimeError("the operator is killed here"))
    with pytest.raises(RuntimeError):
        sim.controller.reconcile(sim.key)
    assert sim.status["restarts"]["disruptions"] == 1 and sim.status["pendingEvents"]  # stored with the decision
    assert [r for _, r, _ in sim.api.recorded].count("Disrupted") == 0
    sim.restart_operator()
    sim.step()
    sim.step()
    assert [r for _, r, _ in sim.api.recorded].count("Disrupted") == 1  # posted once: not lost, not doubled
    assert sim.status["restarts"]["disruptions"] == 1


def test_a_failed_post_of_the_second_of_two_held_events_posts_only_that_one_again():
    """Issue 49: the retry of a failed post posted every held event again (events had generated names)."""
    from kubetf.core.types import Event

    from .test_reconcile import Sim, mwms_job

    sim = Sim(mwms_job())
    sim.step()
    key, job = sim.key, sim.job
    held = [Event("Warning", "Disrupted", "the first"), Event("Normal", "SigtermIgnored", "the second")]
    sim.controller.executor.held_events[key] = (job["metadata"]["uid"], held, None)
    sim.api.refuse_events = [None, RuntimeError("503: the second's post")]
    with pytest.raises(RuntimeError):
        sim.controller.executor._post_held(key, job)
    sim.controller.executor._post_held(key, job)  # the retry
    said = [m for _, _, m in sim.api.recorded]
    assert said.count("the first") == 1 and said.count("the second") == 1


def test_an_event_that_happens_again_is_posted_again_and_a_retried_decisions_is_not():
    """An event is named by the job's version its decision was made on: the second suspension says Suspended again
    (named by the job and the event alone, it was taken for the first one's post and lost), while a decision retried
    after its status write failed posts what it had posted already no second time."""
    from .test_reconcile import Sim, mwms_job

    sim = Sim(mwms_job())
    sim.step()
    sim.run()
    sim.api.deliver(sim.controller)
    sim.api.refuse_status.append(RuntimeError("503: the status write"))
    with pytest.raises(RuntimeError):
        sim.controller.reconcile(sim.key)
    sim.step()  # the retry: the same decision on the same version of the job
    reasons = [r for _, r, _ in sim.api.recorded]
    assert sim.status["phase"] == "Running" and reasons.count("AllPodsRunning") == 1, reasons
    for _ in range(2):
        sim.job["spec"]["runPolicy"]["suspend"] = True
        sim.api.update_job(sim.key)
        sim.step()
        sim.gone()
        sim.step(advance=5)
        sim.job["spec"]["runPolicy"]["suspend"] = False
        sim.api.update_job(sim.key)
        sim.step()
        sim.run()
        sim.step(advance=5)
    reasons = [r for _, r, _ in sim.api.recorded]
    assert (reasons.count("Suspended"), reasons.count("Resumed"), reasons.count("AllPodsRunning")) == (2, 2, 3), reasons
