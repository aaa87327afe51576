"""Gang scheduling without Kueue (kubetf.core.gang) through the real reconcile shell on the fake API: which scheduler
a job gets, what its pods and PodGroups look like, what a restart does to the gang, what the job says while its gang
waits, and its schedule timeout."""

import pytest

from kubetf.core import status as st
from kubetf.core.scheduling import gangs, native, volcano
from kubetf.core.scheduling import workload as kueue

from .jobs import job, replica
from .test_reconcile import Sim

pytestmark = pytest.mark.unit

NATIVE = f"{native.GROUP}/{native.VERSION}"
VOLCANO = f"{volcano.GROUP}/{volcano.VERSION}"


def with_policy(document, **policy):
    document["spec"].setdefault("runPolicy", {})["schedulingPolicy"] = policy
    return document


def mwms(**policy):
    return with_policy(job(chief=replica(1), worker=replica(3), evaluator=replica(1)), **policy)


def ps(**policy):
    return with_policy(job(strategy="ParameterServer", chief=replica(1), worker=replica(2), ps=replica(1)), **policy)


def cluster(document, native=False, volcano=False):
    sim = Sim(document)
    if native:
        sim.api.served[NATIVE] = {"workloads", "podgroups", "podgroups/status"}
    if volcano:
        sim.api.served[VOLCANO] = {"podgroups", "queues"}
    return sim


def g(sim, generation):
    """The name of the job's PodGroup of that generation (it carries the job's uid)."""
    return gangs.group_name(sim.job, generation)


def groups(sim):
    return {name: o for (kind, name), o in sim.api.others.items() if kind == "PodGroup"}


def place(sim, *names):
    """The scheduler binds these pods (all, by default), and the kubelet runs them."""
    for name in names or list(sim.pods):
        pod = sim.pods[name]
        if "deletionTimestamp" not in pod["metadata"]:
            pod["spec"]["nodeName"] = "node-a"
            pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
            sim.api.update_pod(name)


def elsewhere(document):
    for spec in document["spec"]["replicaSpecs"].values():
        spec["template"]["spec"]["schedulerName"] = "my-scheduler"
    return document


@pytest.mark.parametrize(
    "document,native,volcano,expected",
    [
        (mwms(), True, True, native.NAME),  # Auto: the cluster's own where it serves it
        (
            with_policy(
                job(chief=replica(1)),
            ),
            True,
            False,
            "None",
        ),  # one training task: nothing to place together
        (elsewhere(mwms()), True, False, "None"),  # another scheduler: the default one's gang plugin cannot place it
        (mwms(), False, False, "None"),  # nothing served: one by one, as before
        (mwms(gangScheduler="None"), True, False, "None"),
        (mwms(gangScheduler="Volcano"), True, True, volcano.NAME),
    ],
)
def test_the_gang_scheduler_a_job_gets_is_chosen_once(document, native, volcano, expected):
    sim = cluster(document, native, volcano)
    sim.step()
    assert sim.status["gang"]["scheduler"] == expected
    sim.api.served.clear()  # the cluster changes: a job never changes how its pods are placed
    sim.step()
    assert sim.status["gang"]["scheduler"] == expected


def test_auto_is_volcano_when_the_pods_name_it_and_kueue_when_the_job_is_queued():
    document = mwms()
    for spec in document["spec"]["replicaSpecs"].values():
        spec["template"]["spec"]["schedulerName"] = "volcano"
    sim = cluster(document, native=True, volcano=True)
    sim.step()
    assert sim.status["gang"]["scheduler"] == volcano.NAME
    queued = mwms()
    queued["metadata"]["labels"] = {kueue.QUEUE_LABEL: "team-a"}
    sim = cluster(queued, native=True)
    sim.api.kueue = {"queues": {"team-a": "gpus"}, "workloads": {}}
    sim.step()
    assert sim.status["gang"]["scheduler"] == "Kueue"
    assert groups(sim) == {}  # Kueue admits the pods together: no PodGroup of ours


@pytest.mark.parametrize(
    "document,words",
    [
        (mwms(gangScheduler="Volcano"), "Volcano is not installed"),
        (mwms(gangScheduler="Kubernetes"), "GenericWorkload feature gate"),
        (mwms(gangScheduler="Kueue"), "add the label kueue.x-k8s.io/queue-name"),
    ],
)
def test_a_gang_scheduler_the_cluster_does_not_have_fails_the_job_before_anything_is_created(document, words):
    sim = cluster(document)
    sim.step()
    assert (sim.status["phase"], sim.status["reason"]) == ("Failed", "GangSchedulerUnavailable")
    assert words in sim.condition()["message"] and "schedulingPolicy.gangScheduler" in sim.condition()["message"]
    assert sim.pods == {} and sim.api.others == {}


def test_a_scheduler_installed_just_after_the_last_discovery_is_read_again_before_a_job_naming_it_is_refused():
    sim = cluster(mwms())  # a job of no gang reads discovery: neither scheduler is there
    sim.step()
    assert sim.status["gang"]["scheduler"] == "None"
    sim.api.served[VOLCANO] = {"podgroups", "queues"}  # Volcano installed a moment later
    late = mwms(gangScheduler="Volcano")
    late["metadata"]["name"] = "late"
    created = sim.api.add_job(late)
    sim.key = (created["metadata"]["namespace"], "late")
    sim.step(advance=2)  # the operator read discovery 2 s ago, not discovery_seconds (30 s)
    assert sim.status["gang"]["scheduler"] == volcano.NAME


def test_kubernetes_gang_its_workload_and_podgroup_come_first_and_the_evaluator_stays_out():
    sim = cluster(mwms(), native=True)
    plan = sim.step()
    first = plan.batches[0]
    assert [o["kind"] for o in first] == ["Workload", "PodGroup"]  # before any pod of the job
    group = groups(sim)[g(sim, 0)]
    assert group["apiVersion"] == NATIVE
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 4}}  # chief + 3 workers, not the evaluator
    assert group["spec"]["workloadRef"] == {"workloadName": native.workload_name(sim.job), "templateName": "training"}
    assert group["metadata"]["ownerReferences"][0]["uid"] == sim.job["metadata"]["uid"]
    workload = sim.api.others[("Workload", native.workload_name(sim.job))]
    assert workload["spec"]["podGroupTemplates"] == [
        {"name": "training", "schedulingPolicy": {"gang": {"minCount": 4}}}
    ]
    for name in ("mnist-chief-0", "mnist-worker-0", "mnist-worker-2"):
        assert sim.pods[name]["spec"]["schedulingGroup"] == {"podGroupName": g(sim, 0)}
    assert "schedulingGroup" not in sim.pods["mnist-evaluator-0"]["spec"]


def test_volcano_gang_podgroup_with_min_resources_queue_and_priority_and_the_evaluator_in_its_own():
    document = mwms(gangScheduler="Volcano", minAvailable=3, queue="team-gpu")
    document["spec"]["priorityClassName"] = "high"
    for role in ("chief", "worker"):
        document["spec"]["replicaSpecs"][role]["gpus"] = 1
        document["spec"]["replicaSpecs"][role]["template"]["spec"]["containers"][0]["resources"] = {
            "requests": {"cpu": "500m", "memory": "1Gi"}
        }
    sim = cluster(document, volcano=True)
    sim.step()
    group = groups(sim)[g(sim, 0)]
    assert group["apiVersion"] == VOLCANO
    assert group["spec"] == {
        "minMember": 3,
        "minResources": {"cpu": "1500m", "memory": str(3 * 2**30), "nvidia.com/gpu": "3"},
        "queue": "team-gpu",
        "priorityClassName": "high",
    }
    chief = sim.pods["mnist-chief-0"]
    assert chief["spec"]["schedulerName"] == "volcano"
    assert chief["metadata"]["annotations"][volcano.GROUP_ANNOTATION] == g(sim, 0)
    evaluator = sim.pods["mnist-evaluator-0"]
    assert evaluator["metadata"]["annotations"][volcano.GROUP_ANNOTATION] == volcano.evaluator_group(sim.job)
    assert groups(sim)[volcano.evaluator_group(sim.job)]["spec"]["minMember"] == 1


def test_a_waiting_gang_says_so_with_the_schedulers_words_and_its_startup_timeout_does_not_run():
    sim = cluster(mwms(), native=True)
    sim.step()
    group = sim.api.others[("PodGroup", g(sim, 0))]
    message = "minCount (4) cannot be satisfied: 3 scheduled, 0 remaining"
    group["status"] = {
        "conditions": [{"type": "PodGroupInitiallyScheduled", "status": "False", "reason": "Unschedulable",
                        "message": message}]
    }  # fmt: skip
    sim.api._bump(group)
    sim.api._emit("podgroups", "MODIFIED", group)
    sim.step()
    assert (sim.status["phase"], sim.status["reason"]) == ("Pending", "GangWaiting")
    condition = sim.condition()["message"]
    assert f"waiting for 4 training pods to be placed together by Kubernetes (PodGroup {g(sim, 0)})" in condition
    assert f"the scheduler: Unschedulable: {message}" in condition
    assert sim.status["gang"]["waitingSince"] == st.format_time(sim.now)
    place(sim, "mnist-evaluator-0")  # not in the gang: placed alone
    sim.step(advance=3600)  # long past startupTimeoutSeconds (600): the gang's wait is not a startup's
    assert sim.status["phase"] == "Pending"
    place(sim)
    sim.step()
    assert sim.status["phase"] == "Running" and "waitingSince" not in sim.status["gang"]
    assert sim.status["gang"]["placedAt"] == st.format_time(sim.now)


def unschedulable(sim, name, reason, message):
    """The scheduler's words on a pod it has not bound."""
    pod = sim.pods[name]
    pod["status"] = {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": reason, "message": message}]}  # fmt: skip
    sim.api.update_pod(name)


def group_says(sim, name, condition):
    group = sim.api.others[("PodGroup", name)]
    group["status"] = {"conditions": [condition]}
    sim.api._bump(group)
    sim.api._emit("podgroups", "MODIFIED", group)


# As the schedulers wrote them on the 1.37 cluster (tests/e2e/test_gangs.py), for a gang of 4 GPU pods with room
# for 3: Kubernetes' pods repeat the group's words but the one that does not fit; Volcano's say the others would fit.
NO_ROOM = "0/5 nodes are available: 1 Insufficient nvidia.com/gpu, 4 node(s) didn't match Pod's node affinity/selector."
NATIVE_GROUP_SAYS = "minCount (4) cannot be satisfied: 3 scheduled, 0 remaining, pod group preemption: No victims"
VOLCANO_GROUP_SAYS = (
    "1/4 tasks in gang unschedulable: pod group is not ready, 4 Pending, 4 minAvailable; Pending: 1 Unschedulable, "
    f"3 Schedulable. Origin reason is mnist-worker-2: {NO_ROOM}"
)


@pytest.mark.parametrize("scheduler", [native.NAME, volcano.NAME])
def test_a_waiting_gang_says_which_pod_finds_no_room_once_not_which_would_fit(scheduler):
    sim = cluster(mwms(gangScheduler=scheduler), native=True, volcano=True)
    sim.step()
    for name in ("mnist-chief-0", "mnist-worker-0", "mnist-worker-1", "mnist-worker-2"):
        if name == "mnist-worker-2":
            unschedulable(sim, name, "Unschedulable", NO_ROOM)
        elif scheduler == native.NAME:
            unschedulable(sim, name, "Unschedulable", f"pod group is unschedulable, {NATIVE_GROUP_SAYS}")
        else:
            unschedulable(sim, name, "Schedulable", f"Pod ns/{name} can possibly be assigned to node-a, once "
                          "minAvailable is satisfied")  # fmt: skip
    if scheduler == native.NAME:
        group_says(sim, g(sim, 0), {"type": "PodGroupInitiallyScheduled", "status": "False",
                                         "reason": "Unschedulable", "message": NATIVE_GROUP_SAYS})  # fmt: skip
        said = f"the scheduler: Unschedulable: {NO_ROOM}; Unschedulable: {NATIVE_GROUP_SAYS}"
    else:
        group_says(sim, g(sim, 0), {"type": "Unschedulable", "status": "True", "reason": "NotEnoughResources",
                                         "message": VOLCANO_GROUP_SAYS})  # fmt: skip
        said = f"the scheduler: NotEnoughResources: {VOLCANO_GROUP_SAYS}"  # the pod's words are in it already
    sim.step()
    message = sim.condition()["message"]
    assert sim.status["reason"] == "GangWaiting"
    assert message.endswith(said)
    assert message.count(NO_ROOM) == 1 and message.count("minCount") <= 1
    assert "can possibly be assigned" not in message


def test_pods_that_would_fit_are_no_reason_to_say_a_gang_waits_before_the_grace():
    """Volcano marks the pods it would place once the gang is complete `Schedulable`: a gang placed a second later is
    the usual start, not a wait to report."""
    sim = cluster(mwms(gangScheduler="Volcano"), volcano=True)
    sim.step()
    for name in ("mnist-chief-0", "mnist-worker-0", "mnist-worker-1", "mnist-worker-2"):
        unschedulable(sim, name, "Schedulable", f"Pod ns/{name} can possibly be assigned to node-a, once minAvailable "
                      "is satisfied")  # fmt: skip
    sim.step()
    assert sim.status["reason"] == "PodsStarting"


def test_volcanos_not_ready_without_a_pod_that_finds_no_room_waits_out_the_grace_before_it_is_said():
    """Volcano's first sessions of a gang it places a moment later may say `Unschedulable` on its PodGroup with no
    task's own reason (seen on the 1.37 cluster under load): not a why; said once the scheduling grace is over."""
    sim = cluster(mwms(gangScheduler="Volcano"), volcano=True)
    sim.step()
    not_ready = "pod group is not ready, 4 Pending, 4 minAvailable; Pending: 4 Unschedulable"
    for name in ("mnist-chief-0", "mnist-worker-0", "mnist-worker-1", "mnist-worker-2"):
        unschedulable(sim, name, "Unschedulable", not_ready)
    group_says(sim, g(sim, 0), {"type": "Unschedulable", "status": "True", "reason": "NotEnoughResources",
                                     "message": f"4/4 tasks in gang unschedulable: {not_ready}"})  # fmt: skip
    plan = sim.step()
    assert sim.status["reason"] == "PodsStarting" and plan.requeue_at == pytest.approx(sim.now + 30)
    sim.step(advance=30)
    assert sim.status["reason"] == "GangWaiting"
    assert sim.condition()["message"].endswith(f"the scheduler: NotEnoughResources: 4/4 tasks in gang unschedulable: "
                                               f"{not_ready}")  # fmt: skip


@pytest.mark.parametrize("on_timeout,phase,reason", [("Fail", "Failed", "GangScheduleTimeout"),
                                                     ("Wait", "Pending", "GangScheduleTimeout")])  # fmt: skip
def test_a_gang_not_placed_within_its_schedule_timeout_fails_or_waits_on_saying_so(on_timeout, phase, reason):
    sim = cluster(mwms(scheduleTimeoutSeconds=120, onScheduleTimeout=on_timeout), native=True)
    sim.step()
    plan = sim.step()
    # A gang is usually placed within seconds: nothing more to say until the scheduling grace is over.
    assert sim.status["reason"] == "PodsStarting" and plan.requeue_at == pytest.approx(sim.now + 30)
    sim.step(advance=30)
    assert sim.status["reason"] == "GangWaiting"
    place(sim, "mnist-chief-0", "mnist-worker-0")  # 2 of 4: not a gang
    plan = sim.step(advance=90)
    assert (sim.status["phase"], sim.status["reason"]) == (phase, reason)
    assert [r for _, r, _ in sim.api.recorded].count("GangScheduleTimeout") == 1
    if on_timeout == "Fail":
        assert {p["metadata"]["name"] for p in plan.delete} >= {"mnist-worker-1", "mnist-worker-2"}


@pytest.mark.parametrize("native", [True, False], ids=["kubernetes", "volcano"])
def test_a_group_restart_is_a_new_gang_and_the_old_podgroup_goes_once_its_pods_are_gone(native):
    document = mwms() if native else mwms(gangScheduler="Volcano")
    sim = cluster(document, native=native, volcano=not native)
    sim.step()
    place(sim)
    sim.step()
    sim.exit("mnist-worker-1", 1)
    made = sim.api.calls.count("create PodGroup")
    sim.now += 20
    sim.api.deliver(sim.controller)
    sim.controller.reconcile(sim.key)  # the whole MWMS group restarts
    # Kubernetes' next PodGroup is made while the old pods go (Volcano's would hold quota beside theirs), and known
    # at once: a reconcile before its ADDED event does not make it again
    cached = {o["metadata"]["name"] for o in sim.controller.store.owned_of(sim.key)}
    assert (g(sim, 1) in cached) is native
    sim.step()
    assert g(sim, 0) in groups(sim)  # its pods are still terminating
    assert (g(sim, 1) in groups(sim)) is native
    assert sim.api.calls.count("create PodGroup") == made + native
    sim.gone()
    plan = sim.step(advance=20)
    # once the old pods are gone, Kubernetes' replacements wait on nothing else: their batch comes first
    assert ("PodGroup" in {o["kind"] for o in plan.batches[0]}) is not native
    assert g(sim, 0) not in groups(sim)  # once none of its pods is left, after the replacements were created
    assert sim.api.calls.index(f"delete PodGroup {g(sim, 0)}") > max(
        i for i, call in enumerate(sim.api.calls) if call == "create Pod"
    )
    sim.step()
    assert sim.api.calls.count(f"delete PodGroup {g(sim, 0)}") == 1  # not again before its DELETED event
    if not native:
        return
    new = {n: p for n, p in sim.pods.items() if p["metadata"]["labels"]["kubetf.io/attempt"] == "1"}
    assert {p["spec"]["schedulingGroup"]["podGroupName"] for n, p in new.items() if "evaluator" not in n} == {
        g(sim, 1)
    }
    assert groups(sim)[g(sim, 1)]["spec"]["schedulingPolicy"] == {"gang": {"minCount": 4}}


def test_a_lone_parameter_server_worker_replacement_joins_the_running_gang():
    sim = cluster(ps(), native=True)
    sim.step()
    place(sim)
    sim.step()
    sim.exit("mnist-worker-1", 1)
    sim.step(advance=20)
    sim.gone()
    sim.step(advance=20)
    replacement = sim.pods["mnist-worker-1"]
    assert replacement["metadata"]["labels"]["kubetf.io/attempt"] == "1"
    assert replacement["spec"]["schedulingGroup"] == {"podGroupName": g(sim, 0)}  # its bound peers count
    assert set(groups(sim)) == {g(sim, 0)}


def test_a_job_started_before_gangs_were_placed_keeps_going_as_it_started():
    sim = cluster(ps())
    sim.step()
    place(sim)
    sim.step()
    del sim.job["status"]["gang"]  # as an operator of before this feature left it
    sim.api._bump(sim.job)
    sim.api._emit("jobs", "MODIFIED", sim.job)
    sim.api.served[NATIVE] = {"podgroups"}
    sim.step()
    assert sim.status["gang"] == {"scheduler": "None"}
    assert groups(sim) == {}


def test_volcanos_stale_unschedulable_beside_a_newer_scheduled_says_nothing():
    unschedulable = {
        "type": "Unschedulable",
        "status": "True",
        "reason": "NotEnoughResources",
        "message": "1/2 tasks in gang unschedulable",
        "lastTransitionTime": "2026-11-25T10:00:00Z",
    }
    group = {"metadata": {"name": "g"}, "status": {"conditions": [unschedulable]}}
    assert gangs.group_words(group) == "NotEnoughResources: 1/2 tasks in gang unschedulable"
    scheduled = {"type": "Scheduled", "status": "True", "lastTransitionTime": "2026-11-25T10:00:05Z"}
    group["status"]["conditions"].append(scheduled)
    assert gangs.group_words(group) is None


def pod_group_of_pod(pod):
    return gangs.pod_group_of(pod)


@pytest.mark.parametrize("native", [True, False], ids=["kubernetes", "volcano"])
def test_lone_restarts_that_come_to_cover_every_training_task_keep_joining_the_running_gang(native):
    """Issue 46: after the ps (with its chief), then each worker, every training task is on its second attempt;
    the next lone replacement (the ps again) must still join the PodGroup its running peers are in, never a new
    gang whose quorum it alone can never meet."""
    document = ps() if native else ps(gangScheduler="Volcano")
    sim = cluster(document, native=native, volcano=not native)
    sim.step()
    place(sim)
    sim.step()
    for lost in ("mnist-ps-0", "mnist-worker-0", "mnist-worker-1", "mnist-ps-0"):
        sim.evict(lost)
        sim.step()
        sim.gone()
        sim.step()
        place(sim)
        sim.step()
        assert sim.status["phase"] == "Running", (lost, sim.status)
        assert sim.status["gang"]["generation"] == 0
        assert {pod_group_of_pod(p) for p in sim.pods.values()} == {g(sim, 0)}, lost
        assert set(groups(sim)) == {g(sim, 0)}
    assert sim.status["restarts"]["disruptions"] == 4
    assert all(sim.attempt(name) != "0" for name in sim.pods)  # every task restarted at least once


def test_a_whole_group_restart_after_lone_ones_is_the_next_generation_and_leaves_at_most_two_groups():
    sim = cluster(mwms(), native=True)
    sim.step()
    place(sim)
    sim.step()
    for generation in range(1, 6):  # 5 group restarts (a worker lost each time)
        sim.evict("mnist-worker-1")
        sim.step()
        assert len(groups(sim)) <= 2
        sim.gone()
        sim.step()
        place(sim)
        sim.step()
        assert sim.status["gang"]["generation"] == generation
        assert set(groups(sim)) == {g(sim, generation)}, generation


def test_kubernetes_gang_takes_the_priority_class_its_templates_name_when_the_job_names_none():
    """Issue 46: kube-scheduler refuses a group whose pods' priority differs from the group's: the PodGroup and its
    Workload template get the class every training template names."""
    document = mwms()
    for spec in document["spec"]["replicaSpecs"].values():
        spec["template"]["spec"]["priorityClassName"] = "research"
    sim = cluster(document, native=True)
    sim.step()
    assert sim.status["gang"]["scheduler"] == native.NAME
    assert groups(sim)[g(sim, 0)]["spec"]["priorityClassName"] == "research"
    workload = sim.api.others[("Workload", native.workload_name(sim.job))]
    assert workload["spec"]["podGroupTemplates"][0]["priorityClassName"] == "research"
    assert {p["spec"]["priorityClassName"] for p in sim.pods.values()} == {"research"}


def test_templates_of_different_priority_classes_are_never_put_in_one_kubernetes_gang():
    document = mwms()
    document["spec"]["replicaSpecs"]["chief"]["template"]["spec"]["priorityClassName"] = "high"
    sim = cluster(document, native=True)  # Auto: not Kubernetes' gang, which would refuse the group for good
    sim.step()
    assert sim.status["gang"]["scheduler"] == "None" and groups(sim) == {}
    explicit = mwms(gangScheduler="Kubernetes")
    explicit["spec"]["replicaSpecs"]["chief"]["template"]["spec"]["priorityClassName"] = "high"
    sim = cluster(explicit, native=True)
    sim.step()
    assert (sim.status["phase"], sim.status["reason"]) == ("Failed", "GangSchedulerUnavailable")
    assert "set spec.priorityClassName" in sim.condition()["message"] and sim.pods == {}


@pytest.mark.parametrize("kubernetes", [True, False], ids=["kubernetes", "volcano"])
def test_a_job_created_again_under_its_name_never_joins_the_old_jobs_podgroup(kubernetes):
    """Issue 46: the old job's PodGroup outlives it while its pods terminate (its protection finalizer); the new job
    makes and uses groups of its own, named for its uid, and never touches the old one."""
    document = mwms() if kubernetes else mwms(gangScheduler="Volcano")
    sim = cluster(document, native=kubernetes, volcano=not kubernetes)
    sim.step()
    old = sim.job
    old_group = g(sim, 0)
    sim.api.delete_job(*sim.key)  # the old PodGroup stays (the fake API collects no garbage)
    sim.api.deliver(sim.controller)
    sim.controller.reconcile(sim.key)
    for name in list(sim.pods):
        sim.api.remove_pod(name)
    smaller = mwms() if kubernetes else mwms(gangScheduler="Volcano")
    smaller["spec"]["replicaSpecs"]["worker"]["replicas"] = 1
    sim.api.add_job(smaller)
    sim.step()
    assert sim.job["metadata"]["uid"] != old["metadata"]["uid"]
    assert g(sim, 0) != old_group and old_group in groups(sim)  # the old one untouched
    mine = groups(sim)[g(sim, 0)]
    assert mine["metadata"]["ownerReferences"][0]["uid"] == sim.job["metadata"]["uid"]
    assert {pod_group_of_pod(p) for n, p in sim.pods.items() if "evaluator" not in n} == {g(sim, 0)}
    if kubernetes:
        assert mine["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}
        assert native.workload_name(sim.job) != native.workload_name(old)


def test_a_schedulers_transient_error_is_no_reason_to_say_a_gang_waits():
    """Issue 46, what `make demo` showed a newcomer: `SchedulerError: error in "DynamicResources" PodGroupPostFilter
    plugins: not found` on the PodGroup of a gang placed a second later is not GangWaiting, nor a Warning."""
    sim = cluster(mwms(), native=True)
    sim.step()
    transient = 'error in "DynamicResources" PodGroupPostFilter plugins: not found'
    group_says(sim, g(sim, 0), {"type": "PodGroupInitiallyScheduled", "status": "False", "reason": "SchedulerError",
                                "message": transient})  # fmt: skip
    sim.step()
    assert sim.status["reason"] == "PodsStarting"
    assert [(t, r) for t, r, _ in sim.api.recorded if t == "Warning"] == []
    place(sim)
    sim.step()
    assert sim.status["phase"] == "Running"
    assert [(t, r) for t, r, _ in sim.api.recorded if t == "Warning"] == []


def test_gang_waiting_is_a_normal_event():
    sim = cluster(mwms(), native=True)
    sim.step()
    sim.step()  # its pods exist: the gang waits from now
    sim.step(advance=30)  # past the scheduling grace: worth saying
    assert sim.status["reason"] == "GangWaiting"
    assert ("Normal", "GangWaiting") in [(t, r) for t, r, _ in sim.api.recorded]
    assert "GangWaiting" not in [r for t, r, _ in sim.api.recorded if t == "Warning"]


def test_the_startup_timeout_never_counts_while_a_gang_is_not_placed_even_before_its_wait_is_said():
    """Issue 46: startupTimeoutSeconds shorter than the scheduling grace (30 s) ran out before GangWaiting was said."""
    document = mwms()
    document["spec"]["runPolicy"]["startupTimeoutSeconds"] = 10
    sim = cluster(document, native=True)
    sim.step()
    place(sim, "mnist-evaluator-0")
    sim.step(advance=20)  # past the startup timeout, inside the grace: the gang is the schedule timeout's
    assert sim.status["phase"] == "Pending" and sim.status["reason"] == "PodsStarting", sim.status
    place(sim, "mnist-chief-0", "mnist-worker-0", "mnist-worker-1", "mnist-worker-2")
    sim.step()
    assert sim.status["phase"] == "Running"


def test_a_job_whose_training_runs_while_its_evaluator_waits_says_running_and_why_the_evaluator_waits():
    sim = cluster(mwms(), native=True)
    sim.step()
    place(sim, "mnist-chief-0", "mnist-worker-0", "mnist-worker-1", "mnist-worker-2")
    unschedulable(sim, "mnist-evaluator-0", "Unschedulable", NO_ROOM)
    sim.step(advance=31)
    assert (sim.status["phase"], sim.status["reason"]) == ("Running", "EvaluatorPending")
    assert NO_ROOM in sim.condition()["message"] and "the training runs" in sim.condition()["message"]
    place(sim, "mnist-evaluator-0")
    sim.step()
    assert (sim.status["phase"], sim.status["reason"]) == ("Running", "AllPodsRunning")


def test_a_podgroup_delete_that_keeps_failing_never_freezes_the_jobs_status():
    """Issue 46: the failing delete raised before the job's status was written."""
    from kubetf.cluster.kube_api import NotServed

    sim = cluster(mwms(), native=True)
    sim.step()
    place(sim)
    sim.step()
    sim.evict("mnist-worker-1")
    sim.step()
    sim.api.refuse_write[g(sim, 0)] = NotServed(503, "the webhook is unavailable")
    sim.gone()
    sim.api.deliver(sim.controller)
    with pytest.raises(NotServed):
        sim.controller.reconcile(sim.key)  # retried with the job's backoff ...
    assert sim.status["tasks"]["worker-1"]["state"] == "Created"  # ... its replacements recorded all the same
    place(sim)
    sim.api.deliver(sim.controller)
    with pytest.raises(NotServed):
        sim.controller.reconcile(sim.key)
    assert sim.status["phase"] == "Running"
    del sim.api.refuse_write[g(sim, 0)]
    sim.step()
    assert g(sim, 0) not in groups(sim)
