"""Queue positions from Kueue's visibility API (kubetf.runtime.positions): read per ClusterQueue, told to the jobs
whose place changed, within a write budget that serves the front of the queue first."""

import pytest

from kubetf.cluster.cache import Store
from kubetf.cluster.kube import NotServed
from kubetf.core.config import OperatorConfig
from kubetf.core.scheduling import workload as kueue
from kubetf.runtime.positions import QueuePositions

pytestmark = pytest.mark.unit


class Visibility:
    def __init__(self, pending):
        self.pending = pending  # path -> [(namespace, workload name)] in queue order
        self.calls = []

    def pending_workloads(self, path, offset, limit):
        self.calls.append((path, offset))
        if path not in self.pending:
            raise NotServed(403, "forbidden")
        names = self.pending[path][offset : offset + limit]
        return [
            {"metadata": {"namespace": ns, "name": n}, "positionInClusterQueue": offset + i}
            for i, (ns, n) in enumerate(names)
        ]


class Queue:
    def __init__(self):
        self.added = []

    def add(self, key, priority):
        self.added.append(key)


def job(name):
    return {"metadata": {"name": name, "namespace": "team-a", "uid": f"{name}-uid-0000"}, "spec": {}}


def tracking(count, pending, **config):
    queue = Queue()
    store = Store(tombstone_seconds=300)
    positions = QueuePositions(Visibility(pending), store, queue, OperatorConfig(**config), clock=lambda: 0.0)
    jobs = [job(f"j{i}") for i in range(count)]
    for document in jobs:
        workload = {"metadata": {"name": kueue.workload_name(document)}}
        positions.track(
            ("team-a", document["metadata"]["name"]), document, kueue.Admission("lq", "cq", workload=workload)
        )
    return positions, queue, jobs


def test_the_front_of_the_queue_is_told_first_and_the_writes_stay_within_budget():
    names = [("team-a", kueue.workload_name(job(f"j{i}"))) for i in reversed(range(100))]  # j99 first in line
    positions, queue, jobs = tracking(
        100, {"clusterqueues/cq": names}, queue_position_writes=1, queue_position_seconds=30
    )
    positions.poll()
    assert len(queue.added) == 30  # one write a second over the 30 s between reads
    assert queue.added[:3] == [("team-a", "j99"), ("team-a", "j98"), ("team-a", "j97")]
    assert positions.position("team-a", kueue.workload_name(jobs[99])) == 0
    assert positions.position("team-a", kueue.workload_name(jobs[0])) is None  # not told yet: its turn comes next
    queue.added.clear()
    positions.poll()
    assert len(queue.added) == 30 and queue.added[0] == ("team-a", "j69")
    assert positions.kube.calls == [("clusterqueues/cq", 0), ("clusterqueues/cq", 0)]


def test_without_cluster_wide_access_each_local_queue_is_read_instead():
    names = [("team-a", kueue.workload_name(job("j0")))]
    positions, _, _ = tracking(1, {"namespaces/team-a/localqueues/lq": names})
    positions.poll()  # 403 for the ClusterQueue: a namespaced install
    positions.poll()
    assert positions.position("team-a", names[0][1]) == 0
    assert [path for path, _ in positions.kube.calls] == ["clusterqueues/cq", "namespaces/team-a/localqueues/lq"]


def test_a_job_no_longer_queued_is_forgotten():
    names = [("team-a", kueue.workload_name(job("j0")))]
    positions, queue, jobs = tracking(1, {"clusterqueues/cq": names})
    positions.poll()
    positions.track(("team-a", "j0"), jobs[0], None)  # admitted
    assert positions.position("team-a", names[0][1]) is None
    queue.added.clear()
    positions.poll()
    assert queue.added == [] and len(positions.kube.calls) == 1  # nothing tracked: nothing read
