"""Gang scheduling without Kueue (docs/gang-scheduling.md) on the 1.37 cluster, for both gang schedulers a job can
name: Kubernetes' own (the Workload API and kube-scheduler's GangScheduling plugin) and Volcano.

Every test has fake kwok nodes of its own (tests/cluster/kwok.py `ensure_dedicated_node`): a node of a chosen number
of fake GPUs that only the test's pods tolerate and select, so other tests' GPU pods never take its GPUs, and the
arithmetic of "two jobs that each need more than half of them" holds. The pods run nothing: kwok makes them Running
once bound and ends them when their annotations say (`kwok.kubetf.io/exit-code`, `exit-after`) or when a test
annotates one. What the tests look at is where and when the schedulers bound the pods (`spec.nodeName`), from one
watch over the whole test (`Timeline`): never from samples.
"""

from __future__ import annotations

import contextlib
import functools
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import yaml

from kubetf.core import api
from kubetf.core import status as st
from kubetf.core.scheduling import gangs, native
from kubetf.core.scheduling import volcano as volcano_gang  # (`volcano` is the fixture that installs it)
from tests.cluster import kwok
from tests.cluster.fixture import KubeCluster, wait_for
from tests.e2e.conftest import ROOT
from tests.integration.conftest import Cluster

SCHEDULERS = [
    pytest.param(
        native.NAME,
        marks=pytest.mark.k8s_min("1.37", reason="Kubernetes' own gang scheduling, scheduling.k8s.io/v1beta1"),
    ),
    volcano_gang.NAME,
]
SHORT = {native.NAME: "k8s", volcano_gang.NAME: "volcano"}
IMAGE = "kubetf/python-base:bookworm"  # never pulled: kwok runs no containers
ROUNDS = 10
TIMEOUT = 20  # scheduleTimeoutSeconds of the gangs that cannot fit: the test runs past it


# ---------------------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(params=SCHEDULERS)
def scheduler(request) -> str:
    if request.param == volcano_gang.NAME:
        request.getfixturevalue("volcano")  # installed once per run when missing; the operator sees it
    return request.param


@pytest.fixture
def nodes(installed) -> Iterator[Callable[[str, int], str]]:
    """Makes the test's own dedicated fake nodes (name, GPUs); deletes them after the test (after its namespace: this
    fixture is set up before it, by `space`)."""
    made: list[str] = []

    def make(name: str, gpus: int) -> str:
        made.append(name)
        return kwok.ensure_dedicated_node(installed.kubeconfig, installed.core, name, gpus)

    yield make
    kwok.delete_dedicated_nodes(installed.kubeconfig, *made)


@pytest.fixture(autouse=True)
def watches_end() -> Iterator[None]:
    """The watches a test opened end with it, passed or not."""
    yield
    while Recorder.open:
        Recorder.open[-1].close()


@pytest.fixture
def space(nodes, namespace) -> str:
    """The test's namespace, deleted before its nodes are."""
    return namespace


# -------------------------------------------------------------------------------------------------------------- jobs


def fake_template(node: str, exit_after: str | None = None) -> dict:
    """A pod template for the dedicated fake node; with `exit_after`, its pods end with exit code 0 by themselves."""
    annotations = {kwok.EXIT_CODE: "0", kwok.EXIT_AFTER: exit_after} if exit_after else {}
    container = {"name": "tensorflow", "image": IMAGE, "command": ["python", "-c", "pass"]}
    return {"metadata": {"annotations": annotations}, "spec": kwok.on_dedicated_node({"containers": [container]}, node)}


def mwms(node: str, scheduler: str, workers: int = 2, exit_after: str | None = None, **policy: Any) -> dict:
    """A chief and `workers` workers, one GPU each, gang-scheduled by `scheduler`."""
    template = fake_template(node, exit_after)
    return {
        "strategy": "MultiWorkerMirrored",
        "replicaSpecs": {
            "chief": {"replicas": 1, "gpus": 1, "template": template},
            "worker": {"replicas": workers, "gpus": 1, "template": template},
        },
        "runPolicy": {"backoffSeconds": 0, "schedulingPolicy": {"gangScheduler": scheduler, **policy}},
    }


def parameter_server(node: str, scheduler: str, workers: int = 2) -> dict:
    """A chief and `workers` workers of one GPU each, and a ps of none."""
    template = fake_template(node)
    return {
        "strategy": "ParameterServer",
        "replicaSpecs": {
            "chief": {"replicas": 1, "gpus": 1, "template": template},
            "worker": {"replicas": workers, "gpus": 1, "template": template},
            "ps": {"replicas": 1, "template": template},
        },
        "runPolicy": {"backoffSeconds": 0, "schedulingPolicy": {"gangScheduler": scheduler}},
    }


def create(cluster: Cluster, namespace: str, name: str, spec: dict) -> None:
    cluster.create_job(namespace, name, spec)


def condition(status: dict) -> dict:
    """The job's current condition (the one of its phase)."""
    return next((c for c in status.get("conditions") or [] if c.get("type") == status.get("phase")), {})


def reason_is(cluster: Cluster, namespace: str, name: str, phase: str, reason: str, timeout: float) -> dict:
    def check():
        status = cluster.status(namespace, name)
        return status if status.get("phase") == phase and condition(status).get("reason") == reason else None

    return wait_for(check, timeout, lambda: f"{name} {phase} ({reason}): {cluster.describe(namespace, name)}")


def pod_groups(cluster: Cluster, namespace: str, scheduler: str) -> dict[str, dict]:
    group, version = (
        (native.GROUP, native.VERSION) if scheduler == native.NAME
        else (volcano_gang.GROUP, volcano_gang.VERSION)
    )  # fmt: skip
    items = cluster.custom.list_namespaced_custom_object(group, version, namespace, "podgroups")["items"]
    return {g["metadata"]["name"]: g for g in items}


def group_condition(group: dict, kind: str) -> dict:
    return next((c for c in (group.get("status") or {}).get("conditions") or [] if c.get("type") == kind), {})


def live(cluster: Cluster, namespace: str, job: str, count: int, attempt: int | None = None) -> dict[str, dict]:
    """The job's `count` live pods (of that attempt), all Running: bound, and started by kwok."""

    def ready(pods: dict[str, dict]) -> bool:
        if attempt is not None:
            pods = {n: p for n, p in pods.items() if p["metadata"]["labels"][api.LABEL_ATTEMPT] == str(attempt)}
        return len(pods) == count and all((p.get("status") or {}).get("phase") == "Running" for p in pods.values())

    return cluster.wait_pods(namespace, job, ready, f"{count} pods of {job} Running", timeout=120)


def annotate_exit(cluster: Cluster, pod: dict, code: int) -> None:
    """The pod's program ends now with `code` (kwok-stages.yaml pod-exit)."""
    meta = pod["metadata"]
    cluster.core.patch_namespaced_pod(meta["name"], meta["namespace"], {"metadata": {"annotations": {
        kwok.EXIT_CODE: str(code)}}})  # fmt: skip


def group(cluster: Cluster, namespace: str, job: str, generation: int) -> str:
    """The name of the job's PodGroup of that generation: it carries the job's uid (kubetf.core.scheduling.gangs)."""
    found = cluster.job(namespace, job)
    assert found is not None, f"{job} not found"
    return gangs.group_name(found, generation)


def gang_events(cluster: Cluster, namespace: str, name: str) -> list[str]:
    return [e["reason"] for e in cluster.events(namespace, name) if e["reason"].startswith("Gang")]


# --------------------------------------------------------------------------------------------------------- the watch


@dataclass(frozen=True)
class PodEvent:
    seq: int
    at: float  # time.monotonic() when the test received it
    type: str  # ADDED | MODIFIED | DELETED
    name: str
    uid: str
    job: str
    attempt: int
    node: str | None
    phase: str | None
    gpus: int
    group: str | None  # the PodGroup the pod is in (either scheduler)

    @property
    def ended(self) -> bool:
        """The pod no longer holds its node's resources (the schedulers free those of finished and gone pods)."""
        return self.type == "DELETED" or self.phase in ("Succeeded", "Failed")


class Recorder:
    """Every change of the objects a list call returns, from one watch open from now until `stop` (resumed where it
    left off when the API server ends it). A negative check ("no pod was bound before ...") is made over this whole
    record, never over samples; `events` fails the test when the watch broke, as events may then be missing."""

    open: ClassVar[list[Recorder]] = []  # the watches not stopped yet (`watches_end` closes them)

    def __init__(self, list_call: Callable[..., Any]) -> None:
        self.list_call = list_call
        self.recorded: list[Any] = []
        self.error: BaseException | str | None = None
        self.stopping = threading.Event()
        self.response: Any = None
        version = json.loads(list_call(_preload_content=False).data)["metadata"]["resourceVersion"]
        threading.Thread(target=self._record, args=(version,), daemon=True).start()
        Recorder.open.append(self)

    def _record(self, version: str) -> None:
        try:
            while not self.stopping.is_set():
                self.response = self.list_call(
                    watch=True, resource_version=version, timeout_seconds=60, _preload_content=False
                )
                for line in self.response:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    item = event["object"]
                    if event["type"] == "ERROR":  # a 410: events were missed, the record cannot conclude
                        raise RuntimeError(f"the watch ended with {item.get('code')}: {item.get('message')}")
                    version = item["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        self.recorded.append(self.convert(len(self.recorded), event["type"], item))
        except Exception as error:
            if not self.stopping.is_set():
                self.error = error

    def convert(self, seq: int, type_: str, item: dict) -> Any:
        raise NotImplementedError

    def events(self) -> list[Any]:
        if self.error is not None:
            pytest.fail(f"the watch broke, the record is incomplete: {self.error!r}")
        return list(self.recorded)

    def wait(self, predicate: Callable[[list[Any]], Any], what: str, timeout: float = 60) -> Any:
        return wait_for(lambda: predicate(self.events()), timeout, what)

    def stop(self) -> list[Any]:
        events = self.events()
        self.close()
        return events

    def close(self) -> None:
        self.stopping.set()
        if self.response is not None:
            # Unblocks the read in the recording thread, which then ends. A watch the API server has just ended (each
            # after 60 s) has already given its connection back: nothing to unblock, and urllib3 refuses.
            with contextlib.suppress(RuntimeError, OSError):
                self.response.shutdown()
        if self in Recorder.open:
            Recorder.open.remove(self)


class Timeline(Recorder):
    """Every change of every pod in the namespace (PodEvent)."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        super().__init__(functools.partial(cluster.core.list_namespaced_pod, namespace))

    def convert(self, seq: int, type_: str, pod: dict) -> PodEvent:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        labels = meta.get("labels") or {}
        gpus = sum(
            int(((c.get("resources") or {}).get("limits") or {}).get(api.GPU_RESOURCE, 0))
            for c in spec.get("containers") or []
        )
        return PodEvent(
            seq, time.monotonic(), type_, meta["name"], meta["uid"], labels.get(api.LABEL_JOB, ""),
            int(labels.get(api.LABEL_ATTEMPT, 0)), spec.get("nodeName"), (pod.get("status") or {}).get("phase"),
            gpus, gangs.pod_group_of(pod),
        )  # fmt: skip


@dataclass(frozen=True)
class JobEvent:
    seq: int
    at: float
    name: str
    phase: str | None
    reason: str | None
    message: str


class Conditions(Recorder):
    """Every status the namespace's jobs showed (JobEvent: the phase and its condition's reason and message)."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        list_jobs = cluster.custom.list_namespaced_custom_object
        super().__init__(functools.partial(list_jobs, api.GROUP, api.VERSION, namespace, api.PLURAL))

    def convert(self, seq: int, type_: str, job: dict) -> JobEvent:
        status = job.get("status") or {}
        now = condition(status)
        return JobEvent(
            seq, time.monotonic(), job["metadata"]["name"], status.get("phase"), now.get("reason"),
            now.get("message", ""),
        )  # fmt: skip


def first_seen(events: list[PodEvent], holds: Callable[[PodEvent], bool]) -> dict[str, PodEvent]:
    """uid -> the first event of that pod in which `holds`."""
    first: dict[str, PodEvent] = {}
    for event in events:
        if holds(event) and event.uid not in first:
            first[event.uid] = event
    return first


def bound(events: list[PodEvent]) -> dict[str, PodEvent]:
    """uid -> the event in which the pod was first seen bound to a node."""
    return first_seen(events, lambda e: bool(e.node))


def ended(events: list[PodEvent]) -> dict[str, PodEvent]:
    """uid -> the event in which the pod was first seen finished or gone."""
    return first_seen(events, lambda e: e.ended)


def partial_starts(events: list[PodEvent], capacity: int, gang_size: dict[str, int]) -> list[str]:
    """Every binding that started a gang partially: a pod bound while the rest of its gang (its PodGroup's members
    not bound yet, up to the job's gang size) no longer fitted beside the pods then holding the node's GPUs (and any
    binding beyond the node's GPUs: the scheduler did not count the fake node's nvidia.com/gpu). Replayed
    from the watch in order: a scheduler binds only after it saw the GPUs it counts on freed, so a correct gang
    placement never shows here, and a pod bound ahead of a gang that cannot follow always does."""
    holding: dict[str, PodEvent] = {}  # uid -> latest event, of pods bound and not ended
    known: dict[str, PodEvent] = {}  # uid -> latest event, every pod seen
    placed: dict[str, set[str]] = {}  # PodGroup -> uids ever bound in it
    found = []
    for event in events:
        known[event.uid] = event
        if event.ended:
            holding.pop(event.uid, None)
            continue
        if not event.node or event.uid in holding:
            continue
        holding[event.uid] = event
        group = event.group or event.job
        placed.setdefault(group, set()).add(event.uid)
        members = [e for e in known.values() if (e.group or e.job) == group]
        waiting = [e for e in members if not e.node and not e.ended]
        unseen = max(0, gang_size.get(event.job, 1) - len(placed[group]) - len(waiting))
        missing = sum(e.gpus for e in waiting) + unseen * event.gpus
        free = capacity - sum(e.gpus for e in holding.values())
        if free < 0:
            found.append(f"{event.name} bound (event {event.seq}) beyond the node's {capacity} GPUs: {sorted(holding)}")
        elif missing > free:
            held = sorted(e.name for e in holding.values())
            found.append(
                f"{event.name} bound (event {event.seq}) with {missing} GPUs of its gang {group} still to place and "
                f"{free} free; holding the node: {held}"
            )
    return found


def all_bound(timeline: Timeline, counts: dict[str, int], attempt: int | None = None) -> list[PodEvent]:
    """The record once it holds the binding of `counts[job]` pods of each job (of that attempt): the watch delivers
    what a list already shows a moment later, and the checks over the window need it whole."""

    def holds(events: list[PodEvent]) -> bool:
        binds = [e for e in bound(events).values() if attempt is None or e.attempt == attempt]
        return all(sum(1 for e in binds if e.job == job) >= count for job, count in counts.items())

    return timeline.wait(lambda events: holds(events) and events, f"the watch to show {counts} pods bound")


def placement(events: list[PodEvent], job: str) -> tuple[float, float, float]:
    """(the job's first pod created, its first pod bound, its last pod bound), as the test's monotonic times."""
    created = min(e.at for e in events if e.job == job and e.type == "ADDED")
    binds = [e.at for e in bound(events).values() if e.job == job]
    return created, min(binds), max(binds)


# ----------------------------------------------------------------------------------------------- 1. no partial start


def test_two_gangs_that_each_need_more_than_half_the_gpus_never_start_partially(installed, nodes, space, scheduler):
    """A node of 4 GPUs and two jobs of 3 GPUs each (a chief and two workers), submitted together, 10 times: one gang
    is placed whole while the other waits with no pod bound (scheduled one by one, each could hold 2 GPUs and wait
    for the other forever); once the first ends, the second is placed whole; both succeed."""
    gpus, need = 4, 3
    node = nodes(f"e2e-gang-rounds-{SHORT[scheduler]}", gpus)
    timeline, said = Timeline(installed, space), Conditions(installed, space)
    started = time.monotonic()
    firsts = []
    print(f"{scheduler}: {ROUNDS} rounds of two {need}-GPU gangs submitted together on {gpus} GPUs")
    for i in range(ROUNDS):
        names = [f"r{i}-a", f"r{i}-b"] if i % 2 == 0 else [f"r{i}-b", f"r{i}-a"]  # either one submitted first
        submitted = time.monotonic()
        for name in names:
            create(installed, space, name, mwms(node, scheduler, exit_after="1s"))
        for name in names:
            installed.wait_phase(space, name, "Succeeded", timeout=120)
        done = time.monotonic()
        events = all_bound(timeline, dict.fromkeys(names, need))  # all of each job's pods were bound
        jobs = sorted(names, key=lambda n: placement(events, n)[1])
        first, second = jobs
        firsts.append(first)
        first_placed = placement(events, first)[2]
        second_created, second_bound, second_placed = placement(events, second)
        binds, ends = bound(events), ended(events)
        first_uids = {uid for uid, e in binds.items() if e.job == first}
        second_first = min((e for e in binds.values() if e.job == second), key=lambda e: e.seq)
        still = [uid for uid in first_uids if uid not in ends or ends[uid].seq > second_first.seq]
        print(
            f"  round {i}: {first} placed whole {first_placed - submitted:.1f}s after the submit; {second} waited "
            f"{second_placed - second_created:.1f}s, placed whole {second_placed - second_bound:.2f}s after its first "
            f"pod was bound, with {len(still)} of {first}'s pods still ending; both Succeeded "
            f"{done - submitted:.1f}s after the submit"
        )
    events = timeline.stop()
    print(f"{scheduler}: {ROUNDS} rounds in {time.monotonic() - started:.0f}s")
    said.wait(lambda jobs: {j.name for j in jobs if j.phase == "Succeeded"} >= {f"r{i}-{x}" for i in range(ROUNDS)
              for x in "ab"}, "the watch to show every job Succeeded")  # fmt: skip
    waited = {j.name: j.message for j in said.stop() if j.reason == "GangWaiting"}
    example = next(iter(waited.items()), None)
    print(f"{scheduler}: {len(waited)} of the {ROUNDS} second gangs said GangWaiting, e.g. {example}")
    # a gang placed at once is the usual start: it says PodsStarting as any other, never that it waits
    assert not set(firsts) & set(waited), {name: waited[name] for name in set(firsts) & set(waited)}
    assert {e.node for e in bound(events).values()} == {node}  # the scheduler honoured the taints and selectors
    assert partial_starts(events, gpus, {f"r{i}-{x}": need for i in range(ROUNDS) for x in "ab"}) == []
    # the waiting gang never held a GPU while the other ran: its first pod bound only once the other's were ending
    binds, ends = bound(events), ended(events)
    for i in range(ROUNDS):
        first_bind = {x: min(e.seq for e in binds.values() if e.job == f"r{i}-{x}") for x in "ab"}
        first, second = sorted("ab", key=first_bind.__getitem__)
        ran = [uid for uid, e in binds.items() if e.job == f"r{i}-{first}"
               and (uid not in ends or ends[uid].seq > first_bind[second])]  # fmt: skip
        assert len(ran) <= gpus - need, f"round {i}: r{i}-{second} bound while {len(ran)} pods of r{i}-{first} ran"


# ------------------------------------------------------------------------------------------------------- 2. restarts


def test_a_multi_worker_mirrored_group_restart_is_a_new_gang_placed_whole(installed, nodes, space, scheduler):
    """A worker of a running MWMS job fails (exit 1): the whole chief+worker group restarts as a new gang (its
    PodGroup of the next generation), its three pods placed together, and the old PodGroup goes once none of its
    pods is left."""
    gpus, need = 4, 3
    node = nodes(f"e2e-gang-mwms-{SHORT[scheduler]}", gpus)
    timeline = Timeline(installed, space)
    create(installed, space, "mwms", mwms(node, scheduler))
    pods = live(installed, space, "mwms", need, attempt=0)
    first, second = group(installed, space, "mwms", 0), group(installed, space, "mwms", 1)
    assert {gangs.pod_group_of(p) for p in pods.values()} == {first}

    failed = time.monotonic()
    annotate_exit(installed, pods["mwms-worker-1"], 1)
    pods = live(installed, space, "mwms", need, attempt=1)
    placed = time.monotonic()
    assert {gangs.pod_group_of(p) for p in pods.values()} == {second}
    status = installed.wait_phase(space, "mwms", "Running", timeout=30)
    assert status["restarts"]["failures"] == 1
    assert status["gang"]["podGroup"] == second and status["gang"].get("placedAt")
    groups = wait_for(
        lambda: (g := pod_groups(installed, space, scheduler)) and first not in g and g,
        30, f"the old generation's PodGroup {first} deleted",
    )  # fmt: skip
    assert set(groups) == {second}
    if scheduler == native.NAME:  # placed as a gang of 3, and the scheduler says so on the new PodGroup
        assert groups[second]["spec"]["schedulingPolicy"]["gang"]["minCount"] == need
        scheduled = "PodGroupInitiallyScheduled"
    else:
        assert groups[second]["spec"]["minMember"] == need
        scheduled = "Scheduled"
    wait_for(
        lambda: group_condition(pod_groups(installed, space, scheduler)[second], scheduled).get("status")
        == "True", 30, f"{second} {scheduled}",
    )  # fmt: skip
    events = all_bound(timeline, {"mwms": need}, attempt=1)
    new = [e for e in bound(events).values() if e.attempt == 1]
    print(
        f"{scheduler}: worker failed -> new gang {second} placed whole {placed - failed:.1f}s later (its pods bound "
        f"within {max(e.at for e in new) - min(e.at for e in new):.2f}s)"
    )
    assert len(new) == need and {e.node for e in bound(events).values()} == {node}
    assert partial_starts(events, gpus, {"mwms": need}) == []
    old_ended = max(e.seq for e in ended(events).values() if e.attempt == 0)
    assert min(e.seq for e in new) > old_ended, "a new pod was bound before every old one had stopped"

    annotate_exit(installed, pods["mwms-chief-0"], 0)
    installed.wait_phase(space, "mwms", "Succeeded", timeout=60)
    timeline.stop()


def test_a_parameter_server_workers_replacement_joins_the_running_gang(installed, nodes, space, scheduler):
    """A worker of a running ParameterServer job fails (exit 1): that pod alone is replaced, in the same PodGroup,
    and placed at once although the gang's other three members are bound (they count toward its quorum)."""
    gpus = 4
    node = nodes(f"e2e-gang-ps-{SHORT[scheduler]}", gpus)
    timeline = Timeline(installed, space)
    create(installed, space, "ps", parameter_server(node, scheduler))
    pods = live(installed, space, "ps", 4, attempt=0)
    first = group(installed, space, "ps", 0)
    assert {gangs.pod_group_of(p) for p in pods.values()} == {first}
    others = {n: p["metadata"]["uid"] for n, p in pods.items() if n != "ps-worker-1"}

    said = Conditions(installed, space)  # what the job says from the failure on
    annotate_exit(installed, pods["ps-worker-1"], 1)
    pods = installed.wait_pods(
        space, "ps",
        lambda p: "ps-worker-1" in p and p["ps-worker-1"]["metadata"]["labels"][api.LABEL_ATTEMPT] == "1"
        and (p["ps-worker-1"].get("status") or {}).get("phase") == "Running",
        "the replacement of ps-worker-1 Running", timeout=120,
    )  # fmt: skip
    replacement = pods["ps-worker-1"]
    assert gangs.pod_group_of(replacement) == first
    assert {n: p["metadata"]["uid"] for n, p in pods.items() if n != "ps-worker-1"} == others  # untouched
    status = installed.wait_phase(space, "ps", "Running", timeout=30)
    assert status["restarts"]["failures"] == 1
    assert status["gang"]["podGroup"] == first
    assert set(pod_groups(installed, space, scheduler)) == {first}
    uid = replacement["metadata"]["uid"]
    joined = timeline.wait(lambda events: bound(events).get(uid), "the watch to show the replacement bound")
    created = next(e for e in timeline.events() if e.uid == uid and e.type == "ADDED")
    assert joined.node == node
    said.wait(lambda events: any(e.phase == "Running" for e in events), "the watch to show the job Running again")
    reasons = [r for r in dict.fromkeys(e.reason for e in said.stop()) if r]
    print(
        f"{scheduler}: ps-worker-1's replacement joined {first}, bound {joined.at - created.at:.2f}s after it was "
        f"created; the job said {reasons}"
    )
    assert "GangWaiting" not in reasons

    annotate_exit(installed, pods["ps-chief-0"], 0)
    installed.wait_phase(space, "ps", "Succeeded", timeout=60)
    timeline.stop()


# ------------------------------------------------------------------------------- 2b. what issue 46 found stuck


def test_lone_restarts_that_come_to_cover_every_training_task_keep_joining_the_running_gang(
    installed, nodes, space, scheduler
):
    """Issue 46: a ParameterServer job loses its ps (ps and chief restart), then its worker, then its ps again. Once
    every training task had restarted, the gang's generation (then the lowest attempt) moved on and the ps's lone
    replacement went into a new PodGroup whose quorum it alone could never meet: stuck for good. Now every
    replacement joins the PodGroup its running peers are in and is placed; no PodGroup of the job has fewer running
    members than its minimum once the job runs again."""
    node = nodes(f"e2e-gang-lone-{SHORT[scheduler]}", 2)
    create(installed, space, "lone", parameter_server(node, scheduler, workers=1))
    pods = live(installed, space, "lone", 3, attempt=0)
    first = group(installed, space, "lone", 0)
    for lost in ("lone-ps-0", "lone-worker-0", "lone-ps-0"):
        uid = pods[lost]["metadata"]["uid"]
        failed = time.monotonic()
        annotate_exit(installed, pods[lost], 1)

        def replaced(found: dict[str, dict], lost: str = lost, uid: str = uid) -> bool:
            running = all((p.get("status") or {}).get("phase") == "Running" and p["spec"].get("nodeName")
                          for p in found.values())  # fmt: skip
            return len(found) == 3 and found.get(lost, {}).get("metadata", {}).get("uid") not in (None, uid) and running

        # placed within 30 s (kube-scheduler's retry backoff included): a replacement of a stuck gang never is
        pods = installed.wait_pods(space, "lone", replaced, f"{lost}'s replacement placed", timeout=30)
        print(f"{scheduler}: {lost} failed -> its replacement placed {time.monotonic() - failed:.1f}s later")
        assert {gangs.pod_group_of(p) for p in pods.values()} == {first}
        status = installed.wait_phase(space, "lone", "Running", timeout=30)
        assert status["gang"]["podGroup"] == first and status["gang"]["generation"] == 0
        groups = pod_groups(installed, space, scheduler)
        assert set(groups) == {first}
        minimum = (groups[first]["spec"]["schedulingPolicy"]["gang"]["minCount"] if scheduler == native.NAME
                   else groups[first]["spec"]["minMember"])  # fmt: skip
        assert sum(1 for p in pods.values() if gangs.pod_group_of(p) == first) >= minimum == 3
    assert {p["metadata"]["labels"][api.LABEL_ATTEMPT] for p in pods.values()} != {"0"}
    assert installed.status(space, "lone")["restarts"]["failures"] == 3
    annotate_exit(installed, pods["lone-chief-0"], 0)
    installed.wait_phase(space, "lone", "Succeeded", timeout=60)


def test_five_group_restarts_leave_at_most_two_podgroups_and_none_after_the_job_is_deleted(
    installed, nodes, space, scheduler
):
    node = nodes(f"e2e-gang-five-{SHORT[scheduler]}", 3)
    spec = mwms(node, scheduler)
    spec["runPolicy"]["backoffLimit"] = 10
    create(installed, space, "five", spec)
    pods = live(installed, space, "five", 3, attempt=0)
    most = 0
    for attempt in range(1, 6):
        annotate_exit(installed, pods["five-worker-1"], 1)
        while True:  # every PodGroup the job has, sampled while its new gang comes up
            most = max(most, len(pod_groups(installed, space, scheduler)))
            found = installed.live_pods(space, "five")
            if len(found) == 3 and all(p["metadata"]["labels"][api.LABEL_ATTEMPT] == str(attempt)
                                       and (p.get("status") or {}).get("phase") == "Running"
                                       for p in found.values()):  # fmt: skip
                pods = found
                break
            time.sleep(0.2)
        assert {gangs.pod_group_of(p) for p in pods.values()} == {group(installed, space, "five", attempt)}
    wait_for(lambda: set(pod_groups(installed, space, scheduler)) == {group(installed, space, "five", 5)}, 30,
             "the older generations' PodGroups deleted")  # fmt: skip
    print(f"{scheduler}: at most {most} PodGroups at once over 5 group restarts")
    assert most <= 2
    installed.custom.delete_namespaced_custom_object(api.GROUP, api.VERSION, space, api.PLURAL, "five")
    wait_for(lambda: not pod_groups(installed, space, scheduler), 60, "the job's PodGroups gone with it")


def test_a_job_deleted_and_applied_again_smaller_runs_in_a_podgroup_of_its_own(installed, nodes, space, scheduler):
    """Issue 46: the old job's PodGroup outlives it while its pods terminate; the job applied again under its name
    joined it (the old minimum, the old priority), or waited for good once it went. Now it makes its own."""
    node = nodes(f"e2e-gang-again-{SHORT[scheduler]}", 3)
    create(installed, space, "again", mwms(node, scheduler, workers=2))
    live(installed, space, "again", 3, attempt=0)
    old = installed.job(space, "again")
    assert old is not None
    installed.custom.delete_namespaced_custom_object(api.GROUP, api.VERSION, space, api.PLURAL, "again")
    wait_for(lambda: installed.job(space, "again") is None, 30, "the old job gone")
    create(installed, space, "again", mwms(node, scheduler, workers=1))
    new = installed.job(space, "again")
    assert new is not None and new["metadata"]["uid"] != old["metadata"]["uid"]

    def own(found: dict[str, dict]) -> bool:
        mine = [p for p in found.values() if p["metadata"]["ownerReferences"][0]["uid"] == new["metadata"]["uid"]]
        return len(mine) == 2 and all((p.get("status") or {}).get("phase") == "Running" for p in mine)

    pods = installed.wait_pods(space, "again", own, "the new job's 2 pods Running", timeout=60)
    mine = gangs.group_name(new, 0)
    assert mine != gangs.group_name(old, 0)
    assert {gangs.pod_group_of(p) for p in pods.values()
            if p["metadata"]["ownerReferences"][0]["uid"] == new["metadata"]["uid"]} == {mine}  # fmt: skip
    made = pod_groups(installed, space, scheduler)[mine]
    assert made["metadata"]["ownerReferences"][0]["uid"] == new["metadata"]["uid"]
    minimum = (made["spec"]["schedulingPolicy"]["gang"]["minCount"] if scheduler == native.NAME
               else made["spec"]["minMember"])  # fmt: skip
    assert minimum == 2
    installed.wait_phase(space, "again", "Running", timeout=30)


@pytest.mark.k8s_min("1.37", reason="Kubernetes' own gang scheduling, scheduling.k8s.io/v1beta1")
def test_a_job_whose_templates_name_a_priority_class_runs_under_kubernetes_gang_by_default(installed, nodes, space):
    """Issue 46: the PodGroup got no priority while the pods had their template's, and kube-scheduler 1.37 refused
    the group on every cycle ("all pods in a single pod group should have the same priority")."""
    node = nodes("e2e-gang-priority", 3)
    name = f"kubetf-e2e-{space}"
    installed.scheduling.create_priority_class({"metadata": {"name": name}, "value": 100})
    try:
        spec = mwms(node, "Auto")
        del spec["runPolicy"]["schedulingPolicy"]["gangScheduler"]
        for replica in spec["replicaSpecs"].values():
            replica["template"] = {**replica["template"],
                                   "spec": {**replica["template"]["spec"], "priorityClassName": name}}  # fmt: skip
        create(installed, space, "classy", spec)
        pods = live(installed, space, "classy", 3, attempt=0)
        status = installed.wait_phase(space, "classy", "Running", timeout=30)
        assert status["gang"]["scheduler"] == native.NAME
        assert {p["spec"]["priorityClassName"] for p in pods.values()} == {name}
        assert pod_groups(installed, space, native.NAME)[group(installed, space, "classy", 0)]["spec"][
            "priorityClassName"] == name  # fmt: skip
    finally:
        installed.scheduling.delete_priority_class(name)


# ----------------------------------------------------------------------------------------------------- 3. cannot fit


def test_a_gang_that_cannot_fit_says_why_and_honours_its_schedule_timeout(installed, nodes, space, scheduler):
    """Two jobs of 5 GPUs on a node of 4, scheduleTimeoutSeconds 20: both say GangWaiting with the scheduler's own
    words and no pod of theirs is ever bound; past the timeout, `fails` (onScheduleTimeout: Fail) is Failed and its
    pods gone, `waits` (Wait) stays Pending saying GangScheduleTimeout, and is placed whole once the node has room."""
    gpus, need = 4, 5
    node = nodes(f"e2e-gang-timeout-{SHORT[scheduler]}", gpus)
    timeline = Timeline(installed, space)
    policy = {"scheduleTimeoutSeconds": TIMEOUT}
    create(installed, space, "fails", mwms(node, scheduler, workers=need - 1, onScheduleTimeout="Fail", **policy))
    create(installed, space, "waits", mwms(node, scheduler, workers=need - 1, onScheduleTimeout="Wait", **policy))
    created = time.monotonic()

    # what the scheduler says, in the job's condition: a user reads why without looking at pods or PodGroups. The pod
    # that finds no room says so (both schedulers); Kubernetes' PodGroup adds its quorum, Volcano's its gang's count
    words = ["Insufficient nvidia.com/gpu", "minCount (5) cannot be satisfied" if scheduler == native.NAME
             else "1/5 tasks in gang unschedulable"]  # fmt: skip
    for name in ("fails", "waits"):
        message = wait_for(
            lambda name=name: (c := condition(installed.status(space, name))).get("reason") == "GangWaiting"
            and all(w in c.get("message", "") for w in words) and c["message"],
            60, lambda name=name: f"{name} GangWaiting with {words}: {installed.describe(space, name)}",
        )  # fmt: skip
        print(f"{scheduler}: {name} GangWaiting after {time.monotonic() - created:.1f}s: {message}")
        says_why_once(message, words)

    status = reason_is(installed, space, "fails", "Failed", "GangScheduleTimeout", TIMEOUT + 60)
    took = time.monotonic() - created
    print(f"{scheduler}: fails Failed {took:.1f}s after it was created: {condition(status)['message']}")
    says_why_once(condition(status)["message"], words)
    since = status["gang"]["waitingSince"]
    failed_at = condition(status)["lastTransitionTime"]
    assert _seconds(failed_at) - _seconds(since) >= TIMEOUT, (since, failed_at)
    # A failure's event goes out after its deletes, a moment after the status says it.
    wait_for(lambda: "GangScheduleTimeout" in gang_events(installed, space, "fails"), 15, "its GangScheduleTimeout")
    status = reason_is(installed, space, "waits", "Pending", "GangScheduleTimeout", 30)
    print(f"{scheduler}: waits Pending: {condition(status)['message']}")
    says_why_once(condition(status)["message"], words)
    assert "GangScheduleTimeout" in gang_events(installed, space, "waits")

    # every pod of `fails` gone, and none of them, nor of `waits`, ever bound
    uids = {e.uid for e in timeline.events() if e.job == "fails"}
    assert len(uids) == need
    timeline.wait(lambda events: uids <= {e.uid for e in events if e.type == "DELETED"}, "the pods of fails gone")
    waiting = installed.live_pods(space, "waits")
    assert len(waiting) == need and not any(p["spec"].get("nodeName") for p in waiting.values())  # bound stays bound
    assert not bound(timeline.events()), "a pod of a gang that cannot fit was bound"

    # `waits` waited on: once the node has room, its gang is placed whole
    grown = time.monotonic()
    room = {api.GPU_RESOURCE: str(need + 1)}
    installed.core.patch_node_status(node, {"status": {"capacity": room, "allocatable": room}})
    live(installed, space, "waits", need)
    installed.wait_phase(space, "waits", "Running", timeout=60)
    all_bound(timeline, {"waits": need})
    events = timeline.stop()
    print(f"{scheduler}: waits placed whole {time.monotonic() - grown:.1f}s after the node grew to {need + 1} GPUs")
    assert partial_starts(events, need + 1, {"waits": need}) == []
    assert {(e.job, e.node) for e in bound(events).values()} == {("waits", node)}


def says_why_once(message: str, words: list[str]) -> None:
    """The scheduler's words: what does not fit (a pod's, and the PodGroup's may repeat it from another moment),
    the gang's state once (Kubernetes' pods echo their PodGroup's); not Volcano's about the pods that would fit."""
    no_room, gang_state = words
    assert no_room in message and message.count(gang_state) == 1, message
    assert "can possibly be assigned" not in message, message


def _seconds(timestamp: str) -> float:
    parsed = st.parse_time(timestamp)
    assert parsed is not None, timestamp
    return parsed


# ---------------------------------------------------------------------------------------------- 4. a converted TFJob


TFJOB = """
apiVersion: kubeflow.org/v1
kind: TFJob
metadata:
  name: mnist-volcano
spec:
  runPolicy:
    schedulingPolicy: {minAvailable: 3, queue: default}
  tfReplicaSpecs:
    Chief:
      replicas: 1
      restartPolicy: OnFailure
      template: &template
        metadata:
          annotations: {kwok.kubetf.io/exit-code: "0", kwok.kubetf.io/exit-after: 2s}
        spec:
          schedulerName: volcano
          containers:
          - name: tensorflow
            image: kubetf/python-base:bookworm
            command: [python, /app/mnist.py]
            resources: {limits: {nvidia.com/gpu: 1}}
    Worker:
      replicas: 2
      restartPolicy: OnFailure
      template: *template
"""


def test_a_converted_tfjob_with_a_volcano_scheduling_policy_runs_gang_scheduled(
    installed, volcano, nodes, space, tmp_path
):
    """Kubeflow's TFJob whose pods name Volcano, with runPolicy.schedulingPolicy {minAvailable: 3, queue: default},
    converted by `kubetf convert` and applied: Volcano places its three pods together through a PodGroup of
    minMember 3 in the queue default, and the job succeeds."""
    gpus, need = 4, 3
    node = nodes("e2e-gang-tfjob", gpus)
    tfjob = yaml.safe_load(TFJOB)
    template = tfjob["spec"]["tfReplicaSpecs"]["Chief"]["template"]
    template["spec"] = kwok.on_dedicated_node(template["spec"], node)  # the test's node (the anchor shares it)
    source = tmp_path / "tfjob.yaml"
    source.write_text(yaml.safe_dump(tfjob))
    converted = subprocess.run(
        [sys.executable, "-m", "kubetf.cli", "convert", "-f", str(source)],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )  # fmt: skip
    print(f"kubetf convert said:\n{converted.stderr}")
    assert converted.returncode == 0, converted.stderr
    job = next(d for d in yaml.safe_load_all(converted.stdout) if d)
    assert job["spec"]["runPolicy"]["schedulingPolicy"]["gangScheduler"] == volcano_gang.NAME

    timeline = Timeline(installed, space)
    KubeCluster(installed.kubeconfig, local=False).kubectl("apply", "-n", space, "-f", "-", input=converted.stdout)
    groups = wait_for(lambda: pod_groups(installed, space, volcano_gang.NAME), 30, "the job's Volcano PodGroup")
    first = group(installed, space, "mnist-volcano", 0)
    spec = groups[first]["spec"]
    assert spec["minMember"] == need and spec["queue"] == "default"
    assert spec["minResources"] == {api.GPU_RESOURCE: str(need)}
    installed.wait_phase(space, "mnist-volcano", "Succeeded", timeout=120)
    all_bound(timeline, {"mnist-volcano": need})
    events = timeline.stop()
    binds = bound(events)
    assert len(binds) == need and {e.node for e in binds.values()} == {node}
    assert {e.group for e in binds.values()} == {first}  # scheduling.k8s.io/group-name
    assert partial_starts(events, gpus, {"mnist-volcano": need}) == []
    times = [e.at for e in binds.values()]
    print(f"converted TFJob: its {need} pods bound within {max(times) - min(times):.2f}s by Volcano, then Succeeded")
