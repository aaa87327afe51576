"""Creates the API server refuses (invalid, denied, a name still in use) and events that must not be lost."""

import json

import pytest
from kubernetes.client.exceptions import ApiException

from kubetf.cluster.kube import Kube, Refused, refusal
from kubetf.core import reconcile, refusals
from kubetf.core.config import OperatorConfig
from kubetf.core.plan import Observed
from kubetf.core.refusals import DENIED, INVALID, NAME_IN_USE, UNAVAILABLE, Refusal
from kubetf.runtime.executor import NORMAL
from tests.cluster.fixture import wait_for

from .jobs import container, job, replica
from .test_controller import T0, Shell, _deletions, _ended, _training

pytestmark = pytest.mark.unit

QUOTA = 'pods "mnist-worker-1" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=2, limited: pods=2'


def mwms(workers=2, **run_policy):
    document = job(chief=replica(1), worker=replica(workers))
    document["spec"]["runPolicy"] = {"backoffSeconds": 10, **run_policy}
    return document


def denied(name, message=QUOTA):
    return Refused(Refusal(DENIED, "Pod", name, message))


def condition(shell):
    return next(c for c in shell.status()["conditions"] if c["status"] == "True")


def api_error(status, message):
    error = ApiException(status=status, reason="refused")
    error.body = json.dumps({"kind": "Status", "message": message, "code": status})
    return error


# ------------------------------------------------------------------ the API server's answers, classified


@pytest.mark.parametrize(
    "status, message, cause",
    [
        (422, 'Pod "x" is invalid: spec.containers[0].image: Required value', INVALID),
        (400, 'Pod in version "v1" cannot be handled as a Pod: quantities must match the regular expression', INVALID),
        (403, QUOTA, DENIED),
        (403, 'pods "x" is forbidden: violates PodSecurity "restricted:latest": privileged', DENIED),
        (403, 'pods "x" is forbidden: maximum memory usage per Container is 1Gi, but limit is 2Gi', DENIED),
        (400, 'admission webhook "deny.example.com" denied the request: no GPUs on Sundays', DENIED),
        (422, "ValidatingAdmissionPolicy 'p' with binding 'b' denied request: images from our registry", DENIED),
        (500, "etcdserver: request timed out", UNAVAILABLE),
        (429, "too many requests", UNAVAILABLE),
        (500, 'Internal error occurred: failed calling webhook "mpod.kb.io": connection refused', UNAVAILABLE),
        (504, "Timeout: request did not complete within the allotted timeout", UNAVAILABLE),
    ],
)
def test_a_refused_create_is_classified_from_the_api_servers_answer(status, message, cause):
    found = refusal({"kind": "Pod", "metadata": {"name": "x"}}, api_error(status, message))
    assert (found.cause if found else None) == cause
    if found:
        assert found.message == message  # the API server's own words


def existing(kind, deleting=False, owner=None):
    meta = {"name": "mnist", "namespace": "team-a"}
    if deleting:
        meta["deletionTimestamp"] = "2027-01-01T00:00:00Z"
    if owner:
        meta["ownerReferences"] = [{"kind": "TrainingJob", "name": "mnist", "uid": owner, "controller": True}]
    return {"kind": kind, "metadata": meta}


@pytest.mark.parametrize(
    "kind, found, in_use",
    [
        ("Service", existing("Service", owner="this-uid"), False),  # this job's own (an operator restarted)
        ("Service", existing("Service", owner="old-uid"), True),  # a previous job's, not collected yet
        ("Service", existing("Service", owner="this-uid", deleting=True), True),
        ("Service", existing("Service"), True),  # someone else's Service of that name
        ("PersistentVolumeClaim", existing("PersistentVolumeClaim"), False),  # a retained checkpoint: resumed
        ("PersistentVolumeClaim", existing("PersistentVolumeClaim", deleting=True), True),
        ("PersistentVolumeClaim", existing("PersistentVolumeClaim", owner="old-uid"), True),  # retainOnDelete false
        ("Service", None, False),  # gone between the dry run and the look
    ],
)
def test_a_name_already_taken_is_this_jobs_only_when_it_owns_it_or_a_retained_checkpoint(kind, found, in_use):
    kube = Kube(qps=100, burst=100)
    kube._get = lambda *args: found  # the object the API server returns for the name
    result = kube._name_in_use({"kind": kind, "metadata": {"name": "mnist", "namespace": "team-a"}}, "this-uid")
    assert (result is not None and result.cause == NAME_IN_USE) == in_use


def test_an_event_is_raised_when_the_api_server_may_take_it_later_and_dropped_when_never():
    kube = Kube(qps=100, burst=100)
    job_ = {"metadata": {"name": "mnist", "namespace": "team-a", "uid": "u"}}
    for status in (500, 503, 429):
        kube._call = lambda *a, status=status, **k: (_ for _ in ()).throw(api_error(status, "try later"))
        with pytest.raises(ApiException):
            kube.event(job_, "Warning", "Disrupted", "x")
    kube._call = lambda *a, **k: (_ for _ in ()).throw(api_error(403, "events is forbidden"))
    kube.event(job_, "Warning", "Disrupted", "x")  # logged: retrying would never help


# ------------------------------------------------------------------ invalid templates


def test_an_invalid_template_fails_the_job_before_any_child_exists():
    shell = Shell(mwms(workers=3))
    message = 'Pod "mnist-worker-2" is invalid: spec.containers[0].resources.limits[memory]: Invalid value'
    shell.api.invalid["worker"] = message
    shell.controller.reconcile(shell.key)
    status = shell.status()
    assert (status["phase"], status["reason"]) == ("Failed", "InvalidPodTemplate")
    assert condition(shell)["message"].startswith(
        f"replica worker: the API server refused pod mnist-worker-2: {message}"
    )
    assert "Fix spec.replicaSpecs.worker.template" in condition(shell)["message"]
    assert status.get("completionTime")
    assert shell.api.pods == {} and shell.api.others == {}
    # One pod per role is tried (the last index: the longest name), and the Service.
    assert sorted(c for c in shell.api.calls if c.startswith("dry-run")) == [
        "dry-run Pod",
        "dry-run Pod",
        "dry-run Service",
    ]
    assert ("Warning", "InvalidPodTemplate") in [(t, r) for t, r, _ in shell.api.recorded]
    assert shell.controller.reconcile(shell.key).create == []  # finished: never retried


def test_an_undecodable_quantity_is_reported_with_its_field_path():
    document = mwms()
    document["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"memory": "4GB", "cpu": "1"}
    }
    shell = Shell(document)
    shell.api.invalid["worker"] = (
        'Pod in version "v1" cannot be handled as a Pod: quantities must match the regular expression'
    )
    shell.controller.reconcile(shell.key)
    assert (
        "spec.replicaSpecs.worker.template.spec.containers[0].resources.limits.memory='4GB'"
        in condition(shell)["message"]
    )
    assert "cpu" not in condition(shell)["message"]


def test_only_a_new_job_pays_for_a_dry_run():
    shell = Shell(mwms()).running()
    assert shell.api.calls.count("dry-run Pod") == 2
    shell.api.pods["mnist-worker-1"]["status"] = {"phase": "Failed"}  # a restart: worker-1 alone (MWMS group)
    shell.api.update_pod("mnist-worker-1")
    shell.api.deliver(shell.controller)
    shell.controller.reconcile(shell.key)
    for name in list(shell.api.pods):
        shell.api.remove_pod(name)
    shell.api.deliver(shell.controller)
    shell.now += 3600  # past the restart's backoff
    shell.controller.reconcile(shell.key)
    assert len(shell.api.pods) == 3
    assert shell.api.calls.count("dry-run Pod") == 2


def tried(shell):
    """The kinds dry-run since the last look."""
    found = sorted(c.removeprefix("dry-run ") for c in shell.api.calls if c.startswith("dry-run"))
    shell.api.calls.clear()
    return found


def submit(shell, document):
    key = (document["metadata"]["namespace"], document["metadata"]["name"])
    shell.api.add_job(document)
    shell.api.deliver(shell.controller)
    shell.controller.reconcile(key)
    return key


def test_a_burst_of_jobs_from_one_template_dry_runs_their_pods_once():
    shell = Shell(job("run-a", chief=replica(1), worker=replica(2)))
    shell.controller.reconcile(shell.key)
    assert tried(shell) == ["Pod", "Pod", "Service"]
    shell.now += 9
    submit(shell, job("run-b", chief=replica(1), worker=replica(2)))
    # Its pods differ from run-a's only in the job's name and uid: not tried; its Service is, by creating it first.
    assert shell.api.calls[:2] == ["create Service first", "create Pod"]
    assert tried(shell) == []
    assert len(shell.api.pods) == 6
    # Not the same shape: a longer name, another namespace, another image.
    submit(shell, job("run-bb", chief=replica(1), worker=replica(2)))
    assert tried(shell) == ["Pod", "Pod", "Service"]
    submit(shell, job("run-c", namespace="team-b", chief=replica(1), worker=replica(2)))
    assert tried(shell) == ["Pod", "Pod", "Service"]
    other_image = {"spec": {"containers": [container("tf:2")]}}
    submit(shell, job("run-d", chief=replica(1), worker=replica(2, template=other_image)))
    assert tried(shell) == ["Pod", "Service"]  # its chief is run-a's
    shell.now += 10  # admitted_shape_seconds after run-a's trial, 1 s after run-b's
    submit(shell, job("run-e", chief=replica(1), worker=replica(2)))
    assert tried(shell) == ["Pod", "Pod", "Service"]


def test_a_service_tried_by_creating_it_first_stops_the_creates_when_its_name_is_not_the_jobs():
    """The trial by creation says what a dry run would: a Service of the job's name that is someone else's (here: a
    previous job's, still being deleted) is waited for, and no pod is made meanwhile."""
    shell = Shell(job("run-a", chief=replica(1), worker=replica(2)))
    shell.controller.reconcile(shell.key)
    held = {
        "name": "run-b",
        "uid": "uid-of-the-old-run-b",
        "deletionTimestamp": "2027-01-15T07:59:00Z",
        "ownerReferences": [{"kind": "TrainingJob", "name": "run-b", "uid": "old", "controller": True}],
    }
    shell.api.others[("Service", "run-b")] = {"kind": "Service", "metadata": held}
    tried(shell)
    document = job("run-b", chief=replica(1), worker=replica(2))
    shell.api.add_job(document)
    shell.api.deliver(shell.controller)
    key = (document["metadata"]["namespace"], "run-b")
    with pytest.raises(Refused, match="Service run-b of a previous job is still being deleted"):
        shell.controller.reconcile(key)  # retried with the job's backoff
    assert shell.api.calls[0] == "create Service first"
    assert "create Pod" not in shell.api.calls and not [p for p in shell.api.pods if p.startswith("run-b")]
    status = shell.api.jobs[key]["status"]
    assert (status["phase"], status["reason"]) == ("Pending", "NameInUse")
    del shell.api.others[("Service", "run-b")]  # the garbage collector let it go
    shell.controller.reconcile(key)
    assert len([p for p in shell.api.pods if p.startswith("run-b")]) == 3
    assert (
        shell.api.others[("Service", "run-b")]["metadata"]["ownerReferences"][0]["uid"]
        == (shell.api.jobs[key]["metadata"]["uid"])
    )


def test_a_refused_shape_is_tried_again_for_the_next_job():
    shell = Shell(job("run-a", chief=replica(1), worker=replica(2)))
    shell.api.invalid["worker"] = 'Pod "run-a-worker-1" is invalid: spec.containers[0].image: Required value'
    shell.controller.reconcile(shell.key)
    assert shell.status()["reason"] == "InvalidPodTemplate"
    tried(shell)
    key = submit(shell, job("run-b", chief=replica(1), worker=replica(2)))
    assert tried(shell) == ["Pod", "Pod", "Service"]
    assert shell.api.jobs[key]["status"]["reason"] == "InvalidPodTemplate"
    assert not [p for p in shell.api.pods if p.startswith("run-b")]


def test_a_policy_changed_within_seconds_of_a_trial_is_said_by_the_real_create():
    """The price of not trying each job: its objects created before the refusal stay (nothing is lost or hidden)."""
    shell = Shell(job("run-a", chief=replica(1), worker=replica(2)), first_batch=1)
    shell.controller.reconcile(shell.key)
    shell.api.invalid["worker"] = 'pods "run-b-worker-1" is invalid: a policy added a moment ago'
    key = submit(shell, job("run-b", chief=replica(1), worker=replica(2)))
    status = shell.api.jobs[key]["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "InvalidPodTemplate")
    assert "a policy added a moment ago" in next(c for c in status["conditions"] if c["status"] == "True")["message"]


def test_a_template_made_invalid_while_suspended_fails_the_resumed_job_before_any_pod_exists():
    shell = Shell(mwms()).running()
    shell.api.jobs[shell.key]["spec"]["runPolicy"]["suspend"] = True
    shell.api.update_job(shell.key)
    shell.api.deliver(shell.controller)
    shell.controller.reconcile(shell.key)
    for name in list(shell.api.pods):
        shell.api.remove_pod(name)
    shell.api.deliver(shell.controller)
    assert shell.status()["phase"] == "Suspended"
    spec = shell.api.jobs[shell.key]["spec"]
    spec["runPolicy"]["suspend"] = False
    spec["replicaSpecs"]["chief"]["template"]["spec"]["containers"][0]["image"] = ""
    shell.api.update_job(shell.key)
    shell.api.deliver(shell.controller)
    shell.api.invalid["chief"] = 'Pod "mnist-chief-0" is invalid: spec.containers[0].image: Required value'
    shell.controller.reconcile(shell.key)
    assert (shell.status()["phase"], shell.status()["reason"]) == ("Failed", "InvalidPodTemplate")
    assert shell.api.pods == {}


def restart_after_worker_1_failed(shell) -> None:
    """worker-1 failed: the group restart is decided and every old pod is gone, so replacements are due."""
    shell.api.pods["mnist-worker-1"]["status"] = {"phase": "Failed"}
    shell.api.update_pod("mnist-worker-1")
    shell.api.deliver(shell.controller)
    shell.controller.reconcile(shell.key)
    for name in list(shell.api.pods):
        shell.api.remove_pod(name)
    shell.api.deliver(shell.controller)


def test_a_replacement_the_api_server_finds_invalid_fails_the_job():
    """E.g. a LimitRange added while the job ran, whose default request exceeds the template's limit."""
    shell = Shell(mwms()).running()
    restart_after_worker_1_failed(shell)
    shell.api.invalid["worker"] = (
        'Pod "mnist-worker-0" is invalid: spec.containers[0].resources.requests: Invalid value: "2Gi": must be less '
        "than or equal to memory limit of 1Gi"
    )
    shell.now += 3600
    shell.controller.reconcile(shell.key)
    assert (shell.status()["phase"], shell.status()["reason"]) == ("Failed", "InvalidPodTemplate")
    assert list(shell.api.pods) == ["mnist-chief-0"]  # created in the same batch ...
    shell.api.deliver(shell.controller)
    shell.controller.reconcile(shell.key)
    assert shell.api.pods["mnist-chief-0"]["metadata"].get("deletionTimestamp")  # ... stopped (cleanPodPolicy)


# ------------------------------------------------------------------ quota and admission denials


def test_a_quota_denial_keeps_the_job_pending_with_the_message_and_a_warning_then_backs_off():
    shell = Shell(mwms())
    shell.api.refuse["mnist-worker-1"] = denied("mnist-worker-1")
    with pytest.raises(Refused):
        shell.controller.reconcile(shell.key)
    assert sorted(shell.api.pods) == ["mnist-chief-0", "mnist-worker-0"]
    status = shell.status()
    assert (status["phase"], status["reason"]) == ("Pending", "CreateRejected")
    message = condition(shell)["message"]
    assert message.startswith(f"pod mnist-worker-1 (replica worker) could not be created: {QUOTA}")
    assert "raise the namespace's ResourceQuota" in message and "startupTimeoutSeconds=600" in message
    assert status["createRejectedSince"] == "2027-01-15T08:00:00Z"
    assert shell.api.recorded[-1][:2] == ("Warning", "CreateRejected")
    # Retried while still refused: no new event, no status write.
    shell.api.deliver(shell.controller)
    writes, events = shell.api.calls.count("patch status"), len(shell.api.recorded)
    shell.now += 2
    with pytest.raises(Refused):
        shell.controller.reconcile(shell.key)
    assert (shell.api.calls.count("patch status"), len(shell.api.recorded)) == (writes, events)
    # The quota is raised: the pod is created and the refusal is over.
    del shell.api.refuse["mnist-worker-1"]
    shell.controller.reconcile(shell.key)
    assert len(shell.api.pods) == 3
    status = shell.status()
    assert (status["phase"], status["reason"]) == ("Pending", "PodsStarting")
    assert "createRejectedSince" not in status
    assert status["restarts"]["total"] == 0


def fail_once_in_the_worker_loop(shell, failures: int) -> None:
    """Run the controller's real workers until the job's refused reconcile has counted `failures` in all."""
    shell.queued()
    shell.controller.queue.add(shell.key, NORMAL)
    shell.controller.start()
    try:
        wait_for(lambda: shell.controller.queue.failures.get(shell.key) == failures, 5, f"{failures} failure(s)")
    finally:
        shell.controller.stop()


def test_refused_creates_back_off_per_job_in_the_worker_loop():
    shell = Shell(mwms())
    shell.api.refuse["mnist-chief-0"] = denied("mnist-chief-0")
    fail_once_in_the_worker_loop(shell, failures=1)
    assert shell.controller.queue.due[(shell.key, NORMAL)] == T0 + 1  # the first backoff step, not a tight loop


def test_startup_timeout_covers_pods_that_could_not_be_created():
    shell = Shell(mwms(startupTimeoutSeconds=60))
    shell.api.refuse["mnist-chief-0"] = denied("mnist-chief-0")
    with pytest.raises(Refused):
        shell.controller.reconcile(shell.key)
    assert shell.controller.queue.due[(shell.key, NORMAL)] == T0 + 60  # a timer, not the next backoff, fails it
    shell.now = T0 + 59
    with pytest.raises(Refused):
        shell.controller.reconcile(shell.key)
    shell.now = T0 + 60
    shell.controller.reconcile(shell.key)
    status = shell.status()
    assert (status["phase"], status["reason"]) == ("Failed", "StartupTimeout")
    assert condition(shell)["message"].startswith(
        "pods could not be created for startupTimeoutSeconds=60: pod mnist-chief-0"
    )
    assert QUOTA in condition(shell)["message"]


def test_a_restarting_job_whose_replacement_is_refused_stays_restarting():
    shell = Shell(mwms()).running()
    restart_after_worker_1_failed(shell)
    shell.api.refuse["mnist-worker-1"] = denied("mnist-worker-1")
    shell.now += 3600
    with pytest.raises(Refused):
        shell.controller.reconcile(shell.key)
    status = shell.status()
    assert (status["phase"], status["reason"]) == ("Restarting", "CreateRejected")
    assert status["restarts"]["failures"] == 1  # the refusal is not another restart


# ------------------------------------------------------------------ a previous job's Service and PVC


def test_a_recreated_job_waits_for_the_previous_jobs_service_and_creates_nothing_meanwhile():
    shell = Shell(mwms())
    shell.api.others[("Service", "mnist")] = {
        "kind": "Service",
        "metadata": {"name": "mnist", "ownerReferences": [{"uid": "old"}], "deletionTimestamp": "2027-01-01T00:00:00Z"},
    }
    with pytest.raises(Refused) as raised:
        shell.controller.reconcile(shell.key)
    assert raised.value.refusal.cause == NAME_IN_USE
    status = shell.status()
    assert (status["phase"], status["reason"]) == ("Pending", "NameInUse")
    assert condition(shell)["message"].startswith(
        "waiting to create Service mnist: Service mnist of a previous job is still being deleted"
    )
    assert shell.api.pods == {}
    del shell.api.others[("Service", "mnist")]  # the garbage collector got to it
    shell.controller.reconcile(shell.key)
    assert len(shell.api.pods) == 3 and ("Service", "mnist") in shell.api.others
    assert shell.status()["reason"] == "PodsStarting"


def test_a_name_still_in_use_is_looked_at_again_within_seconds_not_minutes():
    shell = Shell(mwms())
    held = {"name": "mnist", "ownerReferences": [{"uid": "old"}], "deletionTimestamp": "2027-01-01T00:00:00Z"}
    shell.api.others[("Service", "mnist")] = {"kind": "Service", "metadata": held}
    shell.controller.queue.failures[shell.key] = 20  # long past the default cap
    fail_once_in_the_worker_loop(shell, failures=21)
    assert shell.controller.queue.due[(shell.key, NORMAL)] == T0 + 10


# ------------------------------------------------------------------ events and the status that records them


def test_events_are_posted_before_the_status_records_what_they_say():
    shell = Shell(mwms())
    shell.controller.reconcile(shell.key)
    shell.api.deliver(shell.controller)
    shell.api.calls.clear()
    for name in shell.api.pods:
        shell.api.pods[name]["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        shell.api.update_pod(name)
    shell.api.deliver(shell.controller)
    shell.controller.reconcile(shell.key)
    assert shell.api.calls == ["create Event", "patch status"]
    assert shell.status()["phase"] == "Running"


def test_a_restarts_event_goes_out_after_its_status_and_deletes_which_its_replacements_wait_for():
    shell = Shell(mwms()).running()
    _training(shell, *shell.api.pods)
    _ended(shell, "mnist-worker-1", "Failed")
    shell.api.calls.clear()
    shell.controller.reconcile(shell.key)
    assert shell.api.calls[:4] == ["patch status", "delete Pod", "delete Pod", "delete Pod"]
    assert shell.api.calls[4:] == ["create Event"]
    assert [reason for _, reason, _ in shell.api.recorded][-1] == "Failed"


def test_a_restarts_event_the_api_server_did_not_take_is_posted_by_the_retry_once():
    shell = Shell(mwms()).running()
    _training(shell, *shell.api.pods)
    _ended(shell, "mnist-worker-1", "Failed")
    events_before = len(shell.api.recorded)
    post = shell.api.event

    def unavailable(*args):
        raise api_error(503, "the server is currently unable to handle the request")

    shell.api.event = unavailable
    with pytest.raises(ApiException):
        shell.controller.reconcile(shell.key)
    assert shell.status()["restarts"]["failures"] == 1  # the decision is stored, and its deletes made
    assert _deletions(shell) == ["delete Pod"] * 3
    shell.api.event = post
    shell.api.deliver(shell.controller)  # the deletes seen
    shell.api.calls.clear()
    shell.controller.reconcile(shell.key)  # the retry: nothing decided again, the event posted
    assert [reason for _, reason, _ in shell.api.recorded[events_before:]] == ["Failed"]
    assert shell.status()["restarts"]["failures"] == 1
    assert "patch status" not in shell.api.calls and _deletions(shell) == []


def test_the_refusal_reason_stays_until_the_creates_go_through():
    """Pure: a pending refusal is not replaced by the derived PodsStarting in between two create attempts."""
    document = mwms()
    document["metadata"]["generation"] = 1
    document["status"] = {
        "phase": "Pending",
        "reason": "CreateRejected",
        "conditions": [{"type": "Pending", "status": "True", "reason": "CreateRejected", "message": "m"}],
        refusals.REFUSED_SINCE: "2027-01-15T08:00:00Z",
    }
    plan = reconcile.plan(Observed(document, [], T0 + 5), OperatorConfig())
    assert plan.status["reason"] == "CreateRejected" and plan.events == []
    assert len(plan.create) == 3


# ------------------------------------------------------------------ an API server or webhook that cannot answer

WEBHOOK_DOWN = (
    'Internal error occurred: failed calling webhook "mpod.kb.io": failed to call webhook: Post '
    '"https://kueue-webhook-service.kueue-system.svc:443/mutate--v1-pod?timeout=10s": connect: connection refused'
)


def unavailable(name):
    return Refused(Refusal(UNAVAILABLE, "Pod", name, WEBHOOK_DOWN))


def test_a_webhook_that_cannot_be_called_is_named_at_once_and_time_does_not_count():
    shell = Shell(mwms(startupTimeoutSeconds=60))
    shell.api.refuse["mnist-chief-0"] = unavailable("mnist-chief-0")
    with pytest.raises(Refused):
        shell.controller.reconcile(shell.key)
    status = shell.status()
    assert (status["phase"], status["reason"]) == ("Pending", "CreateUnavailable")
    assert 'failed calling webhook "mpod.kb.io"' in condition(shell)["message"]
    assert shell.api.recorded[-1][:2] == ("Warning", "CreateUnavailable")
    assert "createRejectedSince" not in status  # nothing counts against startupTimeoutSeconds
    for minutes in range(1, 6):  # down for five minutes, five times the startup timeout
        shell.now = T0 + 60 * minutes
        with pytest.raises(Refused):
            shell.controller.reconcile(shell.key)
    assert shell.status()["phase"] == "Pending"
    assert [r for t, r, _ in shell.api.recorded if t == "Warning"] == ["CreateUnavailable"]  # said once
    del shell.api.refuse["mnist-chief-0"]
    shell.controller.reconcile(shell.key)
    status = shell.status()
    assert len(shell.api.pods) == 3 and status["reason"] == "PodsStarting"
    assert "createUnavailableSince" not in status


def test_an_unavailable_api_is_retried_at_most_five_seconds_apart():
    shell = Shell(mwms())
    shell.api.refuse["mnist-chief-0"] = unavailable("mnist-chief-0")
    shell.controller.queue.failures[shell.key] = 20  # long past the default cap
    fail_once_in_the_worker_loop(shell, failures=21)
    assert shell.controller.queue.due[(shell.key, NORMAL)] == T0 + 5


def test_a_server_error_outside_a_create_is_retried_soon_too():
    shell = Shell(mwms())
    shell.api.patch_job_status = lambda *a: (_ for _ in ()).throw(api_error(503, "the server is shutting down"))
    shell.controller.queue.failures[shell.key] = 20
    fail_once_in_the_worker_loop(shell, failures=21)
    assert shell.controller.queue.due[(shell.key, NORMAL)] == T0 + 5
