"""Scale behaviours on the real API server: foreign pods cost the operator nothing, a burst does not delay the
recovery of a preempted job."""

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.cluster.fixture import wait_for

from .conftest import UNSCHEDULED, replica

FOREIGN_PODS = 10_000
MIB = 1024 * 1024
# Each foreign pod carries this much env, so that keeping them would cost far more than the operator's own drift
# between two settled readings (seen up to 8 MiB on a busy machine): 10,000 pods of ~5 KiB of JSON are ~50 MiB.
FOREIGN_ENV_BYTES = 4000


def memory(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024 / MIB
    raise AssertionError(f"no {field} for {pid}")


def settled(operator) -> tuple[float, float]:
    """(RSS, peak RSS) of the operator once its memory stopped moving: started, cache primed, watches listed."""
    last = [memory(operator.process.pid)]

    def steady():
        now = memory(operator.process.pid)
        still, last[0] = abs(now - last[0]) < 1, now
        return still and now

    rss = wait_for(steady, 60, "the operator's memory to settle", interval=2)
    return rss, memory(operator.process.pid, "VmHWM")


def test_ten_thousand_foreign_pods_do_not_raise_the_operators_memory(cluster, operator, tmp_path):
    foreign = f"foreign-{uuid.uuid4().hex[:6]}"
    cluster.core.create_namespace({"metadata": {"name": foreign}})
    # Like against like: a freshly started operator, settled, without and then with the foreign pods.
    operator.stop()
    operator.start()
    before, started_peak = settled(operator)
    pod = {
        "metadata": {"labels": {"app": "someone-else", "app.kubernetes.io/managed-by": "helm"}},
        "spec": {
            "schedulerName": UNSCHEDULED,
            "containers": [
                {"name": "app", "image": "example/app:1", "env": [{"name": "X", "value": "y" * FOREIGN_ENV_BYTES}]}
            ],
        },
    }

    def create(i: int) -> int:
        created = cluster.core.create_namespaced_pod(
            foreign, {**pod, "metadata": {**pod["metadata"], "name": f"pod-{i}"}}, _preload_content=False
        )
        return len(created.data)

    try:
        with ThreadPoolExecutor(8) as pool:  # the client's connection pool holds 10
            stored = sum(pool.map(create, range(FOREIGN_PODS))) / MIB
        running_after, _ = settled(operator)
        # A restarted operator lists what it watches: with server-side selectors, none of these pods.
        operator.stop()
        operator.start()
        _, restarted_peak = settled(operator)
        print(f"\nRSS: {before:.0f} MiB before, {running_after:.0f} MiB with {FOREIGN_PODS} foreign pods "
              f"({stored:.0f} MiB of JSON); "
              f"a started operator peaks at {started_peak:.0f} MiB without them, "
              f"{restarted_peak:.0f} MiB with them")  # fmt: skip
        # Keeping (or even listing) them would cost at least their JSON: a third of it is far above the drift.
        assert running_after - before <= stored / 3
        assert restarted_peak - started_peak <= stored / 3
    finally:
        cluster.core.delete_namespace(foreign)


def test_a_burst_of_creations_does_not_delay_the_recovery_of_a_preempted_job(cluster, operator, namespace):
    spec = {"strategy": "MultiWorkerMirrored", "replicaSpecs": {"chief": replica(1), "worker": replica(4)}}
    cluster.create_job(namespace, "victim", spec)
    cluster.run_all(namespace, "victim", 5)
    cluster.wait_phase(namespace, "victim", "Running")

    burst = threading.Thread(
        target=lambda: [cluster.create_job(namespace, f"burst-{i}", spec) for i in range(150)], daemon=True
    )
    burst.start()
    wait_for(lambda: len(cluster.pods(namespace, "burst-20")) == 5, 60, "the burst under way")
    lost = cluster.live_pods(namespace, "victim")["victim-worker-2"]
    cluster.delete_pod(lost)
    preempted = time.monotonic()
    cluster.wait_pods(
        namespace,
        "victim",
        lambda p: len(p) == 5 and all(x["metadata"]["labels"]["kubetf.io/attempt"] == "1" for x in p.values()),
        "the whole group recreated",
        timeout=30,
    )
    recovery = time.monotonic() - preempted
    created = sum(1 for i in range(150) if cluster.job(namespace, f"burst-{i}"))
    print(f"\npreemption to all 5 replacement pods: {recovery:.2f}s, while {created} burst jobs were applied")
    burst.join(120)
    assert recovery <= 2.0
