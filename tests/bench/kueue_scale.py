"""Kueue at scale on kwok's fake nodes, with the real Kueue: prints numbers, asserts nothing.

    python -m tests.bench.kueue_scale [--queued 5000] [--admit 1000] [--chain 100]
    make bench-kueue-scale ARGS="--queued 500 --admit 100 --chain 20"

Jobs of 1 chief + 4 workers (MultiWorkerMirrored, 10m CPU a pod) in one LocalQueue of a ClusterQueue that Kueue
manages; their pods go to the fake nodes once admitted. In order:

1. --queued jobs created while the ClusterQueue has no quota: every one Queued with its Workload (made by the
   operator) and no pod. The pods in the namespace meanwhile (none is the point), the time until all are Queued;
   then, for --window seconds while they wait: the operator's API calls per second (all of them, and without its
   leader election's Lease renewals), its CPU and RSS;
2. quota for --admit of them: from each one's admission (its Workload's Admitted condition) to its 5 pods Running,
   p50/p99, and the time until all are Running;
3. a priority chain in a ClusterQueue of quota for one job (StrictFIFO: see --chain-queueing): --chain jobs, each
   of a higher WorkloadPriorityClass than the last, each preempting the one before; then whichever job runs ends,
   again and again, until all have Succeeded: the order they finished in (an inversion: one finished before a
   higher one still waiting), and every job's disruptions as the operator counted them against Kueue's Preempted
   events for its Workload.

The operator runs out of cluster as a subprocess with /metrics on (tests/bench/scale.py Process), alone: an installed
one is scaled to zero meanwhile. Uses $KUBECONFIG, else brings the local cluster up; installs Kueue and adds fake
nodes as needed. Namespaces, queues and priority classes are deleted at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import math
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from kubetf.core import api
from kubetf.core import status as st
from kubetf.core.scheduling import workload as kueue
from tests.bench.scale import (
    PODS_PER_FAKE_NODE,
    Process,
    RawWatch,
    create_namespace,
    fmt_ms,
    out,
    parallel,
)
from tests.cluster import kwok
from tests.cluster.fixture import ensure_cluster
from tests.cluster.queues import FLAVOR, make_flavor
from tests.integration.conftest import (
    Cluster,
    pause_installed_operators,
    pod_template,
    replica,
    resume_installed_operators,
)

PODS_PER_JOB = 5
CPU_PER_POD = 10  # millicores
GROUP, VERSION = kueue.GROUP, kueue.VERSION
ENDED = ("Succeeded", "Restarting", "Queued")  # a chain job's run is over (its watch may say Pending a moment after)


def template() -> dict:
    spec = pod_template()["spec"]
    del spec["schedulerName"]  # the real scheduler places them, on fake nodes
    spec["containers"][0]["resources"] = {"requests": {"cpu": f"{CPU_PER_POD}m"}}
    return {"spec": kwok.on_fake_nodes(spec)}


def job_spec() -> dict:
    return {
        "strategy": "MultiWorkerMirrored",
        "replicaSpecs": {
            "chief": {**replica(1), "template": template()},
            "worker": {**replica(4), "template": template()},
        },
        "runPolicy": {"startupTimeoutSeconds": 7200},
    }


def cluster_queue(cluster: Cluster, name: str, jobs: int, preempt: bool = False, strategy: str | None = None) -> None:
    """A ClusterQueue with CPU quota for `jobs` jobs (patched if it exists)."""
    quota = f"{jobs * PODS_PER_JOB * CPU_PER_POD}m"
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": ["cpu"],
                "flavors": [{"name": FLAVOR, "resources": [{"name": "cpu", "nominalQuota": quota}]}],
            }
        ],
    }
    if preempt:
        spec["preemption"] = {"withinClusterQueue": "LowerPriority"}
    if strategy:
        spec["queueingStrategy"] = strategy
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}
    try:
        cluster.custom.create_cluster_custom_object(GROUP, VERSION, "clusterqueues", body)
    except ApiException as error:
        if error.status != 409:
            raise
        cluster.custom.patch_cluster_custom_object(GROUP, VERSION, "clusterqueues", name, {"spec": spec})


def local_queue(cluster: Cluster, namespace: str, name: str, cq: str) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LocalQueue",
        "metadata": {"name": name},
        "spec": {"clusterQueue": cq},
    }
    cluster.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "localqueues", body)


class Jobs:
    """What the benchmark knows of its namespace, from watches: jobs' phases and restarts, pods by job (attempt,
    phase), Workloads by job."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.phases: dict[str, str] = {}
        self.restarts: dict[str, dict] = {}
        self.pods: dict[str, dict[str, tuple[str, str]]] = {}  # job -> pod -> (attempt, phase)
        self.workloads: dict[str, dict] = {}  # job -> its Workload's status
        self.workload_jobs: dict[str, str] = {}  # Workload name -> its job
        self.most_pods = 0  # the most pods the namespace had at once
        self.running_seen: dict[str, float] = {}  # job -> when all 5 of its live pods were Running (first time)

    def on_job(self, kind: str, job: dict) -> None:
        with self.lock:
            name = job["metadata"]["name"]
            status = job.get("status") or {}
            self.phases[name] = "" if kind == "DELETED" else status.get("phase", "")
            self.restarts[name] = status.get("restarts") or {}

    def on_pod(self, kind: str, pod: dict) -> None:
        meta = pod["metadata"]
        job = (meta.get("labels") or {}).get(api.LABEL_JOB)
        if job is None:
            return
        now = time.monotonic()
        with self.lock:
            pods = self.pods.setdefault(job, {})
            if kind == "DELETED" or meta.get("deletionTimestamp"):
                pods.pop(meta["name"], None)
            else:
                attempt = meta["labels"].get(api.LABEL_ATTEMPT, "")
                pods[meta["name"]] = (attempt, (pod.get("status") or {}).get("phase", ""))
            live = list(pods.values())
            self.most_pods = max(self.most_pods, sum(len(p) for p in self.pods.values()))
            if len(live) == PODS_PER_JOB and all(p == "Running" for _, p in live):
                self.running_seen.setdefault(job, now)

    def on_workload(self, kind: str, workload: dict) -> None:
        job = (workload["metadata"].get("labels") or {}).get(api.LABEL_JOB)
        if job is None:
            return
        with self.lock:
            self.workloads[job] = workload.get("status") or {}
            self.workload_jobs[workload["metadata"]["name"]] = job

    def count(self, predicate) -> int:
        with self.lock:
            return sum(1 for name in list(self.phases) if predicate(name))

    def queued(self, name: str) -> bool:
        """Queued, with its Workload and no pod."""
        return self.phases.get(name) == "Queued" and not self.pods.get(name) and name in self.workloads

    def running(self, name: str) -> bool:
        pods = self.pods.get(name, {})
        return len(pods) == PODS_PER_JOB and all(p == "Running" for _, p in pods.values())

    def admitted_at(self, job: str) -> float | None:
        """The wall-clock time of the job's Workload's Admitted condition."""
        for condition in (self.workloads.get(job) or {}).get("conditions") or []:
            if condition.get("type") == "Admitted" and condition.get("status") == "True":
                return st.parse_time(condition.get("lastTransitionTime"))
        return None


def wait(check, timeout: float, what: str, every: float = 60.0) -> Any:
    """Poll `check` until it returns something true, and return that."""
    start = time.monotonic()
    report = start + every
    while not (value := check()):
        now = time.monotonic()
        if now > start + timeout:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        if now > report:
            report += every
            out(f"  ... {now - start:.0f}s waiting for {what}")
        time.sleep(0.5)
    return value


def api_rate(process: Process, seconds: float) -> tuple[float, float, Counter]:
    """API calls per second over `seconds`: all, and without the Lease renewals; the top calls."""
    before_all, before = process.all_api_calls(), process.api_calls()
    time.sleep(seconds)
    after_all, after = process.all_api_calls(), process.api_calls()
    total = sum((after_all - before_all).values()) / seconds
    without_lease = sum((after - before).values()) / seconds
    return total, without_lease, after - before


def queued_phase(cluster: Cluster, process: Process, state: Jobs, namespace: str, count: int, window: float) -> None:
    names = [f"q-{i}" for i in range(count)]
    start = time.monotonic()
    cpu = process.cpu()
    parallel(lambda n: cluster.create_job(namespace, n, job_spec(), labels={kueue.QUEUE_LABEL: "bench"}), names)
    created = time.monotonic()
    out(f"{count} jobs created in {created - start:.0f}s ({count / (created - start):.1f}/s)")
    wait(lambda: state.count(state.queued) == count, 3600, f"{count} jobs Queued, each with its Workload and no pod")
    with state.lock:
        workloads, most_pods = len(state.workloads), state.most_pods
    out(
        f"all {count} Queued, each with its Workload and no pod, {time.monotonic() - start:.0f}s after the first "
        f"create; Workloads {workloads}; pods in the namespace meanwhile: at most {most_pods}; operator CPU "
        f"{(process.cpu() - cpu) * 1000 / count:.1f} ms per job"
    )
    time.sleep(30)  # the creation's tail: Kueue's own updates of the Workloads settle
    cpu = process.cpu()
    total, ours, top = api_rate(process, window)
    used = process.cpu() - cpu
    common = ", ".join(f"{verb} {resource} {n / window:.2f}/s" for (verb, resource), n in top.most_common(5))
    out(
        f"while {count} jobs wait ({window:.0f}s): {total:.2f} API calls/s in all, {ours:.2f}/s without the "
        f"Lease renewals ({common or 'none'}); CPU {used / window * 100:.1f}% of a core; RSS {process.rss():.0f} MiB"
    )


def admit_phase(cluster: Cluster, state: Jobs, cq: str, count: int, admitted: int) -> None:
    cluster_queue(cluster, cq, admitted)
    raised = time.time()
    start = time.monotonic()
    wait(lambda: len(state.running_seen) >= admitted, 3600, f"{admitted} jobs' pods Running")
    took = time.monotonic() - start
    with state.lock:
        spans = []
        for job, seen_running in state.running_seen.items():
            admitted_wall = state.admitted_at(job)
            if admitted_wall is not None:
                # The Workload's condition is wall time (1 s resolution), the benchmark's own times monotonic.
                spans.append(max(0.0, (seen_running - start) + raised - admitted_wall))
    out(
        f"quota raised for {admitted} of {count}: all {admitted} Running in {took:.0f}s; admission -> 5 pods Running "
        f"{fmt_ms(spans)}"
    )


def chain_phase(cluster: Cluster, namespace: str, state: Jobs, length: int) -> None:
    """Each job preempts the one before; then the running one ends, again and again."""
    classes = [f"kubetf-bench-chain-{i}" for i in range(length)]
    for i, name in enumerate(classes):
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": name},
            "value": 1000 + i,
        }
        try:
            cluster.custom.create_cluster_custom_object(GROUP, VERSION, "workloadpriorityclasses", body)
        except ApiException as error:
            if error.status != 409:
                raise
    start = time.monotonic()
    for i in range(length):
        labels = {kueue.QUEUE_LABEL: "chain", kueue.PRIORITY_LABEL: classes[i]}
        cluster.create_job(namespace, f"c-{i}", job_spec(), labels=labels)
        wait(lambda i=i: f"c-{i}" in state.running_seen, 600, f"c-{i} running (preempting c-{i - 1})")
    out(f"chain of {length}: each job preempted the one before, {time.monotonic() - start:.0f}s")
    waiting = [f"c-{i}" for i in range(length - 1)]
    wait(lambda: all(state.queued(j) for j in waiting), 600, "every preempted job Queued, with no pod")
    out(f"  ... and every preempted job Queued again with no pod, {time.monotonic() - start:.0f}s")
    finished: list[int] = []

    def running() -> str | None:
        with state.lock:  # the watches say which job may run; the API confirms it before its chief is told to exit
            seen = [j for j in range(length) if j not in finished and state.running(f"c-{j}")]
        return next((f"c-{j}" for j in seen if running_now(cluster, namespace, f"c-{j}")), None)

    start = time.monotonic()
    while len(finished) < length:
        # The running job is found each time, never assumed to be the highest left: Kueue may admit a lower one
        # while a higher one is between attempts, and preempt it when the higher one is back.
        job = wait(running, 600, "a job of the chain running")
        highest = max(j for j in range(length) if j not in finished)
        if int(job[2:]) != highest:
            with state.lock:
                pods = sorted(phase for _, phase in state.pods.get(f"c-{highest}", {}).values())
                workload = state.workloads.get(f"c-{highest}", {})
                true = [
                    f"{c['type']} {c.get('reason')}" for c in workload.get("conditions") or [] if c["status"] == "True"
                ]
            out(f"  inversion: {job} runs while c-{highest} waits, its pods: {pods}; its Workload: {true}")
        # Its status says Running before its chief ends: a phase still Queued from before this admission was taken
        # for the end of the run (the job never counted as finished: every later job was an "inversion").
        wait(
            lambda job=job: state.phases.get(job) == "Running" or not state.running(job),  # (or preempted meanwhile)
            60,
            f"{job}'s status to say Running",
        )
        with contextlib.suppress(ApiException):  # preempted meanwhile: its pods are going
            cluster.core.patch_namespaced_pod(
                f"{job}-chief-0", namespace, {"metadata": {"annotations": {kwok.EXIT_CODE: "0"}}}
            )
        wait(lambda job=job: state.phases.get(job) in ENDED, 600, f"{job} Succeeded or preempted")
        if state.phases.get(job) == "Succeeded":
            finished.append(int(job[2:]))
    inversions = sum(1 for a, b in itertools.pairwise(finished) if b > a)
    preemptions = kueue_preemptions(cluster, namespace, state)
    with state.lock:
        counted = {f"c-{i}": state.restarts.get(f"c-{i}", {}).get("disruptions", 0) for i in range(length)}
    wrong = {job: (n, preemptions.get(job, 0)) for job, n in counted.items() if n != preemptions.get(job, 0)}
    out(
        f"chain unwound in {time.monotonic() - start:.0f}s, all {length} Succeeded: finished in priority order but "
        f"for {inversions} inversions; preemptions {sum(preemptions.values())} by Kueue's "
        f"events, disruptions counted by the operator {sum(counted.values())}; jobs whose count differs "
        f"(counted, Kueue's): {wrong or 'none'}"
    )
    for job in wrong:  # what each side said, in order: the operator's restarts and Kueue's words on the Workload
        for event in sorted(job_events(cluster, namespace, state, job), key=lambda e: str(e.first_timestamp)):
            out(
                f"  {job}: {event.first_timestamp:%H:%M:%S} {event.involved_object.kind} {event.reason} "
                f"x{event.count or 1}: {event.message}"
            )


def kueue_preemptions(cluster: Cluster, namespace: str, state: Jobs) -> Counter:
    """Job -> how often Kueue preempted its Workload (its Preempted events)."""
    found: Counter = Counter()
    events = cluster.core.list_namespaced_event(namespace, field_selector="reason=Preempted").items
    for event in events:
        job = state.workload_jobs.get(event.involved_object.name)
        if event.involved_object.kind == "Workload" and job is not None:
            found[job] += max(event.count or 1, (event.series.count if event.series else 1) or 1)
    return found


def job_events(cluster: Cluster, namespace: str, state: Jobs, job: str) -> list:
    """The events of the job and of its Workload (Kueue's), but the routine ones of pods."""
    events = cluster.core.list_namespaced_event(namespace).items
    return [
        e for e in events
        if e.involved_object.name == job
        or (e.involved_object.kind == "Workload" and state.workload_jobs.get(e.involved_object.name) == job)
    ]  # fmt: skip


def running_now(cluster: Cluster, namespace: str, job: str) -> bool:
    """The job's 5 live pods, read now, are of one attempt and Running."""
    pods = list(cluster.live_pods(namespace, job).values())
    attempts = {p["metadata"]["labels"].get(api.LABEL_ATTEMPT) for p in pods}
    return (
        len(pods) == PODS_PER_JOB
        and len(attempts) == 1
        and all((p.get("status") or {}).get("phase") == "Running" for p in pods)
    )


def _gone(cluster: Cluster, namespace: str) -> bool:
    try:
        cluster.core.read_namespace(namespace)
    except ApiException as error:
        if error.status == 404:
            return True
        raise
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, default=5000, help="jobs queued at once (default 5000)")
    parser.add_argument("--admit", type=int, default=1000, help="of them, admitted by raising the quota (default 1000)")
    parser.add_argument("--chain", type=int, default=100, help="jobs in the priority chain (default 100)")
    parser.add_argument(
        "--chain-queueing",
        choices=("StrictFIFO", "BestEffortFIFO"),
        default="StrictFIFO",
        help="the chain's ClusterQueue's queueingStrategy (default StrictFIFO: BestEffortFIFO, Kueue's default, lets "
        "a lower job that fits in while a higher one's attempt failed, e.g. on quota not yet given back)",
    )
    parser.add_argument("--window", type=float, default=120, help="seconds measured while the jobs wait")
    args = parser.parse_args()
    args.admit = min(args.admit, args.queued)

    kube = ensure_cluster()
    kube.install_kueue()
    cluster = Cluster(kube.kubeconfig)
    cluster.install_crd()
    make_flavor(cluster)
    pods = PODS_PER_JOB * (args.admit + 1)
    nodes = max(4, math.ceil(pods * 1.2 / PODS_PER_FAKE_NODE))
    kwok.ensure_fake_nodes(kube.kubeconfig, cluster.core, nodes)
    out(f"{nodes} fake nodes Ready for {pods} pods; Kueue installed")
    paused = pause_installed_operators(cluster)

    suffix = uuid.uuid4().hex[:6]
    namespace, cq, chain_cq = f"kueue-scale-{suffix}", f"bench-{suffix}", f"bench-chain-{suffix}"
    process = Process(kube.kubeconfig, Path(tempfile.mkdtemp(prefix="kubetf-bench-kueue-scale-")))
    state = Jobs()
    watches: list[RawWatch] = []
    try:
        create_namespace(cluster, namespace)
        cluster_queue(cluster, cq, 0)
        cluster_queue(cluster, chain_cq, 1, preempt=True, strategy=args.chain_queueing)
        local_queue(cluster, namespace, "bench", cq)
        local_queue(cluster, namespace, "chain", chain_cq)
        process.start()
        watches = [
            RawWatch(functools.partial(cluster.core.list_namespaced_pod, namespace), state.on_pod),
            RawWatch(
                functools.partial(
                    cluster.custom.list_namespaced_custom_object, api.GROUP, api.VERSION, namespace, api.PLURAL
                ),
                state.on_job,
            ),
            RawWatch(
                functools.partial(cluster.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, "workloads"),
                state.on_workload,
            ),
        ]
        time.sleep(5)
        out(f"operator RSS idle: {process.rss():.0f} MiB")
        if args.queued:
            queued_phase(cluster, process, state, namespace, args.queued, args.window)
        if args.admit:
            admit_phase(cluster, state, cq, args.queued, args.admit)
        if args.chain:
            cluster_queue(cluster, cq, 0)  # the rest stay queued; the chain has its own ClusterQueue
            chain_phase(cluster, namespace, state, args.chain)
        out(f"operator RSS at the end: {process.rss():.0f} MiB")
    finally:
        for watch in watches:
            watch.stopped = True
        try:  # while the operator runs: it lets the deleted jobs' Workloads go (their finalizer)
            cluster.core.delete_namespace(namespace)
            wait(lambda: _gone(cluster, namespace), 900, f"namespace {namespace} deleted")
        except (ApiException, TimeoutError) as error:
            out(f"namespace {namespace} not deleted: {error}")
        process.stop()
        for name in (cq, chain_cq):
            with contextlib.suppress(ApiException):
                cluster.custom.delete_cluster_custom_object(GROUP, VERSION, "clusterqueues", name)
        resume_installed_operators(cluster, paused)


if __name__ == "__main__":
    main()
