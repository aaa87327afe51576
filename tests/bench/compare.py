"""kubetf against Kubeflow's training-operator and against the API server itself: prints numbers, asserts nothing.

    python -m tests.bench.compare [--jobs 20] [--burst 200] [--foreign-pods N] [--parallel 32]

One run, one cluster, one job shape: 1 chief + 4 workers (a TrainingJob; for Kubeflow a TFJob with Chief 1 +
Worker 4). Pods are never scheduled (an unknown schedulerName): this measures the operators and the API server,
not kubelets. A job counts as done when every child it needs exists, as seen by a watch: kubetf makes 5 pods and
one headless Service, Kubeflow 5 pods and one Service per replica.

Contenders, one after the other, each in a fresh namespace, each operator with its default settings and alone on
the cluster (stopped before the next one starts; an installed kubetf chart is scaled to zero meanwhile):
- raw: no operator; this client creates the job object and then its children directly, in parallel (the API
  server's own limit for the same objects), once with kubetf's objects and once with Kubeflow's;
- kubetf: `python -m kubetf.cli operator` as a process;
- kubeflow: training-operator v1.9.4 built from the Go module proxy (cached), `--enable-scheme=tfjob`, no webhook.
For each: apply-to-all-children latency of --jobs jobs one at a time (p50/p99); a burst of --burst jobs applied
at once by --parallel client threads, jobs/s until every child exists; the operator's RSS idle and after the
burst, and its CPU seconds per job (/proc/<pid>/stat, over the sequential jobs and the burst until it is quiet).
--foreign-pods N: afterwards, N plain pods of no job in another namespace (on kwok nodes when nodes labelled
type=kwok exist, else unscheduled); each operator is started fresh and its RSS read once it is quiet.
--without-pod-webhooks: the pod webhooks of the cluster (Kueue's pod integration calls one, mutating and one
validating, on every namespace but its own and kube-system, as it ships) skip the bench's namespaces for the run
(a namespaceSelector expression, taken back at the end): a run with and one without say what they cost every pod
create, kubetf's and everyone else's. The first line says which webhooks were in the path.
--rounds N: the raw client and kubetf measured N times, one after the other (Kubeflow once): each round's
ratios and their median, the table from the round of the median burst ratio.
--only raw,kubetf --kubetf-flags=...: kubetf with a setting changed against the raw client, e.g. one run with
`--admitted-shape-seconds=0` and one without, alternated, for what one setting is worth.

Each contender holds /tmp/kubetf-cluster.lock (--lock) while it uses the cluster; do not wrap this in flock.
Uses $KUBECONFIG, else brings the local cluster up (tests/cluster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kubetf.core import api as kapi
from kubetf.core import builders
from tests.bench import kubeflow
from tests.bench.common import (
    ChildWatch,
    api_client,
    cluster_lock,
    cpu_seconds,
    peak_rss_mib,
    percentile,
    rss_mib,
    settle,
)
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

KUBETF_SPEC = {"strategy": "MultiWorkerMirrored", "replicaSpecs": {"chief": replica(1), "worker": replica(4)}}
CREATE_TIMEOUT = 900  # Kubeflow at 20 QPS takes minutes for a burst of 200
SKIP_WEBHOOKS = "kubetf.io/bench-skips-pod-webhooks"  # on the bench's namespaces; --without-pod-webhooks uses it
SKIP = {"key": SKIP_WEBHOOKS, "operator": "DoesNotExist"}


class PodWebhooks:
    """The cluster's admission webhooks on pod creates; `skip_bench` makes them pass the bench's namespaces by,
    `restore` takes that back."""

    def __init__(self, api: client.ApiClient) -> None:
        self.admission = client.AdmissionregistrationV1Api(api)
        self.kinds = (
            (self.admission.list_mutating_webhook_configuration, self.admission.patch_mutating_webhook_configuration),
            (
                self.admission.list_validating_webhook_configuration,
                self.admission.patch_validating_webhook_configuration,
            ),
        )

    def names(self) -> list[str]:
        return [webhook["name"] for _, _, webhook in self._on_pods()]

    def skip_bench(self) -> None:
        self._edit(lambda expressions: [*expressions, SKIP] if SKIP not in expressions else expressions)

    def restore(self) -> None:
        self._edit(lambda expressions: [e for e in expressions if e != SKIP])

    def _on_pods(self) -> list[tuple[Callable, dict, dict]]:
        found = []
        for list_fn, patch_fn in self.kinds:
            for config in json.loads(list_fn(_preload_content=False).data)["items"]:
                for webhook in config.get("webhooks") or []:
                    rules = webhook.get("rules") or []
                    if any("pods" in (r.get("resources") or []) and "CREATE" in r.get("operations", []) for r in rules):
                        found.append((patch_fn, config, webhook))
        return found

    def _edit(self, change: Callable[[list[dict]], list[dict]]) -> None:
        for patch_fn, config, webhook in self._on_pods():
            selector = dict(webhook.get("namespaceSelector") or {})
            selector["matchExpressions"] = change(list(selector.get("matchExpressions") or []))
            webhooks = [
                {**w, "namespaceSelector": selector} if w["name"] == webhook["name"] else w for w in config["webhooks"]
            ]
            patch_fn(config["metadata"]["name"], {"webhooks": webhooks})


@dataclass
class Result:
    name: str
    children: int
    latencies: list[float] = field(default_factory=list)
    burst_applied: float = 0.0
    burst_done: float = 0.0
    burst: int = 0
    rss_idle: float | None = None
    rss_after: float | None = None
    rss_peak: float | None = None
    cpu_per_job: float | None = None
    apiserver_cpu_per_job: float | None = None
    client_cpu: float | None = None  # this client's CPU use during the burst, in cores
    quiet_after: float | None = None  # seconds from the burst's last child until the operator was quiet

    @property
    def p50(self) -> float:
        return percentile(self.latencies, 0.5)

    @property
    def p99(self) -> float:
        return percentile(self.latencies, 0.99)

    @property
    def rate(self) -> float:
        return self.burst / self.burst_done if self.burst_done else float("nan")


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.kubeconfig = ensure_cluster().kubeconfig
        self.api = api_client(self.kubeconfig, pool=2 * args.parallel + 8)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.cluster = Cluster(self.kubeconfig)
        self.pool = ThreadPoolExecutor(args.parallel)  # the client applying jobs at once
        self.child_pool = ThreadPoolExecutor(args.parallel)  # raw: children of one job in parallel
        self.logs = Path(tempfile.mkdtemp(prefix="bench-compare-"))

    # --- creating things
    def post(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create one object with the plain REST call (no model (de)serialization); return the created object."""
        meta = obj["metadata"]
        namespace = meta["namespace"]
        if obj["kind"] == "Pod":
            response = self.core.create_namespaced_pod(namespace, obj, _preload_content=False)
        elif obj["kind"] == "Service":
            response = self.core.create_namespaced_service(namespace, obj, _preload_content=False)
        else:
            group, version = obj["apiVersion"].split("/")
            plural = kubeflow.PLURAL if obj["kind"] == kubeflow.KIND else kapi.PLURAL
            response = self.custom.create_namespaced_custom_object(
                group, version, namespace, plural, obj, _preload_content=False
            )
        return json.loads(response.data)

    def trainingjob(self, namespace: str, name: str) -> dict[str, Any]:
        return {
            "apiVersion": kapi.API_VERSION,
            "kind": kapi.KIND,
            "metadata": {"name": name, "namespace": namespace},
            "spec": KUBETF_SPEC,
        }

    def apply_kubetf(self, namespace: str, name: str) -> None:
        self.post(self.trainingjob(namespace, name))

    def apply_tfjob(self, namespace: str, name: str) -> None:
        self.post(kubeflow.tfjob(namespace, name, pod_template()))

    def raw(self, make_job: Callable[[str, str], dict], children: Callable[[dict], list[dict]]) -> Callable:
        """A client doing the operator's work itself: the job, then all its children at once."""

        def apply(namespace: str, name: str) -> None:
            job = self.post(make_job(namespace, name))
            for future in [self.child_pool.submit(self.post, child) for child in children(job)]:
                future.result()

        return apply

    # --- namespaces
    def namespace(self, prefix: str) -> str:
        name = f"bench-{prefix}-{uuid.uuid4().hex[:6]}"
        self.core.create_namespace({"metadata": {"name": name, "labels": {SKIP_WEBHOOKS: "true"}}})
        deadline = time.monotonic() + 30
        while True:  # pods are refused until the namespace's default ServiceAccount exists
            try:
                self.core.read_namespaced_service_account("default", name)
                return name
            except ApiException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def delete_namespace(self, name: str, timeout: float = 300) -> None:
        """Delete and wait until gone, so the next contender does not share the API server with the cleanup."""
        try:
            self.core.delete_namespace(name)
        except ApiException as error:
            if error.status == 404:
                return
            raise
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.core.read_namespace(name)
            except ApiException as error:
                if error.status == 404:
                    return
                raise
            time.sleep(1)
        print(f"  (namespace {name} still terminating after {timeout:.0f}s)", flush=True)

    # --- measuring
    def measure(
        self, name: str, apply: Callable[[str, str], None], job_label: str, children: int, pid: int | None
    ) -> Result:
        args = self.args
        result = Result(name, children)
        namespace = self.namespace(name.split()[0])
        try:
            watch = ChildWatch(self.api, namespace, job_label, ("pods", "services"))
            if pid:
                settle(pid)
                result.rss_idle = rss_mib(pid)
            # One job first: proves the contender makes every child (or says it does not), warms caches up.
            apply(namespace, "warmup")
            watch.wait(lambda: watch.count("warmup") >= children, 120, f"{name}: the {children} children of a job")
            time.sleep(1)
            if watch.count("warmup") != children:
                raise RuntimeError(f"{name}: expected {children} children per job, saw {watch.live['warmup']}")
            if pid:
                settle(pid)
                cpu_start = cpu_seconds(pid)
            apiserver = apiserver_pid()
            apiserver_start = cpu_seconds(apiserver) if apiserver else 0.0

            for i in range(args.jobs):
                job = f"seq-{i}"
                start = time.monotonic()
                apply(namespace, job)
                done = watch.wait(lambda j=job: watch.count(j) >= children, 120, f"{name}: children of {job}")
                result.latencies.append((done - start) * 1000)

            names = [f"burst-{i}" for i in range(args.burst)]
            start, client_start = time.monotonic(), cpu_seconds(os.getpid())
            list(self.pool.map(lambda n: apply(namespace, n), names))
            result.burst_applied = time.monotonic() - start
            result.client_cpu = (cpu_seconds(os.getpid()) - client_start) / result.burst_applied
            done = watch.wait(
                lambda: all(watch.count(n) >= children for n in names), CREATE_TIMEOUT, f"{name}: the burst's children"
            )
            result.burst_done, result.burst = done - start, args.burst
            if pid:
                result.quiet_after = settle(pid, most=120)
                result.cpu_per_job = (cpu_seconds(pid) - cpu_start) / (args.jobs + args.burst)
                result.rss_after, result.rss_peak = rss_mib(pid), peak_rss_mib(pid)
            if apiserver:
                result.apiserver_cpu_per_job = (cpu_seconds(apiserver) - apiserver_start) / (args.jobs + args.burst)
        finally:
            self.delete_namespace(namespace)  # while the operator still runs (it may hold finalizers)
        return result

    def report(self, result: Result) -> None:
        line = (
            f"  {result.name}: p50 {result.p50:.0f} ms, p99 {result.p99:.0f} ms; burst of {result.burst}: "
            f"applied in {result.burst_applied:.2f}s (client {100 * (result.client_cpu or 0):.0f}% of a core), "
            f"all children in {result.burst_done:.2f}s = {result.rate:.2f} jobs/s"
        )
        if result.rss_idle is not None:
            line += (
                f"; RSS {result.rss_idle:.0f} -> {result.rss_after:.0f} MiB (peak {result.rss_peak:.0f}), "
                f"CPU {1000 * result.cpu_per_job:.0f} ms/job (quiet {result.quiet_after:.0f}s after the burst)"
            )
        print(line, flush=True)

    # --- the contenders
    def kubetf_operator(self) -> Operator:
        flags = AS_INSTALLED + tuple(self.args.kubetf_flags.split())
        operator = Operator(self.kubeconfig, self.logs / "kubetf-operator.log", flags=flags)
        operator.start()
        return operator

    def kubeflow_operator(self, binary: Path) -> kubeflow.TrainingOperator:
        kubeflow.prepare_certs(self.api)
        operator = kubeflow.TrainingOperator(binary, self.kubeconfig, self.logs / "training-operator.log")
        operator.start()
        return operator

    def foreign_pods(self, count: int) -> str:
        """`count` plain pods of no job in their own namespace: on kwok nodes if there are any, else unscheduled."""
        namespace = self.namespace("foreign")
        nodes = [n.metadata.name for n in self.core.list_node(label_selector="type=kwok").items]
        where = f"on {len(nodes)} kwok nodes" if nodes else "unscheduled"
        print(f"creating {count} foreign pods in {namespace} ({where})", flush=True)

        def pod(i: int) -> dict[str, Any]:
            spec: dict[str, Any] = {
                "containers": [{"name": "app", "image": "kubetf/python-base:bookworm", "command": ["sleep", "inf"]}],
                "enableServiceLinks": False,
            }
            if nodes:
                spec["nodeName"] = nodes[i % len(nodes)]
                spec["tolerations"] = [{"operator": "Exists"}]
            else:
                spec["schedulerName"] = "kubetf-test-unscheduled"
            meta = {"name": f"foreign-{i}", "namespace": namespace, "labels": {"app": "foreign"}}
            return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}

        start = time.monotonic()
        list(self.pool.map(lambda i: self.post(pod(i)), range(count)))
        print(f"  created in {time.monotonic() - start:.1f}s", flush=True)
        return namespace

    def idle_rss(self, start: Callable[[], Any], pid_of: Callable[[Any], int]) -> tuple[float, float]:
        operator = start()
        try:
            pid = pid_of(operator)
            settle(pid, least=10, most=180)
            return rss_mib(pid), peak_rss_mib(pid)
        finally:
            operator.stop()


def apiserver_pid() -> int | None:
    """The local cluster's kube-apiserver process, when it runs on this machine (else its CPU is not shown)."""
    for stat in Path("/proc").glob("[0-9]*/comm"):
        try:
            if stat.read_text().strip() == "kube-apiserver":
                return int(stat.parent.name)
        except OSError:
            continue
    return None


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20, help="jobs applied one at a time (latency)")
    parser.add_argument("--burst", type=int, default=200, help="jobs applied at once (throughput)")
    parser.add_argument("--parallel", type=int, default=32, help="client threads applying the burst")
    parser.add_argument("--foreign-pods", type=int, default=0, help="also: RSS with N pods of no job (0: skip)")
    parser.add_argument(
        "--only", default="raw,kubetf,kubeflow", help="comma-separated contenders: raw, kubetf, kubeflow"
    )
    parser.add_argument("--lock", default="/tmp/kubetf-cluster.lock", help="cluster lock file ('' for none)")
    parser.add_argument(
        "--rounds", type=int, default=1, help="measure the raw client and kubetf this many times, one after the other"
    )
    parser.add_argument(
        "--kubetf-flags", default="", help="more flags for kubetf's operator, such as '--admitted-shape-seconds=0'"
    )
    parser.add_argument(
        "--without-pod-webhooks", action="store_true", help="the cluster's pod webhooks skip the bench's namespaces"
    )
    args = parser.parse_args()
    only = set(args.only.split(","))

    binary = kubeflow.build() if "kubeflow" in only or args.foreign_pods else None
    bench = Bench(args)
    webhooks = PodWebhooks(bench.api)
    print(
        f"bench-compare: 1 chief + 4 workers, {args.jobs} jobs one at a time, a burst of {args.burst} "
        f"({args.parallel} client threads), pods unscheduled; cluster {bench.kubeconfig}; logs {bench.logs}; "
        f"pod webhooks {'skipped' if args.without_pod_webhooks else 'in the path'}: "
        f"{', '.join(webhooks.names()) or 'none'}",
        flush=True,
    )
    results: dict[str, Result] = {}
    rounds: list[tuple[Result, Result]] = []  # (raw, kubetf), measured one after the other
    with cluster_lock(args.lock):
        bench.cluster.install_crd()
        if binary:
            kubeflow.install_crd(bench.kubeconfig, bench.api)
        paused = pause_installed_operators(bench.cluster)
    try:
        if args.without_pod_webhooks:
            webhooks.skip_bench()
        for round_ in range(args.rounds):
            if args.rounds > 1:
                print(f"round {round_ + 1} of {args.rounds}:", flush=True)
            if "raw" in only:
                with cluster_lock(args.lock):
                    print("raw API client, no operator:", flush=True)
                    results["raw"] = bench.measure(
                        "raw (kubetf's objects)",
                        bench.raw(bench.trainingjob, builders.render),
                        kapi.LABEL_JOB,
                        6,
                        None,
                    )
                    bench.report(results["raw"])
                    if binary and round_ == 0:
                        results["raw-kubeflow"] = bench.measure(
                            "raw (Kubeflow's objects)",
                            bench.raw(lambda ns, n: kubeflow.tfjob(ns, n, pod_template()), kubeflow.children),
                            kubeflow.JOB_LABEL,
                            10,
                            None,
                        )
                        bench.report(results["raw-kubeflow"])
            if "kubetf" in only:
                with cluster_lock(args.lock):
                    print(f"kubetf operator ({args.kubetf_flags or 'defaults'}):", flush=True)
                    operator = bench.kubetf_operator()
                    try:
                        assert operator.process is not None
                        results["kubetf"] = bench.measure(
                            "kubetf", bench.apply_kubetf, kapi.LABEL_JOB, 6, operator.process.pid
                        )
                    finally:
                        operator.stop()
                    bench.report(results["kubetf"])
            if "raw" in results and "kubetf" in results:
                rounds.append((results["raw"], results["kubetf"]))
        if "kubeflow" in only and binary:
            with cluster_lock(args.lock):
                print(f"Kubeflow training-operator {kubeflow.VERSION} (defaults, --enable-scheme=tfjob):", flush=True)
                trainer = bench.kubeflow_operator(binary)
                try:
                    assert trainer.process is not None
                    results["kubeflow"] = bench.measure(
                        "kubeflow", bench.apply_tfjob, kubeflow.JOB_LABEL, 10, trainer.process.pid
                    )
                finally:
                    trainer.stop()
                bench.report(results["kubeflow"])
        foreign: dict[str, tuple[float, float]] = {}
        if args.foreign_pods and binary:
            with cluster_lock(args.lock):
                namespace = bench.foreign_pods(args.foreign_pods)
                try:
                    foreign["kubetf"] = bench.idle_rss(bench.kubetf_operator, lambda o: o.process.pid)
                    print(f"  kubetf: RSS {foreign['kubetf'][0]:.0f} MiB (peak {foreign['kubetf'][1]:.0f})")
                    foreign["kubeflow"] = bench.idle_rss(
                        lambda: bench.kubeflow_operator(binary), lambda o: o.process.pid
                    )
                    print(f"  kubeflow: RSS {foreign['kubeflow'][0]:.0f} MiB (peak {foreign['kubeflow'][1]:.0f})")
                finally:
                    bench.delete_namespace(namespace, timeout=600)
    finally:
        if args.without_pod_webhooks:
            webhooks.restore()
        if paused:
            with cluster_lock(args.lock):
                resume_installed_operators(bench.cluster, paused)

    if len(rounds) > 1:  # the table shows the round of the median burst ratio: one run's consistent columns
        results["raw"], results["kubetf"] = sorted(rounds, key=lambda r: r[1].rate / r[0].rate)[len(rounds) // 2]
    summary(args, results, foreign, rounds)


def summary(
    args: argparse.Namespace,
    results: dict[str, Result],
    foreign: dict[str, tuple[float, float]],
    rounds: list[tuple[Result, Result]],
) -> None:
    print()
    print(f"{'':34}" + "".join(f"{r.name.split(' (')[0] + (' kf' if k == 'raw-kubeflow' else ''):>12}"
                                 for k, r in results.items()))  # fmt: skip

    def row(label: str, value: Callable[[Result], float | None], fmt: str) -> None:
        cells = []
        for r in results.values():
            v = value(r)
            cells.append(f"{format(v, fmt):>12}" if v is not None else f"{'-':>12}")
        print(f"{label:34}" + "".join(cells))

    row("children per job", lambda r: r.children, "d")
    row("apply -> all children p50 (ms)", lambda r: r.p50, ".0f")
    row("apply -> all children p99 (ms)", lambda r: r.p99, ".0f")
    row(f"burst of {args.burst}: jobs/s", lambda r: r.rate, ".2f")
    row("burst: all children (s)", lambda r: r.burst_done, ".1f")
    row("RSS idle (MiB)", lambda r: r.rss_idle, ".0f")
    row("RSS after the burst (MiB)", lambda r: r.rss_after, ".0f")
    row("RSS peak (MiB)", lambda r: r.rss_peak, ".0f")
    row("CPU per job (ms)", lambda r: 1000 * r.cpu_per_job if r.cpu_per_job is not None else None, ".0f")
    row(
        "API server CPU per job (ms)",
        lambda r: 1000 * r.apiserver_cpu_per_job if r.apiserver_cpu_per_job else None,
        ".0f",
    )
    row("client CPU while applying (cores)", lambda r: r.client_cpu, ".2f")

    k, f, raw, rawkf = (results.get(n) for n in ("kubetf", "kubeflow", "raw", "raw-kubeflow"))
    for who, label in (("kubetf", "kubetf"), ("kubeflow", "Kubeflow")):
        if who in foreign:
            idle = results[who].rss_idle if who in results else None
            print(
                f"RSS with {args.foreign_pods} foreign pods, {label}: {foreign[who][0]:.0f} MiB "
                f"(peak {foreign[who][1]:.0f})" + (f", idle without them {idle:.0f} MiB" if idle else "")
            )
    print()
    print("ratios:")
    if k and f:
        print(f"  burst kubetf / Kubeflow:            {ratio(k.rate, f.rate)}  (target >= 2)")
        print(f"  p50 kubetf / Kubeflow:              {ratio(k.p50, f.p50)}")
        print(f"  RSS idle kubetf / Kubeflow:         {ratio(k.rss_idle, f.rss_idle)}")
        print(f"  RSS after burst kubetf / Kubeflow:  {ratio(k.rss_after, f.rss_after)}")
        print(f"  CPU per job kubetf / Kubeflow:      {ratio(k.cpu_per_job, f.cpu_per_job)}  (target < 1)")
    if k and raw and len(rounds) > 1:
        # A ratio of two runs minutes apart on this shared machine moves by a third from run to run: each round's,
        # and their median.
        for label, value, target in (
            ("burst kubetf / raw", lambda r: r.rate, ">= 0.8"),
            ("p50 kubetf / raw", lambda r: r.p50, "<= 1.2"),
            ("API server CPU per job kubetf / raw", lambda r: r.apiserver_cpu_per_job, ""),
        ):
            each = [value(kt) / value(rw) for rw, kt in rounds if value(kt) and value(rw)]
            if each:
                listed = ", ".join(f"{x:.2f}" for x in each)
                print(
                    f"  {label}: median {statistics.median(each):.2f} of {listed}"
                    + (f"  (target {target})" if target else "")
                )
    elif k and raw:
        print(f"  burst kubetf / raw:                 {ratio(k.rate, raw.rate)}  (target >= 0.8)")
        print(f"  p50 kubetf / raw:                   {ratio(k.p50, raw.p50)}  (target <= 1.2)")
    if f and rawkf:
        print(f"  burst Kubeflow / raw (its objects): {ratio(f.rate, rawkf.rate)}")
        print(f"  p50 Kubeflow / raw (its objects):   {ratio(f.p50, rawkf.p50)}")
    if "kubetf" in foreign and "kubeflow" in foreign:
        print(
            f"  RSS with {args.foreign_pods} foreign pods kubetf / Kubeflow: "
            f"{ratio(foreign['kubetf'][0], foreign['kubeflow'][0])}  (target < 1)"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
