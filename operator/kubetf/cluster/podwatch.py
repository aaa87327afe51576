"""The operator's pods, watched by the operator itself, not by kopf: each event is parsed as it arrives, handed over
and let go, and a restarted operator lists its pods once (the priming of its cache), not twice.

kopf spent most of the operator's CPU on its per-event machinery for events the handler only stores (py-spy,
docs/operating.md), and a restarted operator listed every pod again for kopf's watch after priming its cache from
its own paged lists. The watch goes on from the priming list's resourceVersion; when the API server no longer has
that version (410 Gone: it restarted, or the watch was away too long) the pods are listed again, page by page, the
cache repaired from that list (what a watch missed, a deletion above all), and the watch goes on from it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kubetf.cluster.kube import describe
from kubetf.cluster.kube_api import Expired, KubeApi

log = logging.getLogger("kubetf.operator")

WATCH_SECONDS = 300  # the API server ends each watch after this long; it goes on from its last version
RETRY_SECONDS = 1.0  # after a watch that failed (the API server restarting, unreachable): as kopf's, every second


class PodWatch:
    """One watch of the operator's pods in one namespace ("": all), on a thread of its own, from `version`.

    `deliver(type, pod)` takes each ADDED, MODIFIED and DELETED event (it does no I/O); `relist(namespace)` lists
    the pods again into the cache and returns that list's resourceVersion."""

    def __init__(
        self,
        kube: KubeApi,
        namespace: str,
        version: int,
        deliver: Callable[[str, dict[str, Any]], None],
        relist: Callable[[str], int],
        stopping: threading.Event,
    ) -> None:
        self.kube, self.namespace, self.version = kube, namespace, version
        self.deliver, self.relist, self.stopping = deliver, relist, stopping

    @property
    def scope(self) -> str:
        return self.namespace or "all namespaces"

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name=f"kubetf-pods-{self.scope}", daemon=True)
        thread.start()
        return thread

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                if not self.version:
                    self.version = self.relist(self.namespace)
                self.follow()
            except Expired as expired:
                log.info("pods in %s: %s; listing them again", self.scope, expired)
                self.version = 0
            except Exception as error:  # the watch or the list failed: again from the last version, soon
                log.warning("watching pods in %s failed (%s); again in %.0fs",
                            self.scope, describe(error), RETRY_SECONDS)  # fmt: skip
                self.stopping.wait(RETRY_SECONDS)

    def follow(self) -> None:
        """One watch, until the API server ends it: every event handed over, the version kept."""
        for event in self.kube.watch_pods(self.namespace, self.version, WATCH_SECONDS):
            kind, obj = event.get("type"), event.get("object") or {}
            version = int((obj.get("metadata") or {}).get("resourceVersion") or 0)
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self.deliver(kind, obj)
            if version:  # a bookmark too: nothing changed, but the watch may go on from here
                self.version = version
            if self.stopping.is_set():
                return
