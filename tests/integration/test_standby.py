"""Two operator processes on one Lease: one acts, the other stands by and takes over when the first is killed."""

import time

from kubetf.core import api
from tests.cluster.fixture import wait_for

from .conftest import SHORT_LEASE_FLAGS, Operator, replica

SPEC = {"strategy": "MultiWorkerMirrored", "replicaSpecs": {"chief": replica(1), "worker": replica(2)}}


def test_standby_takes_over_after_the_leader_is_sigkilled_with_no_duplicate_and_nothing_missed(
    cluster, operator, namespace, tmp_path
):
    operator.stop()  # the tier's own operator gives the lease up; two fresh ones compete for it
    first = Operator(cluster.kubeconfig, tmp_path / "first.log", flags=SHORT_LEASE_FLAGS)
    second = Operator(cluster.kubeconfig, tmp_path / "second.log", flags=SHORT_LEASE_FLAGS)
    try:
        first.start(leader=True)
        second.start(leader=False)
        assert second.role() == "ok standby"
        wait_for(second.ready, 10, "the standby's /readyz to say it can take over")
        assert first.ready()
        for i in range(3):
            cluster.create_job(namespace, f"before-{i}", SPEC)
        for i in range(3):
            cluster.run_all(namespace, f"before-{i}", 3)
        cluster.wait_phase(namespace, "before-0", "Running")
        # A standby writes nothing: the jobs' children were all made by the leader, once.
        assert second.role() == "ok standby"

        # The leader dies in the middle of a burst of creations ...
        for i in range(5):
            cluster.create_job(namespace, f"during-{i}", SPEC)
        first.kill()
        killed = time.monotonic()
        # ... and while nobody leads, a worker of a running job is lost and a new job is applied.
        lost = cluster.live_pods(namespace, "before-1")["before-1-worker-0"]
        cluster.delete_pod(lost)
        cluster.create_job(namespace, "after", SPEC)

        wait_for(lambda: second.role() == "ok leader", 30, "the standby to take the lease")
        takeover = time.monotonic() - killed
        print(f"\nstandby took over {takeover:.1f}s after the leader's SIGKILL (make bench measures it)")

        names = [f"before-{i}" for i in range(3)] + [f"during-{i}" for i in range(5)] + ["after"]
        for name in names:
            cluster.wait_pods(namespace, name, lambda p: len(p) == 3, f"{name}'s 3 pods", timeout=30)
        # The lost worker's group was restarted once (a disruption), nothing else was.
        status = cluster.wait_phase(namespace, "before-1", "Restarting")
        assert status["restarts"] == {**status["restarts"], "disruptions": 1, "failures": 0}
        assert set(cluster.live_pods(namespace, "before-1")) == {
            "before-1-chief-0", "before-1-worker-0", "before-1-worker-1"
        }  # fmt: skip
        for name in names:
            if name != "before-1":
                assert cluster.status(namespace, name)["restarts"]["total"] == 0, name
        every = cluster.raw(cluster.core.list_namespaced_pod(namespace, _preload_content=False))["items"]
        live = [p for p in every if not p["metadata"].get("deletionTimestamp")]
        assert len(live) == 3 * len(names)
        assert len({p["metadata"]["name"] for p in live}) == len(live)
        created_events = [e for n in names for e in cluster.events(namespace, n) if e["reason"] == "CreatedPods"]
        assert created_events, "the leaders record what they create"
    finally:
        second.stop()
        first.kill()
        operator.start()


def test_an_operator_started_beside_a_running_one_stands_by(cluster, operator, namespace, tmp_path):
    laptop = Operator(cluster.kubeconfig, tmp_path / "laptop.log")
    try:
        laptop.start(leader=False)
        cluster.create_job(namespace, "one", SPEC)
        cluster.wait_pods(namespace, "one", lambda p: len(p) == 3, "the job's pods")
        assert laptop.role() == "ok standby"
        assert operator.role() == "ok leader"
        log = (tmp_path / "laptop.log").read_text()
        assert "standby until it holds lease" in log
        assert "Created" not in log
        pods = cluster.pods(namespace, "one")
        assert all(p["metadata"]["labels"][api.LABEL_ATTEMPT] == "0" for p in pods.values())
    finally:
        laptop.stop()
