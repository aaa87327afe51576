"""Scale benchmark on kwok's fake nodes: prints numbers, asserts nothing.

    python -m tests.bench.scale [--jobs 2000] [--burst 200] [--preemptions 20] [--foreign-pods 0]
                                [--operator-flags '--pod-batch-seconds 0'] [--until-restart]
                                [--namespaces 1] [--bound]
    make bench-scale ARGS="--jobs 100 --burst 20"

Jobs of 1 chief + 4 workers (MultiWorkerMirrored) whose pod templates tolerate the fake nodes' taint and select
them (tests/cluster/kwok.py): the real scheduler places their pods, kwok runs them (Running at once, no containers),
the chief exits 0 when the benchmark annotates it (kwok-stages.yaml `pod-exit`). Fake nodes are added to the
local cluster as needed (1,000 pods each). In order:

1. operator RSS idle; with --foreign-pods N plain pods of no job (Running on fake nodes, another namespace): RSS of
   the running operator, and of a restarted one (current and peak);
2. --jobs jobs created at once, to every job Running with its 5 pods Running: time, operator CPU seconds and API
   calls per job, RSS;
3. operator killed (SIGKILL) with all jobs Running and started again: time until it is idle (for 5 s no event on
   the benchmark's jobs, pods and services, no write in its API counter when it has one, and under 10% of a core
   of CPU), and whether every job is still Running with the same 5 pods of the same attempt and restart counters;
4. once the restarted operator's first re-list is done, a burst of --burst more jobs while --preemptions workers of
   running jobs are evicted (Eviction API), one every --preemption-interval s: burst jobs/s (all 5 pods exist),
   preemption -> all 5 replacement pods created p50/p99, and by step: the operator marks the rest of the group
   deleted, kwok removes the pods, the operator creates;
5. every chief exits 0: time until every job is Succeeded with its workers cleaned up, CPU and API calls per job;
   API calls per job lifecycle = (2) + (5).
--until-restart stops after (3), for a restart's memory among many jobs without the burst and the finish.

At 10,000 jobs the cluster, not the operator, sets the pace (2026-11-26: 2,400 jobs Running after 12 minutes, the
operator at 0.16 of a core): kube-controller-manager's Endpoints and EndpointSlice controllers list a namespace's pods
for every Service they sync (10,000 headless Services among 50,000 pods in one namespace: half a core), and the
scheduler falls behind as pods grow. `--namespaces N` spreads the jobs over N namespaces (job i in the (i % N)th),
`--bound` names each job's fake node in its pod template (spec.nodeName: the scheduler is not in the path). The
operator does the same work either way, gangs included (it makes the same PodGroups; bound pods count as placed).

API calls come from the operator's Prometheus counter `kubetf_api_requests_total{verb,resource}` on its
--metrics-port ("n/a" when the operator has none), and how long the API server took to answer them, from the burst
to the last replacement, from its histogram `kubetf_api_request_seconds`. CPU is utime+stime from /proc/<pid>/stat,
RSS VmRSS (peak: VmHWM); during the burst, every process's on this machine (what the API server, etcd, kwok, the
scheduler and the benchmark's own watch use beside the operator). The operator runs out of cluster as a subprocess
(tests/integration/conftest.py Operator), alone: an installed one is scaled to zero meanwhile. The benchmark watches
with raw JSON, not the client's models, which would cost the operator seconds of CPU on this 2-core machine at
10,000s of pods. Namespaces are deleted at the end.
Uses $KUBECONFIG, else brings the local cluster up (tests/cluster).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines
from prometheus_client.parser import text_string_to_metric_families

from kubetf.core import api
from tests.bench.common import cpu_by_process, cpu_seconds, machine_cpu, peak_rss_mib, percentile, rss_mib
from tests.cluster import kwok
from tests.cluster.fixture import ensure_cluster
from tests.integration.conftest import (
    AS_INSTALLED,
    Cluster,
    Operator,
    pause_installed_operators,
    pod_template,
    replica,
    resume_installed_operators,
)

PODS_PER_JOB = 5
VICTIM = "worker-1"  # the pod of each preempted job the Eviction API takes
# A preemption's steps, each when the benchmark saw it: the eviction called, answered, the evicted pod's deletion
# seen by the watch, every old pod marked for deletion, all of them gone, the replacements all created.
PREEMPTION_STEPS = {"answered", "seen", "deleting", "gone", "created"}
PODS_PER_FAKE_NODE = 1000
QUIET = 5.0  # seconds without an API write that count as idle
PROGRESS_EVERY = 60.0  # seconds between progress lines of a long wait
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
CLIENT_THREADS = 4  # the client's connection pool holds 4


def fake_template() -> dict:
    spec = pod_template()["spec"]
    del spec["schedulerName"]  # the integration tier's "never scheduled": here the real scheduler places them
    return {"spec": kwok.on_fake_nodes(spec)}


SPEC = {
    "strategy": "MultiWorkerMirrored",
    "replicaSpecs": {
        "chief": {**replica(1), "template": fake_template()},
        "worker": {**replica(4), "template": fake_template()},
    },
    # The scheduler on this 2-core machine places about 1,000 pods a minute: at 10,000 jobs the last pods wait
    # far beyond the default 600 s, and the startup timeout would fail their jobs (it did: 2,871 of 10,000).
    "runPolicy": {"startupTimeoutSeconds": 7200},
}


# ---------------------------------------------------------------- the operator process
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Process:
    """The operator under test: Operator with /metrics on, restartable, with its CPU and API counters."""

    def __init__(self, kubeconfig: str, workdir: Path, flags: tuple[str, ...] = ()) -> None:
        self.operator = Operator(
            kubeconfig, workdir / "operator.log", metrics_port=free_port(), flags=(*AS_INSTALLED, *flags)
        )

    @property
    def pid(self) -> int:
        assert self.operator.process is not None
        return self.operator.process.pid

    def start(self) -> None:
        # A restart among thousands of jobs waits for the killed one's Lease to expire, then lists every job and
        # pod before it says "ok leader" (4,000 jobs: 8 s + 24 s).
        self.operator.start(timeout=600)

    def kill(self) -> None:
        self.operator.kill()

    def stop(self) -> None:
        self.operator.stop()

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def rss(self) -> float:
        return rss_mib(self.pid)

    def api_calls(self) -> Counter | None:
        """kubetf_api_requests_total by (verb, resource), leader election's lease renewals left out (they are the
        same with or without jobs); None when the operator has no such counter."""
        calls = self.all_api_calls()
        return None if calls is None else Counter({k: v for k, v in calls.items() if k[1] != "leases"})

    def metrics(self, *names: str) -> str | None:
        """The operator's /metrics page; with `names`, only those samples (`?name[]=`): a whole page costs the operator
        CPU in proportion to every job's series (4 s at 10,000 jobs with 20 metrics each), which a measurement of
        it must not add."""
        query = urllib.parse.urlencode([("name[]", name) for name in names])
        try:
            url = f"http://127.0.0.1:{self.operator.metrics_port}/metrics" + (f"?{query}" if query else "")
            with urllib.request.urlopen(url, timeout=30) as response:
                return response.read().decode()
        except OSError:
            return None

    def histogram(self, name: str, *labels: str) -> dict[str, Counter]:
        """A histogram's buckets (each one's cumulative count, by its upper bound), by the values of `labels` joined
        by a space (all under "" without any); read alone (`?name[]=`)."""
        buckets: dict[str, Counter] = {}
        for family in text_string_to_metric_families(self.metrics(f"{name}_bucket") or ""):
            if family.name == name:
                for sample in family.samples:
                    if sample.name.endswith("_bucket"):
                        by = " ".join(sample.labels.get(label, "") for label in labels)
                        buckets.setdefault(by, Counter())[float(sample.labels["le"])] = sample.value
        return buckets

    def queue_waits(self) -> dict[str, Counter]:
        """kubetf_workqueue_wait_seconds by priority."""
        return self.histogram("kubetf_workqueue_wait_seconds", "priority")

    def answer_times(self) -> dict[str, Counter]:
        """kubetf_api_request_seconds by "verb resource" (empty when the operator has no such histogram)."""
        return self.histogram("kubetf_api_request_seconds", "verb", "resource")

    def all_api_calls(self) -> Counter | None:
        """kubetf_api_requests_total by (verb, resource); None when the operator has no such counter."""
        text = self.metrics("kubetf_api_requests_total")
        if text is None:
            return None
        for family in text_string_to_metric_families(text):
            if family.name in ("kubetf_api_requests", "kubetf_api_requests_total"):
                return Counter(
                    {
                        (s.labels.get("verb", "?"), s.labels.get("resource", "?")): s.value
                        for s in family.samples
                        if s.name.endswith("_total")
                    }
                )
        return None


def bucket_quantiles(before: dict[str, Counter], after: dict[str, Counter], keys: Iterable[str]) -> str:
    """A histogram's observations between two readings, by key (in the order of `keys`, those with none left
    out): how many, and the bucket bounds that hold half and 99% of them (Prometheus buckets: an upper bound, not
    a measurement)."""
    parts = []
    for key in keys:
        delta = after.get(key, Counter()) - before.get(key, Counter())
        total = delta.get(math.inf, 0)
        if not total:
            continue
        bounds = sorted(delta)
        p50, p99 = (next(b for b in bounds if delta[b] >= q * total) for q in (0.5, 0.99))
        parts.append(f"{key} n={total:.0f} p50 <= {p50 * 1000:.0f} ms, p99 <= {p99 * 1000:.0f} ms")
    return "; ".join(parts) or "none"


def queue_waits(before: dict[str, Counter], after: dict[str, Counter]) -> str:
    """The work queue's waits for a worker between two readings, by priority."""
    return bucket_quantiles(before, after, ("urgent", "follow", "normal", "resync"))


def answer_times(before: dict[str, Counter], after: dict[str, Counter]) -> str:
    """The API server's answers to the operator between two readings, by call, the most frequent first."""
    counts = {key: after[key].get(math.inf, 0) - before.get(key, Counter()).get(math.inf, 0) for key in after}
    return bucket_quantiles(before, after, sorted(counts, key=lambda key: -counts[key]))


def writes(calls: Counter | None) -> float | None:
    return None if calls is None else sum(v for (verb, _), v in calls.items() if verb in WRITE_VERBS)


def per_job(before: Counter | None, after: Counter | None, jobs: int) -> str:
    if before is None or after is None or jobs == 0:
        return "n/a (the operator has no kubetf_api_requests_total)"
    delta = after - before
    total = sum(delta.values())
    top = ", ".join(f"{verb} {resource} {n / jobs:.1f}" for (verb, resource), n in delta.most_common(6))
    return f"{total / jobs:.1f} per job ({top})"


# ---------------------------------------------------------------- watching without the client's models
def _identity(obj: dict) -> tuple[str, str]:
    meta = obj["metadata"]
    return meta.get("namespace") or "", meta["name"]


class RawWatch:
    """List then watch one resource as JSON dicts, calling on_event(type, object) from a thread."""

    def __init__(self, list_fn: Callable[..., Any], on_event: Callable[[str, dict], None]) -> None:
        self.list_fn, self.on_event = list_fn, on_event
        self.stopped = False
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        version = None
        known: dict[tuple[str, str], dict] = {}  # last object seen: a relist reports what went missing as DELETED
        while not self.stopped:
            try:
                if version is None:
                    listed = json.loads(self.list_fn(_preload_content=False).data)
                    listed_now = {_identity(item) for item in listed["items"]}
                    for identity in set(known) - listed_now:
                        self.on_event("DELETED", known.pop(identity))
                    for item in listed["items"]:
                        known[_identity(item)] = item
                        self.on_event("ADDED", item)
                    version = listed["metadata"]["resourceVersion"]
                response = self.list_fn(
                    watch=True,
                    resource_version=version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=240,
                    # The API server ends a watch after timeout_seconds, but one it closed for a slow reader
                    # ("Forcing watcher close due to unresponsiveness") could leave this read waiting for ever
                    # (seen once: the benchmark's job phases stood still for minutes). Read again from the last
                    # version instead.
                    _request_timeout=(10, 270),
                    _preload_content=False,
                )
                for line in iter_resp_lines(response):
                    event = json.loads(line)
                    if event["type"] == "ERROR":
                        version = None  # 410 Gone: list again
                        break
                    version = event["object"]["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        identity = _identity(event["object"])
                        if event["type"] == "DELETED":
                            known.pop(identity, None)
                        else:
                            known[identity] = event["object"]
                        self.on_event(event["type"], event["object"])
            except Exception:  # a broken connection: watch again from where we were
                time.sleep(1)


class State:
    """What the benchmark knows of its namespaces: each job's phase and live pods, and when anything last changed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.jobs: dict[str, tuple[str, str]] = {}  # name -> (phase, restarts as JSON)
        self.pods: dict[str, dict[str, tuple[str, str]]] = {}  # job -> pod -> (attempt, phase)
        self.pod_uids: dict[str, dict[str, str]] = {}  # job -> pod -> uid, of the same live pods
        self.last_change = time.monotonic()
        # preemptions in flight: job -> (start, attempt of the evicted pod); done: job -> seconds
        self.preempting: dict[str, tuple[float, int]] = {}
        self.recovered: dict[str, float] = {}
        # where a preemption's time goes: job -> uid of each pod it had -> marked for deletion; job -> step -> time
        self.old_pods: dict[str, dict[str, bool]] = {}
        self.steps: dict[str, dict[str, float]] = {}
        # how far a job's status trails its pods: job -> when all its pods were first Running, when it first said so
        self.pods_running_at: dict[str, float] = {}
        self.said_running_at: dict[str, float] = {}

    def on_job(self, kind: str, job: dict) -> None:
        status = job.get("status") or {}
        with self.lock:
            self.last_change = time.monotonic()
            if kind == "DELETED":
                self.jobs.pop(job["metadata"]["name"], None)
            else:
                restarts = json.dumps(status.get("restarts") or {}, sort_keys=True)
                self.jobs[job["metadata"]["name"]] = (status.get("phase", ""), restarts)
                if status.get("phase") == "Running":
                    self.said_running_at.setdefault(job["metadata"]["name"], self.last_change)

    def on_pod(self, kind: str, pod: dict) -> None:
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        job = labels.get(api.LABEL_JOB)
        now = time.monotonic()
        with self.lock:
            self.last_change = now
            if job is None:
                return
            pods, uids = self.pods.setdefault(job, {}), self.pod_uids.setdefault(job, {})
            if kind == "DELETED" or meta.get("deletionTimestamp"):
                pods.pop(meta["name"], None)
                uids.pop(meta["name"], None)
            else:
                pods[meta["name"]] = (labels.get(api.LABEL_ATTEMPT, ""), (pod.get("status") or {}).get("phase", ""))
                uids[meta["name"]] = meta["uid"]
                if len(pods) == PODS_PER_JOB and all(phase == "Running" for _, phase in pods.values()):
                    self.pods_running_at.setdefault(job, now)
            old = self.old_pods.get(job)
            if old is not None and meta["uid"] in old:
                if meta["name"] == f"{job}-{VICTIM}" and (kind == "DELETED" or meta.get("deletionTimestamp")):
                    self.steps[job].setdefault("seen", now)  # the eviction itself, as a watch shows it
                if kind == "DELETED":
                    del old[meta["uid"]]
                elif meta.get("deletionTimestamp"):
                    old[meta["uid"]] = True
                if all(old.values()):
                    self.steps[job].setdefault("deleting", now)
                if not old:
                    self.steps[job].setdefault("gone", now)
            if job in self.preempting:  # replaced: 5 live pods of one newer attempt
                start, attempt = self.preempting[job]
                attempts = {a for a, _ in pods.values()}
                if len(pods) == PODS_PER_JOB and len(attempts) == 1 and int(attempts.pop() or 0) > attempt:
                    self.recovered[job] = now - start
                    self.steps[job]["created"] = now
                    del self.preempting[job]

    def status_lag(self, jobs: Iterable[str]) -> str:
        """How long after all its pods were Running each job's status said Running (0 when it said so first: its
        status follows the pods' Running only)."""
        with self.lock:
            lags = [
                max(0.0, self.said_running_at[j] - self.pods_running_at[j])
                for j in jobs
                if j in self.said_running_at and j in self.pods_running_at
            ]
        return f"{fmt_ms(lags)}, max {max(lags, default=0) * 1000:.0f} ms"

    def preemption_steps(self) -> str:
        """A preemption's time by step: the operator deletes the rest of the group (every old pod marked), kwok
        removes them (all gone: the group barrier), the operator creates the replacements."""
        steps = [s for s in self.steps.values() if s.keys() >= PREEMPTION_STEPS]
        parts = []
        for label, start, end in (
            ("the eviction answered (the API server)", "evicted", "answered"),
            ("group marked for deletion", "evicted", "deleting"),
            ("old pods gone", "deleting", "gone"),
            ("replacements created", "gone", "created"),
        ):
            parts.append(f"{label} {fmt_ms([s[end] - s[start] for s in steps])}")
        return "; ".join(parts)

    def preemption_shares(self) -> str:
        """A preemption's time, the operator's part and the cluster's."""
        steps = [s for s in self.steps.values() if s.keys() >= PREEMPTION_STEPS]
        # The operator acts from when a watch shows the eviction to the group marked, and from the old pods gone to
        # the replacements; the rest is the API server's (its answer, its watch) and the kubelet's (kwok's).
        operator = [(s["deleting"] - s["seen"]) + (s["created"] - s["gone"]) for s in steps]
        cluster = [(s["seen"] - s["evicted"]) + (s["gone"] - s["deleting"]) for s in steps]
        return (
            f"the operator's part (eviction seen by a watch -> group marked, old pods gone -> replacements created) "
            f"{fmt_ms(operator)}; the cluster's (eviction call -> seen by a watch, marked -> gone) {fmt_ms(cluster)}"
        )

    def slowest_preemption(self, burst_start: float) -> str:
        """The slowest preemption, step by step, and when it began: the p99 of 20 is this one."""
        done = {job: s for job, s in self.steps.items() if s.keys() >= PREEMPTION_STEPS}
        if not done:
            return "n/a"
        job, s = max(done.items(), key=lambda item: item[1]["created"] - item[1]["evicted"])

        def ms(start: str, end: str) -> str:
            return f"{(s[end] - s[start]) * 1000:.0f} ms"

        return (
            f"{job}, evicted {s['evicted'] - burst_start:.1f}s into the burst: answered {ms('evicted', 'answered')}, "
            f"seen by a watch {ms('answered', 'seen')} later, group marked {ms('seen', 'deleting')} later, gone "
            f"{ms('deleting', 'gone')} later, replaced {ms('gone', 'created')} later"
        )

    def on_other(self, kind: str, obj: dict) -> None:
        with self.lock:
            self.last_change = time.monotonic()

    def running(self, job: str) -> bool:
        pods = self.pods.get(job, {})
        return (
            self.jobs.get(job, ("", ""))[0] == "Running"
            and len(pods) == PODS_PER_JOB
            and all(phase == "Running" for _, phase in pods.values())
        )

    def children_exist(self, job: str) -> bool:
        return len(self.pods.get(job, {})) == PODS_PER_JOB

    def finished(self, job: str) -> bool:
        """Succeeded, with no pod left running (cleanPodPolicy Running)."""
        pods = self.pods.get(job, {})
        return self.jobs.get(job, ("", ""))[0] == "Succeeded" and all(phase != "Running" for _, phase in pods.values())

    def snapshot(self, jobs: Iterable[str]) -> dict[str, tuple]:
        with self.lock:
            return {j: (self.jobs.get(j), tuple(sorted(self.pods.get(j, {}).items()))) for j in jobs}

    def wait(self, check: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> float:
        """Poll check() (under the lock) until true; the monotonic time it first was. Says every PROGRESS_EVERY s
        how far the namespace has come: at 10,000 jobs a phase takes over an hour."""
        start = time.monotonic()
        deadline, report = start + timeout, start + PROGRESS_EVERY
        while True:
            with self.lock:
                if check():
                    return time.monotonic()
                if time.monotonic() > report:
                    report += PROGRESS_EVERY
                    out(f"  ... {time.monotonic() - start:.0f}s waiting for {what}: {self.progress()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(interval)

    def progress(self) -> str:
        jobs = Counter(phase for phase, _ in self.jobs.values())
        pods = Counter(phase for job in self.pods.values() for _, phase in job.values())
        return f"jobs {dict(sorted(jobs.items()))}, pods {dict(sorted(pods.items()))}"

    def wait_quiet(self, process: Process | None, timeout: float, quiet: float = QUIET) -> float:
        """Wait until for `quiet` s neither the watches nor the operator's write counter moved and the operator
        used under 10% of a core (it is done reading too); return the time of the last activity seen."""
        deadline = time.monotonic() + timeout
        last_writes = writes(process.api_calls()) if process else None
        last_cpu = process.cpu() if process else 0.0
        last_active = time.monotonic()
        tick = 0.25
        while True:
            time.sleep(tick)
            now = time.monotonic()
            if process is not None:
                current = writes(process.api_calls()) if last_writes is not None else None
                cpu = process.cpu()
                if current != last_writes or cpu - last_cpu > 0.1 * tick:
                    last_active = now
                last_writes, last_cpu = current, cpu
            with self.lock:
                last = max(self.last_change, last_active)
            if now - last >= quiet:
                return last
            if now > deadline:
                raise TimeoutError(f"the operator was still writing after {timeout:.0f}s")


def watch_namespaces(cluster: Cluster, namespaces: set[str], state: State) -> list[RawWatch]:
    """Three watches of the whole cluster, whatever the number of namespaces (the client's pool holds 4), each
    passing on only what is in `namespaces`."""
    core = cluster.core

    def within(on_event: Callable[[str, dict], None]) -> Callable[[str, dict], None]:
        return lambda kind, obj: on_event(kind, obj) if obj["metadata"].get("namespace") in namespaces else None

    return [
        RawWatch(core.list_pod_for_all_namespaces, within(state.on_pod)),
        RawWatch(
            functools.partial(cluster.custom.list_cluster_custom_object, api.GROUP, api.VERSION, api.PLURAL),
            within(state.on_job),
        ),
        RawWatch(core.list_service_for_all_namespaces, within(state.on_other)),
    ]


# ---------------------------------------------------------------- helpers
def parallel(fn: Callable[[Any], Any], items: Iterable[Any]) -> None:
    with ThreadPoolExecutor(CLIENT_THREADS) as pool:
        for _ in pool.map(fn, items):
            pass


NAMESPACE_LABEL = ("kubetf.io/bench", "scale")  # on every namespace a run makes: the next run looks for them


def create_namespace(cluster: Cluster, name: str) -> None:
    cluster.core.create_namespace({"metadata": {"name": name, "labels": dict([NAMESPACE_LABEL])}})


class Layout:
    """Where each job goes: its namespace (job i in the (i % N)th), and with `nodes` its fake node, by name."""

    def __init__(self, namespaces: list[str], nodes: list[str] | None) -> None:
        self.namespaces, self.nodes = namespaces, nodes
        self.homes: dict[str, str] = {}

    def create_jobs(self, cluster: Cluster, names: list[str]) -> None:
        start = len(self.homes)
        for i, name in enumerate(names, start):
            self.homes[name] = self.namespaces[i % len(self.namespaces)]
        parallel(lambda item: cluster.create_job(self.homes[item[1]], item[1], self._spec(item[0])),
                 enumerate(names, start))  # fmt: skip

    def _spec(self, i: int) -> dict:
        if self.nodes is None:
            return SPEC
        spec = copy.deepcopy(SPEC)
        for replica_spec in spec["replicaSpecs"].values():
            replica_spec["template"]["spec"]["nodeName"] = self.nodes[i % len(self.nodes)]
        return spec


def foreign_pod(name: str) -> dict:
    spec = {"containers": [{"name": "app", "image": "kubetf/python-base:bookworm", "command": ["sleep", "inf"]}]}
    return {"metadata": {"name": name, "labels": {"app": "foreign"}}, "spec": kwok.on_fake_nodes(spec)}


def fmt_ms(values: list[float]) -> str:
    if not values:
        return "none measured"
    p50, p99 = percentile(values, 0.5) * 1000, percentile(values, 0.99) * 1000
    return f"p50 {p50:.0f} ms, p99 {p99:.0f} ms (n={len(values)})"


def out(message: str) -> None:
    print(message, flush=True)


# ---------------------------------------------------------------- phases
def foreign_pods_phase(cluster: Cluster, process: Process, namespace: str, count: int) -> None:
    running: set[str] = set()
    lock = threading.Lock()

    def on_pod(kind: str, pod: dict) -> None:
        with lock:
            if kind != "DELETED" and (pod.get("status") or {}).get("phase") == "Running":
                running.add(pod["metadata"]["name"])

    create_namespace(cluster, namespace)
    watcher = RawWatch(functools.partial(cluster.core.list_namespaced_pod, namespace), on_pod)
    start = time.monotonic()
    parallel(
        lambda i: cluster.core.create_namespaced_pod(namespace, foreign_pod(f"f-{i}"), _preload_content=False),
        range(count),
    )
    deadline = start + 60 + count / 10
    while True:
        with lock:
            if len(running) >= count:
                break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(running)}/{count} foreign pods Running")
        time.sleep(0.5)
    watcher.stopped = True
    out(f"{count} foreign pods Running on fake nodes in {time.monotonic() - start:.0f}s")
    quiet = State()
    quiet.wait_quiet(process, timeout=120)
    out(f"operator RSS with {count} foreign pods: {process.rss():.0f} MiB (running since before they existed)")
    process.kill()
    process.start()
    quiet.wait_quiet(process, timeout=300)
    out(
        f"operator restarted with {count} foreign pods: RSS {process.rss():.0f} MiB, "
        f"peak {peak_rss_mib(process.pid):.0f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000, help="jobs brought to Running (default 2000)")
    parser.add_argument("--burst", type=int, default=200, help="jobs created during the preemptions (default 200)")
    parser.add_argument("--preemptions", type=int, default=20, help="workers evicted during the burst (default 20)")
    parser.add_argument("--preemption-interval", type=float, default=0.5, help="seconds between evictions")
    parser.add_argument("--foreign-pods", type=int, default=0, help="plain pods of no job in another namespace")
    parser.add_argument("--timeout", type=float, default=3600, help="per phase, seconds")
    parser.add_argument(
        "--operator-flags", default="", help="more flags for the operator, to compare (e.g. '--pod-batch-seconds 0')"
    )
    parser.add_argument("--until-restart", action="store_true", help="stop after the restart (phases 1-3)")
    parser.add_argument("--namespaces", type=int, default=1, help="namespaces the jobs are spread over (default 1)")
    parser.add_argument("--bound", action="store_true", help="pods name their fake node: no scheduler in the path")
    args = parser.parse_args()
    args.preemptions = min(args.preemptions, args.jobs)
    # A run in the background ignores SIGINT, and SIGTERM would end it without its cleanup: the operator left running
    # and its namespaces left for the next run to refuse (thousands of jobs take many minutes to delete by hand).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped by SIGTERM"))

    kube = ensure_cluster()
    cluster = Cluster(kube.kubeconfig)
    # An earlier run's namespace still being deleted: this run's operator would spend itself on those pods' events
    # (and fail the quiet wait: "the operator was still writing").
    selector = "=".join(NAMESPACE_LABEL)
    leftover = cluster.core.list_namespace(label_selector=selector).items
    if leftover:
        sys.exit(
            f"an earlier run's namespaces still exist: {', '.join(n.metadata.name for n in leftover)}; wait for"
            f" their deletion (kubectl get ns -l {selector}) and run again"
        )
    cluster.install_crd()
    pods = PODS_PER_JOB * (args.jobs + args.burst) + args.foreign_pods
    nodes = max(4, math.ceil(pods * 1.2 / PODS_PER_FAKE_NODE))
    start = time.monotonic()
    fake_nodes = kwok.ensure_fake_nodes(kube.kubeconfig, cluster.core, nodes)
    out(f"{nodes} fake nodes Ready ({time.monotonic() - start:.0f}s) for {pods} pods")

    paused = pause_installed_operators(cluster)
    for namespace, name, _ in paused:
        out(f"paused the installed operator {namespace}/{name}")

    suffix = uuid.uuid4().hex[:6]
    namespaces = [f"scale-{suffix}-{i}" for i in range(args.namespaces)] if args.namespaces > 1 else [f"scale-{suffix}"]
    foreign = f"scale-foreign-{suffix}"
    layout = Layout(namespaces, fake_nodes if args.bound else None)
    workdir = Path(tempfile.mkdtemp(prefix="kubetf-bench-scale-"))
    process = Process(kube.kubeconfig, workdir, tuple(args.operator_flags.split()))
    state = State()
    try:
        process.start()
        for namespace in namespaces:
            create_namespace(cluster, namespace)
        watches = watch_namespaces(cluster, set(namespaces), state)
        state.wait_quiet(process, timeout=60, quiet=3)
        api_calls = process.api_calls()
        out(f"operator RSS idle: {process.rss():.0f} MiB; API counter: {'yes' if api_calls is not None else 'n/a'}")

        if args.foreign_pods:
            foreign_pods_phase(cluster, process, foreign, args.foreign_pods)

        # 2. jobs to Running
        names = [f"s-{i}" for i in range(args.jobs)]
        cpu0, created0, t0 = process.cpu(), process.api_calls(), time.monotonic()
        waits0 = process.queue_waits()
        layout.create_jobs(cluster, names)
        applied = time.monotonic()
        done = state.wait(lambda: all(state.running(n) for n in names), args.timeout, f"{args.jobs} jobs Running")
        state.wait_quiet(process, timeout=600)
        cpu1, created1 = process.cpu(), process.api_calls()
        out(
            f"{args.jobs} jobs (1+4) created in {applied - t0:.1f}s, all Running with their pods in {done - t0:.1f}s "
            f"({args.jobs / (done - t0):.1f} jobs/s)"
        )
        out(f"  a job's status Running after its pods all were: {state.status_lag(names)}")
        out(f"  waits in the work queue for a worker: {queue_waits(waits0, process.queue_waits())}")
        out(f"  operator RSS with {args.jobs} jobs Running ({PODS_PER_JOB * args.jobs} pods): {process.rss():.0f} MiB")
        out(f"  operator CPU create -> Running: {(cpu1 - cpu0) / args.jobs * 1000:.1f} ms per job")
        out(f"  API calls create -> Running: {per_job(created0, created1, args.jobs)}")

        # 3. a restarted operator converges
        before = state.snapshot(names)
        process.kill()
        t0 = time.monotonic()
        process.start()
        healthy = time.monotonic()
        last = state.wait_quiet(process, timeout=args.timeout)
        after = state.snapshot(names)
        changed = [n for n in names if before[n] != after[n]]
        out(
            f"operator killed with {args.jobs} jobs Running and started again: healthy after {healthy - t0:.1f}s, "
            f"converged (last write or busy CPU) {max(last, healthy) - t0:.1f}s after start; jobs whose status or "
            f"pods changed: {len(changed)}"
            + (f" (e.g. {changed[0]}: {before[changed[0]]} -> {after[changed[0]]})" if changed else "")
        )
        out(
            f"  its API calls until idle: {per_job(Counter(), process.api_calls(), args.jobs)}"
            if process.api_calls() is not None
            else "  its API calls until idle: n/a"
        )
        out(f"  its RSS: {process.rss():.0f} MiB, peak {peak_rss_mib(process.pid):.0f} MiB")

        if args.until_restart:
            return
        # Its first re-list (audit_after_start, 20 s after the start: every pod, job and gang object listed again)
        # would fall in the burst's first seconds, where the slowest preemptions are: each phase measures alone.
        primed = (process.api_calls() or Counter())[("list", "pods")]
        if primed:
            state.wait(
                lambda: (process.api_calls() or Counter())[("list", "pods")] >= 2 * primed,
                120,
                "the restarted operator's first re-list of its pods",
                interval=1.0,
            )
            state.wait_quiet(process, timeout=args.timeout)

        # 4. preemptions during a burst
        burst = [f"b-{i}" for i in range(args.burst)]
        victims = names[: args.preemptions]
        attempts_before: dict[str, int] = {}
        created: list[float] = []
        burst_thread = threading.Thread(
            target=lambda: (layout.create_jobs(cluster, burst), created.append(time.monotonic()))
        )
        waits0, answers0, machine0 = process.queue_waits(), process.answer_times(), cpu_by_process()
        t0 = time.monotonic()
        burst_thread.start()
        for job in victims:
            with state.lock:
                attempt = int(next(iter(state.pods[job].values()))[0] or 0)
                state.preempting[job] = (time.monotonic(), attempt)
                state.steps[job] = {"evicted": time.monotonic()}
                state.old_pods[job] = {uid: False for uid in state.pod_uids[job].values()}
                attempts_before[job] = attempt
            pod = f"{job}-{VICTIM}"
            namespace = layout.homes[job]
            cluster.core.create_namespaced_pod_eviction(
                pod,
                namespace,
                {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}},
                _preload_content=False,
            )
            with state.lock:
                state.steps[job]["answered"] = time.monotonic()
            time.sleep(args.preemption_interval)
        burst_thread.join()
        applied = created[0]
        done = state.wait(
            lambda: all(state.children_exist(n) for n in burst), args.timeout, f"{args.burst} burst jobs' pods"
        )
        machine = machine_cpu(machine0, cpu_by_process(), done - t0, {process.pid: "operator", os.getpid(): "bench"})
        state.wait(lambda: not state.preempting, 300, "every preempted job's replacement pods")
        answers = answer_times(answers0, process.answer_times())
        out(
            f"burst of {args.burst} jobs: created in {applied - t0:.1f}s, every pod exists after {done - t0:.1f}s "
            f"({args.burst / (done - t0):.1f} jobs/s), with {args.preemptions} evictions meanwhile"
        )
        out(
            f"  eviction of one worker -> all {PODS_PER_JOB} replacement pods created (MWMS group restart): "
            f"{fmt_ms(list(state.recovered.values()))}"
        )
        out(f"    of which: {state.preemption_steps()}")
        out(f"    {state.preemption_shares()}")
        out(f"    the slowest: {state.slowest_preemption(t0)}")
        out(f"  the machine's CPU until every burst pod existed: {machine}")
        out(f"  waits in the work queue for a worker: {queue_waits(waits0, process.queue_waits())}")
        out(f"  the API server's answers to the operator until the last replacement: {answers}")
        everyone = names + burst
        state.wait(lambda: all(state.running(n) for n in everyone), args.timeout, "every job Running")
        state.wait_quiet(process, timeout=600)
        with state.lock:
            extra = {
                job: int(next(iter(state.pods[job].values()))[0] or 0) - attempts_before[job] - 1 for job in victims
            }
        extra = {job: n for job, n in extra.items() if n}
        out(
            f"  group restarts beyond the one each eviction needs: {sum(extra.values())} in {len(extra)} of "
            f"{len(victims)} evicted jobs" + (f" (e.g. {next(iter(extra))})" if extra else "")
        )

        # 5. every chief exits 0
        cpu0, finished0, t0 = process.cpu(), process.api_calls(), time.monotonic()
        parallel(
            lambda job: cluster.core.patch_namespaced_pod(
                f"{job}-chief-0",
                layout.homes[job],
                {"metadata": {"annotations": {kwok.EXIT_CODE: "0"}}},
                _preload_content=False,
            ),
            everyone,
        )
        done = state.wait(lambda: all(state.finished(n) for n in everyone), args.timeout, "every job Succeeded")
        state.wait_quiet(process, timeout=600)
        cpu1, finished1 = process.cpu(), process.api_calls()
        jobs = len(everyone)
        out(f"{jobs} chiefs exit 0: every job Succeeded and cleaned up after {done - t0:.1f}s")
        out(f"  operator CPU Running -> Succeeded: {(cpu1 - cpu0) / jobs * 1000:.1f} ms per job")
        out(f"  API calls Running -> Succeeded: {per_job(finished0, finished1, jobs)}")
        if created0 is not None and created1 is not None and finished0 is not None and finished1 is not None:
            lifecycle = sum((created1 - created0).values()) / args.jobs + sum((finished1 - finished0).values()) / jobs
            out(f"API calls per job lifecycle (create -> Running -> Succeeded -> cleanup): {lifecycle:.1f}")
        else:
            out("API calls per job lifecycle: n/a (the operator has no kubetf_api_requests_total)")
        out(f"operator RSS at the end ({jobs} finished jobs): {process.rss():.0f} MiB")
        for w in watches:
            w.stopped = True
    finally:
        process.stop()
        out(f"operator log: {workdir / 'operator.log'}")
        cleanup(cluster, [*namespaces, foreign])
        resume_installed_operators(cluster, paused)


def cleanup(cluster: Cluster, namespaces: list[str]) -> None:
    start = time.monotonic()
    existing = []
    for name in namespaces:
        try:
            cluster.core.delete_namespace(name, _preload_content=False)
            existing.append(name)
        except ApiException as error:
            if error.status != 404:
                raise
    deadline = start + 900
    while existing and time.monotonic() < deadline:
        existing = [n for n in existing if _exists(cluster, n)]
        time.sleep(1)
    out(
        f"namespaces deleted in {time.monotonic() - start:.0f}s"
        if not existing
        else f"namespaces {existing} still terminating after {time.monotonic() - start:.0f}s"
    )


def _exists(cluster: Cluster, namespace: str) -> bool:
    try:
        cluster.core.read_namespace(namespace, _preload_content=False)
        return True
    except ApiException as error:
        if error.status == 404:
            return False
        raise


if __name__ == "__main__":
    main()
