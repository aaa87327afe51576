"""Operator benchmark against a real API server: prints numbers, asserts nothing.

    python -m tests.bench.operator_bench [--jobs 20] [--burst 200] [--disruptions 20]

- apply-to-all-children latency of 1 chief + 4 worker jobs (p50/p99), one job at a time;
- a burst of --burst such jobs applied at once: jobs/s until every child exists;
- preemption of one worker of a running MWMS job to all replacement pods created (p50/p99);
- the operator's memory (RSS) idle and after the burst;
- a standby's takeover after the leader is SIGKILLed (the operator's default lease timings), --takeovers times: the
  brief's bound is 15 s (the functional tests only print it).
Pods are never scheduled (unknown schedulerName): this measures the operator and the API server, not kubelets.
Uses $KUBECONFIG, else brings the local cluster up (tests/cluster).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from tests.bench.common import ChildWatch, percentile, rss_mib
from tests.cluster.fixture import ensure_cluster, wait_for
from tests.integration.conftest import AS_INSTALLED, Cluster, Operator, replica

SPEC = {"strategy": "MultiWorkerMirrored", "replicaSpecs": {"chief": replica(1), "worker": replica(4)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--disruptions", type=int, default=20)
    parser.add_argument("--takeovers", type=int, default=3)
    args = parser.parse_args()

    cluster = Cluster(ensure_cluster().kubeconfig)
    cluster.install_crd()
    operator = Operator(cluster.kubeconfig, Path(tempfile.mkdtemp()) / "operator.log", flags=AS_INSTALLED)
    operator.start()
    assert operator.process is not None
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    cluster.core.create_namespace({"metadata": {"name": namespace}})
    try:
        time.sleep(2)  # the default ServiceAccount, and an operator at rest
        print(f"operator RSS idle: {rss_mib(operator.process.pid):.0f} MiB")
        watch = ChildWatch(cluster.api_client, namespace, "kubetf.io/job-name")  # pods only, as before

        latencies = []
        for i in range(args.jobs):
            name = f"seq-{i}"
            start = time.monotonic()
            cluster.create_job(namespace, name, SPEC)
            done = watch.wait(lambda n=name: len(watch.live.get(n, ())) == 5)
            latencies.append((done - start) * 1000)
        print(
            f"apply -> all 5 pods, 1+4 job, {args.jobs} jobs one at a time: "
            f"p50 {percentile(latencies, 0.5):.0f} ms, p99 {percentile(latencies, 0.99):.0f} ms"
        )

        names = [f"burst-{i}" for i in range(args.burst)]
        start = time.monotonic()
        for name in names:
            cluster.create_job(namespace, name, SPEC)
        applied = time.monotonic()
        done = watch.wait(lambda: all(len(watch.live.get(n, ())) == 5 for n in names), timeout=600)
        print(
            f"burst of {args.burst} jobs: applied in {applied - start:.1f}s, all children in {done - start:.1f}s "
            f"= {args.burst / (done - start):.1f} jobs/s"
        )
        print(
            f"operator RSS after the burst ({args.jobs + args.burst} jobs, "
            f"{5 * (args.jobs + args.burst)} pods): {rss_mib(operator.process.pid):.0f} MiB"
        )

        recover = []
        for i in range(args.disruptions):
            name = f"seq-{i}"
            cluster.run_all(namespace, name, 5)
            cluster.wait_phase(namespace, name, "Running", timeout=30)
            victim = cluster.pods(namespace, name)[f"{name}-worker-1"]
            start = time.monotonic()
            cluster.delete_pod(victim)
            group = [f"{name}-chief-0"] + [f"{name}-worker-{w}" for w in range(4)]
            done = watch.wait(
                lambda g=group, n=name: len(watch.live.get(n, ())) == 5 and all(watch.attempts.get(p) == "1" for p in g)
            )
            recover.append((done - start) * 1000)
        print(
            f"preemption of one worker -> whole MWMS group recreated, {args.disruptions} times: "
            f"p50 {percentile(recover, 0.5):.0f} ms, p99 {percentile(recover, 0.99):.0f} ms, "
            f"mean {statistics.mean(recover):.0f} ms"
        )
        operator = takeovers(cluster, operator, args.takeovers)
    finally:
        cluster.core.delete_namespace(namespace)
        operator.stop()


def takeovers(cluster: Cluster, leader: Operator, count: int) -> Operator:
    """SIGKILL the leader `count` times with a standby beside it; returns the last leader (to stop)."""
    took = []
    logs = Path(tempfile.mkdtemp())
    for i in range(count):
        standby = Operator(cluster.kubeconfig, logs / f"standby-{i}.log", flags=AS_INSTALLED)
        standby.start(leader=False)
        leader.kill()
        killed = time.monotonic()
        wait_for(lambda s=standby: s.role() == "ok leader", 60, "the standby to take over", interval=0.05)
        took.append(time.monotonic() - killed)
        leader = standby
    print(
        f"standby takeover after the leader's SIGKILL, {count} times (default lease: 8 s): "
        f"p50 {statistics.median(took):.1f} s, max {max(took):.1f} s (target <= 15 s)"
    )
    return leader


if __name__ == "__main__":
    main()
