"""The reconcile shell: watch events in, one reconcile per job at a time, the plan carried out through `Kube`.

Reads come from the cache the watches fill (`cache.Store`); the pure decision is `reconcile.plan`; writes go
through `kube.Kube`. A job whose own creates or deletes the watch has not shown yet waits for them
(`workqueue.Expectations`). Reconciles are ordered by urgency: a pod that ended goes before new jobs' creations,
which go before safety resyncs.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubetf.cluster import metrics
from kubetf.cluster.cache import Key, Store
from kubetf.cluster.kube import Kube, NotLeader, Refused, is_transient
from kubetf.cluster.workqueue import Expectations, ShutDown, WorkQueue
from kubetf.core import api, kueue, reconcile, sigterm
from kubetf.core import status as st
from kubetf.core.config import OperatorConfig
from kubetf.core.reconcile import Event, Plan, Refusal
from kubetf.runtime import positions
from kubetf.runtime.positions import QueuePositions

log = logging.getLogger("kubetf.operator")

# Priorities: lower runs first.
URGENT = 0  # a pod ended, vanished or is being taken away, Kueue admitted or evicted: a restart is due
NORMAL = 1  # a new or changed job, a pod that started, a timer
RESYNC = positions.RESYNC  # nothing changed but a job's place in its queue

AUDIT_AFTER_START = 20.0  # seconds: the watches have listed by then
NODE_STATE_SECONDS = 5.0  # how long a node's Ready state read from the API serves every job with pods there
# A previous job's Service or PVC is usually garbage-collected within seconds: look again soon, not after 5 minutes.
NAME_IN_USE_RECHECK = 10.0
# A LocalQueue the watch has not shown (not listed yet, or missing) is read from the API; its absence serves this
# long. Whether the cluster serves Kueue's API at all is asked as often.
NO_LOCAL_QUEUE_SECONDS = 5.0


class Controller:
    def __init__(self, kube: Kube, config: OperatorConfig, clock: Callable[[], float] = time.time) -> None:
        self.kube, self.config, self.clock = kube, config, clock
        self.store = Store()
        metrics.CACHED_PODS.set_function(lambda: self.store.cached_pods)
        self.queue: WorkQueue[Key] = WorkQueue(config.error_backoff_first, config.error_backoff_cap, clock)
        self.expectations: Expectations[Key] = Expectations(config.expectations_timeout, clock)
        self.lock = threading.Lock()
        self.phases: dict[Key, str] = {}
        self.node_states: dict[str, tuple[float, bool]] = {}  # node -> (read at, lost)
        # A LocalQueue the watch has not shown, read from the API: (namespace, name) -> (read at, Kueue installed,
        # its ClusterQueue or None)
        self.local_queue_reads: dict[tuple[str, str], tuple[float, bool, str | None]] = {}
        self.positions = QueuePositions(kube, self.store, self.queue, config, clock)
        self.sigterm_watch: dict[Key, dict[str, sigterm.Watched]] = {}  # pods sent SIGTERM, by uid
        self.threads: list[threading.Thread] = []
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
                self.prime()
                break
            except Exception:
                log.exception("listing the jobs and pods failed; retrying in %.0fs", delay)
                time.sleep(delay)
                delay = min(2 * delay, 30.0)
        self.start()
        if serving is not None:
            serving.set()
        threading.Thread(target=self._resync_loop, name="kubetf-resync", daemon=True).start()

    def _resync_loop(self) -> None:
        """The first re-list comes once the watches run (a deletion between the priming list and the start of a
        watch is acted on then), the next ones every resync_seconds (with jitter): a missed watch event costs no
        more than that, and no job is polled on its own."""
        delay = AUDIT_AFTER_START
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

    def prime(self) -> None:
        """Fill the cache with paged lists of jobs, the operator's pods and Kueue's LocalQueues and Workloads before
        any reconcile, so that no job is ever judged on a partial view (a restarted operator would see its pods
        'vanished', a queued job's Workload missing and its admission lost)."""
        started = time.monotonic()
        scopes, serves = self.config.list_scopes(), self._serves
        for job in self.kube.list_paged(api.PLURAL, scopes):
            if serves(job):
                self.store.put_job(job)
        for pod in self.kube.list_paged("pods", scopes, api.MANAGED_PODS_SELECTOR):
            key = _pod_job(pod)
            if key is not None and serves(pod):
                self.store.put_pod(key, pod)
        for namespace in scopes:
            for items, _ in self.kube.workload_pages(namespace):
                for workload in filter(serves, items):
                    self.store.put_workload(workload)
            for items, _ in self.kube.local_queue_pages(namespace):
                for queue in filter(serves, items):
                    self.store.put_local_queue(queue)
        self.requeue_all()
        for key in self.store.pod_jobs():  # pods of a job deleted while no operator ran: Kueue's finalizer
            if self.store.job(key) is None:
                self.queue.add(key, NORMAL)
        log.info("cache primed in %.1fs: %d jobs, %d pods", time.monotonic() - started, self.store.job_count(),
                 self.store.pod_count())  # fmt: skip

    def refresh(self) -> None:
        """Compare the cache with fresh paged lists of the jobs, their pods and their groups' Workloads: what a
        watch missed (a deletion during a watch gap, an event lost) is stored, and its job reconciled now."""
        with self.refreshing:
            for namespace in self.config.list_scopes():
                self._refresh_jobs(namespace)
                self._refresh_pods(namespace)
                self._refresh_workloads(namespace)

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
            self._record_phase(key, None)
            self.queue.add(key, NORMAL)  # its pods may still need Kueue's finalizer released

    def _refresh_pods(self, namespace: str) -> None:
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

    def _refresh_workloads(self, namespace: str) -> None:
        listed: set[Key] = set()
        version = 0
        for items, list_version in self.kube.workload_pages(namespace):
            version = list_version
            for workload in filter(self._serves, items):
                meta = workload.get("metadata") or {}
                listed.add((meta.get("namespace") or "", meta.get("name") or ""))
                key = self.store.put_workload(workload)
                if key is not None:
                    self.queue.add(key, URGENT)
        if version:  # listed (Kueue is installed)
            for key in self.store.prune_workloads(namespace, listed, version):
                self.queue.add(key, URGENT)

    def _serves(self, obj: Mapping[str, Any]) -> bool:
        return self.config.serves((obj.get("metadata") or {}).get("namespace") or "")

    def requeue_all(self) -> None:
        """Reconcile every job again."""
        for key in self.store.job_keys():
            self.queue.add(key, NORMAL)

    def leadership(self, held: bool) -> None:
        """The election's word (called on its thread): the lease was lost, or is held again. Held again, every job is
        reconciled from a fresh read (events meanwhile may not have been acted on, the watches may have missed
        some), the decisions refused meanwhile first."""
        with self.lock:
            self.leading = held
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
        self.positions.start()

    def stop(self) -> None:
        self.stopping.set()
        self.positions.stop()
        self.queue.shutdown()

    def _work(self) -> None:
        while True:
            try:
                key, priority = self.queue.get()
            except ShutDown:
                return
            metrics.QUEUE_DEPTH.set(len(self.queue))
            try:
                self.reconcile(key, priority)
                self.queue.forget(key)
            except NotLeader as error:
                self._refused_for_want_of_the_lease(key, priority, error)
            except Refused as error:  # the job's status and a Warning event say it: no traceback
                cap = {
                    reconcile.NAME_IN_USE: NAME_IN_USE_RECHECK,
                    reconcile.UNAVAILABLE: self.config.transient_retry_cap,
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
            finally:
                self.queue.done(key)

    def _refused_for_want_of_the_lease(self, key: Key, priority: int, error: NotLeader) -> None:
        """Keep the decision for when the lease is held again (`leadership`); if it is held already (the election
        saw it back while this reconcile ran), run it again now."""
        with self.lock:
            if not self.leading:
                self.refused[key] = min(priority, self.refused.get(key, priority))
                log.debug("%s/%s: %s; kept until the lease is held again", *key, error)
                return
        self.queue.at(self.clock() + self.config.retry_period, key, priority)

    # ------------------------------------------------------------------ watch events (called on kopf's loop: no I/O)

    def job_event(self, type_: str | None, job: Mapping[str, Any]) -> None:
        key = (api.namespace(dict(job)), api.name(dict(job)))
        if type_ is None:  # kopf's type for an object it listed rather than watched
            self._listed()
        if type_ == "DELETED":
            self.store.remove_job(key, (job.get("metadata") or {}).get("uid", ""))
            self.expectations.forget(key)
            self._record_phase(key, None)
            return
        if self.store.put_job(dict(job)):  # the echo of the operator's own status write changes nothing
            self.queue.add(key, NORMAL)

    def pod_event(self, type_: str | None, pod: Mapping[str, Any]) -> None:
        key = _pod_job(pod)
        if key is None:
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
            self.queue.add(key, URGENT if gone or phase in ("Succeeded", "Failed") else NORMAL)
        deferred = self.expectations.observe(key, meta.get("name", ""), meta.get("uid", ""), gone)
        if deferred is not None:
            self.queue.add(key, deferred)

    def workload_event(self, type_: str | None, workload: Mapping[str, Any]) -> None:
        """A Workload changed: its job is reconciled when what the decisions read of it changed (admitted, evicted,
        finished, a new pod among its owners)."""
        meta = workload.get("metadata") or {}
        if type_ is None:  # kopf's type for an object it listed rather than watched
            self._listed()
        if type_ == "DELETED":
            key = self.store.remove_workload(meta.get("namespace") or "", meta.get("name") or "")
        else:
            key = self.store.put_workload(workload)
        if key is not None:
            self.queue.add(key, URGENT)

    def local_queue_event(self, type_: str | None, queue: Mapping[str, Any]) -> None:
        """A LocalQueue appeared, went or changed its ClusterQueue: the jobs labelled with it are reconciled."""
        meta = queue.get("metadata") or {}
        namespace, name = meta.get("namespace") or "", meta.get("name") or ""
        if type_ == "DELETED":
            changed = self.store.remove_local_queue(namespace, name)
        else:
            changed = self.store.put_local_queue(queue)
        if changed:
            with self.lock:
                self.local_queue_reads.pop((namespace, name), None)
            for key in self.store.jobs_of_queue(namespace, name):
                self.queue.add(key, NORMAL)

    # ------------------------------------------------------------------ reconcile

    def reconcile(self, key: Key, priority: int = NORMAL) -> Plan | None:
        """Reconcile one job from the cache. Returns the plan it carried out, None when there was nothing to decide
        yet (its own writes not shown by the watch)."""
        started = time.monotonic()
        namespace, name = key
        waiting_until = self.expectations.defer(key, priority)
        if waiting_until is not None:
            self.queue.at(waiting_until, key, NORMAL)  # a lost watch event must not stall the job
            return None
        job = self.store.job(key)
        if job is None or job["metadata"].get("deletionTimestamp"):
            self._record_phase(key, None)
            self.positions.track(key, None, None)
            self._let_kueue_finish(key)
            return None
        if not kueue.managed_here(job):
            return None  # MultiKueue's (spec.managedBy): the cluster it dispatches to runs it
        pods = self.store.job_pods(key)
        now = self.clock()
        original = job.get("status") or {}
        lost_nodes = self._lost_nodes(pods, now)
        admission = self._admission(job, now)
        plan = reconcile.plan(job, pods, now, lost_nodes, admission)
        refusal = None
        trial = reconcile.dry_run_objects(plan)
        if trial:  # a new job: nothing is created unless all of it would be
            refusal = self.kube.dry_run(trial, job["metadata"]["uid"])
            if refusal is not None:
                plan.create, plan.ensure = [], []
        stored = original
        posted = 0  # events go out before the status write that records their decision: a crash repeats, never loses
        if plan.persist_first and plan.status != stored:
            posted = self._post(job, plan.events, posted)
            job = self._write_status(job, stored, plan.status)
            stored = plan.status
        if plan.unretriable:  # before the deletions: Kueue must never take the group's end for a lost pod
            log.info("%s/%s: %s marked not to be replaced (Kueue)", *key, ", ".join(_names(plan.unretriable)))
            self.kube.mark_unretriable(plan.unretriable)
        reachable = [p for p in pods if (p.get("spec") or {}).get("nodeName") not in lost_nodes]
        # Does the program act on SIGTERM? One member is sent it first, the rest wait for the answer (core.sigterm).
        # Only a decision still to make needs the answer: pods being deleted at the end have their logs left alone.
        watched = self._watch_sigterms(key, job, reachable, now) if plan.delete else self._forget_sigterms(key)
        grace, hold_until = sigterm.deletion_grace(watched)
        deletions = [] if hold_until is not None else plan.delete
        if deletions and not watched:
            deletions, held = sigterm.first_to_stop(deletions, sigterm.member_gone(job, pods, deletions))
            if held:
                hold_until = now + sigterm.CHECKS_AFTER_SIGTERM[0]
        if plan.delete and hold_until is not None:
            self.queue.at(hold_until, key, URGENT)
        if deletions:
            self.expectations.expect(key, deletions=[p["metadata"]["uid"] for p in deletions])
            for pod in deletions:  # a deletion the watch showed before the expectation was set
                name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
                if not self.store.still_there(key, name, uid):
                    self.expectations.observe(key, name, uid, gone=True)
            for pod in self.kube.delete_pods(deletions, grace_seconds=grace):  # gone: no DELETED event may come
                name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
                self.store.remove_pod(key, name, uid)
                self.expectations.observe(key, name, uid, gone=True)
        if plan.force_delete:
            for pod in self.kube.delete_pods(plan.force_delete, grace_seconds=0):
                self.store.remove_pod(key, pod["metadata"]["name"], pod["metadata"]["uid"])
        if plan.release:
            log.info("%s/%s: releasing %s from Kueue's finalizer", *key, ", ".join(_names(plan.release)))
            self.kube.release_pods(plan.release)  # their DELETED events bring the job back for the replacements
        created: list[dict[str, Any]] = []
        failed: Exception | None = None
        more_to_create = False
        if plan.create:
            created, refusal, failed, more_to_create = self._create(key, plan)
            if created:
                names = ", ".join(p["metadata"]["name"] for p in created)
                plan.events.append(Event("Normal", "CreatedPods", f"Created {names}"))
        final = reconcile.after_creates(plan, pods, created, refusal, now)
        self._post(job, plan.events, posted)
        if final != stored:
            self._write_status(job, stored, final)
        _count_restarts(original, final)
        self._record_phase(key, final.get("phase"))
        self.positions.track(key, job, plan.admission if final.get("phase") == st.QUEUED else None)
        if failed is not None:
            raise failed  # what was created is recorded; the rest is retried with this job's backoff
        if plan.delete_job:
            log.info("deleting %s/%s: ttlSecondsAfterFinished passed", namespace, name)
            self.kube.delete_job(namespace, name, job["metadata"]["uid"])
            return plan
        if more_to_create:
            self.queue.add(key, NORMAL)  # to the back of the line: other jobs' creations go in between
        self._schedule(key, plan)
        metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)
        if refusal is not None and refusal.cause != reconcile.INVALID:
            raise Refused(refusal)  # recorded and reported; retried with this job's backoff
        return plan

    def _admission(self, job: dict[str, Any], now: float) -> kueue.Admission | None:
        """What Kueue says of a queued job that has not ended: its LocalQueue and its group's Workload (watched),
        and its place in the ClusterQueue (kubetf.runtime.positions)."""
        queue = kueue.queue_name(job)
        suspended = ((job.get("spec") or {}).get("runPolicy") or {}).get("suspend")
        if queue is None or suspended or (job.get("status") or {}).get("phase") in st.FINISHED:
            return None
        namespace, group = api.namespace(job), kueue.group_name(job)
        cluster_queue = self.store.local_queue(namespace, queue)
        installed = True
        if cluster_queue is None:
            installed, cluster_queue = self._read_local_queue(namespace, queue, now)
        if not installed or cluster_queue is None:
            return kueue.Admission(queue, cluster_queue, installed)
        workload = self.store.workload(namespace, group)
        position = self.positions.position(namespace, group)
        return kueue.Admission(queue, cluster_queue, installed, workload, position)

    def _read_local_queue(self, namespace: str, name: str, now: float) -> tuple[bool, str | None]:
        """A LocalQueue the watch has not shown: read from the API (its absence, or Kueue's, serves a few seconds)."""
        with self.lock:
            read_at, installed, cluster_queue = self.local_queue_reads.get((namespace, name), (-math.inf, True, None))
        if now - read_at >= NO_LOCAL_QUEUE_SECONDS:
            installed, cluster_queue = self.kube.local_queue(namespace, name)
            with self.lock:
                self.local_queue_reads[(namespace, name)] = (now, installed, cluster_queue)
        return installed, cluster_queue

    def _let_kueue_finish(self, key: Key) -> None:
        """A deleted job's pods go with it (garbage collection): with Kueue's finalizer they would stay, and hold
        the quota, until Kueue finishes their group. Mark them so, and release those that run nothing."""
        pods = [p for p in self.store.job_pods(key) if kueue.FINALIZER in (p["metadata"].get("finalizers") or [])]
        if not pods:
            return
        unretriable = kueue.needs_unretriable(pods)
        if unretriable:
            self.kube.mark_unretriable(unretriable)
        release = kueue.to_release(pods, self._lost_nodes(pods, self.clock()), ending=True)
        if release:
            self.kube.release_pods(release)

    def _lost_nodes(self, pods: list[dict[str, Any]], now: float) -> frozenset[str]:
        """Which nodes of pods being deleted or not ready have stopped reporting (NotReady, Unknown, gone)."""
        nodes = {
            node
            for pod in pods
            if (node := (pod.get("spec") or {}).get("nodeName"))
            and (st.is_deleting(pod) or ((pod.get("status") or {}).get("phase") == "Running" and not st.is_ready(pod)))
        }
        lost = set()
        for node in nodes:
            with self.lock:
                read_at, was_lost = self.node_states.get(node, (-NODE_STATE_SECONDS, False))
            if now - read_at >= NODE_STATE_SECONDS:
                try:
                    was_lost = self.kube.node_lost(node)
                except Exception:  # no node access (RBAC), or the API is down: never force on a guess
                    log.warning("could not read node %s; treating it as reachable", node, exc_info=True)
                    was_lost = False
                with self.lock:
                    self.node_states[node] = (now, was_lost)
            if was_lost:
                lost.add(node)
        return frozenset(lost)

    def _create(self, key: Key, plan: Plan) -> tuple[list[dict[str, Any]], Refusal | None, Exception | None, bool]:
        """Create the plan's PVC, then its Service with the first batch of pods: the pods created, the refusal
        that stopped it (if any), any other error, and whether pods are left for the next turn."""
        # The PVC first, so the scheduler never reports a missing claim for a pod just created; the Service goes
        # with the pods' first batch.
        claims = [o for o in plan.ensure if o["kind"] == "PersistentVolumeClaim"]
        try:
            self.kube.create_all(claims)
        except Refused as error:
            return [], error.refusal, None, False
        batch = plan.create[: self.config.creates_per_reconcile]
        self.expectations.expect(key, creations=[p["metadata"]["name"] for p in batch])
        others = [o for o in plan.ensure if o["kind"] != "PersistentVolumeClaim"]
        creation = self.kube.create_batched([*others, *batch], self.config.first_batch + len(others))
        self.expectations.cancel_creations(key, creation.skipped)
        created = [o for o in creation.created if o.get("kind") == "Pod"]
        for pod in created:
            self.store.put_pod(key, pod)  # its ADDED event then brings nothing new: no reconcile for it
        if isinstance(creation.error, Refused):
            return created, creation.error.refusal, None, False
        return created, None, creation.error, len(plan.create) > len(batch)

    def _post(self, job: dict[str, Any], events: list[Event], start: int) -> int:
        """Post `events[start:]`; returns how many are posted."""
        for event in events[start:]:
            self.kube.event(job, event.type, event.reason, event.message)
        return len(events)

    def _watch_sigterms(
        self, key: Key, job: dict[str, Any], pods: list[dict[str, Any]], now: float
    ) -> list[sigterm.Watched]:
        """The job's pods that were sent SIGTERM, their logs read when a check is due: TensorFlow's line says that
        nothing in the program acts on the SIGTERM (see `kubetf.core.sigterm`)."""
        before = self.sigterm_watch.get(key, {})
        watched: dict[str, sigterm.Watched] = {}
        for pod in pods:
            sent_at = sigterm.sigterm_sent_at(pod)
            if sent_at is None:
                continue
            uid = pod["metadata"]["uid"]
            seen = before.get(uid) or sigterm.Watched(sent_at)
            due = sigterm.checks_due(sent_at, seen.checks, now)
            if due > seen.checks and not seen.swallowed:
                since = sigterm.log_since_seconds(sent_at, now)
                try:
                    text = self.kube.pod_log_tail(pod, sigterm.training_container(pod), since, sigterm.LOG_LIMIT_BYTES)
                except Exception as error:  # no log (RBAC, a kubelet not answering): no later check can do better
                    log.warning("could not read the log of %s (%s): its group keeps its grace period",
                                pod["metadata"]["name"], error)  # fmt: skip
                    watched[uid] = sigterm.Watched(sent_at, len(sigterm.CHECKS_AFTER_SIGTERM))
                    continue
                found = sigterm.swallowed(text)
                if found:
                    name, grace = pod["metadata"]["name"], pod["metadata"].get("deletionGracePeriodSeconds")
                    message = (
                        f"{name}: TensorFlow took the SIGTERM and nothing in the program acts on it; stopping the "
                        f"other pods at once ({sigterm.STOP_GRACE_SECONDS}s grace period) rather than letting them "
                        f"train on for {grace}s. To save a checkpoint on SIGTERM, use PreemptionCheckpointHandler."
                    )
                    log.info("%s/%s: %s", key[0], key[1], message)
                    self.kube.event(job, "Normal", "SigtermIgnored", message)
                seen = sigterm.Watched(sent_at, due, found)
            watched[uid] = seen
        if watched:
            self.sigterm_watch[key] = watched
        else:
            self.sigterm_watch.pop(key, None)
        return list(watched.values())

    def _forget_sigterms(self, key: Key) -> list[sigterm.Watched]:
        self.sigterm_watch.pop(key, None)
        return []

    def _write_status(self, job: dict[str, Any], stored: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        updated = self.kube.patch_job_status(job, st.merge_patch(stored, status))
        if updated is None:
            return job
        self.store.put_job(updated)  # newer than the watch's copy: its echo is then ignored
        return updated

    def _schedule(self, key: Key, plan: Plan) -> None:
        if plan.requeue_at is not None:
            self.queue.at(plan.requeue_at, key, NORMAL)

    def _record_phase(self, key: Key, phase: str | None) -> None:
        """Keep the jobs-by-phase gauge current by moving this job between phases (no scan of every job)."""
        with self.lock:
            before = self.phases.pop(key, None) if phase is None else self.phases.get(key)
            if before == phase:
                return
            if phase is not None:
                self.phases[key] = phase
        if phase is not None:
            metrics.JOBS.labels(phase=phase).inc()
        if before is not None:
            metrics.JOBS.labels(phase=before).dec()


def _one_line(error: BaseException) -> str:
    return str(getattr(error, "reason", None) or error).splitlines()[0][:300]


def _names(pods: list[dict[str, Any]]) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


def _pod_job(pod: Mapping[str, Any]) -> Key | None:
    meta = pod.get("metadata") or {}
    job = (meta.get("labels") or {}).get(api.LABEL_JOB)
    return (meta.get("namespace") or "default", job) if job else None


def _count_restarts(original: dict[str, Any], final: dict[str, Any]) -> None:
    before, after = original.get("restarts") or {}, final.get("restarts") or {}
    for kind, field in (("failure", "failures"), ("disruption", "disruptions")):
        delta = after.get(field, 0) - before.get(field, 0)
        if delta > 0:
            metrics.RESTARTS.labels(kind=kind).inc(delta)
