"""Python's garbage collector kept from stopping kopf's event loop.

A full collection walks every object the collector tracks, with the GIL held: every thread stops, kopf's event
loop and its watches with them. The operator holds long-lived objects for every job and pod it serves (its cache,
kopf's memory of each object, the progress book), so a full collection grows with the jobs: 80-100 ms of CPU for
180,000 objects at 2,000 jobs, 150-340 ms on a loaded machine, and they came every 5-10 s while jobs changed
(`make bench-progress`: most of kopf's late event-loop probes fell on one).

So what survived a full collection is frozen (`gc.freeze`: moved where the collector no longer looks, still freed
by reference counting as usual), and a full collection walks only what is newer than the last one: 2-6 ms. The
cost is that a reference cycle among frozen objects is not reclaimed when it becomes garbage (kopf's per-event
bodies, closed connections: about 2,000-3,000 objects a minute and a half under the benchmark's load); a complete
collection (everything thawed, collected, frozen again) reclaims them every COMPLETE_EVERY seconds, a pause as
long as a full collection's was, once per interval instead of every few seconds.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from typing import Any

from kubetf.cluster import metrics

log = logging.getLogger("kubetf.operator")

# How long a reference cycle among long-lived objects may wait to be reclaimed; the memory it holds meanwhile is
# bounded by this much of the operator's churn.
COMPLETE_EVERY = 600.0


class ShortFullCollections:
    """Between start and stop: what survives a full collection is frozen, and a thread collects completely every
    `every` seconds. Every collection's pause is timed (kubetf_gc_pause_seconds, by generation)."""

    def __init__(self, every: float = COMPLETE_EVERY) -> None:
        self.every = every
        self._stop = threading.Event()
        self._started: float | None = None  # the running collection's start; collections never overlap (GIL)

    def start(self) -> None:
        """Collect completely once (what starting left behind) and freeze the rest."""
        collect_completely()
        gc.callbacks.append(self._on_collection)
        threading.Thread(target=self._complete_collections, name="kubetf-heap", daemon=True).start()
        log.info("full collections walk only what is newer than the last; a complete one every %.0f s", self.every)

    def stop(self) -> None:
        self._stop.set()
        gc.callbacks.remove(self._on_collection)
        gc.unfreeze()

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self._started is not None:
            metrics.GC_PAUSE.labels(str(info["generation"])).observe(time.perf_counter() - self._started)
            self._started = None
        if info["generation"] == 2:
            gc.freeze()

    def _complete_collections(self) -> None:
        while not self._stop.wait(self.every):
            collect_completely()


def collect_completely() -> int:
    """Thaw, collect everything, freeze again; how many unreachable objects were found."""
    gc.unfreeze()
    found = gc.collect()
    gc.freeze()
    return found
