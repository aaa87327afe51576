"""Carries a plan out (kubetf.core.plan), in its fixed order, deciding nothing: every choice is in the plan.

Events go out before the status write that records their decision, but for a decision that must be stored before
pods are touched (a restart, a failure, a suspend): its events go out after its deletes, which a preemption's
replacements wait for, and are stored with the decision (`pendingEvents`: an operator that stops before it posts them
leaves them to the next). Each event is named by its job's version its decision was made on (`Event.name`): posted
again by a retry of that decision or by the next operator (stored events keep their basis), it is the one already
there; an event that happens again later (a second suspension) is an Event of its own.
Its own creates and deletes are recorded as expectations (cluster.workqueue), so no reconcile acts on a cache that
has not seen them; created pods go into the cache at once, so their ADDED events bring no reconcile.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from kubetf.cluster import metrics
from kubetf.cluster.cache import Key, Store, changed_besides_status
from kubetf.cluster.kube_api import Conflict, Creation, KubeApi, Refused
from kubetf.cluster.workqueue import Expectations, WorkQueue
from kubetf.core import failing, goodput, reconcile, refusals, scheduling
from kubetf.core import status as st
from kubetf.core.config import OperatorConfig
from kubetf.core.failing import Failing
from kubetf.core.plan import Bookkeeping, Event, Observed, Plan
from kubetf.core.progress.health import UNHEALTHY
from kubetf.core.sigterm import Watched
from kubetf.core.types import Write
from kubetf.runtime import positions
from kubetf.runtime.positions import QueuePositions
from kubetf.runtime.progress.gauges import JobSeries

log = logging.getLogger("kubetf.operator")

# Priorities: lower runs first.
URGENT = 0  # a pod ended, vanished or is being taken away, Kueue admitted or evicted: a restart is due
# A job's pods started, were scheduled, turned ready: its status follows them before new jobs are created. Such a
# reconcile is a status write at most, and each pod brings few; behind a burst of new jobs' creations (NORMAL) the
# statuses of jobs already Running lagged their pods by a minute and more (bench-scale, 1,000 jobs).
FOLLOW = 1
NORMAL = 2  # a new or changed job, a timer
# Only a status to write: a place in Kueue's queue, a new job's first status while other jobs wait for their creations.
REPORT = positions.REPORT


class Progress(Protocol):
    """The progress held per job (kubetf.runtime.progress.book), as the executor's status writes use it."""

    def written(self, key: Key, uid: str, version: int) -> None: ...

    def forget(self, key: Key) -> None: ...


class Executor:
    def __init__(
        self,
        kube: KubeApi,
        store: Store,
        queue: WorkQueue[Key],
        expectations: Expectations[Key],
        positions: QueuePositions,
        config: OperatorConfig,
        progress: Progress,
        series: JobSeries,
    ) -> None:
        self.kube, self.store, self.queue, self.expectations = kube, store, queue, expectations
        self.positions, self.config, self.progress, self.series = positions, config, progress, series
        self.lock = threading.Lock()
        self.phases: dict[Key, str] = {}
        self.sigterm: dict[Key, dict[str, Watched]] = {}  # what each job's plan asked to remember (core.sigterm)
        # Events not posted yet (`_hold_events`): the job's uid, the events, when its held first status is due at the
        # latest (None: a restart's, posted once its deletes are made).
        self.held_events: dict[Key, tuple[str, list[Event], float | None]] = {}
        self.admitted = refusals.Admitted(config.admitted_shape_seconds)
        # The names of the events posted for each job while its status may still list them as pending (a decision
        # stored first stores its events with it): not posted again when its next reconcile takes them back.
        self.posted: dict[Key, set[str]] = {}

    def carry_out(self, key: Key, seen: Observed, plan: Plan | Bookkeeping) -> Plan | None:
        """Do what `plan` says; returns the final plan (after its creates). Raises what stopped it: an API error
        (retried with the job's backoff), a refused create (its job's status says it, then retried)."""
        if isinstance(plan, Bookkeeping):
            self.bookkeeping(key, seen, plan)
            return None
        job: dict[str, Any] = seen.job or {}
        original = job.get("status") or {}
        self._post_held(key, job)
        plan, trial_refusal = self._try(job, plan, seen.now)
        read = job  # the version this decision was made on: its events' basis (Event.name)
        plan.events = [e.decided_on(read) for e in plan.events]
        stored, posted = original, 0
        if plan.persist_first and plan.status != stored:
            # With its events: an operator that stops before it posts them leaves them to the next one
            # (kubetf.core.reconcile takes them back), posted under the same names: never lost, never twice.
            pending = [e.as_status() for e in plan.events]
            first = {**plan.status, "pendingEvents": pending} if pending else plan.status
            job, stored = self._write_status(key, job, stored, first, plan)
            # Held, then posted after the deletes below: counted as posted, so the final post leaves them out.
            posted = self._hold_events(key, job, plan.events)
        self._delete(key, plan)
        self._post_held(key, job)
        creation = self._create(key, plan)
        # After the creates, which never wait for them (a group restart's replacements are in a PodGroup of their
        # own); one that fails is retried with the job, after its status is written: the status never freezes on it.
        failed = self._write_objects(key, plan.writes)
        refusal = creation.refusal or trial_refusal
        final = reconcile.after_creates(plan, seen.pods, creation.created, refusal, seen.now, self.config, stored)
        final.events = [e.decided_on(read) for e in final.events]
        if not self._report_later(key, job, stored, final, creation, refusal, posted, seen.now):
            self._post(job, final.events, posted, key)
            # Events stored as pending (and posted since) go with the next write the job makes anyway, not one of
            # their own: a later reconcile that takes them back finds them posted (`posted`).
            if _but_pending(final.status) != _but_pending(stored):
                self._write_status(key, job, stored, final.status, final)
            elif final.progress is not None and _without_history(final.progress.progress) == _without_history(
                stored.get("progress")
            ):
                self.progress.written(key, job["metadata"]["uid"], final.progress.version)  # nothing new to write
        self._remember(key, job, original, final)
        self._schedule(key, final)
        if creation.error is not None:
            raise creation.error  # what was created is recorded; the rest is retried with this job's backoff
        if failed is not None:
            raise failed
        if final.delete_job:
            log.info("deleting %s/%s: ttlSecondsAfterFinished passed", *key)
            self.kube.delete_job(*key, job["metadata"]["uid"])
        if refusal is not None and refusal.cause != refusals.INVALID:
            raise Refused(refusal)  # recorded and reported; retried with this job's backoff
        return final

    def bookkeeping(self, key: Key, seen: Observed, plan: Bookkeeping) -> None:
        """A job that runs no pod here: one that is gone (forget it, its progress and series too; let its Workloads
        go; release what an older integration still holds of its pods), or one MultiKueue runs elsewhere (its
        Workload made and written; its status only to say it can never be dispatched)."""
        job = seen.job
        self.positions.track(key, None, None)
        if job is None:
            self.record_phase(key, None)
            self.progress.forget(key)
            with self.lock:
                self.sigterm.pop(key, None)
                self.held_events.pop(key, None)
                self.posted.pop(key, None)
        else:
            self.record_phase(key, (plan.status or job.get("status") or {}).get("phase"))
        self._release(key, plan.release)
        if plan.create:
            created = self.kube.create_batches([plan.create])
            for obj in created.created:
                self.store.put_owned(obj)
            if created.refusal is not None:
                raise Refused(created.refusal)
            if created.error is not None:
                raise created.error
        failed = self._write_objects(key, plan.writes)
        if job is not None and plan.status is not None:
            self._post(job, plan.events, 0)
            stored = job.get("status") or {}
            if plan.status != stored:
                self._write_status(key, job, stored, plan.status, None)
        if failed is not None:
            raise failed

    def report_failing(self, key: Key, failure: Failing, now: float) -> None:
        """The job's reconciles keep failing: say so in its status (kubetf.core.failing), with a Warning event. On
        a best-effort basis: the API server may be what fails."""
        job = self.store.job(key)
        if job is None or (job.get("status") or {}).get("phase") is None:
            return
        stored = job.get("status") or {}
        status = dict(stored)
        warning = failing.mark(status, failure, self.config.reconcile_error_after, now)
        elsewhere = not scheduling.runs_here(job)
        if elsewhere:  # its status is another cluster's, copied here (MultiKueue): never a second writer of it
            warning = warning if failure.attempts == self.config.reconcile_error_after else None
        elif status == stored:
            return
        try:
            if warning is not None:
                self._post(job, [Event("Warning", failing.RECONCILE_ERROR, warning)], 0)
            if not elsewhere:
                self._write_status(key, job, stored, status, None)
        except Exception as error:
            log.warning("%s/%s: could not record that its reconciles fail (%s)", *key, error)

    def record_phase(self, key: Key, phase: str | None) -> None:
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

    # ------------------------------------------------------------------ steps

    def _report_later(
        self, key: Key, job: dict[str, Any], stored: dict[str, Any], final: Plan, creation: Creation,
        refusal: refusals.Refusal | None, posted: int, now: float,
    ) -> bool:  # fmt: skip
        """A new job whose pods were all created while other new jobs wait for theirs: its first status (and the
        events going with it) waits until they are created too, at most `first_status_within`. In a burst of new jobs
        the API server's CPU sets the pace; the status write is its dearest call for such a job (`make
        bench-call-cost`), and the first one is often superseded by the next (its pods scheduled, running). Its next
        reconcile, whatever brings it, writes the status from what it observes and posts the events held here first;
        only a status that reconcile can decide again is held (core.reconcile.first_report_may_wait)."""
        if (
            creation.error is not None
            or not reconcile.first_report_may_wait(stored, final, creation.created, refusal)
            or not self.queue.waiting(NORMAL, besides=key)
        ):
            return False
        due = now + self.config.first_status_within
        metrics.FIRST_STATUSES_HELD.inc()
        self._hold_events(key, job, final.events[posted:], due)
        self.queue.add(key, REPORT)
        self.queue.at(due, key, NORMAL)
        return True

    def _hold_events(self, key: Key, job: dict[str, Any], events: list[Event], due: float | None = None) -> int:
        """Keep these events of the job to post later (`_post_held`): those of a first status held until `due`,
        those of a restart's decision until its deletes are made. Returns how many."""
        with self.lock:
            self.held_events[key] = (job["metadata"]["uid"], events, due)
        return len(events)

    def _post_held(self, key: Key, job: dict[str, Any]) -> None:
        """Post the events held for this job (not a successor's of its name); let go of them once posted: a post
        that fails fails the reconcile, whose retry posts them before anything else. A held first status's latest
        report is not due any more: this reconcile reports (and sets again the wakeups its plan needs)."""
        with self.lock:
            held = self.held_events.get(key)
        if held is None:
            return
        uid, events, due = held
        if uid == job["metadata"]["uid"]:
            for posted, event in enumerate(events):
                try:
                    self._post(job, [event], 0, key)
                except Exception:
                    with self.lock:  # the retry posts the rest, not again those posted
                        self.held_events[key] = (uid, events[posted:], due)
                    raise
        with self.lock:
            self.held_events.pop(key, None)
        if due is not None:
            self.queue.cancel_at(key, NORMAL, due)

    def _try(self, job: dict[str, Any], plan: Plan, now: float) -> tuple[Plan, refusals.Refusal | None]:
        """The plan's trial (core.refusals): dry runs of what was not admitted lately, or a lone Service created
        first; the plan without its creates when refused."""
        with self.lock:
            untried, shapes = self.admitted.untried(plan.trial, job, now)
        plan, first = refusals.service_first(plan, untried)
        uid = job["metadata"]["uid"]
        if first is not None:
            refusal = self.kube.create_first(first, uid)
        else:
            refusal = self.kube.dry_run(untried, uid) if untried else None
        if refusal is None and shapes:
            with self.lock:
                self.admitted.remember(shapes, now)
        return refusals.after_dry_run(plan, refusal), refusal

    def _delete(self, key: Key, plan: Plan) -> None:
        self.expectations.expect(key, deletions=[p["metadata"]["uid"] for p in plan.delete])
        for pod in plan.delete:  # a deletion the watch showed before the expectation was set
            name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
            if not self.store.still_there(key, name, uid):
                self.expectations.observe(key, name, uid, gone=True)
        deletion = self.kube.delete_pods(plan.delete, grace_seconds=plan.grace)
        forced = self.kube.delete_pods(plan.force_delete, grace_seconds=0)
        failed = deletion.failed + forced.failed
        # A delete that failed shows no event: not waited for (the retry, at most transient_retry_cap later, deletes
        # it again), as the Job controller lowers its expectations after a failed delete.
        self.expectations.cancel_deletions(key, [pod["metadata"]["uid"] for pod, _ in failed])
        # A forced pod without finalizers is gone at once: a reconcile that runs before its DELETED event must not
        # find it cached and wait for it (CI run 27: a lost ps was never replaced).
        refused = [pod for pod, _ in forced.failed]
        gone = (
            deletion.gone
            + forced.gone
            + [
                p
                for p in plan.force_delete
                if not p["metadata"].get("finalizers") and not any(p is g for g in [*forced.gone, *refused])
            ]
        )
        for pod in gone:  # already gone: their DELETED events, handled or to come, will not bring the job back
            name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
            self.store.remove_pod(key, name, uid)
            self.expectations.observe(key, name, uid, gone=True)
        if gone:  # this plan took them for present: decide again without them
            self.queue.add(key, URGENT)
        if failed:
            raise failed[0][1]  # the job's reconcile is retried with its backoff, the deletes with it
        # The DELETED events of the others bring the job back for the replacements.
        self._release(key, plan.release)

    def _release(self, key: Key, pods: list[dict[str, Any]]) -> None:
        if pods:
            log.info("%s/%s: releasing %s from Kueue's pod-integration finalizer", *key, ", ".join(_names(pods)))
            self.kube.release_pods(pods)

    def _write_objects(self, key: Key, writes: list[Write]) -> Exception | None:
        """The writes of the objects the job owns (its PodGroups, its Workload), in order, each against the version the
        last one left (the first: the version read). One that finds its object changed stops those of that object: the
        job is decided again on the newer one, which its watch brings. Another error stops nothing else and is
        returned: the job's reconcile is retried with its backoff."""
        versions: dict[str, str] = {}
        changed: set[str] = set()
        failed: Exception | None = None
        for write in writes:
            meta = write.obj["metadata"]
            if meta["uid"] in changed:
                continue
            try:
                written = self.kube.write(write, versions.get(meta["uid"], meta.get("resourceVersion") or ""))
            except Conflict as conflict:
                log.info("%s/%s: %s; deciding again on the newer one", *key, conflict)
                changed.add(meta["uid"])
                self.queue.add(key, NORMAL)
                continue
            except Exception as error:
                log.warning("%s/%s: %s failed: %s", *key, write.describe(), error)
                failed = failed or error
                continue
            log.info("%s/%s: %s", *key, write.describe())
            if write.verb == "delete":
                self.store.remove_owned(write.obj, key)  # a reconcile before its DELETED event would delete it again
            elif written is not None:
                versions[meta["uid"]] = written["metadata"]["resourceVersion"]
                self.store.put_owned(written)
        return failed

    def _create(self, key: Key, plan: Plan) -> Creation:
        self.expectations.expect(key, creations=_names(plan.create))
        creation = self.kube.create_batches(plan.batches)
        self.expectations.cancel_creations(key, creation.skipped)
        for obj in creation.created:
            if obj.get("kind") == "Pod":
                self.store.put_pod(key, obj)  # its ADDED event then brings nothing new: no reconcile for it
            else:
                self.store.put_owned(obj)  # not made again by a reconcile that comes before its ADDED event
        creation.created = [o for o in creation.created if o.get("kind") == "Pod"]
        return creation

    def _post(self, job: dict[str, Any], events: list[Event], start: int, key: Key | None = None) -> int:
        """Post `events[start:]`, each under its own name (`Event.name`: one posted again is the one already
        there), but those this operator posted already (`posted`); returns how many are posted."""
        for event in events[start:]:
            name = event.decided_on(job).name(job)
            with self.lock:
                if key is not None and name in self.posted.get(key, ()):
                    continue
            # The decisions, in the operator's log too: what it did to a job, next to what it logs of its own state.
            log.info("%s/%s: %s %s", job["metadata"].get("namespace"), job["metadata"]["name"], event.reason,
                     event.message)  # fmt: skip
            self.kube.event(job, event.type, event.reason, event.message, name)
            if key is not None:
                with self.lock:
                    self.posted.setdefault(key, set()).add(name)
        return len(events)

    def _write_status(
        self, key: Key, job: dict[str, Any], stored: dict[str, Any], status: dict[str, Any], plan: Plan | None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Write `status` as a merge patch against `stored` (a key it lacks is removed); with the plan's held
        progress (kubetf.core.plan.Plan.progress_along) when it has some not written yet, as a whole value.
        Returns the job as the API server answered and the status written."""
        along = plan.progress_along if plan is not None else None
        if along is not None and _without_history(along) != _without_history(status.get("progress")):
            status = {**status, "progress": along}
        current = self.store.job(key)
        if current is None or current["metadata"].get("uid") != job["metadata"].get("uid"):
            # Deleted, or deleted and created again under its name, while this reconcile ran: the status subresource
            # takes no uid precondition, and this decision's status would land on the new job (seen: the pods the
            # garbage collector deleted with the old job counted as the new one's disruption).
            log.info("%s/%s: deleted or replaced meanwhile; its status is not written", *key)
            return job, stored
        patch = st.merge_patch(stored, status)
        updated = self.kube.patch_job_status(job, patch)
        if updated is None:
            return job, status
        if "pendingEvents" not in status:
            with self.lock:
                self.posted.pop(key, None)
        held = plan.progress if plan is not None else None
        if held is not None and status.get("progress") == held.progress:
            self.progress.written(key, job["metadata"]["uid"], held.version)
        self.store.put_job(updated)  # newer than the watch's copy: its echo is then ignored ...
        if changed_besides_status(job, updated):
            # ... and so are the events of what others changed since this decision's read (a resume right after
            # the suspend it decided, CI run 29): the job is decided again on what the answer carries.
            self.queue.add(key, NORMAL)
        return updated, status

    def _remember(self, key: Key, job: dict[str, Any], original: dict[str, Any], final: Plan) -> None:
        _count_restarts(original, final.status)
        _time_to_resume(original, final.status)
        self.record_phase(key, final.status.get("phase"))
        self.series.health(key, _unhealthy(final.status))
        self.series.goodput(key, final.status, st.parse_time(job["metadata"].get("creationTimestamp")))
        self.positions.track(key, job, final.queue_place)
        with self.lock:
            if final.sigterm:
                self.sigterm[key] = final.sigterm
            else:
                self.sigterm.pop(key, None)

    def _schedule(self, key: Key, final: Plan) -> None:
        if final.hold_until is not None:
            self.queue.at(final.hold_until, key, URGENT)
        if final.more_to_create:
            self.queue.add(key, NORMAL)  # to the back of the line: other jobs' creations go in between
        if final.requeue_at is not None:
            self.queue.at(final.requeue_at, key, NORMAL)


def _names(objects: list[dict[str, Any]]) -> list[str]:
    return [o["metadata"]["name"] for o in objects]


def _count_restarts(original: dict[str, Any], final: dict[str, Any]) -> None:
    before, after = original.get("restarts") or {}, final.get("restarts") or {}
    for kind, field in (("failure", "failures"), ("disruption", "disruptions")):
        delta = after.get(field, 0) - before.get(field, 0)
        if delta > 0:
            metrics.RESTARTS.labels(kind=kind).inc(delta)


def _time_to_resume(original: dict[str, Any], final: dict[str, Any]) -> None:
    """kubetf_job_time_to_resume_seconds: once the first training step after a restart is seen (a new
    `trainingSince`: the step's report, not this reconcile), how long after the restart it came, by what the restart
    was (a queue's preemption: the job was queued meanwhile). Seen once, though this reconcile also saw the job
    restart again; a restart training came after already (a suspension since) is not resumed again."""
    before, after = original.get("goodput") or {}, final.get("goodput") or {}
    resumed = st.parse_time(after.get("trainingSince"))
    restarted = goodput.unresumed(original)
    if resumed is None or after.get("trainingSince") == before.get("trainingSince"):
        return
    if restarted is None or resumed < restarted:
        return
    restarts = original.get("restarts") or {}  # the restart resumed, not one this reconcile counted
    kind = "preemption" if "by Kueue" in str(restarts.get("lastReason")) else str(restarts.get("lastKind")).lower()
    metrics.TIME_TO_RESUME.labels(kind if kind in ("failure", "disruption", "preemption") else "other").observe(
        resumed - restarted
    )


def _unhealthy(status: dict[str, Any]) -> str | None:
    """The reason of a True TrainingUnhealthy condition."""
    found = next((c for c in status.get("conditions") or [] if c.get("type") == UNHEALTHY), None)
    return found.get("reason") if found and found.get("status") == "True" else None


def _but_pending(status: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in status.items() if k != "pendingEvents"}


def _without_history(progress: Any) -> Any:
    """A job's progress but its history: what the cache keeps of it (kubetf.cluster.cache.slim_job)."""
    return {k: v for k, v in progress.items() if k != "history"} if isinstance(progress, dict) else progress
