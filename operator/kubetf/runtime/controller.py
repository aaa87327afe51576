"""The reconcile shell: watch events in, one reconcile per job at a time, each a plan carried out.

Reads come from the cache the watches fill (`cache.Store`), completed by `Observer`; the decision is pure
(`core.reconcile.plan`); `Executor` carries it out. A job whose own creates or deletes the watch has not shown yet
waits for them (`workqueue.Expectations`). Reconciles are ordered by urgency: a pod that ended goes before a pod
that started, which goes before new jobs' creations, which go before what only reports
(a place in Kueue's queue, a new job's first status while others wait for their creations).
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubetf.cluster import metrics
from kubetf.cluster.cache import Key, Store
from kubetf.cluster.kube import describe, is_transient
from kubetf.cluster.kube_api import KubeApi, NotLeader, Refused
from kubetf.cluster.podwatch import PodWatch
from kubetf.cluster.workqueue import Expectations, ShutDown, WorkQueue
from kubetf.core import api, inplace, policy, reconcile, refusals, scheduling
from kubetf.core.config import OperatorConfig
from kubetf.core.failing import RECONCILE_ERROR, Failing
from kubetf.core.plan import Plan
from kubetf.core.types import Resource
from kubetf.runtime.executor import FOLLOW, NORMAL, REPORT, URGENT, Executor
from kubetf.runtime.observer import Observer
from kubetf.runtime.positions import QueuePositions
from kubetf.runtime.progress.book import ProgressBook
from kubetf.runtime.progress.gauges import JobSeries

log = logging.getLogger("kubetf.operator")

PRIORITY_NAMES = {URGENT: "urgent", FOLLOW: "follow", NORMAL: "normal", REPORT: "report"}


class Controller:
    def __init__(self, kube: KubeApi, config: OperatorConfig, clock: Callable[[], float] = time.time) -> None:
        self.kube, self.config, self.clock = kube, config, clock
        self.store = Store(config.tombstone_seconds)
        metrics.CACHED_PODS.set_function(lambda: self.store.cached_pods)
        self.queue: WorkQueue[Key] = WorkQueue(
            config.error_backoff_first,
            config.error_backoff_cap,
            clock,
            on_wait=lambda priority, seconds: metrics.QUEUE_WAIT.labels(PRIORITY_NAMES[priority]).observe(seconds),
        )
        self.expectations: Expectations[Key] = Expectations(config.expectations_timeout, clock)
        self.lock = threading.Lock()
        self.positions = QueuePositions(kube, self.store, self.queue, config, clock)
        self.series = JobSeries()
        # The progress the training pods report (kubetf.runtime.progress): a write that falls due reconciles the job.
        self.book = ProgressBook(config, clock, wake=lambda key: self.queue.add(key, NORMAL), series=self.series)
        self.observer = Observer(kube, self.store, self.positions, self.book, config, clock)
        self.executor = Executor(
            kube, self.store, self.queue, self.expectations, self.positions, config, self.book, self.series
        )
        self.threads: list[threading.Thread] = []
        self.failing: dict[Key, Failing] = {}  # jobs whose last reconciles failed (kubetf.core.failing)
        # Leadership (cluster.leader): a reconcile whose writes were refused for want of the lease is kept here, with
        # its priority, and run again once the lease is held (`leadership`).
        self.leading = True
        self.refused: dict[Key, int] = {}
        self.audit_on_list = False  # set once the re-list after the start is done: later kopf lists are re-lists
        self.refreshing = threading.Lock()  # one re-list at a time
        self.stopping = threading.Event()
        self.auditing = False
        self.audit_again = False  # a re-list came during an audit that may have listed before it

    # ------------------------------------------------------------------ lifecycle

    def run(self, serving: threading.Event | None = None) -> None:
        """Prime the cache, start the workers (then `serving` is set), then re-list everything once the watches run
        and every `resync_seconds` after that (call on a thread)."""
        delay = 1.0
        while True:
            try:
                pods_listed_at = self.prime()
                break
            except Exception:
                log.exception("listing the jobs and pods failed; retrying in %.0fs", delay)
                time.sleep(delay)
                delay = min(2 * delay, 30.0)
        for namespace, version in pods_listed_at.items():  # from the priming list on: nothing missed between
            PodWatch(self.kube, namespace, version, self.pod_event, self.relist_pods, self.stopping).start()
        self.start()
        if serving is not None:
            serving.set()
        threading.Thread(target=self._resync_loop, name="kubetf-resync", daemon=True).start()

    def _resync_loop(self) -> None:
        """The first re-list comes once the watches run (a deletion between the priming list and the start of a
        watch is acted on then), the next ones every resync_seconds (with jitter): a missed watch event costs no
        more than that, and no job is polled on its own."""
        delay = self.config.audit_after_start
        while not self.stopping.wait(delay):
            self._refresh()
            self.audit_on_list = True
            jitter = random.uniform(-self.config.resync_jitter, self.config.resync_jitter)
            delay = self.config.resync_seconds * (1 + jitter)

    def _refresh(self) -> None:
        try:
            self.refresh()
        except Exception:  # the watches and the next re-list remain
            log.exception("re-listing jobs, pods and Workloads failed")

    def _listed(self) -> None:
        """kopf listed again: its watch could not resume (a restarted API server has none of the old versions),
        and a list shows no deletions, so a pod deleted meanwhile would stay cached. Re-list once more: a list
        taken after kopf's shows them, and kopf's watch goes on from its own list."""
        with self.lock:
            if not self.audit_on_list:
                return
            if self.auditing:
                self.audit_again = True
                return
            self.auditing = True
        threading.Thread(target=self._refresh_until_done, name="kubetf-refresh", daemon=True).start()

    def _refresh_until_done(self) -> None:
        while True:
            self._refresh()
            with self.lock:
                if not self.audit_again:
                    self.auditing = False
                    return
                self.audit_again = False

    def prime(self) -> dict[str, int]:
        """Fill the cache with paged lists of jobs, the operator's pods and Kueue's LocalQueues and Workloads before
        any reconcile, so that no job is ever judged on a partial view (a restarted operator would see its pods
        'vanished', a queued job's Workload missing and its admission lost). Returns, by scope, the resourceVersion
        of the list of pods: where their watches start."""
        started = time.monotonic()
        pods_listed_at: dict[str, int] = {}
        scopes, serves = self.config.list_scopes(), self._serves
        for job in self.kube.list_paged(api.PLURAL, scopes):
            if serves(job):
                self.store.put_job(job)
        for namespace in scopes:
            for items, version in self.kube.pages("pods", namespace, api.MANAGED_PODS_SELECTOR):
                pods_listed_at[namespace] = version
                for pod in items:
                    key = _pod_job(pod)
                    if key is not None and serves(pod):
                        self.store.put_pod(key, pod)
        for namespace in scopes:
            for items, _ in self.kube.local_queue_pages(namespace):
                for queue in filter(serves, items):
                    self.store.put_local_queue(queue)
            for resource in scheduling.RESOURCES:
                for items, _ in self.kube.owned_pages(namespace, resource):
                    for obj in filter(serves, items):
                        self.store.put_owned(obj)
        self.requeue_all()
        # What a job deleted while no operator ran left: pods (Kueue's old finalizer), a Workload whose quota is held
        # until it is finished and let go. The garbage collector's deletion of it brings no event once seen.
        for key in {*self.store.pod_jobs(), *self.store.owned_jobs()}:
            if self.store.job(key) is None:
                self.queue.add(key, NORMAL)
        log.info("cache primed in %.1fs: %d jobs, %d pods", time.monotonic() - started, self.store.job_count(),
                 self.store.pod_count())  # fmt: skip
        return pods_listed_at

    def refresh(self) -> None:
        """Compare the cache with fresh paged lists of the jobs, their pods and their groups' Workloads: what a
        watch missed (a deletion during a watch gap, an event lost) is stored, and its job reconciled now."""
        with self.refreshing:
            for namespace in self.config.list_scopes():
                self._refresh_jobs(namespace)
                self._refresh_pods(namespace)
                for resource in scheduling.RESOURCES:
                    self._refresh_owned(namespace, resource)

    def _refresh_jobs(self, namespace: str) -> None:
        listed: set[Key] = set()
        version = 0
        for items, list_version in self.kube.pages(api.PLURAL, namespace):
            version = list_version
            for job in filter(self._serves, items):
                key = (api.namespace(job), api.name(job))
                listed.add(key)
                if self.store.put_job(job):
                    self.queue.add(key, NORMAL)
        for key in self.store.prune_jobs(namespace, listed, version):
            log.warning("%s/%s: deleted while the watch was away", *key)
            self.executor.record_phase(key, None)
            self.queue.add(key, NORMAL)  # its pods may still need Kueue's finalizer released

    def relist_pods(self, namespace: str) -> int:
        """The pod watch could not go on (cluster.podwatch): list the pods again into the cache, as a re-list does;
        returns that list's resourceVersion, where the watch goes on."""
        with self.refreshing:
            return self._refresh_pods(namespace)

    def _refresh_pods(self, namespace: str) -> int:
        # Each page goes into the cache as it comes, newer versions only; what is kept to the end is the names
        # (holding 50,000 pods' slim copies instead cost a restarted operator about 100 MB at once).
        listed: dict[Key, set[str]] = {
            key: set() for key in self.store.pod_jobs() if not namespace or key[0] == namespace
        }
        changed: set[Key] = set()
        version = 0
        for items, list_version in self.kube.pages("pods", namespace, api.MANAGED_PODS_SELECTOR):
            version = list_version
            for pod in items:
                key = _pod_job(pod)
                if key is not None and self._serves(pod):
                    listed.setdefault(key, set()).add(pod["metadata"]["name"])
                    if self.store.put_pod(key, pod):
                        changed.add(key)
        for key, names in listed.items():
            if self.store.prune_pods(key, names, version) or key in changed:
                log.warning("%s/%s: the watch had missed changes of its pods; acting on a fresh list", *key)
                self.expectations.forget(key)
                self.queue.add(key, URGENT)
        return version

    def _refresh_owned(self, namespace: str, resource: Resource) -> None:
        listed: set[tuple[Key, str]] = set()
        version = 0
        priority = URGENT if resource.urgent else NORMAL
        for items, list_version in self.kube.owned_pages(namespace, resource):
            version = list_version
            for obj in filter(self._serves, items):
                meta = obj.get("metadata") or {}
                listed.add(((meta.get("namespace") or "", (meta.get("labels") or {}).get(api.LABEL_JOB) or ""),
                            meta.get("name") or ""))  # fmt: skip
                key = self.store.put_owned(obj)
                if key is not None:
                    self.queue.add(key, priority)
        if version:  # listed (the cluster serves that API)
            for key in self.store.prune_owned(namespace, resource, listed, version):
                self.queue.add(key, priority)

    def _serves(self, obj: Mapping[str, Any]) -> bool:
        return self.config.serves((obj.get("metadata") or {}).get("namespace") or "")

    def requeue_all(self) -> None:
        """Reconcile every job again."""
        for key in self.store.job_keys():
            self.queue.add(key, NORMAL)

    def leadership(self, held: bool) -> None:
        """The election's word (called on its thread): the lease was lost, or is held again. Held again, every job is
        reconciled from a fresh read (events meanwhile may not have been acted on, the watches may have missed
        some), the decisions refused meanwhile first. Lost, the progress held is outdated: another leader takes
        reports meanwhile."""
        with self.lock:
            self.leading = held
        if not held:
            self.book.clear()
        if held:
            threading.Thread(target=self._regained, name="kubetf-regained", daemon=True).start()

    def _regained(self) -> None:
        self._refresh()
        with self.lock:
            refused, self.refused = self.refused, {}
        for key, priority in refused.items():
            self.queue.add(key, priority)
        self.requeue_all()
        if refused:
            log.info("holding the lease again: %d decisions refused meanwhile run again", len(refused))

    def start(self) -> None:
        for i in range(self.config.workers):
            thread = threading.Thread(target=self._work, name=f"kubetf-reconcile-{i}", daemon=True)
            thread.start()
            self.threads.append(thread)
        for i in range(self.config.urgent_workers):
            thread = threading.Thread(target=self._work, args=(URGENT,), name=f"kubetf-urgent-{i}", daemon=True)
            thread.start()
            self.threads.append(thread)
        self.positions.start()
        self.book.start()

    def stop(self) -> None:
        self.stopping.set()
        self.positions.stop()
        self.book.stop()
        self.queue.shutdown()

    def _work(self, most: int | None = None) -> None:
        while True:
            try:
                key, priority = self.queue.get(most)
            except ShutDown:
                return
            metrics.QUEUE_DEPTH.set(len(self.queue))
            self.process(key, priority)

    def process(self, key: Key, priority: int) -> None:
        """One reconcile of a key the queue handed out, and what its outcome means: its backoff, its failures."""
        try:
            with self.kube.urgent() if priority == URGENT else contextlib.nullcontext():
                self.reconcile(key, priority)
            self.queue.forget(key)
            self._succeeded(key)
        except NotLeader as error:
            self._refused_for_want_of_the_lease(key, priority, error)
        except Refused as error:  # the job's status and a Warning event say it: no traceback
            cap = {
                refusals.NAME_IN_USE: self.config.name_in_use_recheck,
                refusals.UNAVAILABLE: self.config.transient_retry_cap,
            }.get(error.refusal.cause)
            delay = self.queue.retry(key, priority, cap)
            log.warning("%s/%s: could not create %s; retrying in %.0fs", *key, error, delay)
        except Exception as error:
            metrics.RECONCILE_ERRORS.inc()
            if is_transient(error):  # the API server restarting, overloaded: back soon, and so is the job
                delay = self.queue.retry(key, priority, self.config.transient_retry_cap)
                log.warning("reconcile of %s/%s failed (%s); retrying in %.0fs", *key, _one_line(error), delay)
            else:
                delay = self.queue.retry(key, priority)
                log.exception("reconcile of %s/%s failed; retrying in %.0fs", *key, delay)
            self._failed(key, error)
        finally:
            self.queue.done(key)

    def _failed(self, key: Key, error: Exception) -> None:
        """One more failed reconcile in a row: past `reconcile_error_after`, the job's status says so."""
        with self.lock:
            before = self.failing.get(key)
            failure = self.failing[key] = Failing((before.attempts if before else 0) + 1, _one_line(error))
        if failure.attempts >= self.config.reconcile_error_after:
            self.executor.report_failing(key, failure, self.clock())

    def _succeeded(self, key: Key) -> None:
        """A reconcile succeeded: a ReconcileError condition its failures left is cleared by the next one."""
        with self.lock:
            failed = self.failing.pop(key, None)
        if failed is not None and _says_failing(self.store.job(key)):
            self.queue.add(key, NORMAL)

    def _refused_for_want_of_the_lease(self, key: Key, priority: int, error: NotLeader) -> None:
        """Keep the decision for when the lease is held again (`leadership`); if it is held already (the election
        saw it back while this reconcile ran), run it again now."""
        with self.lock:
            if not self.leading:
                self.refused[key] = min(priority, self.refused.get(key, priority))
                log.debug("%s/%s: %s; kept until the lease is held again", *key, error)
                return
        self.queue.at(self.clock() + self.config.retry_period, key, priority)

    # ------------------------------------------------------------------ watch events (called on kopf's loop, the
    # pods' on their watch's thread: no I/O)

    def job_event(self, type_: str | None, job: Mapping[str, Any]) -> None:
        if not self._serves(job):  # kopf watches every namespace when a pattern names them (runner)
            return
        key = (api.namespace(dict(job)), api.name(dict(job)))
        if type_ is None:  # kopf's type for an object it listed rather than watched
            self._listed()
        if type_ == "DELETED":
            self.store.remove_job(key, (job.get("metadata") or {}).get("uid", ""))
            self.expectations.forget(key)
            self.queue.add(key, NORMAL)  # its farewell, off this loop: Kueue's bookkeeping, its progress and series
            return
        if self.store.put_job(dict(job)):  # the echo of the operator's own status write changes nothing
            self.queue.add(key, NORMAL)

    def pod_event(self, type_: str | None, pod: Mapping[str, Any]) -> None:
        key = _pod_job(pod)
        if key is None or not self._serves(pod):
            return
        if type_ is None:  # kopf's type for an object it listed rather than watched
            self._listed()
        meta = pod.get("metadata") or {}
        deleted = type_ == "DELETED"
        gone = deleted or bool(meta.get("deletionTimestamp"))
        # The cache first: a reconcile the expectations let through must find what they waited for.
        if deleted:
            changed = self.store.remove_pod(key, meta.get("name", ""), meta.get("uid", ""))
        else:
            changed = self.store.put_pod(key, pod)
        if changed:
            phase = (pod.get("status") or {}).get("phase")
            if gone or phase in ("Succeeded", "Failed") or policy.disruption_reason(pod) or inplace.exited(dict(pod)):
                self.queue.add(key, URGENT)
            else:  # it started, was scheduled, turned ready: its peers' same changes follow, all in one reconcile
                self.queue.at(self.clock() + self.config.pod_batch_seconds, key, FOLLOW)
        deferred = self.expectations.observe(key, meta.get("name", ""), meta.get("uid", ""), gone)
        if deferred is not None:
            self.queue.add(key, deferred)

    def owned_event(self, type_: str | None, obj: Mapping[str, Any], resource: Resource) -> None:
        """An object a scheduler integration made for a job changed (a Workload admitted or evicted, a PodGroup the
        scheduler wrote on): its job is reconciled when what the decisions read of it changed."""
        if not self._serves(obj):
            return
        if type_ is None:  # kopf's type for an object it listed rather than watched
            self._listed()
        found = {**obj, "apiVersion": resource.api_version, "kind": resource.kind}
        key = self.store.remove_owned(found) if type_ == "DELETED" else self.store.put_owned(found)
        if key is not None:
            self.queue.add(key, URGENT if resource.urgent else NORMAL)

    def local_queue_event(self, type_: str | None, queue: Mapping[str, Any]) -> None:
        """A LocalQueue appeared, went or changed its ClusterQueue: the jobs labelled with it are reconciled."""
        meta = queue.get("metadata") or {}
        namespace, name = meta.get("namespace") or "", meta.get("name") or ""
        if not self.config.serves(namespace):
            return
        if type_ == "DELETED":
            changed = self.store.remove_local_queue(namespace, name)
        else:
            changed = self.store.put_local_queue(queue)
        if changed:
            self.observer.forget_local_queue(namespace, name)
            for key in self.store.jobs_of_queue(namespace, name):
                self.queue.add(key, NORMAL)

    # ------------------------------------------------------------------ reconcile

    def reconcile(self, key: Key, priority: int = NORMAL) -> Plan | None:
        """Reconcile one job from the cache. Returns the plan it carried out, None when there was nothing to decide
        (its own writes not shown by the watch yet, or the job does not run here)."""
        started = time.monotonic()
        waiting_until = self.expectations.defer(key, priority)
        if waiting_until is not None:
            self.queue.at(waiting_until, key, NORMAL)  # a lost watch event must not stall the job
            return None
        with self.lock:
            failure = self.failing.get(key)
        seen = self.observer.observe(key, self.executor.sigterm.get(key, {}), failure)
        plan = reconcile.decide(seen, self.config)
        if plan.read_logs:  # a group restart waits on what its first member's log says (core.sigterm)
            seen = self.observer.with_logs(seen, plan.read_logs)
            plan = reconcile.decide(seen, self.config)
        final = self.executor.carry_out(key, seen, plan)
        metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)
        return final


def _says_failing(job: Mapping[str, Any] | None) -> bool:
    conditions = ((job or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == RECONCILE_ERROR and c.get("status") == "True" for c in conditions)


def _one_line(error: BaseException) -> str:
    return describe(error).splitlines()[0][:300] if str(error) else type(error).__name__


def _pod_job(pod: Mapping[str, Any]) -> Key | None:
    meta = pod.get("metadata") or {}
    job = (meta.get("labels") or {}).get(api.LABEL_JOB)
    return (meta.get("namespace") or "default", job) if job else None
