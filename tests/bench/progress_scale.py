"""Progress reports at scale on kwok's fake nodes: prints numbers, asserts nothing.

    python -m tests.bench.progress_scale [--jobs 2000] [--every 1.0] [--window 60] [--metrics 2]
                                         [--stall-seconds 600] [--delete 0]
    make bench-progress ARGS="--jobs 200 --window 30"
    make bench-progress ARGS="--jobs 10000 --every 5 --window 150 --stall-seconds 60 --metrics 20 --delete 1000"

--jobs jobs of one worker each on kwok's fake nodes (tests/bench/scale.py's pods: Running, no containers), all
Running. Then two windows of --window seconds on the same operator and the same jobs, side by side:

1. quiet: no job reports;
2. reporting: every job's pod reports every --every seconds, as the trainer library does: a simulated trainer whose
   step grows, with a token of audience kubetf.io/progress bound to its pod (TokenRequest: what the kubelet mounts),
   a new HTTP connection per report, to the operator's progress port.

For each window: the operator's CPU (% of one core), RSS, API calls/s and status writes/s (its
`kubetf_api_requests_total`, the Lease's renewals left out). For the reporting one also: reports answered per
second by HTTP status, report latency p50/p99, the reporters' own CPU (they share the machine), and at its end how
old each job's status.progress is (now - lastReportTime: how stale `kubectl get tj` is at that load), and how many
jobs were judged TrainingStalled though every one of them advanced (with --stall-seconds shorter than the time
between two writes of a job's progress, a judge that read the stored progress would find them all stalled). Each
report carries --metrics metrics (each a series on /metrics).

3. with --delete N: N of the jobs deleted at once while the others go on reporting (stopped, they would rightly be
   judged stalled --stall-seconds later, in the middle of it), and kopf's event loop measured meanwhile
   (`kubetf_event_loop_lag_seconds`, a probe due every 100 ms): how many probes ran more than 50 ms late, and the
   worst bucket, beside Python's full garbage collections (`kubetf_gc_pause_seconds`: each stops every thread, the
   loop's too); then whether their series are gone from /metrics.

The operator runs out of cluster as a subprocess, with the defaults of its progress flags (a job written at most
every 30 s, 5 writes/s for all jobs) but --progress-stall-seconds; an installed one is scaled to zero meanwhile.
Uses $KUBECONFIG, else brings the local cluster up (tests/cluster).
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import resource
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from kubetf.core import api
from kubetf.core.progress.identity import AUDIENCE
from kubetf.core.status import parse_time
from tests.bench.common import percentile
from tests.bench.scale import (
    PODS_PER_FAKE_NODE,
    Process,
    State,
    cleanup,
    create_namespace,
    fake_template,
    out,
    parallel,
    watch_namespaces,
)
from tests.cluster import kwok
from tests.cluster.fixture import ensure_cluster
from tests.integration.conftest import Cluster, pause_installed_operators, replica, resume_installed_operators

REPORTERS = 32  # threads sending the reports; each owns an equal share of the jobs
SPEC = {
    "strategy": "MultiWorkerMirrored",
    "replicaSpecs": {"worker": {**replica(1), "template": fake_template()}},
    "runPolicy": {"startupTimeoutSeconds": 7200},
}


class Reporters:
    """Threads that report each job's progress every `every` seconds with its pod's token, until stopped."""

    def __init__(self, port: int, tokens: dict[str, str], every: float, metrics: int) -> None:
        self.port, self.every, self.metrics = port, every, metrics
        self.jobs = sorted(tokens)
        self.tokens = tokens
        self.lock = threading.Lock()
        self.answers: Counter = Counter()
        self.latencies: list[float] = []
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(REPORTERS)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(30)

    def _run(self, share: int) -> None:
        mine = self.jobs[share::REPORTERS]
        step = 0
        while not self.stopping.is_set():
            round_start = time.monotonic()
            step += 10
            for job in mine:
                if self.stopping.is_set():
                    return
                self._report(job, step)
            # Each job once per `every` seconds: what is left of the round is waited; a late round starts at once.
            self.stopping.wait(max(0.0, self.every - (time.monotonic() - round_start)))

    def _report(self, job: str, step: int) -> None:
        metrics = {"loss": 1.0 / (1 + step), **{f"metric_{i}": step / (i + 1) for i in range(self.metrics - 1)}}
        body = json.dumps(
            {"epoch": step // 100, "epochs": 1000, "step": step, "steps": 100_000, "metrics": metrics}
        ).encode()  # fmt: skip
        headers = {"Authorization": f"Bearer {self.tokens[job]}", "Content-Type": "application/json"}
        start = time.monotonic()
        try:
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            connection.request("POST", "/v1/progress", body, headers)
            status = connection.getresponse().status
            connection.close()
        except OSError as error:
            status = type(error).__name__
        with self.lock:
            self.answers[status] += 1
            self.latencies.append(time.monotonic() - start)

    def take(self) -> tuple[Counter, list[float]]:
        with self.lock:
            answers, latencies = self.answers, self.latencies
            self.answers, self.latencies = Counter(), []
        return answers, latencies


def token(cluster: Cluster, namespace: str, pod: dict) -> str:
    """What the kubelet mounts in a training pod's projected volume: a token of kubetf's audience bound to it."""
    request = {
        "spec": {
            "audiences": [AUDIENCE],
            "expirationSeconds": 3600,
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod["metadata"]["name"],
                               "uid": pod["metadata"]["uid"]},
        }
    }  # fmt: skip
    return cluster.core.create_namespaced_service_account_token("default", namespace, request).status.token


def running(state: State, job: str) -> bool:
    """The job Running with its one pod Running (State.wait calls it under the state's lock)."""
    pods = state.pods.get(job, {})
    return state.jobs.get(job, ("", ""))[0] == "Running" and [phase for _, phase in pods.values()] == ["Running"]


def window(process: Process, seconds: float) -> dict[str, float]:
    """The operator over `seconds`: CPU as % of a core, RSS at the end, API calls/s, status writes/s."""
    cpu0, calls0, start = process.cpu(), process.api_calls() or Counter(), time.monotonic()
    time.sleep(seconds)
    cpu1, calls1, took = process.cpu(), process.api_calls() or Counter(), time.monotonic() - start
    delta = calls1 - calls0
    status_writes = sum(v for (verb, resource_), v in delta.items() if verb == "patch" and "status" in resource_)
    return {
        "cpu": 100 * (cpu1 - cpu0) / took,
        "rss": process.rss(),
        "calls": sum(delta.values()) / took,
        "status_writes": status_writes / took,
        "seconds": took,
        "by_call": {f"{verb} {res}": round(v / took, 2) for (verb, res), v in sorted(delta.items())},
    }


def pauses(process: Process) -> dict[str, Counter]:
    """What holds kopf's event loop up, cumulative counts per bucket bound: its lag probes
    (kubetf_event_loop_lag_seconds) and Python's full garbage collections (kubetf_gc_pause_seconds, generation 2)."""
    return {
        "lag": process.histogram("kubetf_event_loop_lag_seconds").get("", Counter()),
        "gc": process.histogram("kubetf_gc_pause_seconds", "generation").get("2", Counter()),
    }


def jobs_known(process: Process) -> float:
    """How many jobs the operator holds (kubetf_jobs, every phase): a job's farewell takes it out, then its series."""
    text = process.metrics("kubetf_jobs") or ""
    return sum(s.value for f in text_string_to_metric_families(text) if f.name == "kubetf_jobs" for s in f.samples)


def series_of(process: Process, namespace: str) -> int:
    """The per-job series on the operator's /metrics of jobs in `namespace` (the whole page: seconds of the operator's
    CPU at 10,000 jobs; not read while the event loop is measured)."""
    text = process.metrics() or ""
    return sum(1 for line in text.splitlines() if line.startswith("kubetf_job_") and f'namespace="{namespace}"' in line)


def stalled(cluster: Cluster, namespace: str) -> tuple[int, int]:
    """(TrainingStalled events in the namespace, jobs whose TrainingUnhealthy condition is True now)."""
    events = cluster.raw(cluster.core.list_namespaced_event(
        namespace, field_selector="reason=TrainingStalled", _preload_content=False))["items"]  # fmt: skip
    jobs = cluster.raw(cluster.custom.list_namespaced_custom_object(
        "kubetf.io", "v1alpha1", namespace, "trainingjobs", _preload_content=False))["items"]  # fmt: skip
    unhealthy = sum(
        1
        for j in jobs
        if any(c["type"] == "TrainingUnhealthy" and c["status"] == "True" for c in (j.get("status") or {}).get(
            "conditions") or [])
    )  # fmt: skip
    return len(events), unhealthy


def delete_jobs(cluster: Cluster, process: Process, namespace: str, names: list[str]) -> None:
    """Delete `names` at once (the other jobs' reports go on); kopf's event-loop lag until the operator has let them
    go, then whether their series went."""
    series0 = series_of(process, namespace)
    known0 = jobs_known(process)
    before = pauses(process)
    start = time.monotonic()
    parallel(
        lambda name: cluster.custom.delete_namespaced_custom_object("kubetf.io", "v1alpha1", namespace,
                                                                    "trainingjobs", name),
        names,
    )  # fmt: skip
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and jobs_known(process) > known0 - len(names):
        time.sleep(1)
    took = time.monotonic() - start
    after = pauses(process)
    series1 = series_of(process, namespace)
    out(
        f"\ndeleting {len(names)} jobs while the others report: the operator let them go in {took:.0f} s ({series0} -> "
        f"{series1} series of the namespace after); kopf's event loop over that time: "
        f"{held_up(before, after)}"
    )


def held_up(before: dict[str, Counter], after: dict[str, Counter]) -> str:
    """Between two readings of `pauses`: the probes, how many ran more than 50 ms late, the bucket that holds every
    one; the full collections and the bucket that holds the longest."""

    def over(name: str) -> tuple[float, float, float]:
        count = after[name].get(math.inf, 0) - before[name].get(math.inf, 0)
        late = count - (after[name].get(0.05, 0) - before[name].get(0.05, 0))
        within = min((le for le in after[name] if after[name][le] - before[name].get(le, 0) == count), default=0)
        return count, late, within * 1000

    probes, late, worst = over("lag")
    collections, _, longest = over("gc")
    return (
        f"{probes:.0f} probes, {late:.0f} of them more than 50 ms late, every one within {worst:.0f} ms; "
        f"{collections:.0f} full garbage collections, each within {longest:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000, help="jobs of one worker, Running (default 2000)")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between a job's reports (default 1)")
    parser.add_argument("--window", type=float, default=60.0, help="seconds measured, quiet and reporting (default 60)")
    parser.add_argument("--timeout", type=float, default=1800, help="for the jobs to be Running, seconds")
    parser.add_argument("--metrics", type=int, default=2, help="metrics in each report (default 2)")
    parser.add_argument("--stall-seconds", type=float, default=600, help="the operator's --progress-stall-seconds")
    parser.add_argument("--delete", type=int, default=0, help="then delete this many jobs at once (default 0)")
    args = parser.parse_args()

    kube = ensure_cluster()
    cluster = Cluster(kube.kubeconfig)
    cluster.install_crd()
    nodes = max(2, math.ceil(args.jobs * 1.2 / PODS_PER_FAKE_NODE))
    kwok.ensure_fake_nodes(kube.kubeconfig, cluster.core, nodes)
    paused = pause_installed_operators(cluster)
    for ns, name, _ in paused:
        out(f"paused the installed operator {ns}/{name}")

    namespace = f"progress-{uuid.uuid4().hex[:6]}"
    workdir = Path(tempfile.mkdtemp(prefix="kubetf-bench-progress-"))
    process = Process(kube.kubeconfig, workdir, flags=("--progress-stall-seconds", str(args.stall_seconds)))
    state = State()
    try:
        process.start()
        port = process.operator.progress_port  # a free one, passed by the test Operator
        create_namespace(cluster, namespace)
        watches = watch_namespaces(cluster, {namespace}, state)
        names = [f"p-{i}" for i in range(args.jobs)]
        start = time.monotonic()
        parallel(lambda name: cluster.create_job(namespace, name, SPEC), names)
        state.wait(lambda: all(running(state, n) for n in names), args.timeout, f"{args.jobs} jobs Running")
        state.wait_quiet(process, timeout=600)
        out(f"{args.jobs} jobs of one worker Running in {time.monotonic() - start:.0f}s (kwok, {nodes} fake nodes)")
        pods = {
            p["metadata"]["labels"][api.LABEL_JOB]: p
            for p in cluster.raw(cluster.core.list_namespaced_pod(namespace, _preload_content=False))["items"]
            if not p["metadata"].get("deletionTimestamp")
        }
        tokens: dict[str, str] = {}
        parallel(lambda name: tokens.__setitem__(name, token(cluster, namespace, pods[name])), names)

        quiet = window(process, args.window)
        reporters = Reporters(port, tokens, args.every, args.metrics)
        own0 = resource.getrusage(resource.RUSAGE_SELF)
        reporters.start()
        time.sleep(min(30.0, args.window / 2))  # past the first reports' TokenReviews and first writes
        reporters.take()
        held0 = pauses(process)
        busy = window(process, args.window)
        held1 = pauses(process)
        answers, latencies = reporters.take()
        own1 = resource.getrusage(resource.RUSAGE_SELF)
        now = time.time()
        ages = [
            now - parse_time(p["lastReportTime"])
            for j in cluster.raw(cluster.custom.list_namespaced_custom_object(
                "kubetf.io", "v1alpha1", namespace, "trainingjobs", _preload_content=False))["items"]
            if (p := (j.get("status") or {}).get("progress")) and p.get("lastReportTime")
        ]  # fmt: skip
        for w in watches:
            w.stopped = True
        if not args.delete:
            reporters.stop()  # else they go on: a job whose reports stop is rightly judged stalled

        seconds = busy["seconds"]
        out(f"\n{'':34}{'quiet':>12}{'reporting':>12}")
        for label, key, unit in (
            ("operator CPU, % of a core", "cpu", "%"),
            ("operator RSS, MiB", "rss", ""),
            ("operator API calls/s", "calls", ""),
            ("  of which status writes/s", "status_writes", ""),
        ):
            out(f"{label:34}{quiet[key]:>11.1f}{unit or ' '}{busy[key]:>11.1f}{unit or ' '}")
        reports = sum(answers.values())
        out(
            f"\nreports: {reports / seconds:.0f}/s answered (asked: {args.jobs / args.every:.0f}/s), by status "
            f"{dict(answers)}; latency p50 {percentile(latencies, 0.5) * 1000:.0f} ms, "
            f"p99 {percentile(latencies, 0.99) * 1000:.0f} ms"
        )
        own = (own1.ru_utime + own1.ru_stime - own0.ru_utime - own0.ru_stime) / (seconds + min(30.0, args.window / 2))
        out(f"the reporters' own CPU (this process, sharing the machine): {100 * own:.0f}% of a core")
        out(f"API calls/s while reporting, by call: {busy['by_call']}")
        if ages:
            out(
                f"status.progress age at the end (now - lastReportTime), {len(ages)} of {args.jobs} jobs written: "
                f"p50 {percentile(ages, 0.5):.0f} s, p99 {percentile(ages, 0.99):.0f} s, max {max(ages):.0f} s"
            )
        else:
            out("status.progress: no job's was written")
        out(f"CPU per accepted report: {busy['cpu'] * 10 / max(1, answers.get(204, 0) / seconds):.2f} ms")
        events, unhealthy = stalled(cluster, namespace)
        out(
            f"TrainingStalled with --progress-stall-seconds {args.stall_seconds:g} while every job advanced: "
            f"{events} events, {unhealthy} jobs TrainingUnhealthy at the end (each job's status.progress is written "
            f"about every {args.jobs / 5:.0f} s at this load: 5 writes/s for all jobs)"
        )
        out(f"kopf's event loop while reporting: {held_up(held0, held1)}")
        if args.delete:
            delete_jobs(cluster, process, namespace, names[: args.delete])
            reporters.stop()
    finally:
        process.stop()
        out(f"operator log: {workdir / 'operator.log'}")
        cleanup(cluster, [namespace])
        resume_installed_operators(cluster, paused)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
