"""Where each queued job stands in its ClusterQueue, from Kueue's visibility API (`pendingworkloads`).

Every `queue_position_seconds` the operator reads the pending Workloads of each ClusterQueue that holds a queued
job of its own (one call per 1,000 pending Workloads), and each job whose place changed is reconciled, so its
condition and `status.queuePosition` say it. Those reconciles write, so they are budgeted: at most
`queue_position_writes` a second, the front of each queue first; a job that did not get its turn keeps its old
place until the next read. 5,000 queued jobs moving up one place cost a few writes a second, not a storm.

Where Kueue does not serve the API (a Kueue without it, no RBAC for it, its APIService unavailable) the jobs say
nothing of a position, and the operator asks again after `positions_unavailable_recheck`. A namespaced install
(no cluster-wide RBAC) reads each LocalQueue's pending Workloads instead, which carry the same ClusterQueue
positions.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from kubetf.cluster.cache import Key, Store
from kubetf.cluster.kube import NotServed
from kubetf.core import api
from kubetf.core.config import OperatorConfig
from kubetf.core.scheduling import workload as kueue

log = logging.getLogger("kubetf.runtime.positions")

PAGE = 1000  # the visibility API's own default and maximum page
REPORT = 3  # the work queue's lowest priority (runtime.executor.REPORT): a place in a queue is never urgent


class Reader(Protocol):
    def pending_workloads(self, path: str, offset: int, limit: int) -> list[dict[str, Any]]: ...


class Queue(Protocol):
    def add(self, key: Key, priority: int) -> None: ...


class QueuePositions:
    def __init__(
        self, kube: Reader, store: Store, queue: Queue, config: OperatorConfig, clock: Callable[[], float] = time.time
    ) -> None:
        self.kube, self.store, self.queue, self.config, self.clock = kube, store, queue, config, clock
        self.lock = threading.Lock()
        # queued job -> (namespace, its Workload, LocalQueue, ClusterQueue), as its last reconcile saw it
        self.tracked: dict[Key, tuple[str, str, str, str]] = {}
        self.told: dict[Key, int] = {}  # (namespace, Workload) -> the position its job was last reconciled with
        self.unavailable_until = 0.0
        self.cluster_wide = True  # False once the ClusterQueue endpoint is refused: per LocalQueue then
        self.stopping = threading.Event()

    # ------------------------------------------------------------------ what reconciles use

    def track(self, key: Key, job: dict[str, Any] | None, admission: kueue.Admission | None) -> None:
        """After each reconcile: follow the job while it is queued (`admission` given), forget it otherwise."""
        with self.lock:
            before = self.tracked.pop(key, None)
            workload = admission.workload if admission is not None else None
            if job is not None and admission is not None and admission.cluster_queue and workload is not None:
                name = workload["metadata"]["name"]
                self.tracked[key] = (api.namespace(job), name, admission.local_queue, admission.cluster_queue)
            elif before is not None:
                self.told.pop((before[0], before[1]), None)

    def position(self, namespace: str, workload: str) -> int | None:
        with self.lock:
            return self.told.get((namespace, workload))

    # ------------------------------------------------------------------ the reader

    def start(self) -> None:
        threading.Thread(target=self._run, name="kubetf-queue-positions", daemon=True).start()

    def stop(self) -> None:
        self.stopping.set()

    def _run(self) -> None:
        while not self.stopping.wait(self.config.queue_position_seconds):
            try:
                self.poll()
            except Exception:
                log.exception("reading Kueue's queue positions failed")

    def poll(self) -> None:
        """Read every ClusterQueue that holds a tracked job; reconcile the jobs whose place changed, within budget."""
        if self.clock() < self.unavailable_until:
            return
        with self.lock:
            tracked = dict(self.tracked)
            told = dict(self.told)
        if not tracked:
            return
        found: dict[Key, int] = {}
        try:
            for path, workloads in self._reads(tracked).items():
                found.update(self._read(path, workloads))
        except NotServed as error:
            if error.status == 403 and self.cluster_wide:
                self.cluster_wide = False  # a namespaced install: LocalQueues, next time
                log.info("no access to ClusterQueues' pending workloads; reading each LocalQueue's instead")
                return
            self.unavailable_until = self.clock() + self.config.positions_unavailable_recheck
            log.warning("Kueue's visibility API (%s/%s) does not answer (%s): queued jobs say nothing of their "
                        "position; asking again in %.0fs", kueue.VISIBILITY_GROUP, kueue.VISIBILITY_VERSION,
                        error.status, self.config.positions_unavailable_recheck)  # fmt: skip
            return
        moved = sorted(
            ((found.get((ns, workload)), key, (ns, workload)) for key, (ns, workload, _, _) in tracked.items()),
            key=lambda entry: (entry[0] is None, entry[0] or 0),
        )
        budget = max(1, int(self.config.queue_position_writes * self.config.queue_position_seconds))
        for position, key, workload_key in moved:
            if told.get(workload_key) == position:
                continue
            if budget == 0:
                break
            budget -= 1
            with self.lock:
                if key not in self.tracked:
                    continue
                if position is None:
                    self.told.pop(workload_key, None)
                else:
                    self.told[workload_key] = position
            self.queue.add(key, REPORT)

    def _reads(self, tracked: dict[Key, tuple[str, str, str, str]]) -> dict[str, set[Key]]:
        """What to read: each ClusterQueue (or, without cluster-wide access, each LocalQueue) with the Workloads in
        it."""
        reads: dict[str, set[Key]] = {}
        for namespace, workload, local_queue, cluster_queue in tracked.values():
            path = f"clusterqueues/{cluster_queue}" if self.cluster_wide else (
                f"namespaces/{namespace}/localqueues/{local_queue}"
            )  # fmt: skip
            reads.setdefault(path, set()).add((namespace, workload))
        return reads

    def _read(self, path: str, workloads: set[Key]) -> dict[Key, int]:
        """The positions of `workloads` in one queue's pending list, read page by page until all are
        found."""
        found: dict[Key, int] = {}
        offset = 0
        while len(found) < len(workloads):
            items = self.kube.pending_workloads(path, offset, PAGE)
            for item in items:
                meta = item.get("metadata") or {}
                key = (meta.get("namespace") or "", meta.get("name") or "")
                if key in workloads:
                    found[key] = int(item.get("positionInClusterQueue") or 0)
            if len(items) < PAGE:
                break
            offset += len(items)
        return found
