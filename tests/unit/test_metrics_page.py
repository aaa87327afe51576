"""The /metrics page (kubetf.runtime.pages): the whole registry, or only the samples a scrape names (`?name[]=`);
built once for every scrape that asks meanwhile, within a share of a core, and not at all for nobody."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from kubetf.cluster import metrics
from kubetf.core.config import OperatorConfig
from kubetf.runtime import pages
from kubetf.runtime.pages import BuildCancelled, SharedPages, build
from kubetf.runtime.progress.gauges import JobSeries
from kubetf.runtime.runner import _serve_metrics

pytestmark = pytest.mark.unit


def test_a_scrape_that_names_samples_gets_those_alone_not_every_jobs_series():
    series = JobSeries()
    series.publish(("team-a", "mnist"), {"metrics": {"loss": 0.5}})
    metrics.QUEUE_DEPTH.set(3)
    try:
        whole = build(()).decode()
        named = build(("kubetf_workqueue_depth",)).decode()
        jobs = build(("kubetf_job_metric",)).decode()
    finally:
        series.remove(("team-a", "mnist"))
    assert 'kubetf_job_metric{job="mnist",metric="loss",namespace="team-a"} 0.5' in whole
    assert "kubetf_workqueue_depth 3.0" in whole
    assert [line for line in named.splitlines() if not line.startswith("#")] == ["kubetf_workqueue_depth 3.0"]
    assert [line for line in jobs.splitlines() if not line.startswith("#")] == [
        'kubetf_job_metric{job="mnist",metric="loss",namespace="team-a"} 0.5'
    ]


class Builds:
    """A build that takes `cpu` seconds of its thread's CPU (spinning), or until released, counting its calls."""

    def __init__(self, cpu: float = 0.0, cpus: dict[str, float] | None = None) -> None:
        self.cpu, self.cpus = cpu, cpus or {}
        self.calls = 0
        self.release = threading.Event()
        self.stopped = threading.Event()  # set when a build was cancelled
        self.hold = False

    def __call__(self, selection: pages.Selection) -> bytes:
        self.calls += 1
        began = time.thread_time()
        cpu = self.cpus.get("".join(selection), self.cpu)
        try:
            while time.thread_time() - began < cpu or (self.hold and not self.release.is_set()):
                pages.checkpoint()  # what a collector does in a long loop
                time.sleep(0.001) if self.hold else None
        except BuildCancelled:
            self.stopped.set()
            raise
        return f"page {self.calls} of {selection}".encode()


def run(coroutine):
    return asyncio.run(coroutine)


def test_every_scrape_that_asks_while_a_page_is_built_gets_that_page_and_the_operator_builds_it_once():
    builds = Builds()
    builds.hold = True
    shared = SharedPages(0.1, builds)

    async def scrapes() -> list[bytes]:
        many = [asyncio.ensure_future(shared.page(())) for _ in range(200)]
        await asyncio.sleep(0.05)
        builds.release.set()
        return await asyncio.gather(*many)

    assert set(run(scrapes())) == {b"page 1 of ()"}
    assert builds.calls == 1


def test_a_page_is_served_again_until_its_build_is_within_the_cpu_share_of_the_time_since():
    now = [1000.0]
    builds = Builds(cpu=0.05)
    shared = SharedPages(0.1, builds, clock=lambda: now[0])

    async def scrape() -> bytes:
        return await shared.page(())

    first = run(scrape())
    now[0] += 0.2  # 0.05 s of CPU is 0.1 of 0.5 s: not yet
    assert run(scrape()) == first and builds.calls == 1
    now[0] += 0.4
    assert run(scrape()) != first and builds.calls == 2


def test_past_the_budget_a_selection_built_before_is_served_as_it_is_and_another_waits():
    now = [1000.0]
    builds = Builds(cpus={"a": 0.01, "b": 0.4, "c": 0.4, "d": 0.4})
    shared = SharedPages(0.1, builds, clock=lambda: now[0])  # a page of 0.01 s is served for 0.1 s, of 0.4 s for 4 s

    async def scrapes() -> None:
        for selection in "abcd":  # 1.21 s of CPU at once, past the burst of 1 s
            await shared.page((selection,))
        now[0] += 0.2  # the first page stale; 0.02 s of the budget back, still below nothing
        assert await shared.page(("a",)) == b"page 1 of ('a',)" and builds.calls == 4  # as it was
        other = asyncio.ensure_future(shared.page(("e",)))  # nothing to serve: waits for the budget
        await asyncio.sleep(0.05)
        assert not other.done()
        now[0] += 10
        assert await asyncio.wait_for(other, 5) == b"page 5 of ('e',)"

    run(scrapes())


def test_a_build_nobody_waits_for_any_more_is_cancelled_and_a_later_scrape_builds_anew():
    builds = Builds()
    builds.hold = True
    shared = SharedPages(0.1, builds)

    async def scrapes() -> bytes:
        gone = [asyncio.ensure_future(shared.page(())) for _ in range(3)]
        await asyncio.sleep(0.05)
        for scrape in gone:
            scrape.cancel()  # each client went away
        await asyncio.gather(*gone, return_exceptions=True)
        assert await asyncio.to_thread(builds.stopped.wait, 5), "the build went on for nobody"
        builds.hold = False
        return await shared.page(())

    assert run(scrapes()) == b"page 2 of ()"


def test_the_jobs_series_stop_building_within_a_thousand_jobs_once_nobody_waits():
    series = JobSeries()
    keys = [("team-a", f"job-{i}") for i in range(3000)]
    for key in keys:
        series.publish(key, {"percent": 50, "metrics": {"loss": 0.5}})
    cancelled = threading.Event()
    cancelled.set()
    pages._building.cancelled = cancelled
    try:
        with pytest.raises(BuildCancelled):
            build(("kubetf_job_metric",))
    finally:
        pages._building.cancelled = None
        for key in keys:
            series.remove(key)


def test_many_slow_scrapes_of_the_port_cost_one_build(monkeypatch):
    builds = Builds()
    builds.hold = True
    monkeypatch.setattr(pages, "build", builds)
    server = _serve_metrics(0, OperatorConfig())
    port = server.port
    clients = [socket.create_connection(("127.0.0.1", port), source_address=(f"127.0.0.{2 + i}", 0)) for i in range(6)]
    for client in clients:
        client.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.1)
    builds.release.set()
    answers = [b"".join(iter(lambda c=client: c.recv(65536), b"")) for client in clients]
    server.stop()
    assert builds.calls == 1
    assert all(a.startswith(b"HTTP/1.1 200 ") and a.endswith(b"page 1 of ()") for a in answers)
