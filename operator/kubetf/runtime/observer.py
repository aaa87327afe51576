"""What a reconcile reads (kubetf.core.plan.Observed): the job, its pods and the objects its scheduler integrations made
(PodGroups, Workloads) from the cache the watches fill, and from the API what no watch holds: which gang schedulers
the cluster serves, the nodes of pods that may be lost, a LocalQueue not shown yet, the
priority class of a job whose Workload is to be made, the ResourceFlavors of an admitted job, and the logs a
MultiWorkerMirrored group restart asks for (kubetf.core.sigterm). Reads shared by every job (a node, a LocalQueue,
a class, a flavor) serve a few seconds (OperatorConfig); a node is read by one reconcile at a time."""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kubetf.cluster.cache import Key, Store
from kubetf.cluster.kube_api import KubeApi
from kubetf.core import api, node_loss, scheduling
from kubetf.core import status as st
from kubetf.core.config import OperatorConfig
from kubetf.core.failing import Failing
from kubetf.core.plan import Observed
from kubetf.core.scheduling import kueue, native, volcano
from kubetf.core.scheduling import workload as wl
from kubetf.core.sigterm import LogRead, Watched
from kubetf.core.types import owned_by, uid_of
from kubetf.runtime.positions import QueuePositions
from kubetf.runtime.progress.book import ProgressBook

log = logging.getLogger("kubetf.operator")


class Observer:
    def __init__(
        self,
        kube: KubeApi,
        store: Store,
        positions: QueuePositions,
        book: ProgressBook,
        config: OperatorConfig,
        clock: Callable[[], float],
    ) -> None:
        self.kube, self.store, self.positions, self.config, self.clock = kube, store, positions, config, clock
        self.book = book
        self.discovery: tuple[float, scheduling.Served | None] = (-math.inf, None)  # (read at, what the cluster serves)
        self.lock = threading.Lock()
        self.node_states: dict[str, tuple[float, float | None]] = {}  # node -> (read at, lost since or None)
        # A LocalQueue the watch has not shown, read from the API: (namespace, name) -> (read at, Kueue installed,
        # its ClusterQueue or None)
        self.local_queue_reads: dict[tuple[str, str], tuple[float, bool, str | None]] = {}
        # Cluster-scoped objects read for Workloads, by (kind, name): (read at, the object or None when missing)
        self.class_reads: dict[tuple[str, str], tuple[float, dict[str, Any] | None]] = {}

    def observe(self, key: Key, sigterm: Mapping[str, Watched], failing: Failing | None = None) -> Observed:
        job, now = self.store.job(key), self.clock()
        pods, foreign = st.split_pods(key[1], self.store.job_pods(key))
        owned = self.store.owned_of(key)
        held = self.book.held(key, job["metadata"].get("uid", "")) if job is not None else None
        wants_gang = job is not None and scheduling.runs_here(job) and not (job.get("status") or {}).get("gang")
        asked = ((api.run_policy(job).get("schedulingPolicy") or {}).get("gangScheduler")) if job else None
        served = self.served(now, asked) if wants_gang else scheduling.Served()
        own = self._own_workload(job, owned, pods) if job is not None else None
        return Observed(
            job, pods, now, self._lost_nodes(pods, now), self._admission(job, own, now), sigterm, owned=owned,
            progress=held, failing=failing, foreign=foreign, served=served, key=key,
        )  # fmt: skip

    def served(self, now: float, asked: str | None = None) -> scheduling.Served:
        """Which gang schedulers' APIs the cluster serves (discovery, read again every `discovery_seconds`); asked
        only for a job whose gang scheduler is not chosen yet. A job that names a scheduler the last reading did not
        find has it read again first (at most once a second): one installed a moment ago is no reason to refuse
        the job. Raises when it could never be read."""
        with self.lock:
            read_at, known = self.discovery
        missing = known is not None and (
            (asked == native.NAME and not known.kubernetes) or (asked == volcano.NAME and not known.volcano)
        )
        if known is None or now - read_at >= (1.0 if missing else self.config.discovery_seconds):
            try:
                found = self.kube.served_resources(native.POD_GROUPS.api_version) or set()
                volcano_found = self.kube.served_resources(volcano.POD_GROUPS.api_version) or set()
            except Exception:
                if known is None:
                    raise  # the job's reconcile is retried: a gang scheduler is never chosen on a guess
                log.warning("API discovery failed; using what it said %.0fs ago", now - read_at, exc_info=True)
                return known
            known = scheduling.Served(kubernetes="podgroups" in found, volcano="podgroups" in volcano_found)
            with self.lock:
                self.discovery = (now, known)
        return known

    def with_logs(self, seen: Observed, reads: list[LogRead]) -> Observed:
        """`seen` with the logs read (None: unreadable, and said so in the operator's log)."""
        logs: dict[str, str | None] = dict(seen.logs)
        for read in reads:
            meta = read.pod["metadata"]
            try:
                text = self.kube.pod_log_tail(read.pod, read.container, read.since_seconds, read.limit_bytes)
                logs[meta["uid"]] = text
            except Exception as error:  # no log (RBAC, a kubelet not answering): no later check can do better
                log.warning("could not read the log of %s (%s): its group keeps its grace period", meta["name"], error)
                logs[meta["uid"]] = None
        return dataclasses.replace(seen, logs=logs)

    def forget_local_queue(self, namespace: str, name: str) -> None:
        """The watch showed the LocalQueue: what was read of it is outdated."""
        with self.lock:
            self.local_queue_reads.pop((namespace, name), None)

    def _own_workload(
        self, job: dict[str, Any], owned: list[dict[str, Any]], pods: list[dict[str, Any]]
    ) -> dict[str, Any] | None:
        """The job's Workload (kubetf.core.scheduling.workload.workload_name): its own (by uid), or the prebuilt one it
        adopts. Before a job whose pods run is taken for one without a Workload (its pods would be stopped), the API
        is asked: the watch may not have shown it yet."""
        if kueue.queue_name(job) is None:
            return None
        name = wl.workload_name(job)
        found = next((w for w in owned if wl.WORKLOADS.holds(w) and w["metadata"].get("name") == name), None)
        running = any(not st.is_deleting(p) and not st.is_finished(p) for p in pods)
        if found is None and running:
            found = self.kube.get_owned(wl.WORKLOADS, api.namespace(job), name)
            if found is not None:
                found = {**found, "apiVersion": wl.WORKLOADS.api_version, "kind": "Workload"}
                self.store.put_owned(found)
        if found is None:
            return None
        return found if owned_by(found, uid_of(job)) or wl.adoptable(found, job) else None

    def _admission(
        self, job: dict[str, Any] | None, workload: dict[str, Any] | None, now: float
    ) -> wl.Admission | None:
        """What Kueue says of a queued job: its LocalQueue, its Workload (watched) and its place in the ClusterQueue
        (kubetf.runtime.positions); with what a Workload to be made needs (its priority) or an admitted one's pods
        (the ResourceFlavors assigned)."""
        queue = kueue.queue_name(job) if job is not None else None
        if job is None or queue is None:
            return None
        namespace = api.namespace(job)
        cluster_queue = self.store.local_queue(namespace, queue)
        installed = True
        if cluster_queue is None and workload is None:
            installed, cluster_queue = self._read_local_queue(namespace, queue, now)
        if not installed:
            return wl.Admission(queue, cluster_queue, installed)
        if workload is None:
            priority = None
            if cluster_queue is not None and not _stopped(job) and not wl.prebuilt_name(job):
                source = wl.priority_source(job)
                priority = wl.priority_of(source, self._read_class(*source, now) if source else None)
            return wl.Admission(queue, cluster_queue, installed, priority=priority)
        admission = wl.Admission(queue, cluster_queue, installed, workload)
        position = self.positions.position(namespace, workload["metadata"]["name"]) if not admission.admitted else None
        flavors: dict[str, dict[str, Any]] = {}
        if admission.admitted and not _stopped(job) and scheduling.runs_here(job):
            for name in sorted(kueue.flavors_of(workload)):
                flavor = self._read_class("ResourceFlavor", name, now)
                if flavor is None:
                    raise LookupError(f"ResourceFlavor {name}, assigned to Workload {workload['metadata']['name']}, "
                                      "does not exist")  # fmt: skip
                flavors[name] = flavor
        return dataclasses.replace(admission, position=position, flavors=flavors)

    def _read_class(self, kind: str, name: str, now: float) -> dict[str, Any] | None:
        """A WorkloadPriorityClass, PriorityClass or ResourceFlavor (None: missing), read again after a few seconds."""
        with self.lock:
            read_at, found = self.class_reads.get((kind, name), (-math.inf, None))
        if now - read_at >= self.config.local_queue_recheck:
            found = self.kube.get_cluster_object(kind, name)
            with self.lock:
                self.class_reads[(kind, name)] = (now, found)
        return found

    def _read_local_queue(self, namespace: str, name: str, now: float) -> tuple[bool, str | None]:
        """A LocalQueue the watch has not shown: read from the API (its absence, or Kueue's, serves a few seconds)."""
        with self.lock:
            read_at, installed, cluster_queue = self.local_queue_reads.get((namespace, name), (-math.inf, True, None))
        if now - read_at >= self.config.local_queue_recheck:
            installed, cluster_queue = self.kube.local_queue(namespace, name)
            with self.lock:
                self.local_queue_reads[(namespace, name)] = (now, installed, cluster_queue)
        return installed, cluster_queue

    def _lost_nodes(self, pods: list[dict[str, Any]], now: float) -> dict[str, float]:
        """The nodes of pods being deleted or not ready that stopped reporting (NotReady, Unknown, gone), and since
        when (kubetf.core.node_loss)."""
        nodes = {
            node
            for pod in pods
            if (node := (pod.get("spec") or {}).get("nodeName"))
            and (st.is_deleting(pod) or ((pod.get("status") or {}).get("phase") == "Running" and not st.is_ready(pod)))
        }
        lost = {}
        for node in nodes:
            with self.lock:
                read_at, since = self.node_states.get(node, (-math.inf, None))
                due = now - read_at >= self.config.node_state_seconds
                if due:  # claimed: meanwhile the other reconciles take what was read before (bench-scale, 2,000
                    # jobs finishing on 14 nodes: 0.9 reads per job, each reconcile reading while another's was slow)
                    self.node_states[node] = (now, since)
            if due:
                since = self._read_node(node, now)
                with self.lock:
                    self.node_states[node] = (now, since)
            if since is not None:
                lost[node] = since
        return lost

    def _read_node(self, node: str, now: float) -> float | None:
        try:
            found = self.kube.get_node(node)
        except Exception:  # no node access (RBAC), or the API is down: never force on a guess
            log.warning("could not read node %s; treating it as reachable", node, exc_info=True)
            return None
        return node_loss.lost_since(found, now, self.config.node_silence)


def _stopped(job: dict[str, Any]) -> bool:
    """Suspended or finished: no pod of it is to run."""
    return bool(api.run_policy(job).get("suspend")) or (job.get("status") or {}).get("phase") in st.FINISHED
