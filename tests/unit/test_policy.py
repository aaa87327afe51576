import pytest

from kubetf.core import api, policy
from kubetf.core.policy import Outcome

from .jobs import job, replica

MWMS = api.with_defaults(job(chief=replica(1), worker=replica(3), evaluator=replica(1)))
PS = api.with_defaults(
    job(strategy="ParameterServer", chief=replica(1), worker=replica(2), ps=replica(2), evaluator=replica(1))
)
MIRRORED = api.with_defaults(job(strategy="Mirrored", worker=replica(1)))
TF1 = api.with_defaults(job(strategy="Independent", worker=replica(2), ps=replica(2)))
ESTIMATOR = api.with_defaults(
    job(strategy="Independent", chief=replica(1), worker=replica(2), ps=replica(1), evaluator=replica(1))
)


@pytest.mark.parametrize(
    "document,role,index,expected",
    [
        (MWMS, "worker", 2, [("chief", 0), ("worker", 0), ("worker", 1), ("worker", 2)]),
        (MWMS, "chief", 0, [("chief", 0), ("worker", 0), ("worker", 1), ("worker", 2)]),
        (MWMS, "evaluator", 0, [("evaluator", 0)]),
        (PS, "worker", 1, [("worker", 1)]),
        (PS, "ps", 1, [("chief", 0), ("ps", 1)]),
        (PS, "chief", 0, [("chief", 0)]),
        (PS, "evaluator", 0, [("evaluator", 0)]),
        (MIRRORED, "worker", 0, [("worker", 0)]),
        # Independent: MonitoredTrainingSession survives a lost ps (the chief restores it from its checkpoint), a
        # lost worker does not stall the others, a lost chief resumes from its own checkpoint.
        (TF1, "ps", 1, [("ps", 1)]),
        (TF1, "worker", 0, [("worker", 0)]),
        (TF1, "worker", 1, [("worker", 1)]),
        (ESTIMATOR, "chief", 0, [("chief", 0)]),
        (ESTIMATOR, "ps", 0, [("ps", 0)]),
        (ESTIMATOR, "evaluator", 0, [("evaluator", 0)]),
    ],
)
def test_restart_exactly_what_tensorflow_needs(document, role, index, expected):
    assert policy.restart_targets(document, role, index) == expected


def pod(phase, exit_code=None, reason=None, conditions=(), status_reason=None, deleted=False, ran=True):
    status = {"phase": phase, "conditions": list(conditions)}
    if status_reason:
        status["reason"] = status_reason
    if exit_code is not None:
        terminated = {"exitCode": exit_code, **({"reason": reason} if reason else {})}
        status["containerStatuses"] = [{"name": "tensorflow", "state": {"terminated": terminated}}]
    elif not ran:
        status["containerStatuses"] = [{"name": "tensorflow", "state": {"waiting": {"reason": "ContainerCreating"}}}]
    metadata = {"deletionTimestamp": "2026-11-22T10:00:00Z"} if deleted else {}
    return {"metadata": metadata, "spec": {"containers": [{"name": "tensorflow"}]}, "status": status}


EVICTED = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI", "message": "Eviction API"}
PREEMPTED = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler", "message": "preempted"}
TAINT = {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager", "message": "node lost"}


# The situation, the pod as the API shows it, the restartPolicy, what it counts as.
@pytest.mark.parametrize(
    "situation,the_pod,restart_policy,outcome",
    [
        ("exit 0", pod("Succeeded", 0), "OnFailure", Outcome.SUCCEEDED),
        ("program error", pod("Failed", 1), "OnFailure", Outcome.FAILED),
        ("program error, ExitCode", pod("Failed", 1), "ExitCode", Outcome.PERMANENT),
        ("usage error, ExitCode", pod("Failed", 2), "ExitCode", Outcome.PERMANENT),
        ("exit 255, ExitCode: retryable", pod("Failed", 255), "ExitCode", Outcome.FAILED),
        ("PreemptionCheckpointHandler saved and exited 42", pod("Failed", 42), "Never", Outcome.DISRUPTED),
        # 137/143 alone: a liveness probe, a wrapper's child killed, the program killing itself.
        ("SIGKILL, nobody deleted the pod", pod("Failed", 137), "OnFailure", Outcome.FAILED),
        ("SIGKILL, nobody deleted the pod, ExitCode: retryable", pod("Failed", 137), "ExitCode", Outcome.FAILED),
        ("SIGTERM, nobody deleted the pod", pod("Failed", 143), "OnFailure", Outcome.FAILED),
        ("SIGTERM, Never: fails the job", pod("Failed", 143), "Never", Outcome.FAILED),
        # ... but a sign that something outside stopped the pod makes it a disruption.
        ("SIGTERM after someone deleted the pod", pod("Failed", 143, deleted=True), "Never", Outcome.DISRUPTED),
        ("SIGKILL after the grace period", pod("Failed", 137, deleted=True), "ExitCode", Outcome.DISRUPTED),
        ("SIGTERM, evicted", pod("Failed", 143, conditions=[EVICTED]), "OnFailure", Outcome.DISRUPTED),
        ("SIGTERM, preempted by the scheduler", pod("Failed", 143, conditions=[PREEMPTED]), "Never", Outcome.DISRUPTED),
        ("SIGKILL, node lost (taint manager)", pod("Failed", 137, conditions=[TAINT]), "OnFailure", Outcome.DISRUPTED),
        ("exit 1 while evicted", pod("Failed", 1, conditions=[EVICTED]), "ExitCode", Outcome.DISRUPTED),
        ("OOMKilled", pod("Failed", 137, reason="OOMKilled"), "OnFailure", Outcome.FAILED),
        (
            "OOMKilled while being deleted",
            pod("Failed", 137, reason="OOMKilled", deleted=True),
            "OnFailure",
            Outcome.FAILED,
        ),
        ("graceful node shutdown", pod("Failed", status_reason="NodeShutdown"), "OnFailure", Outcome.DISRUPTED),
        ("node-pressure eviction", pod("Failed", 137, status_reason="Evicted"), "Never", Outcome.DISRUPTED),
        ("preempted before it started", pod("Pending", conditions=[EVICTED]), "OnFailure", Outcome.DISRUPTED),
        # The kubelet refused the pod before any container ran: the node's trouble.
        (
            "kubelet admission error",
            pod("Failed", status_reason="UnexpectedAdmissionError", ran=False),
            "Never",
            Outcome.DISRUPTED,
        ),
        (
            "GPU device plugin lost its GPUs",
            pod("Failed", status_reason="OutOfnvidia.com/gpu"),
            "Never",
            Outcome.DISRUPTED,
        ),
        ("node affinity at admission", pod("Failed", status_reason="NodeAffinity"), "OnFailure", Outcome.DISRUPTED),
        (
            "failed with no container status, unknown reason",
            pod("Failed", status_reason="Whatever"),
            "OnFailure",
            Outcome.FAILED,
        ),
        ("OutOfcpu after the container ran", pod("Failed", 1, status_reason="OutOfcpu"), "OnFailure", Outcome.FAILED),
    ],
    ids=lambda value: value if isinstance(value, str) and " " in value else "",
)
def test_preemption_is_told_from_failure(situation, the_pod, restart_policy, outcome):
    assert policy.classify_pod(the_pod, restart_policy).outcome is outcome, situation


def test_a_failure_quotes_the_last_line_the_program_left():
    failed = pod("Failed", 1)
    terminated = failed["status"]["containerStatuses"][0]["state"]["terminated"]
    terminated["message"] = 'Traceback (most recent call last):\n  File "train.py"\nValueError: bad shape (3, 4)\n\n'
    assert policy.classify_pod(failed, "OnFailure").reason == "exit code 1: ValueError: bad shape (3, 4)"
    # A disruption's reason is the disruption, whatever the program printed as it was stopped.
    evicted = pod("Failed", 143, conditions=[EVICTED])
    evicted["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = "KeyboardInterrupt"
    assert "KeyboardInterrupt" not in policy.classify_pod(evicted, "OnFailure").reason


def test_running_pod_has_not_ended():
    assert policy.classify_pod(pod("Running"), "OnFailure") is None


def test_local_signals_map_to_container_exit_codes():
    # `kubetf local` never signals its own processes to end them: a signal came from outside.
    assert policy.classify_signal(15, "OnFailure").outcome is Outcome.DISRUPTED
    assert policy.classify_signal(9, "OnFailure").exit_code == 137
    # A wrapper shell reporting its killed child as exit 137 is the program's business.
    assert policy.classify_exit(137, "OnFailure").outcome is Outcome.FAILED


@pytest.mark.parametrize(
    "document,role,index,expected",
    [
        # A new MWMS member waits until every member of the old group is gone.
        (MWMS, "worker", 1, [("chief", 0), ("worker", 0), ("worker", 1), ("worker", 2)]),
        (MWMS, "evaluator", 0, [("evaluator", 0)]),
        # A new ps waits for the old chief (which held its variables' handles); the new chief for any old ps.
        (PS, "ps", 1, [("chief", 0), ("ps", 1)]),
        (PS, "chief", 0, [("chief", 0), ("ps", 0), ("ps", 1)]),
        (PS, "worker", 0, [("worker", 0)]),
        (TF1, "ps", 0, [("ps", 0)]),
        (ESTIMATOR, "chief", 0, [("chief", 0)]),
    ],
)
def test_a_replacement_waits_for_the_old_pods_of_its_restart_group(document, role, index, expected):
    assert policy.barrier(document, role, index) == expected


@pytest.mark.parametrize("document", [MWMS, PS, MIRRORED, TF1, ESTIMATOR])
def test_the_barrier_covers_every_group_a_task_restarts_with(document):
    for task in api.tasks(document):
        groups = [policy.restart_targets(document, *other) for other in api.tasks(document)]
        needed = {t for group in groups if task in group for t in group}
        assert needed <= set(policy.barrier(document, *task)), task


def decide(document, role, outcome_pod, failures=0, disruptions=0, restart_policy="OnFailure", **run_policy):
    document = api.with_defaults(document)
    document["spec"]["runPolicy"].update(run_policy)
    document["spec"]["replicaSpecs"][role]["restartPolicy"] = restart_policy
    return policy.decide(document, role, policy.classify_pod(outcome_pod, restart_policy), failures, disruptions)


def test_disruptions_never_count_against_backoff_limit():
    decision = decide(MWMS, "worker", pod("Failed", 1, conditions=[EVICTED]), failures=3, disruptions=10)
    assert decision.restart
    assert decision.reason.startswith("Disrupted: EvictionByEvictionAPI")


def test_max_disruptions_caps_preemption_restarts():
    decision = decide(MWMS, "worker", pod("Failed", 143, deleted=True), disruptions=2, maxDisruptions=2)
    assert not decision.restart
    assert decision.reason.startswith("MaxDisruptionsExceeded")


def test_failures_restart_until_backoff_limit():
    assert decide(MWMS, "worker", pod("Failed", 1), failures=2, backoffLimit=3).restart
    decision = decide(MWMS, "worker", pod("Failed", 1), failures=3, backoffLimit=3)
    assert not decision.restart
    assert decision.reason == "BackoffLimitExceeded: exit code 1 after 3 restart(s)"


def test_exit_code_policy_retries_are_limited_too():
    assert not decide(MWMS, "worker", pod("Failed", 255), failures=3, restart_policy="ExitCode").restart
    assert not decide(MWMS, "worker", pod("Failed", 2), restart_policy="ExitCode").restart


def test_never_fails_on_first_failure_but_survives_preemption():
    assert not decide(MWMS, "worker", pod("Failed", 1), restart_policy="Never").restart
    assert decide(MWMS, "worker", pod("Failed", 1, conditions=[EVICTED]), restart_policy="Never").restart


def test_backoff_is_exponential_and_capped():
    assert [policy.backoff_seconds(MWMS, n) for n in (1, 2, 3, 10)] == [10, 20, 40, 300]


def test_success_policy():
    assert policy.success_tasks(MWMS) == [("chief", 0)]
    workers_only = api.with_defaults(job(worker=replica(3)))
    assert policy.success_tasks(workers_only) == [("worker", 0)]
    workers_only["spec"]["successPolicy"] = "AllWorkers"
    assert policy.success_tasks(workers_only) == [("worker", 0), ("worker", 1), ("worker", 2)]
    assert not policy.succeeded(workers_only, {("worker", 0), ("worker", 1)})
    assert policy.succeeded(workers_only, {("worker", 0), ("worker", 1), ("worker", 2)})


def test_success_of_independent_jobs():
    # No chief: worker 0 is TF1's chief. AllWorkers: TF1 workers exit when the global step is reached.
    assert policy.success_tasks(TF1) == [("worker", 0)]
    assert policy.success_tasks(ESTIMATOR) == [("chief", 0)]
    all_workers = dict(ESTIMATOR, spec=dict(ESTIMATOR["spec"], successPolicy="AllWorkers"))
    assert policy.success_tasks(all_workers) == [("chief", 0), ("worker", 0), ("worker", 1)]
    assert not policy.succeeded(all_workers, {("chief", 0), ("worker", 0), ("ps", 0)})
