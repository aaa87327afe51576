"""Python's garbage collector kept from stopping kopf's event loop.

A full collection walks every object the collector tracks, with the GIL held: every thread stops, kopf's event
loop and its watches with them. The operator holds long-lived objects for every job and pod it serves (its cache,
kopf's memory of each object, the progress book), so a full collection grows with the jobs: 80-100 ms of CPU for
180,000 objects at 2,000 jobs, 150-340 ms on a loaded machine, and they came every 5-10 s while jobs changed
(`make bench-progress`: most of kopf's late event-loop probes fell on one).

So what survived a full collection is frozen (`gc.freeze`: moved where the collector no longer looks, still freed
by reference counting as usual), and a full collection walks only what is newer than the last one: 2-6 ms of
CPU. The cost is that a reference cycle among frozen objects is not reclaimed when it becomes garbage: a full
collection freezes whatever lives at that moment, short-lived objects too (kopf's per-event bodies: about
2,000-3,000 objects a minute and a half under the benchmark's load). A complete collection (everything thawed,
collected, frozen again) reclaims them, a pause as long as a full collection's was (250-400 ms at 10,000 jobs):
- every COMPLETE_EVERY seconds, at a quiet second (few reconciles began in it), so that it does not land in a burst
  of work (a preemption, 1,000 jobs deleted at once), unless none comes within another COMPLETE_EVERY;
- sooner when what is frozen grew by more than GROWTH of what the last one left (and MIN_GROWTH objects), at a
  quiet second within GROWTH_PATIENCE: garbage that comes faster (the operator's HTTP server used to leave a
  reference cycle of about 2 KiB per connection, and a flood of connections froze a million of them within minutes:
  a complete collection then paused the process for 3-4 s) is reclaimed while it comes, and the pause of the
  collection that reclaims it stays within a quarter of the last one's.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger("kubetf.operator")

# How long a reference cycle among long-lived objects may wait to be reclaimed; the memory it holds meanwhile is
# bounded by this much of the operator's churn.
COMPLETE_EVERY = 600.0

QUIET_POLL = 1.0  # seconds between two looks for a quiet moment
# What is frozen may grow by this share of what the last complete collection left, and at least by MIN_GROWTH
# objects (an idle operator's heap is small), before a complete collection is due; it then waits for a quiet second
# for at most GROWTH_PATIENCE seconds. Counting the frozen objects walks them (10 ms per million): every GROWTH_POLL.
GROWTH = 0.25
MIN_GROWTH = 100_000
GROWTH_PATIENCE = 30.0
GROWTH_POLL = 5.0

PAUSE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class _Pauses(Collector):
    """kubetf_gc_pause_seconds, counted in plain numbers. Not a prometheus_client Histogram: a collection starts in
    whichever thread allocates, possibly one holding that Histogram's lock (a scrape), and the callback taking it
    again there would deadlock. Collections never overlap, so the counts need no lock."""

    def __init__(self) -> None:
        self.counts: dict[str, list[float]] = {}  # generation -> cumulative count per bucket, then +Inf, then sum

    def observe(self, generation: int, seconds: float) -> None:
        counts = self.counts.setdefault(str(generation), [0.0] * (len(PAUSE_BUCKETS) + 2))
        for i, bound in enumerate(PAUSE_BUCKETS):
            if seconds <= bound:
                counts[i] += 1
        counts[-2] += 1
        counts[-1] += seconds

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            "kubetf_gc_pause_seconds",
            "How long each of Python's garbage collections stopped every thread, kopf's event loop included, by "
            "generation (2: full, and the complete collections of kubetf.runtime.heap)",
            labels=["generation"],
        )
        for generation, counts in sorted(self.counts.items()):
            snapshot = list(counts)
            buckets = [(str(bound), n) for bound, n in zip(PAUSE_BUCKETS, snapshot, strict=False)]
            family.add_metric([generation], [*buckets, ("+Inf", snapshot[-2])], snapshot[-1])
        yield family


PAUSES = _Pauses()
REGISTRY.register(PAUSES)


class ShortFullCollections:
    """Between start and stop: what survives a full collection is frozen, and a thread collects completely every
    `every` seconds, at a moment `quiet()` says so (at the latest `every` seconds later), or sooner when the frozen
    heap grew by `growth` (at the latest `patience` seconds later). Every collection's pause is timed
    (kubetf_gc_pause_seconds, by generation)."""

    def __init__(
        self,
        every: float = COMPLETE_EVERY,
        quiet: Callable[[], bool] = lambda: True,
        growth: float = GROWTH,
        min_growth: int = MIN_GROWTH,
        patience: float = GROWTH_PATIENCE,
        poll: float = GROWTH_POLL,
    ) -> None:
        self.every, self.quiet = every, quiet
        self.growth, self.min_growth, self.patience, self.poll = growth, min_growth, patience, poll
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._complete_collections, name="kubetf-heap", daemon=True)
        self._started: float | None = None  # the running collection's start; collections never overlap (GIL)

    def start(self) -> None:
        """Collect completely once (what starting left behind) and freeze the rest."""
        collect_completely()
        gc.callbacks.append(self._on_collection)
        self._thread.start()
        log.info("full collections walk only what is newer than the last; a complete one every %.0f s", self.every)

    def stop(self) -> None:
        """Stop the complete collections (one under way ends first) and freeze nothing any more."""
        self._stop.set()
        self._thread.join()
        gc.callbacks.remove(self._on_collection)
        gc.unfreeze()

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self._started is not None:
            PAUSES.observe(info["generation"], time.perf_counter() - self._started)
            self._started = None
        if info["generation"] == 2:
            gc.freeze()

    def _complete_collections(self) -> None:
        left = gc.get_freeze_count()  # what the last complete collection left
        last = time.monotonic()
        while not self._stop.wait(min(self.poll, self.every)):
            now = time.monotonic()
            if now - last >= self.every:
                why, latest = "due", now + self.every
            elif gc.get_freeze_count() - left > max(self.min_growth, self.growth * left):
                why, latest = "grown", now + self.patience
            else:
                continue
            while not self.quiet() and time.monotonic() < latest:
                if self._stop.wait(QUIET_POLL):
                    return
            started = time.perf_counter()
            found = collect_completely()
            left, last = gc.get_freeze_count(), time.monotonic()
            log.info(
                "a complete collection (%s): %d unreachable objects, %d left, %.0f ms",
                why, found, left, (time.perf_counter() - started) * 1000,
            )  # fmt: skip


def collect_completely() -> int:
    """Thaw, collect everything, freeze again; how many unreachable objects were found."""
    gc.unfreeze()
    found = gc.collect()
    gc.freeze()
    return found
