"""A TrainingJob as one of Kueue's external frameworks: the Workload the operator makes for it, no pod until Kueue
admits it, the admission's assignments on its pods, eviction as one disruption and the quota given back once no pod
runs, PodsReady, the Workload finished when the job ends, MultiKueue's two sides. The test plays Kueue's
controller (admission, eviction) on the in-memory API; the real protocol runs in tests/integration/test_kueue.py."""

import pytest

from kubetf.core import api, builders, types
from kubetf.core import status as st
from kubetf.core.failing import Failing
from kubetf.core.scheduling import multikueue
from kubetf.core.scheduling import workload as kueue

from .jobs import job, replica
from .test_reconcile import Sim, mwms_job, ps_job

QUEUE, CLUSTER_QUEUE = "team-a", "gpus"
DEFAULT_FLAVOR = {"metadata": {"name": "default"}, "spec": {}}


def queued(document, **labels):
    document["metadata"]["labels"] = {kueue.QUEUE_LABEL: QUEUE, **labels}
    return document


def kueue_sim(document, queues=None, classes=None):
    sim = Sim(document)
    sim.api.kueue = {
        "queues": {QUEUE: CLUSTER_QUEUE} if queues is None else queues,
        "workloads": {},
        "classes": {("ResourceFlavor", "default"): DEFAULT_FLAVOR, **(classes or {})},
    }
    return sim


def conditions(workload):
    return {c["type"]: c for c in (workload.get("status") or {}).get("conditions") or []}


def kueue_sets(sim, at=None, **changes):
    """Kueue's controller writes conditions on the job's Workload: type=(status, reason, message) at `at`."""
    workload = sim.api.workload()
    found = conditions(workload)
    stamp = st.format_time(sim.now if at is None else at)
    for type_, (status, reason, message) in changes.items():
        before = found.get(type_)
        changed = before is None or before["status"] != status
        found[type_] = {"type": type_, "status": status, "reason": reason, "message": message,
                        "lastTransitionTime": stamp if changed else before["lastTransitionTime"]}  # fmt: skip
    workload.setdefault("status", {})["conditions"] = list(found.values())
    sim.api.kueue_wrote(workload)


def admit(sim, at=None, flavor="default", cluster=None, **assignment):
    """Kueue reserves quota (in `flavor` for every PodSet) and admits the Workload; `cluster`: MultiKueue's, on the
    manager, dispatched it to that worker cluster."""
    workload = sim.api.workload()
    if cluster is not None:
        workload.setdefault("status", {})["clusterName"] = cluster
    workload.setdefault("status", {})["admission"] = {
        "clusterQueue": CLUSTER_QUEUE,
        "podSetAssignments": [
            {"name": p["name"], "count": p["count"], "flavors": {"cpu": flavor}, **assignment}
            for p in workload["spec"]["podSets"]
        ],
    }
    changes = {
        "QuotaReserved": ("True", "QuotaReserved", f"Quota reserved in ClusterQueue {CLUSTER_QUEUE}"),
        "Admitted": ("True", "Admitted", f"The workload is admitted by ClusterQueue {CLUSTER_QUEUE}"),
    }
    if "Evicted" in conditions(workload):
        changes["Evicted"] = ("False", "QuotaReserved", "Previously: evicted")
    kueue_sets(sim, at, **changes)


def kueue_evicts(sim, reason="Preempted", message="Preempted to accommodate a higher priority Workload"):
    """Kueue's Evict: Evicted=True; the admission and the quota stay until the job's controller gives them back."""
    kueue_sets(sim, Evicted=("True", reason, message))


def run(sim):
    """The scheduler places the pods on a node, the kubelet runs them."""
    for pod in sim.pods.values():
        pod["spec"].setdefault("nodeName", "node-a")
    sim.run()


def admitted_and_running(document, **kwargs):
    sim = kueue_sim(document, **kwargs)
    sim.step()
    admit(sim)
    sim.step()
    run(sim)
    sim.step()
    assert sim.status["phase"] == "Running", sim.status
    return sim


def drain(sim):
    """Forget every queued reconcile and timer of the job."""
    queue = sim.controller.queue
    with queue.cond:
        queue.timers.clear()
        queue.due.clear()
    while len(queue):
        key, _ = queue.get()
        queue.done(key)


# ---------------------------------------------------------------------- the Workload the operator makes


def test_the_workload_is_named_as_kueue_names_its_own_jobs_workloads():
    # Kueue's own vectors (pkg/controller/jobframework/workload_names_test.go, v0.19.2): a batch Job's names.
    assert kueue.workload_name_for("name", "uid", "Job", "batch") == "job-name-ef3a1"
    long_name = "marketing-campaign-" + "x" * 300
    assert len(kueue.workload_name_for(long_name, "uid")) == 253
    document = api.with_defaults(queued(mwms_job()))
    document["metadata"]["uid"] = "1234-uid"
    assert kueue.workload_name(document) == kueue.workload_name_for("mnist", "1234-uid", "TrainingJob", "kubetf.io")
    assert kueue.workload_name(document).startswith("trainingjob-mnist-")
    document["metadata"]["annotations"] = {kueue.PREBUILT: "made-by-multikueue"}
    assert kueue.workload_name(document) == "made-by-multikueue"


def test_a_queued_job_makes_its_workload_and_no_pod():
    wpc = {"metadata": {"name": "research"}, "value": 200}
    sim = kueue_sim(
        queued(ps_job(), **{kueue.PRIORITY_LABEL: "research"}), classes={("WorkloadPriorityClass", "research"): wpc}
    )
    plan = sim.step()
    assert plan.create == [] and sim.pods == {}
    workload = sim.api.workload()
    meta, spec = workload["metadata"], workload["spec"]
    assert meta["name"] == kueue.workload_name(sim.job)
    assert meta["ownerReferences"] == [
        {"apiVersion": "kubetf.io/v1alpha1", "kind": "TrainingJob", "name": "mnist", "uid": sim.job["metadata"]["uid"],
         "controller": True, "blockOwnerDeletion": True}
    ]  # fmt: skip
    assert meta["finalizers"] == [kueue.FINALIZER]
    assert meta["labels"][kueue.JOB_UID_LABEL] == sim.job["metadata"]["uid"]
    assert meta["labels"][api.LABEL_JOB] == "mnist"  # the operator's watch selects its own
    assert spec["queueName"] == QUEUE
    assert spec["priorityClassRef"] == {"group": kueue.GROUP, "kind": "WorkloadPriorityClass", "name": "research"}
    assert spec["priority"] == 200
    # One PodSet per role, in TF_CONFIG's order, each with its count and the template of its pods.
    assert [(p["name"], p["count"]) for p in spec["podSets"]] == [
        ("chief", 1), ("worker", 2), ("ps", 1), ("evaluator", 1)
    ]  # fmt: skip
    worker = spec["podSets"][1]["template"]
    expected = builders.desired_pod(api.with_defaults(sim.job), "worker", 0, 0, sim.controller.config.progress_url)
    assert worker["spec"] == expected["spec"]
    assert worker["metadata"]["labels"][api.LABEL_ROLE] == "worker"
    assert sim.status["phase"] == "Queued" and sim.condition()["reason"] == "Queued"
    assert "queuedSince" in sim.status and "activeSince" not in sim.status  # no timer counts while queued
    assert "PodsReady" not in conditions(workload)  # none before the first admission: Kueue reads it as WaitForStart
    assert sim.step().create == [] and len(sim.api.kueue["workloads"]) == 1  # made once


def test_a_priority_class_that_does_not_exist_is_said_and_the_workload_waits_for_it():
    document = queued(mwms_job())
    document["spec"]["priorityClassName"] = "high"
    sim = kueue_sim(document)
    plan = sim.step()
    assert sim.api.kueue["workloads"] == {}
    assert (sim.status["phase"], sim.condition()["reason"]) == ("Queued", "PriorityClassNotFound")
    assert "PriorityClass high (from spec.priorityClassName) does not exist" in sim.condition()["message"]
    assert ("Warning", "PriorityClassNotFound") in [(t, r) for t, r, _ in sim.api.recorded]
    assert plan.requeue_at is not None  # no watch shows the class: read again then
    sim.api.kueue["classes"][("PriorityClass", "high")] = {"metadata": {"name": "high"}, "value": 1000}
    sim.step(advance=plan.requeue_at - sim.now)
    spec = sim.api.workload()["spec"]
    assert spec["priorityClassRef"]["kind"] == "PriorityClass" and spec["priority"] == 1000


def test_a_job_changed_while_it_holds_no_quota_changes_its_workload_but_not_under_a_reservation():
    sim = kueue_sim(queued(mwms_job()))
    sim.step()
    sim.job["spec"]["replicaSpecs"]["worker"]["replicas"] = 4
    sim.api.update_job(sim.key)
    sim.step()
    assert [p["count"] for p in sim.api.workload()["spec"]["podSets"]] == [1, 4]
    admit(sim)
    sim.step()
    sim.job["spec"]["replicaSpecs"]["worker"]["replicas"] = 1
    sim.api.update_job(sim.key)
    sim.step()
    assert [p["count"] for p in sim.api.workload()["spec"]["podSets"]] == [1, 4]  # immutable while reserved


# ---------------------------------------------------------------------- waiting for admission


def test_a_queued_job_says_where_it_waits_in_kueues_words_until_admitted():
    sim = kueue_sim(queued(mwms_job()))
    plan = sim.step()
    assert plan.requeue_at is None  # Kueue's Workload is watched: nothing is polled
    kueue_sets(sim, QuotaReserved=(
        "False", "Pending", "couldn't assign flavors to pod set worker: insufficient unused quota for nvidia.com/gpu"
    ))  # fmt: skip
    sim.api.deliver(sim.controller)
    assert sim.controller.queue.get()[0] == sim.key  # the Workload's change brings the job back
    sim.controller.queue.done(sim.key)
    sim.step(advance=30)
    message = sim.condition()["message"]
    assert sim.status["phase"] == "Queued" and sim.condition()["reason"] == "Queued"
    assert f"LocalQueue {QUEUE} (ClusterQueue {CLUSTER_QUEUE})" in message
    assert f"Workload {kueue.workload_name(sim.job)}" in message
    assert "all 3 pods" in message and "insufficient unused quota for nvidia.com/gpu" in message
    assert [r for _, r, _ in sim.api.recorded if r == "Queued"] == []  # waiting in a queue is no warning
    sim.api.workload()["status"]["admissionChecks"] = [{"name": "provisioning", "state": "Pending", "message": "wait"}]
    kueue_sets(sim, QuotaReserved=("True", "QuotaReserved", "reserved"))
    sim.step()
    assert sim.pods == {}, "quota reserved, an admission check not ready: not admitted yet"
    assert "admission check provisioning: Pending wait" in sim.condition()["message"]
    admit(sim)
    sim.step()
    assert sim.status["phase"] == "Pending" and len(sim.pods) == 3
    run(sim)
    sim.step()
    assert sim.status["phase"] == "Running"


def test_a_missing_local_queue_is_said_with_a_warning_and_its_creation_brings_the_job_back():
    sim = kueue_sim(queued(mwms_job()), queues={})
    sim.step()
    assert (sim.status["phase"], sim.condition()["reason"]) == ("Queued", "LocalQueueNotFound")
    assert f"LocalQueue {QUEUE} does not exist in namespace" in sim.condition()["message"]
    assert ("Warning", "LocalQueueNotFound") in [(t, r) for t, r, _ in sim.api.recorded]
    assert sim.api.kueue["workloads"] == {}
    sim.api.kueue["queues"][QUEUE] = CLUSTER_QUEUE
    sim.api.deliver(sim.controller)
    assert sim.controller.queue.get()[0] == sim.key
    sim.controller.queue.done(sim.key)
    sim.step()
    assert (sim.status["phase"], sim.condition()["reason"]) == ("Queued", "Queued")
    assert len(sim.api.kueue["workloads"]) == 1


def test_without_kueue_a_labelled_job_runs_and_is_warned_about_once():
    sim = Sim(queued(mwms_job()))  # the cluster has no Kueue
    sim.step()
    run(sim)
    sim.step()
    sim.step()
    assert sim.status["phase"] == "Running"
    assert [r for t, r, _ in sim.api.recorded if t == "Warning"] == ["KueueNotInstalled"]


def test_a_queued_job_costs_no_api_call_while_it_waits():
    sim = kueue_sim(queued(mwms_job()))
    sim.step()
    kueue_sets(sim, QuotaReserved=("False", "Pending", "insufficient unused quota for nvidia.com/gpu"))
    sim.step()
    sim.api.calls.clear()
    for _ in range(10):
        sim.step(advance=600)
    assert sim.status["phase"] == "Queued"
    assert sim.api.calls == []


def test_a_queued_job_says_its_place_in_the_cluster_queue_from_kueues_visibility_api():
    sim = kueue_sim(queued(mwms_job()))
    sim.step()
    name = kueue.workload_name(sim.job)
    kueue_sets(sim, QuotaReserved=("False", "Pending", "insufficient unused quota"))
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
    sim.step()
    sim.controller.positions.poll()  # not served
    sim.step()
    assert sim.status["phase"] == "Queued" and "queuePosition" not in sim.status
    calls = sim.api.calls.count(f"get clusterqueues/{CLUSTER_QUEUE}/pendingworkloads")
    assert calls == 1
    sim.controller.positions.poll()
    assert sim.api.calls.count(f"get clusterqueues/{CLUSTER_QUEUE}/pendingworkloads") == calls  # not asked again soon


# ---------------------------------------------------------------------- admitted


def test_admitted_pods_get_what_the_admission_assigned():
    gpu = {
        "metadata": {"name": "a100"},
        "spec": {
            "nodeLabels": {"gpu.example.com/model": "a100"},
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }
    sim = kueue_sim(queued(mwms_job()), classes={("ResourceFlavor", "a100"): gpu})
    sim.step()
    workload = sim.api.workload()
    workload["status"] = {"admissionChecks": [{"name": "check", "state": "Ready", "podSetUpdates": [
        {"name": "worker", "labels": {"from-check": "yes"}, "nodeSelector": {"zone": "b"}}
    ]}]}  # fmt: skip
    admit(sim, flavor="a100", topologyAssignment={"levels": ["kubernetes.io/hostname"], "domains": []})
    plan = sim.step()
    assert len(plan.create) == 3
    worker = sim.pods["mnist-worker-0"]
    labels, spec = worker["metadata"]["labels"], worker["spec"]
    assert spec["nodeSelector"] == {"gpu.example.com/model": "a100", "zone": "b"}
    assert {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert labels[kueue.PODSET_LABEL] == "worker" and labels["from-check"] == "yes"
    assert labels[kueue.LOCAL_QUEUE_LABEL] == QUEUE and labels[kueue.CLUSTER_QUEUE_LABEL] == CLUSTER_QUEUE
    assert worker["metadata"]["annotations"][kueue.WORKLOAD_ANNOTATION] == workload["metadata"]["name"]
    assert worker["metadata"]["annotations"][kueue.UNCONSTRAINED_TOPOLOGY] == "true"
    assert spec["schedulingGates"] == [{"name": kueue.TOPOLOGY_GATE}]  # Kueue's topology ungater places it
    chief = sim.pods["mnist-chief-0"]
    assert "from-check" not in chief["metadata"]["labels"] and chief["spec"]["nodeSelector"] == {
        "gpu.example.com/model": "a100"
    }


def test_pods_ready_is_reported_and_the_operators_own_restart_keeps_the_admission():
    sim = admitted_and_running(queued(mwms_job()))
    ready = conditions(sim.api.workload())["PodsReady"]
    assert (ready["status"], ready["reason"]) == ("True", "Started")
    admission = sim.api.workload()["status"]["admission"]
    sim.exit("mnist-worker-1", 1)  # a failure: the operator's restart, not Kueue's
    sim.step()
    ready = conditions(sim.api.workload())["PodsReady"]
    assert (ready["status"], ready["reason"]) == ("False", "WaitForRecovery")
    sim.gone()
    for _ in range(3):
        sim.step(advance=10)
    run(sim)
    sim.step()
    workload = sim.api.workload()
    assert sim.status["phase"] == "Running" and sim.status["restarts"]["failures"] == 1
    assert workload["status"]["admission"] == admission  # never given back
    assert conditions(workload)["QuotaReserved"]["status"] == "True"
    ready = conditions(workload)["PodsReady"]
    assert (ready["status"], ready["reason"]) == ("True", "Recovered")


# ---------------------------------------------------------------------- eviction


def test_kueue_preemption_is_one_disruption_and_the_quota_goes_back_once_no_pod_runs():
    sim = admitted_and_running(queued(ps_job()))
    kueue_evicts(sim)
    sim.step()
    restarts = sim.status["restarts"]
    assert (restarts["disruptions"], restarts["failures"]) == (1, 0)
    assert "Preempted by Kueue: Preempted to accommodate" in restarts["lastReason"]
    assert all("deletionTimestamp" in p["metadata"] for p in sim.pods.values())
    assert sim.status["phase"] == "Queued" and "evicted: Preempted to accommodate" in sim.condition()["message"]
    workload = sim.api.workload()
    assert workload["status"]["admission"] is not None, "quota given back while pods still run"
    sim.gone()
    sim.step()
    workload = sim.api.workload()
    assert "admission" not in workload["status"]
    found = conditions(workload)
    assert [(found[t]["status"], found[t]["reason"]) for t in ("QuotaReserved", "Admitted", "Requeued")] == [
        ("False", "Pending"), ("False", "NoReservation"), ("True", "Preempted")
    ]  # fmt: skip
    assert sim.pods == {} and sim.status["restarts"]["disruptions"] == 1  # the deletions were not counted again
    admit(sim)
    sim.step()
    run(sim)
    sim.step()
    assert sim.status["phase"] == "Running" and sim.status["restarts"]["total"] == 1
    assert {sim.attempt(n) for n in sim.pods} == {"1"}


def test_a_pods_ready_timeout_requeues_after_kueues_backoff():
    sim = kueue_sim(queued(mwms_job()))
    sim.step()
    admit(sim)
    sim.step()  # pods created; they never get ready
    kueue_evicts(sim, "PodsReadyTimeout", "Exceeded the PodsReady timeout team-a/x")
    sim.step()
    sim.gone()
    sim.step()
    requeued = conditions(sim.api.workload())["Requeued"]
    assert (requeued["status"], requeued["reason"]) == ("False", "PodsReadyTimeout")  # Kueue's backoff says when
    assert "PodsReadyTimeout by Kueue" in sim.status["restarts"]["lastReason"]


def test_a_pod_that_failed_while_kueue_evicted_is_not_counted_beside_the_eviction():
    sim = admitted_and_running(queued(mwms_job()))
    sim.exit("mnist-worker-0", 137)
    kueue_evicts(sim)
    sim.step()
    assert (sim.status["restarts"]["disruptions"], sim.status["restarts"]["failures"]) == (1, 0)


def test_the_quota_waits_for_a_pod_stuck_terminating_but_not_for_one_on_a_lost_node():
    sim = admitted_and_running(queued(mwms_job()))
    kueue_evicts(sim)
    sim.step()
    sim.api.remove_pod("mnist-chief-0")
    sim.api.remove_pod("mnist-worker-0")
    sim.step(advance=60)  # mnist-worker-1 still terminates on a node that reports
    assert sim.api.workload()["status"].get("admission") is not None
    sim.api.lost_nodes["node-a"] = sim.now - 600
    sim.step(advance=60)
    assert "admission" not in sim.api.workload()["status"]


def test_a_workload_deleted_under_a_running_job_stops_it_and_a_new_one_is_made():
    sim = admitted_and_running(queued(mwms_job()))
    old = sim.api.workload()
    old["metadata"]["deletionTimestamp"] = st.format_time(sim.now)
    sim.api.kueue_wrote(old)
    sim.step()
    assert "WorkloadDeleted: its Workload" in sim.status["restarts"]["lastReason"]
    assert kueue.FINALIZER in old["metadata"]["finalizers"], "its finalizer went while pods ran"
    sim.gone()
    sim.step()  # the finalizer goes: the Workload is gone
    assert sim.api.kueue["workloads"] == {}
    sim.step()
    made = sim.api.workload()
    assert made["metadata"]["uid"] != old["metadata"]["uid"] and sim.status["phase"] == "Queued"


def test_a_conflicting_write_is_decided_again_on_the_newer_workload():
    sim = admitted_and_running(queued(mwms_job()))
    kueue_evicts(sim)
    sim.step()
    sim.gone()
    sim.api.deliver(sim.controller)
    kueue_sets(sim, Requeued=("False", "Kueue", "written before the operator's release"))  # the cache lags
    drain(sim)
    sim.controller.reconcile(sim.key)
    assert sim.api.workload()["status"].get("admission") is not None, "written over a newer version"
    assert sim.controller.queue.get()[0] == sim.key  # decided again ...
    sim.controller.queue.done(sim.key)
    sim.step()  # ... on the newer Workload, which the watch brought
    assert "admission" not in sim.api.workload()["status"]


# ---------------------------------------------------------------------- the end, suspension, deletion


@pytest.mark.parametrize(("code", "reason"), [(0, "Succeeded"), (1, "Failed")])
def test_the_workload_finishes_the_moment_the_job_ends(code, reason):
    document = queued(mwms_job(backoffLimit=0))
    sim = admitted_and_running(document)
    sim.exit("mnist-chief-0", code)
    sim.step()
    workload = sim.api.workload()
    finished = conditions(workload)["Finished"]
    assert (finished["status"], finished["reason"]) == ("True", reason)
    assert kueue.FINALIZER not in workload["metadata"]["finalizers"]
    calls = len(sim.api.calls)
    sim.step()
    assert [c for c in sim.api.calls[calls:] if c.startswith("write Workload")] == []  # once


def test_suspend_deactivates_the_workload_and_resume_queues_it_again():
    sim = admitted_and_running(queued(mwms_job()))
    sim.job["spec"]["runPolicy"]["suspend"] = True
    sim.api.update_job(sim.key)
    sim.step()
    assert sim.api.workload()["spec"]["active"] is False
    kueue_evicts(sim, "Deactivated", "The workload is deactivated")
    sim.step()
    assert sim.api.workload()["status"].get("admission") is not None  # its pods still run
    sim.gone()
    sim.step()
    assert "admission" not in sim.api.workload()["status"] and sim.status["phase"] == "Suspended"
    sim.job["spec"]["runPolicy"]["suspend"] = False
    sim.api.update_job(sim.key)
    sim.step()
    assert sim.api.workload()["spec"]["active"] is True
    assert sim.status["phase"] == "Queued" and sim.pods == {}
    admit(sim)
    sim.step()
    assert len(sim.pods) == 3


def test_a_deleted_job_finishes_its_workload_and_lets_it_go():
    sim = admitted_and_running(queued(mwms_job()))
    sim.api.delete_job(*sim.key)
    sim.api.deliver(sim.controller)
    sim.controller.reconcile(sim.key)
    workload = sim.api.workload()
    finished = conditions(workload)["Finished"]
    assert (finished["status"], finished["reason"]) == ("True", "OwnerNotFound")
    assert kueue.FINALIZER not in workload["metadata"]["finalizers"]  # the garbage collector takes it now


def test_a_previous_jobs_workload_is_let_go_and_no_one_elses_is_touched():
    sim = kueue_sim(queued(mwms_job()))
    earlier = {
        "apiVersion": f"{kueue.GROUP}/{kueue.VERSION}",
        "kind": "Workload",
        "metadata": {
            "name": "trainingjob-mnist-0ld00", "namespace": sim.key[0], "uid": "w-old", "resourceVersion": "1",
            "finalizers": [kueue.FINALIZER],
            "labels": {api.LABEL_MANAGED_BY: api.MANAGER, api.LABEL_JOB: "mnist"},
            "ownerReferences": [{"apiVersion": "kubetf.io/v1alpha1", "kind": "TrainingJob", "name": "mnist",
                                 "uid": "an-earlier-mnist", "controller": True}],
        },
        "spec": {"podSets": []},
        "status": {"conditions": []},
    }  # fmt: skip
    batch_job = {"apiVersion": "batch/v1", "kind": "Job", "name": "mnist", "uid": "a-batch-job", "controller": True}
    not_ours = {"name": "not-ours", "uid": "w-other", "ownerReferences": [batch_job]}
    stranger = {**earlier, "metadata": {**earlier["metadata"], **not_ours}}
    sim.api.kueue["workloads"] = {"trainingjob-mnist-0ld00": earlier, "not-ours": stranger}
    sim.step()
    assert conditions(earlier)["Finished"]["reason"] == "OwnerNotFound"
    assert earlier["metadata"]["finalizers"] == []
    assert "status" not in stranger or conditions(stranger) == {}
    assert stranger["metadata"]["finalizers"] == [kueue.FINALIZER]


# ---------------------------------------------------------------------- moving from the pod integration


def test_pods_made_under_kueues_pod_integration_stop_once_and_the_job_queues_under_its_own_workload():
    sim = Sim(queued(mwms_job()))  # an operator before this one: Kueue's pod integration admitted the pods
    sim.step()
    run(sim)
    sim.step()
    for name, pod in sim.pods.items():
        pod["metadata"]["finalizers"] = [kueue.POD_FINALIZER]
        sim.api.update_pod(name)
    sim.api.kueue = {"queues": {QUEUE: CLUSTER_QUEUE}, "workloads": {}, "classes": {}}
    sim.restart_operator()
    sim.step()
    assert "NoWorkload" in sim.status["restarts"]["lastReason"]
    assert sim.api.kueue["workloads"] == {}, "a Workload made while the old pods still run"
    for pod in sim.pods.values():
        pod["status"]["phase"] = "Failed"  # stopped; the pod integration's finalizer keeps them
    for name in list(sim.pods):
        sim.api.update_pod(name)
    sim.step()
    assert sim.pods == {}  # released by the operator
    sim.step()
    assert len(sim.api.kueue["workloads"]) == 1 and sim.status["phase"] == "Queued"


# ---------------------------------------------------------------------- MultiKueue


def test_multikueues_job_on_the_manager_has_its_workload_and_no_pod_and_follows_the_copied_status():
    document = queued(mwms_job())
    document["spec"]["managedBy"] = multikueue.MANAGED_BY
    sim = kueue_sim(document)
    sim.api.deliver(sim.controller)
    assert sim.controller.reconcile(sim.key) is None
    assert len(sim.api.kueue["workloads"]) == 1 and sim.pods == {} and "status" not in sim.job
    admit(sim, cluster="worker1")
    sim.api.deliver(sim.controller)
    sim.controller.reconcile(sim.key)
    assert sim.pods == {} and "status" not in sim.job  # the worker runs it
    # Kueue copies the worker's status: running, all ready.
    sim.job["status"] = {"phase": "Running", "replicaStatuses": {"chief": {"active": 1, "ready": 1},
                                                                 "worker": {"active": 2, "ready": 2}}}  # fmt: skip
    sim.api.update_job(sim.key)
    sim.api.deliver(sim.controller)
    sim.controller.reconcile(sim.key)
    assert conditions(sim.api.workload())["PodsReady"]["status"] == "True"
    assert "patch status" not in sim.api.calls
    sim.job["status"] = {"phase": "Succeeded", "conditions": [{"type": "Succeeded", "status": "True",
                                                               "message": "mnist-chief-0 exited 0"}]}  # fmt: skip
    sim.api.update_job(sim.key)
    sim.api.deliver(sim.controller)
    sim.controller.reconcile(sim.key)
    workload = sim.api.workload()
    assert conditions(workload)["Finished"]["reason"] == "Succeeded"
    assert kueue.FINALIZER not in workload["metadata"]["finalizers"]


def dispatched_on_the_manager():
    """A MultiKueue job on the manager, its Workload admitted and dispatched to the cluster worker1."""
    document = queued(mwms_job())
    document["spec"]["managedBy"] = multikueue.MANAGED_BY
    sim = kueue_sim(document)
    sim.api.deliver(sim.controller)
    sim.controller.reconcile(sim.key)
    admit(sim, cluster="worker1")
    return sim


def test_multikueues_evicted_job_gives_the_manager_quota_back_at_once():
    sim = dispatched_on_the_manager()
    sim.job["status"] = {"phase": "Running", "replicaStatuses": {"chief": {"active": 1}, "worker": {"active": 2}}}
    sim.api.update_job(sim.key)
    kueue_evicts(sim, "AdmissionCheck", "Admitting remote lost")  # the worker is gone: its copy says nothing more
    sim.api.deliver(sim.controller)
    sim.controller.reconcile(sim.key)
    assert "admission" not in sim.api.workload()["status"]
    requeued = conditions(sim.api.workload())["Requeued"]
    assert (requeued["status"], requeued["reason"]) == ("False", "AdmissionCheck")  # after Kueue's backoff


def test_multikueues_copy_on_a_worker_adopts_the_prebuilt_workload_and_never_makes_one():
    document = queued(mwms_job())
    document["metadata"]["annotations"] = {kueue.PREBUILT: "trainingjob-mnist-abcde"}
    document["metadata"]["labels"][kueue.ORIGIN_LABEL] = "multikueue"
    sim = kueue_sim(document)
    sim.step()
    assert sim.api.kueue["workloads"] == {} and sim.pods == {}
    assert "waiting for Workload trainingjob-mnist-abcde, which Kueue made for this job" in sim.condition()["message"]
    prebuilt = {
        "apiVersion": f"{kueue.GROUP}/{kueue.VERSION}", "kind": "Workload",
        "metadata": {"name": "trainingjob-mnist-abcde", "namespace": sim.key[0], "uid": "w-1", "resourceVersion": "1",
                     "labels": {api.LABEL_MANAGED_BY: api.MANAGER, api.LABEL_JOB: "mnist",
                                kueue.ORIGIN_LABEL: "multikueue"}},
        "spec": {"queueName": QUEUE, "podSets": [{"name": "chief", "count": 1}, {"name": "worker", "count": 2}]},
    }  # fmt: skip
    sim.api.kueue["workloads"]["trainingjob-mnist-abcde"] = prebuilt
    admit(sim)
    sim.step()
    owner = types.controller_of(prebuilt)
    assert owner["uid"] == sim.job["metadata"]["uid"] and owner["kind"] == "TrainingJob"
    assert len(sim.pods) == 3
    assert sim.pods["mnist-worker-0"]["metadata"]["labels"][kueue.WORKER_POD_LABEL] == "true"


# ---------------------------------------------------------------------- restarts of the operator, the cache


def test_an_operator_restarted_among_queued_and_admitted_jobs_writes_nothing():
    queued_sim = kueue_sim(queued(mwms_job()))
    queued_sim.step()
    kueue_sets(queued_sim, QuotaReserved=("False", "Pending", "insufficient unused quota for nvidia.com/gpu"))
    queued_sim.step()
    running = admitted_and_running(queued(mwms_job()))
    for sim in (queued_sim, running):
        before = dict(sim.status)
        workloads = repr(sim.api.kueue["workloads"])
        sim.restart_operator()  # its Workload and LocalQueue come from the priming lists, not a watch yet
        writes = sim.api.calls.count("patch status")
        sim.controller.reconcile(sim.key)
        assert sim.api.calls.count("patch status") == writes, sim.status
        assert sim.status == before and repr(sim.api.kueue["workloads"]) == workloads


def test_a_running_job_whose_workload_the_cache_lacks_asks_the_api_before_stopping_anything():
    sim = admitted_and_running(queued(mwms_job()))
    sim.controller.store.owned.clear()  # a watch that has not shown it (yet)
    sim.step()
    assert sim.status["phase"] == "Running" and sim.status["restarts"]["total"] == 0
    assert "get Workload" in sim.api.calls


def test_the_cache_keeps_what_the_decisions_read_of_a_workload():
    sim = admitted_and_running(queued(mwms_job()))
    workload = sim.api.workload()
    workload["status"]["resourceRequests"] = [{"name": "worker", "resources": {"cpu": "2"}}]
    workload["metadata"]["managedFields"] = [{"manager": "kueue"}]
    slim = kueue.slim(workload)
    assert "resourceRequests" not in slim["status"] and "managedFields" not in slim["metadata"]
    assert slim["status"]["conditions"] == workload["status"]["conditions"]  # sent back whole by a status write
    assert [a["flavors"] for a in slim["status"]["admission"]["podSetAssignments"]] == [{"cpu": "default"}] * 2
    assert slim["metadata"]["finalizers"] == [kueue.FINALIZER] and slim["spec"]["active"] is True
    sim.api.kueue_wrote(workload)  # a change of nothing read: no reconcile
    drain(sim)
    sim.api.deliver(sim.controller)
    assert len(sim.controller.queue) == 0


# ---------------------------------------------------------------------- bad input


@pytest.mark.parametrize("value", ["Team_A", "team-a-", "a" * 254])
def test_a_queue_label_that_cannot_name_a_local_queue_is_refused(value):
    document = queued(mwms_job())
    document["metadata"]["labels"][kueue.QUEUE_LABEL] = value
    problems = api.validate(document)
    assert [p.path for p in problems] == [f"metadata.labels[{kueue.QUEUE_LABEL}]"]
    assert "is not a LocalQueue name" in problems[0].message


def test_managed_by_takes_only_the_values_the_crd_allows_and_multikueue_needs_a_queue():
    document = mwms_job()
    document["spec"]["managedBy"] = "someone/else"
    assert [p.path for p in api.validate(document)] == ["spec.managedBy"]
    document["spec"]["managedBy"] = multikueue.MANAGED_BY
    assert [str(p) for p in api.validate(document)] == [
        "spec.managedBy: kueue.x-k8s.io/multikueue needs the label kueue.x-k8s.io/queue-name, or nothing ever "
        "dispatches the job: add the label, naming a LocalQueue whose ClusterQueue has a MultiKueue admission check, "
        "or remove spec.managedBy to run the job on this cluster"
    ]
    assert api.validate(queued(document)) == []


def test_a_released_pod_is_deleted_at_once_rather_than_waiting_for_its_kubelet():
    """Its containers are gone (Failed): the kubelet's own confirmation would hold the name most of a second longer."""
    from kubetf.cluster.kube import Kube

    kube = Kube(qps=100, burst=100, may_write=lambda: True)
    calls = []
    kube._patch_pod = lambda pod, patch: calls.append(("patch", [op["op"] for op in patch]))
    kube.delete_pod = lambda pod, grace_seconds=None: calls.append(("delete", grace_seconds)) or True
    held = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "finalizers": [kueue.POD_FINALIZER]},
        "status": {"phase": "Failed"},
    }
    kube.release_pods([held])
    assert calls == [("patch", ["test", "test", "remove"]), ("delete", 0)]


def test_replicas_of_a_job_are_counted_in_its_pod_sets():
    document = api.with_defaults(queued(job(chief=replica(1), worker=replica(3))))
    templates = {r: builders.desired_pod(document, r, 0) for r in api.replica_specs(document)}
    assert [(p["name"], p["count"]) for p in kueue.pod_sets(document, templates)] == [("chief", 1), ("worker", 3)]


# ---------------------------------------------------------------------- issue 46: what the seam fixed


def test_kueues_preemption_never_fails_a_job_for_its_max_disruptions():
    """Issue 46: docs/kueue.md promises a disruption, never a failure; maxDisruptions caps the restarts a job's own
    pods cause, not the times a queue takes the whole job back."""
    document = queued(mwms_job())
    document["spec"]["runPolicy"]["maxDisruptions"] = 0
    sim = admitted_and_running(document)
    kueue_evicts(sim)
    sim.step()
    assert sim.status["phase"] == "Queued" and sim.status["restarts"]["disruptions"] == 1
    sim.gone()
    sim.step()
    admit(sim)
    sim.step()
    run(sim)
    sim.step()
    assert sim.status["phase"] == "Running"
    sim.evict("mnist-worker-0")  # one of its own pods: that one the cap counts
    sim.step()
    assert (sim.status["phase"], sim.status["reason"]) == ("Failed", "MaxDisruptionsExceeded")


def test_no_pod_is_made_for_an_admission_that_no_longer_matches_the_job():
    """Issue 46 (Kueue's EquivalentToWorkload): suspended, resized and resumed in one apply, the job must not run more
    pods than Kueue admitted: its quota goes back, its Workload follows the job, and Kueue admits it anew."""
    sim = kueue_sim(queued(mwms_job()))
    sim.step()
    admit(sim)
    sim.job["spec"]["replicaSpecs"]["worker"]["replicas"] = 4  # before the operator made a pod of the admission
    sim.api.update_job(sim.key)
    sim.step()
    assert sim.pods == {} and sim.status["phase"] == "Queued"
    assert "WorkloadChanged" in sim.condition()["message"]
    workload = sim.api.workload()
    assert "admission" not in workload["status"]  # the quota given back: the spec may follow now
    sim.step()
    workload = sim.api.workload()
    assert [p["count"] for p in workload["spec"]["podSets"]] == [1, 4]
    admit(sim)
    sim.step()
    assert len(sim.pods) == 5


def test_an_operator_that_builds_its_pods_differently_leaves_every_admitted_job_running():
    """An upgrade that adds a variable to every pod (KUBETF_RUN_ID) changed the hash of the PodSets' templates: a
    comparison of templates would have stopped every admitted job at once. The job's shape is what is compared; a
    Workload made before shapes were recorded is compared by its queue, roles and counts."""
    for recorded_shape in (True, False):
        sim = admitted_and_running(queued(mwms_job()))
        annotations = sim.api.workload()["metadata"]["annotations"]
        annotations[kueue.SPEC_HASH_ANNOTATION] = "made-by-an-older-operator"
        if not recorded_shape:
            del annotations[kueue.SHAPE_ANNOTATION]
        sim.api.kueue_wrote(sim.api.workload())
        sim.step()
        assert sim.status["phase"] == "Running"
        assert not any("deletionTimestamp" in p["metadata"] for p in sim.pods.values())
        sim.job["spec"]["replicaSpecs"]["worker"]["replicas"] = 1
        sim.api.update_job(sim.key)
        sim.step()
        assert "WorkloadChanged" in sim.status["restarts"]["lastReason"], recorded_shape


def test_an_admitted_job_whose_resources_grow_is_admitted_anew():
    sim = admitted_and_running(queued(mwms_job()))
    container = sim.job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    container.setdefault("resources", {})["requests"] = {"cpu": "3"}
    sim.api.update_job(sim.key)
    sim.step()
    assert all("deletionTimestamp" in p["metadata"] for p in sim.pods.values())
    assert "WorkloadChanged" in sim.status["restarts"]["lastReason"]


def test_a_running_job_whose_admission_no_longer_matches_stops_once_and_is_admitted_anew():
    sim = admitted_and_running(queued(mwms_job()))
    sim.job["spec"]["replicaSpecs"]["worker"]["replicas"] = 1
    sim.api.update_job(sim.key)
    sim.step()
    assert all("deletionTimestamp" in p["metadata"] for p in sim.pods.values())
    assert "WorkloadChanged" in sim.status["restarts"]["lastReason"]
    sim.gone()
    sim.step()
    sim.step()
    assert [p["count"] for p in sim.api.workload()["spec"]["podSets"]] == [1, 1]
    admit(sim)
    sim.step()
    assert len(sim.pods) == 2


def test_a_workload_the_job_owns_for_a_queue_label_since_removed_gives_its_quota_back_when_the_job_ends():
    """Issue 46: the label removed from an admitted job (where no admission policy stopped it) left its Workload
    QuotaReserved and Admitted after the job ended, the ClusterQueue's quota held until the job was deleted."""
    sim = admitted_and_running(queued(mwms_job()))
    del sim.job["metadata"]["labels"][kueue.QUEUE_LABEL]
    sim.api.update_job(sim.key)
    sim.step()
    assert sim.status["phase"] == "Running"  # it runs on, as it was
    sim.exit("mnist-chief-0", 0)
    sim.step()
    assert sim.status["phase"] == "Succeeded"
    workload = sim.api.workload()
    assert conditions(workload)["Finished"]["status"] == "True"
    assert kueue.FINALIZER not in workload["metadata"]["finalizers"]


def test_a_workload_labelled_for_the_job_but_owned_by_nothing_is_never_touched():
    """Issue 46: a Workload is a job's only by its controller reference, never by the labels anyone can copy."""
    sim = kueue_sim(queued(mwms_job()))
    stray = {
        "apiVersion": f"{kueue.GROUP}/{kueue.VERSION}", "kind": "Workload",
        "metadata": {"name": "made-by-hand", "namespace": sim.key[0], "uid": "w-hand", "resourceVersion": "1",
                     "finalizers": [kueue.FINALIZER],
                     "labels": {api.LABEL_MANAGED_BY: api.MANAGER, api.LABEL_JOB: "mnist"}},
        "spec": {"podSets": []},
        "status": {"conditions": [{"type": "Admitted", "status": "True", "reason": "Admitted", "message": ""}]},
    }  # fmt: skip
    sim.api.kueue["workloads"]["made-by-hand"] = stray
    sim.step()
    sim.api.delete_job(*sim.key)
    sim.api.deliver(sim.controller)
    sim.controller.reconcile(sim.key)
    assert "Finished" not in conditions(stray) and stray["metadata"]["finalizers"] == [kueue.FINALIZER]


def test_a_multikueue_job_without_a_queue_label_says_nothing_will_dispatch_it():
    document = mwms_job()
    document["spec"]["managedBy"] = multikueue.MANAGED_BY
    sim = kueue_sim(document)
    sim.api.deliver(sim.controller)
    sim.controller.reconcile(sim.key)
    assert (sim.status["phase"], sim.status["reason"]) == ("Pending", "NotDispatched")
    assert "no label kueue.x-k8s.io/queue-name" in sim.condition()["message"] and sim.pods == {}
    assert [r for t, r, _ in sim.api.recorded if t == "Warning"] == ["NotDispatched"]
    sim.controller.reconcile(sim.key)
    assert [r for _, r, _ in sim.api.recorded].count("NotDispatched") == 1  # said once


def test_a_multikueue_job_admitted_without_a_multikueue_check_says_so():
    document = queued(mwms_job())
    document["spec"]["managedBy"] = multikueue.MANAGED_BY
    sim = kueue_sim(document)
    sim.api.deliver(sim.controller)
    sim.controller.reconcile(sim.key)
    assert "status" not in sim.job
    admit(sim)  # by a ClusterQueue without a MultiKueue admission check: no worker cluster is named
    sim.api.deliver(sim.controller)
    sim.controller.reconcile(sim.key)
    assert (sim.status["phase"], sim.status["reason"]) == ("Pending", "NotDispatched")
    assert "has no MultiKueue admission check" in sim.condition()["message"]


def test_the_manager_never_writes_a_dispatched_jobs_status_even_when_its_reconciles_fail():
    """Issue 46: the manager's ReconcileError and Kueue's copy of the worker's status were two writers."""
    sim = dispatched_on_the_manager()
    sim.job["status"] = {"phase": "Running"}  # Kueue's copy of the worker's
    sim.api.update_job(sim.key)
    sim.api.deliver(sim.controller)
    writes = sim.api.calls.count("patch status")
    for attempts in range(1, 6):
        sim.controller.executor.report_failing(sim.key, Failing(attempts, "boom"), sim.now)
    assert sim.api.calls.count("patch status") == writes and sim.status == {"phase": "Running"}
    assert [r for _, r, _ in sim.api.recorded].count("ReconcileError") == 1  # said once, as an event


def test_a_job_deleted_while_no_operator_ran_has_its_admitted_workload_finished_and_let_go():
    """Its Workload (admitted, no pod made yet) held its quota for good: the next operator queued only jobs and the
    jobs of cached pods, and the garbage collector's deletion brought no event it had not seen."""
    sim = kueue_sim(queued(mwms_job()))
    sim.step()
    admit(sim)
    sim.api.jobs.pop(sim.key)  # deleted while no operator runs
    sim.restart_operator()
    assert sim.controller.queue.get()[0] == sim.key  # queued by the prime
    assert sim.controller.reconcile(sim.key) is None  # nothing of the job is left to plan: its remains go
    workload = sim.api.workload()
    assert conditions(workload)["Finished"]["reason"] == "OwnerNotFound"
    assert kueue.FINALIZER not in workload["metadata"]["finalizers"]
