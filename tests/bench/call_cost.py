"""What each call a new job costs the API server's CPU, and what a burst of new jobs can reach from it.

On the local cluster a burst of new jobs is bound by the API server's CPU (docs/operating.md, "What a new job costs
the API server"): a client that creates only a job's children (the raw client of `make bench-compare`) sets the
pace, and kubetf's burst against it follows the API server's CPU per job. This measures that CPU call by call: for
each kind of call a new 1 chief + 4 worker job makes, --calls of them on 8 threads into a fresh namespace, each
on an object of its own (a status patch on a job of its own: patches of one object race and the API server retries
them), the kube-apiserver process's CPU read from /proc before and after, less what it uses idle (read over the
second before, once it is quiet again after the last kind's calls). Each kind is measured --rounds times, in turns,
and the median printed. Then the sums: the raw client's job (the job, its Service and 5 pods), kubetf's (the same,
the dry runs of the Service and of one pod per role, one event, one status write), their ratio (the burst ratio
the API server's CPU allows), and what that ratio would be without each of kubetf's extra calls.

Needs the local cluster's API server on this machine (its CPU is read from /proc). Uses $KUBECONFIG, else brings
the local cluster up (tests/cluster); an installed kubetf is scaled to zero meanwhile. --without-pod-webhooks: the
cluster's pod webhooks (Kueue's) skip the namespace for the run, as in `make bench-compare`. Holds
/tmp/kubetf-cluster.lock (--lock) meanwhile.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kubetf.core import api as kapi
from kubetf.core import builders
from tests.bench.common import api_client, cluster_lock, cpu_seconds, settle
from tests.bench.compare import (
    KUBETF_SPEC,
    SKIP_WEBHOOKS,
    PodWebhooks,
    apiserver_pid,
)
from tests.cluster.fixture import ensure_cluster
from tests.integration.conftest import Cluster, pause_installed_operators, resume_installed_operators

THREADS = 8
# The local cluster's API server idles at about 3% of a core (its controllers' watches and leases): quiet below this.
IDLE_SHARE = 0.06
# What kubetf writes when a new job's pods are created (taken from a job in `make bench-scale`, its gang left out).
NEW_JOB_STATUS = {
    "activeSince": "2026-11-27T02:14:55Z",
    "conditions": [
        {
            "lastTransitionTime": "2026-11-27T02:14:55Z",
            "message": "5/5 pods not running yet",
            "observedGeneration": 1,
            "reason": "PodsStarting",
            "status": "True",
            "type": "Pending",
        }
    ],
    "observedGeneration": 1,
    "phase": "Pending",
    "ready": "0/5",
    "reason": "PodsStarting",
    "replicaStatuses": {
        "chief": {"active": 1, "failed": 0, "ready": 0, "succeeded": 0},
        "worker": {"active": 4, "failed": 0, "ready": 0, "succeeded": 0},
    },
    "restarts": {"disruptions": 0, "failures": 0, "total": 0},
    "startTime": "2026-11-27T02:14:55Z",
    "tasks": {task: {"attempt": 0, "state": "Created"} for task in ("chief-0", *(f"worker-{i}" for i in range(4)))},
}
# A new job's calls beside the user's own create: (kind of call, how many the raw client makes, how many kubetf)
PER_JOB = (
    ("job create", 1, 1),
    ("Service create", 1, 1),
    ("pod create", 5, 5),
    ("Service dry run", 0, 1),
    ("pod dry run", 0, 2),
    ("event create", 0, 1),
    ("status patch", 0, 1),
)


class Probe:
    def __init__(self, args: argparse.Namespace, kubeconfig: str) -> None:
        self.api = api_client(kubeconfig, pool=2 * THREADS)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.pool = ThreadPoolExecutor(THREADS)
        self.namespace = f"bench-calls-{uuid.uuid4().hex[:6]}"
        labels = {SKIP_WEBHOOKS: "true"} if args.without_pod_webhooks else {}
        self.core.create_namespace({"metadata": {"name": self.namespace, "labels": labels}})
        deadline = time.monotonic() + 30
        while True:  # pods are refused until the namespace's default ServiceAccount exists
            try:
                self.core.read_namespaced_service_account("default", self.namespace)
                break
            except ApiException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        job: dict[str, Any] = self.create_job("template")
        children = builders.render(job)
        self.pod = next(c for c in children if c["kind"] == "Pod" and c["metadata"]["name"].endswith("worker-3"))
        self.service = next(c for c in children if c["kind"] == "Service")
        self.uid = job["metadata"]["uid"]

    def create_job(self, name: str, **options: Any) -> Any:
        body = {"apiVersion": kapi.API_VERSION, "kind": kapi.KIND, "metadata": {"name": name}, "spec": KUBETF_SPEC}
        return self.custom.create_namespaced_custom_object(
            kapi.GROUP, kapi.VERSION, self.namespace, kapi.PLURAL, body, **options
        )

    def calls(self) -> dict[str, Callable[[str], Any]]:
        """Each kind of call, on an object named by its argument (a dry run's name not taken by a create: it would
        be refused as AlreadyExists)."""
        ns, core, custom = self.namespace, self.core, self.custom

        def named(obj: dict[str, Any], name: str) -> dict[str, Any]:
            obj = copy.deepcopy(obj)
            obj["metadata"]["name"] = f"{obj['metadata']['name']}-{name}"
            return obj

        def event(name: str) -> Any:
            body = {
                "metadata": {"generateName": "template."},
                "involvedObject": {
                    "apiVersion": kapi.API_VERSION,
                    "kind": kapi.KIND,
                    "name": "template",
                    "namespace": ns,
                    "uid": self.uid,
                },
                "type": "Normal",
                "reason": "CreatedPods",
                "count": 1,
                "source": {"component": "kubetf-operator"},
                "message": "created 5 pods: template-chief-0, template-worker-0, template-worker-1, ...",
            }
            return core.create_namespaced_event(ns, body, _preload_content=False)

        return {
            "job create": lambda n: self.create_job(f"j-{n}", _preload_content=False),
            "Service create": lambda n: core.create_namespaced_service(
                ns, named(self.service, n), _preload_content=False
            ),
            "pod create": lambda n: core.create_namespaced_pod(ns, named(self.pod, n), _preload_content=False),
            "Service dry run": lambda n: core.create_namespaced_service(
                ns, named(self.service, f"try-{n}"), dry_run="All", _preload_content=False
            ),
            "pod dry run": lambda n: core.create_namespaced_pod(
                ns, named(self.pod, f"try-{n}"), dry_run="All", _preload_content=False
            ),
            "event create": event,
            # on the jobs "job create" made in the same round (measured before it in each round)
            "status patch": lambda n: custom.patch_namespaced_custom_object_status(
                kapi.GROUP,
                kapi.VERSION,
                ns,
                kapi.PLURAL,
                f"j-{n}",
                {"status": NEW_JOB_STATUS},
                _preload_content=False,
            ),
        }

    def measure(self, call: Callable[[str], Any], names: list[str], pid: int) -> float:
        """The API server's CPU per call, in ms: what it used meanwhile, less what it uses idle (its controllers'
        watches, leases: read just before, over a quiet second)."""
        settle(pid, quiet=1.0, least=1.0, most=60.0, share=IDLE_SHARE)  # what came before (its deletions) is done
        idle_start, idle_cpu = time.monotonic(), cpu_seconds(pid)
        time.sleep(1.0)
        start, before = time.monotonic(), cpu_seconds(pid)
        idle_rate = (before - idle_cpu) / (start - idle_start)
        list(self.pool.map(call, names))
        used = cpu_seconds(pid) - before - idle_rate * (time.monotonic() - start)
        return used * 1000 / len(names)

    def delete_namespace(self) -> None:
        self.core.delete_namespace(self.namespace)


def report(costs: dict[str, float]) -> None:
    raw = sum(costs[kind] * n for kind, n, _ in PER_JOB)
    kubetf = sum(costs[kind] * n for kind, _, n in PER_JOB)
    print(f"a new job of 1 chief + 4 workers, the API server's CPU: raw client {raw:.1f} ms, kubetf {kubetf:.1f} ms")
    print(f"  raw / kubetf (the burst ratio the API server's CPU allows): {raw / kubetf:.2f}")
    for kind, raw_n, kubetf_n in PER_JOB:
        if kubetf_n > raw_n:
            without = kubetf - costs[kind] * (kubetf_n - raw_n)
            print(f"  without kubetf's {kind} ({kubetf_n - raw_n}): {without:.1f} ms, ratio {raw / without:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300, help="calls of each kind per round (default 300)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each kind's median is printed (default 3)")
    parser.add_argument("--without-pod-webhooks", action="store_true", help="the pod webhooks skip the namespace")
    parser.add_argument("--lock", default="/tmp/kubetf-cluster.lock", help="the shared cluster's lock ('' for none)")
    args = parser.parse_args()
    kubeconfig = ensure_cluster().kubeconfig
    pid = apiserver_pid()
    if pid is None:
        raise SystemExit("no kube-apiserver process on this machine: its CPU per call cannot be read")
    with cluster_lock(args.lock):
        cluster = Cluster(kubeconfig)
        paused = pause_installed_operators(cluster)  # an installed operator would act on the probe's jobs
        try:
            probe = Probe(args, kubeconfig)
            try:
                measure(args, probe, pid)
            finally:
                probe.delete_namespace()
        finally:
            resume_installed_operators(cluster, paused)


def measure(args: argparse.Namespace, probe: Probe, pid: int) -> None:
    """Every kind of call, --rounds times in turns; the medians printed, then the sums (`report`)."""
    webhooks = PodWebhooks(probe.api)
    if args.without_pod_webhooks:
        webhooks.skip_bench()
    try:
        print(
            f"pod webhooks {'skipped' if args.without_pod_webhooks else 'called'}: "
            f"{', '.join(webhooks.names()) or 'none installed'}; {args.calls} calls of each kind per round, "
            f"{THREADS} at once, {args.rounds} rounds",
            flush=True,
        )
        samples: dict[str, list[float]] = {}
        for round_ in range(args.rounds):
            names = [f"r{round_}-{i}" for i in range(args.calls)]
            for kind, call in probe.calls().items():
                samples.setdefault(kind, []).append(probe.measure(call, names, pid))
        costs = {kind: statistics.median(values) for kind, values in samples.items()}
        for kind, values in samples.items():
            spread = ", ".join(f"{v:.2f}" for v in values)
            print(f"  {kind:16s} {costs[kind]:6.2f} ms of the API server's CPU per call (rounds: {spread})")
        report(costs)
    finally:
        if args.without_pod_webhooks:
            webhooks.restore()


if __name__ == "__main__":
    main()
