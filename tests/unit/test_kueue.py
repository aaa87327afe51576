"""A TrainingJob under Kueue's plain-pod groups: what its pods carry, what Kueue's marks mean to the job, and the
restart protocol that keeps (or gives back) the job's admission. The test plays Kueue's webhook and controller."""

import pytest

from kubetf.cluster.cache import pod_signature, slim_pod
from kubetf.core import api, builders, kueue
from kubetf.core import status as st

from .jobs import job, replica
from .test_reconcile import Sim, mwms_job, ps_job

QUEUE, CLUSTER_QUEUE = "team-a", "gpus"


def queued(document, **labels):
    document["metadata"]["labels"] = {kueue.QUEUE_LABEL: QUEUE, **labels}
    return document


def kueue_sim(document, queues=None):
    sim = Sim(document)
    sim.api.kueue = {"queues": {QUEUE: CLUSTER_QUEUE} if queues is None else queues, "workloads": {}}
    return sim


def set_workload(sim, at=None, **conditions):
    """The group's Workload with these conditions: type=(status, message), changed at `at` (default: now)."""
    name = kueue.group_name(sim.job)
    workload = sim.api.kueue["workloads"].setdefault(name, {"metadata": {"name": name}})
    stamp = st.format_time(sim.now if at is None else at)
    workload["status"] = {
        "conditions": [
            {"type": t, "status": s, "message": m, "lastTransitionTime": stamp} for t, (s, m) in conditions.items()
        ]
    }


def admit(sim, at=None):
    """Kueue admits the group (at `at`, default now) and ungates its pods."""
    set_workload(sim, at, QuotaReserved=("True", "Quota reserved"), Admitted=("True", "The workload is admitted"))
    for name, pod in sim.pods.items():
        if kueue.is_gated(pod):
            pod["spec"]["schedulingGates"] = []
            sim.api.update_pod(name)


def kueue_preempts(sim, message="Preempted to accommodate a higher priority Workload"):
    """Kueue's Stop: every pod not finished nor gated gets TerminationTarget and is deleted; the Workload is evicted."""
    set_workload(
        sim,
        Evicted=("True", message),
        QuotaReserved=("False", "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu"),
        Admitted=("False", "evicted"),
    )
    for name, pod in sim.pods.items():
        if pod["status"]["phase"] in ("Succeeded", "Failed") or kueue.is_gated(pod):
            continue
        pod["status"].setdefault("conditions", []).append(
            {"type": kueue.TERMINATION_TARGET, "status": "True", "reason": "WorkloadEvicted", "message": message}
        )
        pod["metadata"]["deletionTimestamp"] = st.format_time(sim.now + 30)
        sim.api.update_pod(name)


def terminate(sim):
    """Pods being deleted stop running: gone, unless Kueue's finalizer keeps the object (Failed, then)."""
    for name in [n for n, p in sim.pods.items() if "deletionTimestamp" in p["metadata"]]:
        pod = sim.pods[name]
        if pod["metadata"].get("finalizers"):
            if pod["status"]["phase"] not in ("Succeeded", "Failed"):
                pod["status"]["phase"] = "Failed"
                sim.api.update_pod(name)
        else:
            sim.api.remove_pod(name)


def run(sim):
    """The scheduler places the pods on a node, the kubelet runs them."""
    for pod in sim.pods.values():
        pod["spec"].setdefault("nodeName", "node-a")
    sim.run()


def admitted_and_running(document):
    sim = kueue_sim(document)
    sim.step()
    admit(sim)
    sim.step()
    run(sim)
    sim.step()
    assert sim.status["phase"] == "Running", sim.status
    return sim


# ---------------------------------------------------------------------- the pods


def test_a_queued_jobs_pods_form_one_group_named_by_the_job_and_stable_across_restarts():
    document = queued(ps_job(), **{kueue.PRIORITY_LABEL: "research"})
    document["spec"]["priorityClassName"] = "high"
    document = api.with_defaults(document)
    pods = builders.desired_pods(document)
    restarted = builders.desired_pod(document, "worker", 1, attempt=3)
    groups = {p["metadata"]["labels"][kueue.GROUP_LABEL] for p in [*pods, restarted]}
    assert groups == {"mnist-1234-uid"}  # the job's name and its uid: a re-created job is another group
    for pod in pods:
        assert pod["metadata"]["labels"][kueue.QUEUE_LABEL] == QUEUE
        assert pod["metadata"]["labels"][kueue.PRIORITY_LABEL] == "research"
        assert pod["metadata"]["annotations"][kueue.TOTAL_ANNOTATION] == "5"  # chief, 2 workers, ps, evaluator
        assert pod["spec"]["priorityClassName"] == "high"
    other = api.with_defaults(queued(ps_job()))
    other["metadata"]["uid"] = "9876-uid"
    assert builders.desired_pod(other, "chief", 0)["metadata"]["labels"][kueue.GROUP_LABEL] == "mnist-9876-uid"


def test_a_group_name_is_a_label_value_for_the_longest_job_name():
    document = queued(job(name="j" * 56, worker=replica(1)))
    document["metadata"]["uid"] = "abcdef01-2345"
    assert len(kueue.group_name(document)) <= 63
    assert kueue.group_name(document).endswith("-abcdef01")


def test_a_job_without_the_queue_label_carries_nothing_of_kueue():
    pod = builders.desired_pod(api.with_defaults(mwms_job()), "worker", 0)
    assert not [k for k in pod["metadata"]["labels"] if k.startswith("kueue.x-k8s.io")]
    assert "annotations" not in pod["metadata"]


def test_the_cache_keeps_kueues_marks_and_a_pod_ungated_needs_a_reconcile():
    pod = {
        "metadata": {
            "name": "p",
            "finalizers": [kueue.FINALIZER, "other"],
            "annotations": {kueue.RETRIABLE_ANNOTATION: "false", "big": "x" * 1000},
        },
        "spec": {"schedulingGates": [{"name": kueue.GATE}], "containers": [{"name": "tensorflow"}]},
        "status": {"phase": "Pending"},
    }
    slim = slim_pod(pod)
    assert slim["metadata"]["finalizers"] == [kueue.FINALIZER, "other"]  # any one: a forced deletion waits for it
    assert slim["metadata"]["annotations"] == {kueue.RETRIABLE_ANNOTATION: "false"}
    assert kueue.is_gated(slim)
    ungated = {**pod, "spec": {**pod["spec"], "schedulingGates": []}}
    assert pod_signature(slim_pod(ungated)) != pod_signature(slim)


# ---------------------------------------------------------------------- waiting for admission


def test_a_queued_job_says_where_it_waits_in_kueues_words_until_admitted():
    sim = kueue_sim(queued(mwms_job()))
    plan = sim.step()
    assert len(plan.create) == 3 and all(kueue.is_gated(p) for p in sim.pods.values())
    assert sim.status["phase"] == "Queued"
    assert plan.requeue_at is None  # Kueue's Workload is watched: nothing is polled
    set_workload(
        sim,
        QuotaReserved=(
            "False",
            "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu, 2 more needed",
        ),
    )
    sim.api.deliver(sim.controller)
    assert sim.controller.queue.get()[0] == sim.key  # the Workload's change brings the job back
    sim.controller.queue.done(sim.key)
    plan = sim.step(advance=30)
    message = sim.condition()["message"]
    assert sim.status["phase"] == "Queued" and sim.condition()["reason"] == "Queued"
    assert f"LocalQueue {QUEUE} (ClusterQueue {CLUSTER_QUEUE})" in message
    assert "all 3 pods" in message and "insufficient unused quota for nvidia.com/gpu, 2 more needed" in message
    assert plan.requeue_at is None
    assert [r for _, r, _ in sim.api.recorded if r == "Queued"] == []  # waiting in a queue is no warning
    admit(sim)
    sim.step()
    assert sim.status["phase"] == "Pending"
    run(sim)
    sim.step()
    assert sim.status["phase"] == "Running"


def test_a_missing_local_queue_is_said_with_a_warning():
    sim = kueue_sim(queued(mwms_job()), queues={})
    sim.step()
    assert sim.status["phase"] == "Queued"
    assert sim.condition()["reason"] == "LocalQueueNotFound"
    assert f"LocalQueue {QUEUE} does not exist in namespace" in sim.condition()["message"]
    assert ("Warning", "LocalQueueNotFound") in [(t, r) for t, r, _ in sim.api.recorded]


def test_without_kueue_a_labelled_job_runs_and_is_warned_about_once():
    sim = Sim(queued(mwms_job()))  # the cluster has no Kueue: nothing gates the pods
    sim.step()
    run(sim)
    sim.step()
    sim.step()
    assert sim.status["phase"] == "Running"
    assert [r for t, r, _ in sim.api.recorded if t == "Warning"] == ["KueueNotInstalled"]


def test_a_job_managed_by_multikueue_is_left_alone():
    document = queued(mwms_job())
    document["spec"]["managedBy"] = kueue.MANAGED_BY_MULTIKUEUE
    sim = kueue_sim(document)
    sim.api.deliver(sim.controller)
    assert sim.controller.reconcile(sim.key) is None
    assert sim.pods == {} and "status" not in sim.job


# ---------------------------------------------------------------------- preemption and restarts


def test_kueue_preemption_is_one_disruption_and_the_job_queues_again_in_the_same_group():
    sim = admitted_and_running(queued(ps_job()))
    group = {p["metadata"]["labels"][kueue.GROUP_LABEL] for p in sim.pods.values()}
    kueue_preempts(sim)
    sim.step()
    restarts = sim.status["restarts"]
    assert (restarts["disruptions"], restarts["failures"]) == (1, 0)
    assert "WorkloadEvicted by Kueue: Preempted to accommodate" in restarts["lastReason"]
    # The pods stop; Kueue's finalizer keeps them until the operator releases them, all but one while no other pod
    # of the group exists: the Workload (and its place in the queue) lives on.
    terminate(sim)
    for _ in range(5):
        sim.step()
        assert sim.pods, "no pod of the group left: Kueue would drop the Workload and its place in the queue"
    assert len(sim.pods) == 5 and all(st.pod_task(p)[2] == 1 for p in sim.pods.values())
    assert all(kueue.is_gated(p) for p in sim.pods.values())
    assert {p["metadata"]["labels"][kueue.GROUP_LABEL] for p in sim.pods.values()} == group
    assert sim.status["phase"] == "Queued"
    assert "evicted: Preempted to accommodate" in sim.condition()["message"]
    assert sim.status["restarts"]["disruptions"] == 1  # the other pods' deletions were not counted again
    admit(sim)
    sim.step()
    run(sim)
    sim.step()
    assert sim.status["phase"] == "Running"
    assert sim.status["restarts"]["total"] == 1


def test_an_evicted_mwms_worker_restarts_the_group_under_the_same_admission():
    sim = admitted_and_running(queued(mwms_job()))
    sim.evict("mnist-worker-1")  # not Kueue: a node drain's eviction
    sim.step()
    phases = [sim.status["phase"]]
    terminate(sim)  # every old pod stopped; Kueue's finalizer keeps them
    # An old pod is kept until a new one exists: the group's Workload never goes, nor its admission.
    for _ in range(4):
        sim.step()
        assert sim.pods, "no pod of the group left: Kueue would drop the Workload and its admission"
        admit(sim)  # Kueue ungates replacements at once: the Workload stays admitted
        phases.append(sim.status["phase"])
    run(sim)
    sim.step()
    phases.append(sim.status["phase"])
    assert "Queued" not in phases
    assert phases[-1] == "Running"
    assert {sim.attempt(n) for n in sim.pods} == {"1"}


def test_a_failed_pod_is_released_for_its_replacement_of_the_same_name():
    sim = admitted_and_running(queued(ps_job()))
    sim.exit("mnist-worker-1", 1)
    sim.step(advance=1)
    terminate(sim)  # the failed pod the operator deleted is kept by Kueue's finalizer
    assert "mnist-worker-1" in sim.pods
    sim.step(advance=60)  # past the failure backoff
    assert "release" in sim.api.calls
    sim.step()
    assert sim.attempt("mnist-worker-1") == "1"


# ---------------------------------------------------------------------- the end gives the quota back


def test_success_marks_every_pod_unretriable_so_kueue_finishes_the_workload():
    sim = admitted_and_running(queued(ps_job()))
    sim.exit("mnist-chief-0", 0)
    plan = sim.step()
    assert sim.status["phase"] == "Succeeded"
    assert sorted(p["metadata"]["name"] for p in plan.unretriable) == sorted(sim.pods)
    assert all(p["metadata"]["annotations"][kueue.RETRIABLE_ANNOTATION] == "false" for p in sim.pods.values())
    terminate(sim)  # the ps and workers stop; the operator does not wait for Kueue to let them go
    sim.exit("mnist-evaluator-0", 0)  # its last evaluation done, within its grace
    sim.step()
    # kept (cleanPodPolicy Running): Kueue finalizes them
    assert sorted(sim.pods) == ["mnist-chief-0", "mnist-evaluator-0"]
    sim.step()
    assert sim.api.calls.count("mark unretriable") == 5


def test_suspend_gives_the_quota_back_and_resume_waits_for_the_finished_workload_to_go():
    sim = admitted_and_running(queued(mwms_job()))
    sim.job["spec"]["runPolicy"]["suspend"] = True
    sim.api.update_job(sim.key)
    sim.step()
    assert all(p["metadata"]["annotations"][kueue.RETRIABLE_ANNOTATION] == "false" for p in sim.pods.values())
    terminate(sim)
    sim.step()
    assert sim.pods == {}
    set_workload(sim, Finished=("True", "Pods succeeded: 0/3."))  # not garbage-collected yet
    sim.job["spec"]["runPolicy"]["suspend"] = False
    sim.api.update_job(sim.key)
    plan = sim.step()
    assert plan.create == [] and plan.requeue_at is None  # no timer: the Workload's deletion is watched
    del sim.api.kueue["workloads"][kueue.group_name(sim.job)]
    sim.api.deliver(sim.controller)
    assert sim.controller.queue.get()[0] == sim.key
    sim.controller.queue.done(sim.key)
    plan = sim.step(advance=2)
    assert len(plan.create) == 3
    assert sim.status["phase"] == "Queued"


def test_a_deleted_jobs_pods_are_marked_and_released():
    sim = admitted_and_running(queued(mwms_job()))
    group = kueue.group_name(sim.job)
    sim.api.delete_job(*sim.key)
    for name, pod in sim.pods.items():  # the garbage collector deletes them
        pod["metadata"]["deletionTimestamp"] = st.format_time(sim.now)
        sim.api.update_pod(name)
    sim.api.deliver(sim.controller)
    assert sim.controller.reconcile(sim.key) is None
    assert sim.api.calls.count("mark unretriable") == 3
    terminate(sim)
    sim.api.deliver(sim.controller)
    sim.controller.reconcile(sim.key)
    assert sim.pods == {}
    assert not any(c.startswith("delete workload") for c in sim.api.calls)  # its pods were still there
    sim.api.deliver(sim.controller)  # the pods' DELETED events
    sim.controller.reconcile(sim.key)
    assert f"delete workload {group}" in sim.api.calls  # not left to the garbage collector: its quota goes now
    assert group not in sim.api.kueue["workloads"]


def test_a_suspended_jobs_workload_goes_once_its_pods_are_gone():
    sim = admitted_and_running(queued(mwms_job()))
    sim.job["spec"]["runPolicy"]["suspend"] = True
    sim.api.update_job(sim.key)
    sim.step()
    terminate(sim)
    sim.step()
    assert sim.pods == {}
    sim.step()
    assert kueue.group_name(sim.job) not in sim.api.kueue["workloads"]
    assert sim.status["phase"] == "Suspended"


def test_a_running_jobs_workload_is_never_deleted_even_with_no_pod_left():
    sim = admitted_and_running(queued(mwms_job()))
    group = kueue.group_name(sim.job)
    sim.api.kueue["workloads"][group].setdefault("metadata", {})["ownerReferences"] = []  # frozen: no owner
    sim.step()
    sim.step()
    assert group in sim.api.kueue["workloads"]
    assert not any(c.startswith("delete workload") for c in sim.api.calls)


def foreign_group(sim, name, owner="uid-of-another-teams-pod"):
    """Another team's plain pod group in the job's namespace: its Workload, owned by its own running pod."""
    sim.api.kueue["workloads"][name] = {
        "metadata": {"name": name, "ownerReferences": [{"kind": "Pod", "uid": owner}]},
        "status": {"conditions": [{"type": "Admitted", "status": "True"}]},
    }


def test_another_teams_pod_group_named_like_the_job_is_never_touched_when_the_job_ends():
    sim = admitted_and_running(queued(mwms_job()))  # the job "mnist"
    foreign_group(sim, "mnist-finetune")  # "<job>-<8 characters>": what a prefix match took for the job's own
    foreign_group(sim, "mnist-00000002")  # the job's name and 8 hex characters, owned by someone else's pod
    own = kueue.group_name(sim.job)
    sim.api.delete_job(*sim.key)
    for name, pod in sim.pods.items():  # the garbage collector deletes them
        pod["metadata"]["deletionTimestamp"] = st.format_time(sim.now)
        sim.api.update_pod(name)
    sim.api.deliver(sim.controller)
    sim.controller.reconcile(sim.key)
    terminate(sim)
    sim.api.deliver(sim.controller)
    sim.controller.reconcile(sim.key)
    sim.api.deliver(sim.controller)
    sim.controller.reconcile(sim.key)
    assert own not in sim.api.kueue["workloads"]  # its own went at once
    assert {"mnist-finetune", "mnist-00000002"} <= set(sim.api.kueue["workloads"])
    assert [c for c in sim.api.calls if c.startswith("delete workload")] == [f"delete workload {own}"]
    assert "mnist-finetune" not in {name for _, name in sim.controller.store.workloads}  # not even kept in memory


def test_two_jobs_whose_names_share_all_but_the_last_character_keep_their_own_workloads():
    long = "a" * 54  # a group name keeps 54 characters of the job's name (and 8 of its uid)
    sim = kueue_sim(queued(job(f"{long}1", worker=replica(2))))
    other = sim.api.add_job(queued(job(f"{long}2", worker=replica(2))))
    other_key = ("team-a", other["metadata"]["name"])
    groups = kueue.group_name(sim.job), kueue.group_name(other)
    assert groups[0][:54] == groups[1][:54] and groups[0] != groups[1]
    for key in (sim.key, other_key):
        sim.api.deliver(sim.controller)
        sim.controller.reconcile(key)
    for group in groups:  # Kueue admits both groups
        sim.api.kueue["workloads"][group] = {
            "metadata": {"name": group},
            "status": {
                "conditions": [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}]
            },
        }
    for name, pod in sim.pods.items():
        pod["spec"]["schedulingGates"] = []
        sim.api.update_pod(name)
    run(sim)
    sim.api.delete_job(*sim.key)  # the first job ends; its pods go with it
    for _ in range(3):
        for name, pod in sim.pods.items():
            if pod["metadata"]["labels"][api.LABEL_JOB] == sim.key[1]:
                pod["metadata"]["deletionTimestamp"] = st.format_time(sim.now)
                sim.api.update_pod(name)
        terminate(sim)
        sim.api.deliver(sim.controller)
        sim.controller.reconcile(sim.key)
    assert groups[0] not in sim.api.kueue["workloads"]
    assert groups[1] in sim.api.kueue["workloads"]  # the other job's: untouched, its pods run on
    assert [c for c in sim.api.calls if c.startswith("delete workload")] == [f"delete workload {groups[0]}"]
    assert len([p for p in sim.pods.values() if p["metadata"]["labels"][api.LABEL_JOB] == other_key[1]]) == 2


# ---------------------------------------------------------------------- bad input


@pytest.mark.parametrize("value", ["Team_A", "team-a-", "a" * 254])
def test_a_queue_label_that_cannot_name_a_local_queue_is_refused(value):
    document = queued(mwms_job())
    document["metadata"]["labels"][kueue.QUEUE_LABEL] = value
    problems = api.validate(document)
    assert [p.path for p in problems] == [f"metadata.labels[{kueue.QUEUE_LABEL}]"]
    assert "is not a LocalQueue name" in problems[0].message


def test_managed_by_takes_only_the_values_the_crd_allows():
    document = mwms_job()
    document["spec"]["managedBy"] = "someone/else"
    assert [p.path for p in api.validate(document)] == ["spec.managedBy"]
    document["spec"]["managedBy"] = kueue.MANAGED_BY_MULTIKUEUE
    assert api.validate(document) == []


def test_the_last_old_pod_owning_the_workload_stays_until_kueue_made_a_new_pod_an_owner():
    sim = admitted_and_running(queued(mwms_job()))
    workload = sim.api.kueue["workloads"][kueue.group_name(sim.job)]
    old = [{"kind": "Pod", "uid": p["metadata"]["uid"]} for p in sim.pods.values()]
    workload["metadata"]["ownerReferences"] = old  # Kueue has not adopted the new pods yet
    sim.evict("mnist-worker-1")
    sim.step()
    terminate(sim)
    for _ in range(4):
        sim.step()
        admit(sim)
    owners = [p for p in sim.pods.values() if p["metadata"]["uid"] in {o["uid"] for o in old}]
    assert len(owners) == 1 and len(sim.pods) == 3, "the garbage collector would take the Workload with it"
    del workload["metadata"]["ownerReferences"]  # Kueue's reconcile adds the new pods as owners
    for _ in range(2):
        sim.step()
        admit(sim)
    assert {sim.attempt(n) for n in sim.pods} == {"1"} and len(sim.pods) == 3


# ---------------------------------------------------------------------- watched, not polled


def drain(sim):
    """Forget every queued reconcile and timer of the job."""
    queue = sim.controller.queue
    with queue.cond:
        queue.timers.clear()
        queue.due.clear()
    while len(queue):
        key, _ = queue.get()
        queue.done(key)


def test_a_queued_job_costs_no_api_call_while_it_waits():
    sim = kueue_sim(queued(mwms_job()))
    sim.step()
    set_workload(sim, QuotaReserved=("False", "insufficient unused quota for nvidia.com/gpu, 2 more needed"))
    sim.step()
    sim.api.calls.clear()
    for _ in range(10):
        sim.step(advance=600)
    assert sim.status["phase"] == "Queued"
    assert sim.api.calls == []


def test_a_workloads_new_owner_releases_the_last_old_pod_at_once():
    """A preempted group is complete again (admissible) as soon as Kueue has made a new pod an owner of the
    Workload: the operator sees that change as a watch event, not at its next timer."""
    sim = admitted_and_running(queued(mwms_job()))
    workload = sim.api.kueue["workloads"][kueue.group_name(sim.job)]
    old = [{"kind": "Pod", "uid": p["metadata"]["uid"]} for p in sim.pods.values()]
    workload["metadata"]["ownerReferences"] = old  # Kueue has not adopted the new pods yet
    kueue_preempts(sim)
    sim.step()
    terminate(sim)
    for _ in range(3):
        sim.step()
    assert len(sim.pods) == 3 and sum(st.pod_task(p)[2] == 0 for p in sim.pods.values()) == 1
    drain(sim)  # nothing queued, no timer: only a watch event can bring the job back
    del workload["metadata"]["ownerReferences"]  # Kueue's reconcile adds the new pods as owners
    sim.api.deliver(sim.controller)
    assert sim.controller.queue.get() == (sim.key, 0)  # URGENT
    sim.controller.queue.done(sim.key)
    sim.step()  # the last old pod released ...
    sim.step()  # ... gone: its replacement created
    assert {sim.attempt(n) for n in sim.pods} == {"1"} and len(sim.pods) == 3


def test_a_local_queue_created_after_the_job_brings_it_back():
    sim = kueue_sim(queued(mwms_job()), queues={})
    sim.step()
    assert sim.condition()["reason"] == "LocalQueueNotFound"
    sim.api.kueue["queues"][QUEUE] = CLUSTER_QUEUE
    sim.api.deliver(sim.controller)
    assert sim.controller.queue.get()[0] == sim.key
    sim.controller.queue.done(sim.key)
    sim.step()
    assert (sim.status["phase"], sim.condition()["reason"]) == ("Queued", "Queued")


def test_a_queued_job_says_its_place_in_the_cluster_queue_from_kueues_visibility_api():
    sim = kueue_sim(queued(mwms_job()))
    sim.step()
    name = kueue.group_name(sim.job)
    set_workload(sim, QuotaReserved=("False", "insufficient unused quota"))
    sim.api.kueue["pending"] = {CLUSTER_QUEUE: ["someone-else", "and-another", name]}
    sim.step()
    sim.controller.positions.poll()
    sim.step()
    assert sim.status["queuePosition"] == 2
    assert "2 ahead in its ClusterQueue" in sim.condition()["message"]
    sim.api.kueue["pending"] = {CLUSTER_QUEUE: [name]}
    sim.controller.positions.poll()
    sim.step()
    assert sim.status["queuePosition"] == 0 and "next in its ClusterQueue" in sim.condition()["message"]
    writes = sim.api.calls.count("patch status")
    drain(sim)
    sim.controller.positions.poll()  # nothing moved: no reconcile, no write
    assert len(sim.controller.queue) == 0
    sim.step()
    assert sim.api.calls.count("patch status") == writes
    admit(sim)
    sim.step()
    assert "queuePosition" not in sim.status and "queuedSince" not in sim.status


def test_without_kueues_visibility_api_a_queued_job_just_says_nothing_of_its_place():
    sim = kueue_sim(queued(mwms_job()))
    sim.step()
    sim.controller.positions.poll()  # 404: not served
    sim.step()
    assert sim.status["phase"] == "Queued" and "queuePosition" not in sim.status
    calls = sim.api.calls.count(f"get clusterqueues/{CLUSTER_QUEUE}/pendingworkloads")
    sim.controller.positions.poll()
    assert sim.api.calls.count(f"get clusterqueues/{CLUSTER_QUEUE}/pendingworkloads") == calls  # not asked again soon


def test_an_operator_restarted_among_queued_and_admitted_jobs_writes_nothing():
    queued_sim = kueue_sim(queued(mwms_job()))
    queued_sim.step()
    set_workload(queued_sim, QuotaReserved=("False", "insufficient unused quota for nvidia.com/gpu, 2 more needed"))
    queued_sim.step()
    running = admitted_and_running(queued(mwms_job()))
    for sim in (queued_sim, running):
        before = dict(sim.status)
        sim.restart_operator()  # its Workload and LocalQueue come from the priming lists, not a watch yet
        writes = sim.api.calls.count("patch status")
        sim.controller.reconcile(sim.key)
        assert sim.api.calls.count("patch status") == writes, sim.status
        assert sim.status == before


def test_a_released_pod_is_deleted_at_once_rather_than_waiting_for_its_kubelet():
    """Its containers are gone (Failed): the kubelet's own confirmation would hold the name most of a second longer."""
    from kubetf.cluster.kube import Kube

    kube = Kube(qps=100, burst=100, may_write=lambda: True)
    calls = []
    kube._patch_pod = lambda pod, patch: calls.append(("patch", [op["op"] for op in patch]))
    kube.delete_pod = lambda pod, grace_seconds=None: calls.append(("delete", grace_seconds)) or True
    held = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "finalizers": [kueue.FINALIZER]},
        "status": {"phase": "Failed"},
    }
    kube.release_pods([held])
    assert calls == [("patch", ["test", "test", "remove"]), ("delete", 0)]
