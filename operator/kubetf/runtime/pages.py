"""The /metrics page: built once and shared by every scrape that asks meanwhile, within a share of one core.

A whole page grows with the jobs' series (at 10,000 jobs reporting 20 metrics each it was 17.8 MB and about 2 s of
CPU), so building one per request let a few clients, or many, hold the operator's CPU and memory. Here:
- one build at a time, on a thread of its own; every request for the same page (the same `name[]` selection) while
  it is built waits for it and gets the same bytes, written to each connection without a copy;
- a page is served again, unbuilt, until its build's CPU time is at most `cpu_share` of the time since it began (a
  page that took 0.2 s is served for 2 s at 0.1; one that took 1 ms, for 10 ms): however many ask, builds take at
  most that share of a core. Builds of every selection together draw on one budget of the same rate (a burst of 1 s
  of CPU): past it a selection already built is served as it is, another waits for the budget;
- a build that nobody waits for any more (every client that asked went away) is cancelled: it stops at the next
  family of samples, or within a thousand jobs of the jobs' series (`checkpoint`);
- at most MAX_PAGES pages are kept, the least recently asked for dropped first.
Everything but the build runs on the /metrics port's event loop (kubetf.runtime.server), so it needs no lock.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from kubetf.runtime.server import Answer

MAX_PAGES = 4
BURST = 1.0  # seconds of build CPU that may be spent at once before the budget's rate applies

Selection = tuple[str, ...]  # the samples a scrape names (`?name[]=`), sorted; () for the whole page


class BuildCancelled(Exception):
    """Nobody waits for the page being built any more."""


_building = threading.local()  # the build thread's: the event set when nobody waits for its page


def checkpoint() -> None:
    """Raise BuildCancelled when nobody waits for the page this thread builds any more: a collector with a long loop
    calls it now and then. Anywhere but in a build it does nothing."""
    cancelled: threading.Event | None = getattr(_building, "cancelled", None)
    if cancelled is not None and cancelled.is_set():
        raise BuildCancelled


class _Checked(Collector):
    """A registry's families, checking between two whether the build is still wanted."""

    def __init__(self, registry: Collector) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            checkpoint()
            yield family


def build(selection: Selection) -> bytes:
    """The page of every series, or of the samples `selection` names (as prometheus_client's own handler does for
    `?name[]=kubetf_jobs`: only the collectors of those names are asked)."""
    registry = REGISTRY.restricted_registry(list(selection)) if selection else REGISTRY
    return generate_latest(_Checked(registry))


@dataclass
class _Page:
    content: bytes
    started: float
    cpu: float  # seconds the build took on its thread

    def fresh(self, now: float, share: float) -> bool:
        return now < self.started + self.cpu / share


@dataclass
class _Build:
    selection: Selection
    started: float
    done: asyncio.Future[_Page]
    cancelled: threading.Event = field(default_factory=threading.Event)
    waiters: int = 0


class SharedPages:
    def __init__(
        self,
        cpu_share: float,
        make: Callable[[Selection], bytes] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`make`: a page's bytes (`build`, a test's own)."""
        self.share, self.make, self.clock = cpu_share, make or build, clock
        self.pages: OrderedDict[Selection, _Page] = OrderedDict()
        self.current: _Build | None = None
        self.budget, self.budget_at = BURST, clock()
        self.builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kubetf-metrics-build")
        self.builds = 0  # started, for the tests and the docs' numbers

    async def answer(self, selection: Selection) -> Answer:
        return Answer(200, content=await self.page(selection), content_type=CONTENT_TYPE_LATEST)

    async def page(self, selection: Selection) -> bytes:
        """The page of `selection`: a fresh one as it is, else the one being built (a new build when none is)."""
        while True:
            now = self.clock()
            page = self.pages.get(selection)
            if page is not None and page.fresh(now, self.share):
                self.pages.move_to_end(selection)
                return page.content
            current = self.current
            if current is not None and current.selection == selection and not current.cancelled.is_set():
                return await self._wait(current)
            if current is not None:  # another selection's build: one at a time
                await asyncio.wait((current.done,))
                continue
            if self._spent(now):
                if page is not None:
                    return page.content  # over budget: the last one, rather than another build
                await asyncio.sleep(-self.budget / self.share)
                continue
            return await self._wait(self._start(selection, now))

    def _spent(self, now: float) -> bool:
        self.budget = min(BURST, self.budget + (now - self.budget_at) * self.share)
        self.budget_at = now
        return self.budget <= 0

    def _start(self, selection: Selection, now: float) -> _Build:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[_Page] = loop.create_future()
        started = _Build(selection, now, done)
        self.current = started
        self.builds += 1

        def run() -> None:
            _building.cancelled = started.cancelled
            begun = time.thread_time()
            try:
                content = self.make(selection)
            except BaseException as error:  # BuildCancelled, or a collector's failure: each waiter is told
                loop.call_soon_threadsafe(self._ended, started, None, time.thread_time() - begun, error)
            else:
                loop.call_soon_threadsafe(self._ended, started, content, time.thread_time() - begun, None)
            finally:
                _building.cancelled = None

        self.builder.submit(run)
        return started

    def _ended(self, build: _Build, content: bytes | None, cpu: float, error: BaseException | None) -> None:
        self.budget -= cpu
        if self.current is build:
            self.current = None
        if content is None:
            build.done.set_exception(error or BuildCancelled())
            build.done.exception()  # retrieved: a cancelled build may have nobody left to read it
            return
        page = _Page(content, build.started, cpu)
        self.pages[build.selection] = page
        self.pages.move_to_end(build.selection)
        while len(self.pages) > MAX_PAGES:
            self.pages.popitem(last=False)
        build.done.set_result(page)

    async def _wait(self, build: _Build) -> bytes:
        build.waiters += 1
        try:
            page = await asyncio.shield(build.done)
        finally:
            build.waiters -= 1
            if build.waiters == 0 and not build.done.done():
                build.cancelled.set()  # its every client went away
        return page.content

    def stop(self) -> None:
        self.builder.shutdown(wait=False, cancel_futures=True)
