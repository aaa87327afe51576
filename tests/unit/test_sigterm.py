"""Telling a program that ignores SIGTERM (TensorFlow swallowed it) from one that saves on it (`core.sigterm`)."""

import pytest

from kubetf.core import api, sigterm
from kubetf.core import status as st
from kubetf.core.config import DEFAULTS

from .jobs import job, replica

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0
# Printed by tensorflow-cpu 2.21.0 a second after a MultiWorkerMirrored worker got SIGTERM (seen).
TF_LINE = (
    "W0000 00:00:1795371225.954084    5683 preemption_notifier.cc:90] SIGTERM caught at 2026-11-22T18:13:45.95+00:00"
)


def pod(deleted_at=None, grace=120, state="running", container="tensorflow"):
    meta = {"name": "mnist-worker-1", "uid": "u1"}
    if deleted_at is not None:
        meta |= {"deletionTimestamp": st.format_time(deleted_at + grace), "deletionGracePeriodSeconds": grace}
    return {
        "metadata": meta,
        "spec": {"containers": [{"name": "sidecar"}, {"name": container}]},
        "status": {"containerStatuses": [{"name": container, "state": {state: {}}}]},
    }


@pytest.mark.parametrize(
    ("situation", "the_pod", "sent_at"),
    [
        ("a running pod nobody deletes", pod(), None),
        ("a pod deleted at T0 with a 120 s grace period", pod(T0), T0),
        ("a deleted pod whose program already ended", pod(T0, state="terminated"), None),
        ("a deleted pod whose program has not started", pod(T0, state="waiting"), None),
        ("a pod already being stopped with a 1 s grace period", pod(T0, grace=1), None),
        ("no container named tensorflow: the first one is the training container", pod(T0, container="main"), None),
    ],
)
def test_when_the_sigterm_was_sent(situation, the_pod, sent_at):
    assert sigterm.sigterm_sent_at(the_pod, DEFAULTS.sigterm_stop_grace) == sent_at, situation


@pytest.mark.parametrize(
    ("situation", "log", "ignored"),
    [
        ("TensorFlow's own handler took the SIGTERM", f"epoch 3\n{TF_LINE}\nepoch 4\n", True),
        ("nothing about SIGTERM", "epoch 3\nepoch 4\n", False),
        ("PreemptionCheckpointHandler took it (its log)", "Member 1 has received termination notice.\n", False),
        ("the program itself prints the words", "my handler: SIGTERM caught at 12:00, saving\n", False),
    ],
)
def test_whether_the_log_says_the_sigterm_was_swallowed(situation, log, ignored):
    assert sigterm.swallowed(log) is ignored, situation


def test_checks_a_few_times_in_the_first_seconds_then_never_again():
    checks = DEFAULTS.sigterm_checks
    assert checks == (0, 2, 4, 6)  # the first at once: can the log be read at all?
    assert sigterm.checks_due(T0, 1, T0 + 1, checks) == 1
    assert sigterm.checks_due(T0, 0, T0 + 4.5, checks) == 3  # a late reconcile does the checks it missed at once
    assert sigterm.checks_due(T0, 4, T0 + 4.5, checks) == 4


@pytest.mark.parametrize(
    ("situation", "watched", "decision"),
    [
        ("nobody was sent SIGTERM: delete now, with the pods' own grace period", [], (None, None)),
        ("a SIGTERM 1 s ago, looked at once: wait for the next check", [sigterm.Watched(T0 - 1, 1)], (None, T0 + 1)),
        ("TensorFlow swallowed one: stop the rest", [sigterm.Watched(T0 - 1), sigterm.Watched(T0, 1, True)], (1, None)),
        ("every check done, no line: the pods' own grace period", [sigterm.Watched(T0 - 9, 4)], (None, None)),
    ],
)
def test_how_the_operator_deletes_a_group(situation, watched, decision):
    assert sigterm.deletion_grace(watched, DEFAULTS) == decision, situation


def test_a_group_restart_sends_sigterm_to_one_running_member_first():
    chief, worker0 = pod(), pod()
    disrupted = pod()
    disrupted["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True"}]
    pending = pod(state="waiting")
    now, held = sigterm.first_to_stop([chief, worker0, disrupted, pending])
    assert [id(p) for p in now] == [id(disrupted), id(pending)] and [id(p) for p in held] == [id(chief), id(worker0)]
    ended = pod(state="terminated")  # the others' collectives fail anyway
    assert sigterm.first_to_stop([chief, worker0, ended]) == ([chief, worker0, ended], [])
    assert sigterm.first_to_stop([chief]) == ([chief], [])
    # a member whose pod is gone has ended: the others end by themselves
    assert sigterm.first_to_stop([chief, worker0], member_gone=True) == ([chief, worker0], [])


def _member(role, index, state="running"):
    member = pod(state=state)
    member["metadata"]["labels"] = {api.LABEL_ROLE: role, api.LABEL_INDEX: str(index)}
    return member


def test_a_member_is_gone_when_a_task_restarted_with_the_deleted_ones_has_no_pod():
    mwms = job(chief=replica(1), worker=replica(2))
    chief, worker0, worker1 = _member("chief", 0), _member("worker", 0), _member("worker", 1)
    assert sigterm.member_gone(mwms, [chief, worker0], [chief, worker0])  # worker-1's pod vanished
    assert not sigterm.member_gone(mwms, [chief, worker0, worker1], [chief, worker0])
    ps = job(strategy="ParameterServer", chief=replica(1), worker=replica(2), ps=replica(1))
    assert not sigterm.member_gone(ps, [_member("chief", 0), _member("ps", 0)], [_member("ps", 0)])  # workers apart
    exited = _member("worker", 1, state="terminated")  # being deleted, its program ended
    assert sigterm.member_gone(mwms, [chief, worker0, exited], [chief, worker0])


def test_an_evicted_member_whose_program_exited_stops_the_rest_at_once():
    """The eviction's SIGTERM ended worker-1's program before its pod went: the others' collectives fail, so they
    are all deleted now, none sent SIGTERM first and held for its log."""
    mwms = job(chief=replica(1), worker=replica(2))
    pods = _group(mwms, deleted_at=T0)
    evicted = next(p for p in pods if p["metadata"]["name"] == "mnist-worker-1")
    evicted["status"] = {"phase": "Failed", "containerStatuses": [{"name": "tensorflow", "state": {"terminated": {}}}]}
    rest = [p for p in pods if p is not evicted]
    staging = sigterm.stage(mwms, rest, pods, {}, {}, {}, T0, DEFAULTS)
    assert staging.delete == rest and staging.held == [] and staging.read == [] and staging.hold_until is None


def _group(job_, deleted_at=None):
    pods = []
    for role, index in api.tasks(job_):
        member = pod(deleted_at if (role, index) == ("worker", 1) else None)
        member["metadata"] = {**member["metadata"], "name": f"mnist-{role}-{index}", "uid": f"{role}-{index}"}
        member["metadata"]["labels"] = {api.LABEL_ROLE: role, api.LABEL_INDEX: str(index)}
        pods.append(member)
    return pods


def test_a_staged_group_restart_asks_for_the_first_members_log_then_decides_from_it():
    mwms = job(chief=replica(1), worker=replica(2))
    pods = _group(mwms, deleted_at=T0)  # worker-1 evicted: sent SIGTERM at T0
    rest = [p for p in pods if p["metadata"]["name"] != "mnist-worker-1"]
    first = sigterm.stage(mwms, rest, pods, {}, {}, {}, T0, DEFAULTS)
    assert first.delete == [] and first.held == rest
    assert [(r.pod["metadata"]["name"], r.container, r.since_seconds) for r in first.read] == [
        ("mnist-worker-1", "tensorflow", 5)  # from before the SIGTERM: the clocks of the API server and node differ
    ]
    found = sigterm.stage(mwms, rest, pods, {}, first.memory, {"worker-1": TF_LINE}, T0, DEFAULTS)
    assert found.delete == rest and found.grace == DEFAULTS.sigterm_stop_grace and found.read == []
    assert found.ignored[0].startswith("mnist-worker-1: TensorFlow took the SIGTERM")
    quiet = sigterm.stage(mwms, rest, pods, {}, first.memory, {"worker-1": "epoch 3\n"}, T0, DEFAULTS)
    assert quiet.delete == [] and quiet.hold_until == T0 + 2 and quiet.memory["worker-1"].checks == 1
    unreadable = sigterm.stage(mwms, rest, pods, {}, first.memory, {"worker-1": None}, T0, DEFAULTS)
    assert unreadable.delete == rest and unreadable.grace is None  # no later look can do better: their own grace


def test_only_a_multi_worker_mirrored_group_restart_is_staged():
    ps = job(strategy="ParameterServer", chief=replica(1), worker=replica(2), ps=replica(1))
    pods = _group(ps)
    staging = sigterm.stage(ps, pods, pods, {}, {}, {}, T0, DEFAULTS)
    assert staging.delete == pods and staging.held == [] and staging.read == []
