"""kopf handlers: thin wiring from watch events and timers to one idempotent reconcile per job.

Every trigger (a TrainingJob event, an event of one of its pods, a due deadline) asks for `reconcile(job)`.
Requests for one job are coalesced and never run concurrently, so each reconcile sees the job's latest status;
the pure decision is `reconcile.plan`, the API calls are `kube.Kube`.
"""

from __future__ import annotations

import heapq
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from kubetf import api, metrics, policy, reconcile
from kubetf import status as st
from kubetf.kube import Kube
from kubetf.reconcile import Plan

log = logging.getLogger("kubetf.operator")

Key = tuple[str, str]  # (namespace, name)

# Periodic resync of unfinished jobs: a safety net (watches deliver the changes; deadlines and backoffs have
# exact timers), spread out so that jobs created together do not resync together.
RESYNC_SECONDS = 300.0
RESYNC_JITTER = 0.2


class Coalescer:
    """Runs `work(key)` for each requested key, one run per key at a time; requests made during a run cause
    exactly one more run. The requesting thread does the work when nothing runs for that key yet."""

    def __init__(self, work: Callable[[Key], None]) -> None:
        self.work = work
        self.lock = threading.Lock()
        self.running: set[Key] = set()
        self.again: set[Key] = set()

    def request(self, key: Key) -> None:
        with self.lock:
            if key in self.running:
                self.again.add(key)
                return
            self.running.add(key)
        try:
            while True:
                try:
                    self.work(key)
                except Exception:
                    metrics.RECONCILE_ERRORS.inc()
                    log.exception("reconcile of %s/%s failed; retrying in 5s", *key)
                    SCHEDULER.at(time.time() + 5, key)
                with self.lock:
                    if key not in self.again:
                        self.running.discard(key)
                        return
                    self.again.discard(key)
        except BaseException:
            with self.lock:
                self.running.discard(key)
            raise


class Scheduler:
    """Exact-time wakeups per job (deadlines, startup timeouts, failure backoff, TTL), on one thread."""

    def __init__(self) -> None:
        self.heap: list[tuple[float, Key]] = []
        self.due: dict[Key, float] = {}
        self.cond = threading.Condition()
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="kubetf-timer")
        self.thread: threading.Thread | None = None

    def start(self, fire: Callable[[Key], None]) -> None:
        self.fire = fire
        self.thread = threading.Thread(target=self._loop, name="kubetf-scheduler", daemon=True)
        self.thread.start()

    def at(self, when: float, key: Key) -> None:
        """Wake `key` at `when`, unless an earlier wakeup is already set."""
        with self.cond:
            current = self.due.get(key)
            if current is not None and current <= when and current > time.time():
                return
            self.due[key] = when
            heapq.heappush(self.heap, (when, key))
            self.cond.notify()

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.heap or self.heap[0][0] > time.time():
                    self.cond.wait(timeout=(self.heap[0][0] - time.time()) if self.heap else None)
                when, key = heapq.heappop(self.heap)
                if self.due.get(key) != when:
                    continue  # superseded by an earlier wakeup that already fired
                del self.due[key]
            self.pool.submit(self.fire, key)


SCHEDULER = Scheduler()
KUBE: Kube | None = None
# Set by `kubetf operator` before kopf starts.
QPS, BURST, VERBOSE = 100.0, 200, False
PHASES: dict[Key, str] = {}


def kube() -> Kube:
    if KUBE is None:
        raise RuntimeError("operator not started")
    return KUBE


def reconcile_job(key: Key) -> None:
    started = time.monotonic()
    namespace, name = key
    client = kube()
    job = client.get_job(namespace, name)
    original = (job or {}).get("status") or {}
    if job is None or job["metadata"].get("deletionTimestamp"):
        _record_phase(key, None)
        return
    pods = client.list_pods(namespace, name)
    now = time.time()
    plan = reconcile.plan(job, pods, now)
    stored = job.get("status") or {}
    if plan.persist_first and plan.status != stored:
        job = client.patch_job_status(job, merge_patch(stored, plan.status)) or job
        stored = plan.status
    if plan.delete:
        client.delete_pods(plan.delete)
    created = []
    if plan.create:
        # The PVC and Service first, so the scheduler never reports a missing claim for a pod just created.
        client.create_all(plan.ensure)
        created = client.create_all(plan.create)
        for pod in created:
            POD_STATES.seen(pod)  # its ADDED event brings nothing new: no reconcile for it
        if created:
            names = ", ".join(p["metadata"]["name"] for p in created)
            plan.events.append(reconcile.Event("Normal", "CreatedPods", f"Created {names}"))
    final = reconcile.after_creation(plan, pods, created, now)
    if final != stored:
        client.patch_job_status(job, merge_patch(stored, final))
    for event in plan.events:
        client.event(job, event.type, event.reason, event.message)
    _count_restarts(original, final)
    _record_phase(key, final.get("phase"))
    if plan.delete_job:
        log.info("deleting %s/%s: ttlSecondsAfterFinished passed", namespace, name)
        client.delete_job(namespace, name, job["metadata"]["uid"])
        return
    _schedule(key, plan, final, now)
    metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)


def _schedule(key: Key, plan: Plan, final: dict[str, Any], now: float) -> None:
    if plan.requeue_at is not None:
        SCHEDULER.at(plan.requeue_at, key)
    elif final.get("phase") not in (*st.FINISHED, st.SUSPENDED):
        SCHEDULER.at(now + RESYNC_SECONDS * (1 + random.uniform(-RESYNC_JITTER, RESYNC_JITTER)), key)


def _count_restarts(original: dict[str, Any], final: dict[str, Any]) -> None:
    before, after = original.get("restarts") or {}, final.get("restarts") or {}
    for kind, field in (("failure", "failures"), ("disruption", "disruptions")):
        delta = after.get(field, 0) - before.get(field, 0)
        if delta > 0:
            metrics.RESTARTS.labels(kind=kind).inc(delta)


def _record_phase(key: Key, phase: str | None) -> None:
    """Keep the jobs-by-phase gauge current by moving this job between phases (no scan of every job)."""
    before = PHASES.pop(key, None) if phase is None else PHASES.get(key)
    if before == phase:
        return
    if phase is not None:
        PHASES[key] = phase
        metrics.JOBS.labels(phase=phase).inc()
    if before is not None:
        metrics.JOBS.labels(phase=before).dec()


def merge_patch(old: Any, new: Any) -> Any:
    """RFC 7386 merge patch turning `old` into `new` (removed keys become null)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch = {k: None for k in old if k not in new}
    for k, v in new.items():
        if k not in old:
            patch[k] = v
        elif old[k] != v:
            patch[k] = merge_patch(old[k], v)
    return patch


class PodStates:
    """What the operator last knew of each of its pods, so pod events that change nothing it reads (our own
    creations, metadata-only updates) do not cost a reconcile."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.known: dict[str, tuple[Any, ...]] = {}

    @staticmethod
    def signature(pod: Mapping[str, Any]) -> tuple[Any, ...]:
        status = pod.get("status") or {}
        meta = pod.get("metadata") or {}
        return (
            status.get("phase"),
            bool(meta.get("deletionTimestamp")),
            st.is_ready(dict(pod)),
            st.pending_reason(dict(pod)),
            policy.disruption_reason(dict(pod)),
        )

    def seen(self, pod: Mapping[str, Any]) -> None:
        with self.lock:
            self.known[pod["metadata"]["uid"]] = self.signature(pod)

    def changed(self, pod: Mapping[str, Any], deleted: bool) -> bool:
        uid = pod["metadata"]["uid"]
        with self.lock:
            if deleted:
                self.known.pop(uid, None)
                return True
            signature = self.signature(pod)
            if self.known.get(uid) == signature:
                return False
            self.known[uid] = signature
            return True


COALESCER = Coalescer(reconcile_job)
POD_STATES = PodStates()


# ---------------------------------------------------------------------- kopf wiring


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    global KUBE
    settings.posting.level = logging.WARNING
    # kopf logs every handler call at INFO: thousands of lines a minute for pod events.
    logging.getLogger("kopf.objects").setLevel(logging.DEBUG if VERBOSE else logging.WARNING)
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 30
    settings.batching.batch_window = 0.01
    settings.execution.max_workers = 16
    KUBE = Kube(qps=QPS, burst=BURST)
    SCHEDULER.start(COALESCER.request)


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
def job_event(namespace: str | None, name: str, type: str, **_: Any) -> None:
    key = (namespace or "default", name)
    if type == "DELETED":
        _record_phase(key, None)
        return
    COALESCER.request(key)


@kopf.on.event("", "v1", "pods", labels={api.LABEL_MANAGED_BY: api.MANAGER, api.LABEL_JOB: kopf.PRESENT})
def pod_event(namespace: str | None, labels: Mapping[str, str], body: Mapping[str, Any], type: str, **_: Any) -> None:
    if POD_STATES.changed(body, deleted=type == "DELETED"):
        COALESCER.request((namespace or "default", labels[api.LABEL_JOB]))
