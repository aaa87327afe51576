"""The operator SIGKILLed 20 times at random moments while 20 jobs are created and restarted: nothing is lost,
nothing is done twice.

The operator runs as its Deployment runs it: a leader and standbys, a killed process replaced at once (a
standby takes the lease once the dead leader's has expired). The test plays the user (it creates the jobs and,
until the last kill, keeps making one of a job's pods exit 1 or deleting it, one restart at a time per job) and
the kubelet (it starts every pod the operator creates). A watch records every pod ever created, so a pod created
twice, or recreated without a restart, shows even if it was deleted again at once. The plan (jobs, the sequence
of restarts of each, kill moments) comes from a seeded random: `KUBETF_CHAOS_SEED=<seed printed> pytest ...`
replays it; the timing, and so how far each job gets in its sequence, is the machine's.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from kubetf.core import api

from .conftest import TEST_FLAGS, Cluster, Operator, mwms_spec, ps_spec

KILLS = 20
JOBS = 20
# How long a leader runs before it is killed: from its first moments (priming the cache, the first reconciles)
# to the middle of a burst of restarts (20 jobs, each restarted every 1-10 s: a few in flight at any time).
LEAD_SECONDS = (0.0, 2.5)
# The whole test, kills and convergence: a run takes about KILLS x (lease expiry + LEAD_SECONDS). How long the jobs
# took to converge after the last kill is printed, not bounded (a duration is a benchmark's: `make bench` measures
# takeovers).
DEADLINE_SECONDS = 600
# Shorter still than SHORT_LEASE_FLAGS: 20 takeovers are most of the test's time. A killed leader's lease expires
# in 2 s.
FLAGS = (*TEST_FLAGS, "--lease-duration", "2", "--renew-deadline", "1.5", "--retry-period", "0.25")
MAX_FAILURES = 3  # per job, then only deletions: the backoff after a failure stays at most 4 s
RESTART_EVERY = (1.0, 10.0)  # seconds from a job's last restart being carried out to its next
RUN_POLICY = {"backoffLimit": 10, "backoffSeconds": 1}
MWMS = mwms_spec(**RUN_POLICY)
PS = ps_spec(**RUN_POLICY)


def restarted_tasks(strategy: str, task: str) -> list[str]:
    """docs/restarts.md's rule: what restarts when `task` ends abnormally."""
    if strategy == "MultiWorkerMirrored":
        return ["chief-0", "worker-0", "worker-1"]
    if task == "ps-0":
        return ["chief-0", "ps-0"]
    return [task]


@dataclass
class Job:
    name: str
    spec: dict
    created_in_round: int  # created once this many kills have happened
    rng: random.Random  # the job's own sequence of restarts and pauses
    created: bool = False
    done: list[tuple[str, str]] = field(default_factory=list)  # the restarts made: (exit1 | delete, task)
    act_at: float | None = None  # settled: its next restart is made then

    @property
    def strategy(self) -> str:
        return self.spec["strategy"]

    @property
    def tasks(self) -> list[str]:
        return sorted(f"{role}-{i}" for role, r in self.spec["replicaSpecs"].items() for i in range(r["replicas"]))

    def pod(self, task: str) -> str:
        return f"{self.name}-{task}"

    def next_restart(self) -> tuple[str, str]:
        failures = self.expected_counters()["failures"]
        kind = "exit1" if failures < MAX_FAILURES and self.rng.random() < 0.5 else "delete"
        return kind, self.rng.choice(self.tasks)

    def expected_counters(self) -> dict[str, int]:
        return {
            "failures": sum(kind == "exit1" for kind, _ in self.done),
            "disruptions": sum(kind == "delete" for kind, _ in self.done),
        }

    def expected_attempts(self) -> dict[str, int]:
        attempts = Counter({task: 0 for task in self.tasks})
        for _kind, task in self.done:
            attempts.update(restarted_tasks(self.strategy, task))
        return dict(attempts)


def make_plan(rng: random.Random) -> tuple[list[Job], list[float]]:
    jobs = [
        Job(f"job-{i:02d}", MWMS if i % 2 == 0 else PS, rng.randrange(KILLS // 2), random.Random(rng.random()))
        for i in range(JOBS)
    ]
    return jobs, [rng.uniform(*LEAD_SECONDS) for _ in range(KILLS)]


class PodRecorder:
    """Every pod created in a namespace (uid -> name, attempt), from one watch kept open for the whole test."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace
        self.created: dict[str, tuple[str, int]] = {}
        self.error: Exception | None = None
        version = cluster.core.list_namespaced_pod(namespace).metadata.resource_version
        threading.Thread(target=self._record, args=(version,), daemon=True).start()

    def _record(self, version: str) -> None:
        try:
            while True:  # the stream ends after timeout_seconds; go on from where it stopped
                # Raw events: the client's models cost a Configuration per object (most of this test's own CPU).
                stream = self.cluster.core.list_namespaced_pod(
                    self.namespace, watch=True, resource_version=version, timeout_seconds=DEADLINE_SECONDS,
                    _preload_content=False,
                )  # fmt: skip
                for line in stream:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    pod = event["object"]
                    if event["type"] == "ERROR":  # a 410 would mean events were missed: the test cannot conclude
                        raise RuntimeError(f"the watch ended with {pod.get('code')}: {pod.get('message')}")
                    version = pod["metadata"]["resourceVersion"]
                    if event["type"] == "ADDED":
                        attempt = int(pod["metadata"]["labels"][api.LABEL_ATTEMPT])
                        self.created[pod["metadata"]["uid"]] = (pod["metadata"]["name"], attempt)
        except Exception as error:
            self.error = error

    def attempts_created(self) -> dict[str, list[int]]:
        """Pod name -> every attempt created for it, in order."""
        if self.error is not None:
            pytest.fail(f"the pod watch broke, the record is incomplete: {self.error!r}")
        found: dict[str, list[int]] = {}
        for name, attempt in self.created.values():
            found.setdefault(name, []).append(attempt)
        return {name: sorted(attempts) for name, attempts in found.items()}


class Deployment:
    """The operator as its Deployment runs it: a leader and standbys; a killed process is replaced at once. Two
    standbys, so the one that takes over has been up for a whole term: a replacement still starting (seconds of
    imports on a loaded machine, longer than a term here) held each takeover back by that much."""

    STANDBYS = 2

    def __init__(self, kubeconfig: str, log_dir: Path) -> None:
        self.kubeconfig, self.log_dir = kubeconfig, log_dir
        self.started = 0
        self.leader: Operator | None = None
        self.standbys = [self._launch() for _ in range(self.STANDBYS)]
        self.elected_at = 0.0

    def _launch(self) -> Operator:
        process = Operator(self.kubeconfig, self.log_dir / f"operator-{self.started:02d}.log", flags=FLAGS)
        self.started += 1
        process.launch()
        return process

    def poll(self) -> None:
        """Notice a standby taking the lease; start the next standby. Fails if a process exited by itself."""
        if self.leader is not None:
            self.leader.role()
        for standby in self.standbys:
            if standby.role() == "ok leader" and self.leader is None:
                self.leader = standby
                self.standbys = [s for s in self.standbys if s is not standby] + [self._launch()]
                self.elected_at = time.monotonic()

    def kill_leader(self) -> None:
        assert self.leader is not None
        self.leader.kill()
        self.leader = None

    def stop(self) -> None:
        for process in (self.leader, *self.standbys):
            if process is not None:
                process.stop()


def test_operator_sigkilled_20_times_while_20_jobs_are_created_and_restarted(cluster, operator, namespace, tmp_path):
    seed = int(os.environ.get("KUBETF_CHAOS_SEED") or random.randrange(2**32))
    print(f"\nseed {seed} (replay: KUBETF_CHAOS_SEED={seed}); operator logs in {tmp_path}")
    jobs, lead_seconds = make_plan(random.Random(seed))
    recorder = PodRecorder(cluster, namespace)
    operator.stop()  # the tier's operator gives the lease up: this test runs its own
    deployment = Deployment(cluster.kubeconfig, tmp_path)
    try:
        in_flight, converged = drive(cluster, namespace, jobs, deployment, lead_seconds)
    finally:
        deployment.stop()
        operator.start()

    failures = sum(j.expected_counters()["failures"] for j in jobs)
    print(
        f"{KILLS} kills, {deployment.started} operator processes; {sum(len(j.done) for j in jobs)} restarts made "
        f"({failures} failures); {in_flight} jobs were restarting at the last kill; "
        f"every job converged {converged:.1f}s after it"
    )
    assert all(job.done for job in jobs), "each job was restarted at least once while the operator was being killed"
    pods = cluster.live_pods_by_job(namespace)
    created = recorder.attempts_created()
    for job in jobs:
        status = cluster.status(namespace, job.name)
        assert status["phase"] == "Running", job.name
        assert {k: status["restarts"][k] for k in ("failures", "disruptions")} == job.expected_counters(), job.name
        attempts = job.expected_attempts()
        # One live pod per task, of the attempt the restarts made: nothing missing, nothing extra.
        assert {
            name: int(pod["metadata"]["labels"][api.LABEL_ATTEMPT]) for name, pod in pods.get(job.name, {}).items()
        } == {job.pod(task): attempt for task, attempt in attempts.items()}, job.name
        # Each attempt of each task was created exactly once.
        assert {name: attempts for name, attempts in created.items() if name.startswith(f"{job.name}-")} == {
            job.pod(task): list(range(attempt + 1)) for task, attempt in attempts.items()
        }, job.name
    services = cluster.core.list_namespaced_service(namespace).items
    assert sorted(s.metadata.name for s in services) == [job.name for job in jobs]


def drive(
    cluster: Cluster, namespace: str, jobs: list[Job], deployment: Deployment, lead_seconds: list[float]
) -> tuple[int, float]:
    """Kill the leader KILLS times while creating and restarting the jobs; then wait until every job has converged.
    Returns how many jobs had a restart under way at the last kill, and how long after it they had all converged."""
    start = time.monotonic()
    kills = 0
    kill_at = None
    last_kill = 0.0
    in_flight = 0
    while True:
        now = time.monotonic()
        if now - start > DEADLINE_SECONDS:
            pytest.fail(f"not converged in {DEADLINE_SECONDS}s ({kills} kills): {unsettled(cluster, namespace, jobs)}")
        deployment.poll()
        if kills < KILLS and deployment.leader is not None:
            if kill_at is None:
                kill_at = deployment.elected_at + lead_seconds[kills]
            if now >= kill_at:
                deployment.kill_leader()
                kills, kill_at, last_kill = kills + 1, None, now
                if kills == KILLS:
                    in_flight = sum(1 for job in jobs if job.created and job.act_at is None)
        for job in jobs:
            if not job.created and job.created_in_round <= kills:
                cluster.create_job(namespace, job.name, job.spec)
                job.created = True
        statuses = cluster.statuses(namespace)
        pods = cluster.live_pods_by_job(namespace)
        settled = 0
        for job in (j for j in jobs if j.created):
            status = statuses.get(job.name) or {}
            assert status.get("phase") != "Failed", f"{job.name} failed: {status}"
            job_pods = pods.get(job.name, {})
            start_pending(cluster, job_pods)
            if not is_settled(job, status, job_pods):
                job.act_at = None
                continue
            settled += 1
            if job.act_at is None:
                job.act_at = now + job.rng.uniform(*RESTART_EVERY)
            if kills < KILLS and now >= job.act_at:
                kind, task = job.next_restart()
                if restart(cluster, kind, job_pods[job.pod(task)]):
                    job.done.append((kind, task))
                    job.act_at = None
        if kills == KILLS and settled == len(jobs):
            return in_flight, now - last_kill
        time.sleep(0.1)


def start_pending(cluster: Cluster, pods: dict[str, dict]) -> None:
    """The kubelet's part: every pod the operator created starts running."""
    for pod in pods.values():
        if (pod.get("status") or {}).get("phase") in (None, "Pending"):
            try:
                cluster.run(pod)
            except ApiException as error:
                if error.status != 404:  # deleted by the operator meanwhile, as a kubelet may find it
                    raise


def restart(cluster: Cluster, kind: str, pod: dict) -> bool:
    try:
        if kind == "exit1":
            cluster.exit(pod, 1)
        else:
            cluster.delete_pod(pod)
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def is_settled(job: Job, status: dict, pods: dict[str, dict]) -> bool:
    """Running, every restart made so far counted, and exactly the pods of the current attempts, all running."""
    counters = status.get("restarts") or {}
    attempts = job.expected_attempts()
    return (
        status.get("phase") == "Running"
        and {k: counters.get(k) for k in ("failures", "disruptions")} == job.expected_counters()
        and {n: p["metadata"]["labels"][api.LABEL_ATTEMPT] for n, p in pods.items()}
        == {job.pod(t): str(a) for t, a in attempts.items()}
        and all((p.get("status") or {}).get("phase") == "Running" for p in pods.values())
    )


def unsettled(cluster: Cluster, namespace: str, jobs: list[Job]) -> dict:
    statuses = cluster.statuses(namespace)
    pods = cluster.live_pods_by_job(namespace)
    return {
        job.name: {
            "done": job.done,
            "status": {k: (statuses.get(job.name) or {}).get(k) for k in ("phase", "restarts", "tasks")},
            "pods": {n: (p.get("status") or {}).get("phase") for n, p in pods.get(job.name, {}).items()},
        }
        for job in jobs
        if not is_settled(job, statuses.get(job.name) or {}, pods.get(job.name, {}))
    }
