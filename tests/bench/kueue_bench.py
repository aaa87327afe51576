"""Kueue benchmark on the real node: prints numbers, asserts nothing.

    python -m tests.bench.kueue_bench [--rounds 5]

- apply -> every pod Running, for a 1 chief + 4 worker job of real pods (a `sleep`), with and without Kueue,
  alternating, in one run on the same cluster: p50 of each and the ratio (what Kueue's admission costs);
- Kueue's preemption: a high-priority job takes a full ClusterQueue from a running low-priority 1+4 job; the time
  from the high job's apply to the low job's pods all gone, and to the high job's pods all Running.
Uses $KUBECONFIG, else brings the local cluster up; installs Kueue (`local-cluster.sh kueue`) if it is not there.
Runs its own operator process (an installed one is scaled to zero meanwhile), as `make bench` does.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from kubetf.core.scheduling import workload as kueue
from tests.bench.common import percentile
from tests.cluster.fixture import ensure_cluster, wait_for
from tests.cluster.queues import Queue, make_flavor, priority_classes
from tests.integration.conftest import (
    AS_INSTALLED,
    Cluster,
    Operator,
    pause_installed_operators,
    resume_installed_operators,
)

POD_SPEC = {
    "terminationGracePeriodSeconds": 5,
    "containers": [
        {
            "name": "tensorflow",
            "image": "kubetf/python-base:bookworm",
            "imagePullPolicy": "IfNotPresent",
            "args": ["sleep", "3600"],  # the image's init (tini) stays PID 1: SIGTERM ends it at once
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
        }
    ],
}
SPEC = {
    "strategy": "MultiWorkerMirrored",
    "replicaSpecs": {
        "chief": {"replicas": 1, "template": {"spec": POD_SPEC}},
        "worker": {"replicas": 4, "template": {"spec": POD_SPEC}},
    },
}


def all_running(cluster: Cluster, namespace: str, job: str, count: int = 5) -> bool:
    pods = cluster.live_pods(namespace, job)
    return len(pods) == count and all(p["status"].get("phase") == "Running" for p in pods.values())


def apply_to_running(cluster: Cluster, namespace: str, name: str, labels: dict | None) -> float:
    start = time.monotonic()
    cluster.create_job(namespace, name, SPEC, **({"labels": labels} if labels else {}))
    wait_for(lambda: all_running(cluster, namespace, name), 120, f"{name} running", interval=0.05)
    took = time.monotonic() - start
    cluster.custom.delete_namespaced_custom_object("kubetf.io", "v1alpha1", namespace, "trainingjobs", name)
    wait_for(lambda: not cluster.pods(namespace, name), 120, f"{name}'s pods gone", interval=0.2)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    kube = ensure_cluster()
    cluster = Cluster(kube.kubeconfig)
    cluster.install_crd()
    paused = pause_installed_operators(cluster)
    operator = Operator(cluster.kubeconfig, Path(tempfile.mkdtemp()) / "operator.log", flags=AS_INSTALLED)
    namespace = f"bench-kueue-{uuid.uuid4().hex[:6]}"
    kube.install_kueue()
    make_flavor(cluster)
    priority_classes(cluster, **{"kubetf-bench-low": 100, "kubetf-bench-high": 1000})
    operator.start()
    cluster.core.create_namespace({"metadata": {"name": namespace}})
    queue = None
    try:
        wait_for(lambda: cluster.core.list_namespaced_service_account(namespace).items, 30, "a ServiceAccount")
        queue = Queue(cluster, namespace, gpus=0)
        plain, queued = [], []
        for i in range(args.rounds):
            plain.append(apply_to_running(cluster, namespace, f"plain-{i}", None))
            queued.append(apply_to_running(cluster, namespace, f"queued-{i}", {kueue.QUEUE_LABEL: queue.local}))
        p_plain, p_queued = statistics.median(plain), statistics.median(queued)
        print(f"apply -> all 5 pods Running, 1+4 job of real pods, {args.rounds} rounds each:")
        print(f"  without Kueue: p50 {p_plain:.2f}s (max {max(plain):.2f}s)")
        print(f"  with Kueue:    p50 {p_queued:.2f}s (max {max(queued):.2f}s)")
        print(f"  ratio with/without: {p_queued / p_plain:.2f}")

        # Preemption: the queue holds exactly one 1+4 job of 1 CPU each.
        preempt(cluster, namespace, args.rounds)
    finally:
        operator.stop()
        if queue is not None:
            cluster.core.delete_namespace(namespace)
            wait_for(lambda: not cluster.core.list_namespaced_pod(namespace).items, 120, "bench pods gone")
            queue.delete()
        resume_installed_operators(cluster, paused)
    print(f"operator log: {operator.log_path}")


def preempt(cluster: Cluster, namespace: str, rounds: int) -> None:
    full = Queue(cluster, namespace, gpus=0, cpu="500m", local="full")
    spec = {
        **SPEC,
        "replicaSpecs": {
            role: {**r, "template": {"spec": {**POD_SPEC, "containers": [_cpu(POD_SPEC["containers"][0], "100m")]}}}
            for role, r in SPEC["replicaSpecs"].items()
        },
    }
    gone, started = [], []
    try:
        for i in range(rounds):
            low, high = f"low-{i}", f"high-{i}"
            labels = {kueue.QUEUE_LABEL: full.local}
            cluster.create_job(namespace, low, spec, labels={**labels, kueue.PRIORITY_LABEL: "kubetf-bench-low"})
            wait_for(lambda n=low: all_running(cluster, namespace, n), 120, f"{low} running", interval=0.1)
            start = time.monotonic()
            cluster.create_job(namespace, high, spec, labels={**labels, kueue.PRIORITY_LABEL: "kubetf-bench-high"})

            def low_gone(n: str = low) -> bool:
                return all(
                    p["metadata"]["labels"]["kubetf.io/attempt"] != "0" for p in cluster.pods(namespace, n).values()
                )

            wait_for(low_gone, 120, f"{low}'s pods gone", interval=0.05)
            gone.append(time.monotonic() - start)
            wait_for(lambda n=high: all_running(cluster, namespace, n), 120, f"{high} running", interval=0.05)
            started.append(time.monotonic() - start)
            for name in (low, high):
                cluster.custom.delete_namespaced_custom_object("kubetf.io", "v1alpha1", namespace, "trainingjobs", name)
            wait_for(lambda: not cluster.core.list_namespaced_pod(namespace).items, 120, "round's pods gone")
    finally:
        full.delete()
    print(f"Kueue preemption of a running 1+4 job by a higher priority one, {rounds} rounds:")
    print(f"  high applied -> low's pods all gone: p50 {statistics.median(gone):.2f}s, max {max(gone):.2f}s")
    p50, p90 = statistics.median(started), percentile(started, 0.9)
    print(f"  high applied -> high's pods all Running: p50 {p50:.2f}s, p90 {p90:.2f}s")


def _cpu(container: dict, cpu: str) -> dict:
    return {**container, "resources": {"requests": {"cpu": cpu, "memory": "16Mi"}}}


if __name__ == "__main__":
    main()
