"""Every door holds for every tenant, at the size issue 49 asks for: an ordinary pod in another namespace, labelled
as kubetf's (any tenant can), attacks the operator's ports while 2,000 jobs on kwok's fake nodes report their
progress every 10 s (2 metrics each; the /metrics page is then about 0.6 MB):

1. 200 connections send `GET /metrics` and never read: each is closed within a few seconds, and the operator's RSS
   grows by less than 50 MiB;
2. a flood of idle connections (1,075 held at once, each opened again as soon as it is answered) for 3 minutes;
3. a flood of forged tokens (300 a second, claiming the attacker's own pod) for 3 minutes.

The jobs' tokens are reviewed and their progress histories filled first (60 points each, as after 10 minutes of
reports), so that where the operator's memory begins is what these jobs hold for good. Meanwhile (the test process,
on the node, is the kubelet and the other tenant): the liveness probe never fails
(`/healthz` every second, the chart's 5 s timeout), a new job's reporter (the trainer library's) gets its first 204
within 1 s during each flood, no job is judged stalled (`--progress-stall-seconds 60`), the operator never exits,
and its RSS stays within 50 MiB of where it began (and is back there 30 s after the attacks) and under 300 MiB. The
numbers are printed.

Marked `load` (minutes, thousands of jobs): `make test-load` runs it, `make test` does not. KUBETF_LOAD_JOBS and
KUBETF_LOAD_SECONDS make a smaller run (for a try on a busy machine; the issue's size is the default).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from kubetf.core import api
from kubetf.core.progress.merge import HISTORY_POINTS
from kubetf_trainer.report import Reporter
from tests.bench.progress_scale import Reporters, stalled, token
from tests.bench.scale import PODS_PER_FAKE_NODE, fake_template, parallel
from tests.cluster import kwok
from tests.cluster.fixture import wait_for

from .conftest import TEST_FLAGS, Operator, free_port, replica

pytestmark = [pytest.mark.integration, pytest.mark.load]

JOBS = int(os.environ.get("KUBETF_LOAD_JOBS", "2000"))
ATTACK_SECONDS = float(os.environ.get("KUBETF_LOAD_SECONDS", "180"))
REPORT_EVERY = 10.0
METRICS = 2  # loss and one more, as the bench's reporters (a job's history keeps loss and 3 metrics whatever it sends)
ATTACKER_CPU = "500m"  # a tenant's pod as a LimitRange would size it: on this machine it shares the operator's cores
STALL_SECONDS = 60
SLOW_READERS = 200
IDLE_HELD = 1075
FORGED_PER_SECOND = 300
ATTACKER = Path(__file__).with_name("attacker.py").read_text()
SPEC = {
    "strategy": "MultiWorkerMirrored",
    "replicaSpecs": {"worker": {**replica(1), "template": fake_template()}},
    "runPolicy": {"startupTimeoutSeconds": 7200},
}


def cpu_seconds(pid: int) -> float:
    """The process's CPU time so far (user and system)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS:"))


class Watch:
    """In the background, every second: the liveness probe as the kubelet sends it (its 5 s timeout), the
    operator's RSS and whether its process still runs."""

    def __init__(self, operator: Operator) -> None:
        self.operator = operator
        self.probes: list[tuple[int | str, float]] = []
        self.rss: list[float] = []
        self.exited: int | None = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        assert self.operator.process is not None
        while not self.stopping.wait(1.0):
            if (code := self.operator.process.poll()) is not None:
                self.exited = code
                return
            self.rss.append(rss_mib(self.operator.process.pid))
            start = time.monotonic()
            try:
                url = f"http://127.0.0.1:{self.operator.port}/healthz"
                with urllib.request.urlopen(url, timeout=5) as response:
                    status: int | str = response.status
            except Exception as error:  # any failure is the probe's failure
                status = type(error).__name__
            self.probes.append((status, time.monotonic() - start))

    def failed_probes(self) -> list[tuple[int | str, float]]:
        return [p for p in self.probes if p[0] != 200]


@pytest.fixture
def tenant_operator(cluster, operator, tmp_path):
    """In place of this worker's operator: the same with /metrics and a short stall judgement (a job whose reports
    stop for 60 s is TrainingStalled)."""
    operator.stop()
    flags = (*TEST_FLAGS, "--progress-stall-seconds", str(STALL_SECONDS))
    tenant = Operator(cluster.kubeconfig, tmp_path / "operator.log", metrics_port=free_port(), flags=flags)
    tenant.start()
    try:
        yield tenant
    finally:
        tenant.stop()
        print(f"operator log: {tmp_path / 'operator.log'}")
        operator.start()


def node_address(cluster) -> str:
    """The real node's address (not a fake node's): where its pods reach the operator running on it."""
    fake = set(kwok.ready_fake_nodes(cluster.core))
    for node in cluster.core.list_node().items:
        if node.metadata.name not in fake:
            return next(a.address for a in node.status.addresses if a.type == "InternalIP")
    raise AssertionError("no real node")


def attack(cluster, namespace: str, name: str, **env: object) -> dict:
    """Run one attack (tests/integration/attacker.py) from a pod of `namespace` labelled as kubetf's; what it met."""
    pod = {
        "metadata": {"name": name, "labels": {api.LABEL_MANAGED_BY: api.MANAGER, api.LABEL_JOB: "attacker"}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "attacker", "image": "kubetf/python-base:bookworm", "imagePullPolicy": "IfNotPresent",
                "command": ["python3", "-c", ATTACKER, name.split("-", 1)[1]],
                "resources": {"requests": {"cpu": ATTACKER_CPU}, "limits": {"cpu": ATTACKER_CPU}},
                "env": [*({"name": k, "value": str(v)} for k, v in env.items()),
                        {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}],
            }],
        },
    }  # fmt: skip
    cluster.core.create_namespaced_pod(namespace, pod)
    seconds = float(env.get("SECONDS", 30))  # type: ignore[arg-type]
    wait_for(
        lambda: cluster.core.read_namespaced_pod(name, namespace).status.phase in ("Succeeded", "Failed"),
        seconds + 180, f"the attacker pod {name} done", interval=2,
    )  # fmt: skip
    log = cluster.core.read_namespaced_pod_log(name, namespace)
    return json.loads(log.strip().splitlines()[-1])


def first_report(cluster, operator: Operator, namespace: str, name: str, tmp_path: Path) -> float:
    """A new job, Running (its pod on a fake node): seconds from its reporter's first report to its first 204."""
    cluster.create_job(namespace, name, SPEC)
    cluster.wait_phase(namespace, name, "Running", timeout=60)
    (pod,) = cluster.live_pods(namespace, name).values()
    token_file = tmp_path / f"{name}.token"
    token_file.write_text(token(cluster, namespace, pod))
    reporter = Reporter(f"http://127.0.0.1:{operator.progress_port}/v1/progress", str(token_file), at_exit=False)
    start = time.monotonic()
    reporter.report(epoch=1, epochs=10, step=10, steps=1000, metrics={"loss": 1.0})
    try:
        wait_for(lambda: reporter.sent >= 1, 30, f"{name}'s first report taken", interval=0.01)
        return time.monotonic() - start
    finally:
        reporter.stop()  # and the job goes: without reports it would rightly be judged stalled a minute later
        cluster.custom.delete_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name)


def sample(text: str, line_start: str) -> float:
    """The value of the sample whose line starts with `line_start` (its name and labels), 0 when there is none."""
    return next((float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start)), 0.0)


def metrics(operator: Operator, *names: str) -> str:
    query = "&".join(f"name[]={name}" for name in names)
    with urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics?{query}", timeout=30) as page:
        return page.read().decode()


def test_every_door_holds_for_every_tenant_while_2000_jobs_report(cluster, namespace, tenant_operator, tmp_path):
    operator = tenant_operator
    assert operator.process is not None
    pid = operator.process.pid
    evil = f"{namespace}-evil"  # another tenant's namespace, served by the same operator
    cluster.core.create_namespace({"metadata": {"name": evil}})
    target = node_address(cluster)
    reporters = None
    watch = Watch(operator)
    try:
        wait_for(lambda: cluster.core.list_namespaced_service_account(evil).items, 30, "evil's ServiceAccount")
        kwok.ensure_fake_nodes(cluster.kubeconfig, cluster.core, max(2, math.ceil(JOBS * 1.2 / PODS_PER_FAKE_NODE)))
        names = [f"r-{i}" for i in range(JOBS)]
        started = time.monotonic()
        parallel(lambda name: cluster.create_job(namespace, name, SPEC), names)

        def running() -> int:
            jobs = cluster.raw(cluster.custom.list_namespaced_custom_object(
                api.GROUP, api.VERSION, namespace, api.PLURAL, _preload_content=False))["items"]  # fmt: skip
            return sum(1 for j in jobs if (j.get("status") or {}).get("phase") == "Running")

        wait_for(lambda: running() == JOBS, 1800, lambda: f"{running()} of {JOBS} jobs Running", interval=10)
        pods = {
            p["metadata"]["labels"][api.LABEL_JOB]: p
            for p in cluster.raw(cluster.core.list_namespaced_pod(namespace, _preload_content=False))["items"]
        }
        tokens: dict[str, str] = {}
        parallel(lambda name: tokens.__setitem__(name, token(cluster, namespace, pods[name])), names)
        print(f"\n{JOBS} jobs Running and their tokens in {time.monotonic() - started:.0f} s")
        started = time.monotonic()

        # Every job's token reviewed, then its progress history filled (its 60 points: what a job that has reported
        # for 10 minutes holds), reporting back to back; then every REPORT_EVERY seconds. The operator's memory then
        # holds what these jobs make it hold for good, and where it began is that.
        reporters = Reporters(operator.progress_port, tokens, 0.0, METRICS)
        reporters.start()
        heard = Counter()

        def reviewed() -> float:
            text = metrics(operator, "kubetf_progress_token_reviews_total")
            return sample(text, 'kubetf_progress_token_reviews_total{result="valid"}')

        wait_for(lambda: reviewed() >= JOBS, 600, lambda: f"{reviewed():.0f} tokens reviewed", interval=5)

        def filled() -> bool:
            answers, _ = reporters.take()
            heard.update(answers)
            return heard[204] >= (HISTORY_POINTS + 1) * JOBS

        wait_for(filled, 1800, lambda: f"reports taken: {heard}", interval=5)
        reporters.every = REPORT_EVERY
        time.sleep(2 * REPORT_EVERY)  # the last fast round done
        reporters.take()
        page = metrics(operator)  # a whole page, as a Prometheus scrape: in the baseline
        watch.thread.start()
        wait_for(lambda: watch.rss, 10, "the first RSS sample")
        baseline = rss_mib(pid)
        cpu, quiet = cpu_seconds(pid), time.monotonic()
        time.sleep(30)  # the operator's CPU with the jobs reporting and nobody attacking
        alone = 100 * (cpu_seconds(pid) - cpu) / (time.monotonic() - quiet)
        print(
            f"every job reviewed and its history filled in {time.monotonic() - started:.0f} s ({heard}); a /metrics "
            f"page of {len(page) / 1e6:.1f} MB; RSS {baseline:.0f} MiB; the operator's CPU {alone:.0f}% of a core"
        )

        # 1. slow readers of /metrics
        before = len(watch.rss)
        slow = attack(cluster, evil, "attack-slow-readers", TARGET=target, PORT=operator.metrics_port,
                      CONNECTIONS=SLOW_READERS, SECONDS=30)  # fmt: skip
        slow_rss = max(watch.rss[before:])
        closed = metrics(operator, "kubetf_http_connections_closed_total", "kubetf_http_connections")
        print(f"slow readers: {slow}; RSS at most {slow_rss:.0f} MiB meanwhile")
        print("  " + "\n  ".join(line for line in closed.splitlines() if not line.startswith("#")))

        # 2. idle connections, 3. forged tokens: each for ATTACK_SECONDS, a new job reporting in the middle of it
        floods = {}
        for name, port, env in (
            ("attack-idle", operator.progress_port, {"CONNECTIONS": IDLE_HELD}),
            ("attack-forged", operator.progress_port, {"RATE": FORGED_PER_SECOND, "THREADS": 16}),
        ):
            before, cpu, begun = len(watch.rss), cpu_seconds(pid), time.monotonic()
            result: dict = {}
            flood = threading.Thread(
                target=lambda n=name, p=port, e=env, r=result: r.update(
                    attack(cluster, evil, n, TARGET=target, PORT=p, SECONDS=ATTACK_SECONDS, **e)
                ),
                daemon=True,
            )
            flood.start()
            time.sleep(ATTACK_SECONDS / 3)
            new_job = first_report(cluster, operator, namespace, f"new-{name}", tmp_path)
            flood.join(ATTACK_SECONDS + 300)
            answers, latencies = reporters.take()
            latencies.sort()
            floods[name] = {
                "attacker": result,
                "operator CPU, % of a core": round(100 * (cpu_seconds(pid) - cpu) / (time.monotonic() - begun)),
                "new job's first 204, s": round(new_job, 3),
                "RSS at its start, max, end, MiB": (watch.rss[before], max(watch.rss[before:]), watch.rss[-1]),
                "the 2,000 jobs' reports": dict(answers),
                "their latency p50/p99, s": (round(latencies[len(latencies) // 2], 3),
                                              round(latencies[int(len(latencies) * 0.99)], 3)),
            }  # fmt: skip
            print(f"{name}: {json.dumps(floods[name])}")
        time.sleep(30)  # after the attacks: the memory they held comes back
        after = rss_mib(pid)
        reviews = metrics(operator, "kubetf_progress_token_reviews_total", "kubetf_http_requests_total")
        print("  " + "\n  ".join(line for line in reviews.splitlines() if not line.startswith("#")))
    finally:
        watch.stopping.set()
        if reporters is not None:
            reporters.stop()
        cluster.core.delete_namespace(evil)

    events, unhealthy = stalled(cluster, namespace)
    probes = [latency for _, latency in watch.probes]
    peak = max(watch.rss)
    print("RSS every 15 s, MiB: " + " ".join(f"{r:.0f}" for r in watch.rss[::15]))
    print(
        f"liveness: {len(watch.probes)} probes, {len(watch.failed_probes())} failed, slowest {max(probes):.3f} s; "
        f"RSS {baseline:.0f} MiB at the start, at most {peak:.0f} MiB ({peak - baseline:+.0f}), "
        f"{after:.0f} MiB 30 s after the attacks; TrainingStalled events {events}, unhealthy jobs {unhealthy}"
    )
    assert watch.exited is None and operator.process.poll() is None, "the operator exited"
    assert not watch.failed_probes()
    assert slow["closed by the server"] == slow["connections"] == SLOW_READERS, slow
    assert slow["closed within max"] < 10, slow
    assert slow_rss - baseline < 50
    for name, flood in floods.items():
        assert flood["new job's first 204, s"] < 1.0, (name, flood)
    assert (events, unhealthy) == (0, 0)
    assert peak - baseline < 50 and peak < 300
    assert after - baseline < 50
