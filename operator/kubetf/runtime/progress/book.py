"""The progress the leader holds for each job: every report folded in as it comes (kubetf.core.progress.merge), kept
until the job's own status write carries it (the executor is the one writer of a job's status).

When a job's progress is written: its first report and a final one at once, the rest at most once per
`progress_write_seconds`, all jobs together within `progress_writes_per_second`. A write that falls due is
*released*: the job is reconciled, and its plan puts the held progress into the status it writes. Between two
released writes the held progress goes along with any status write the job makes for its own reasons (a phase
change), so the write that says a job ended says how far it got. A write that fails stays released and is retried
with the job's reconcile until it is stored.

Entries belong to one incarnation of a job (its uid): a job re-created under the same name starts afresh. The
lease lost, everything held is dropped: the next leader starts from what the status stored.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kubetf.cluster.cache import Key
from kubetf.core.config import OperatorConfig
from kubetf.core.progress import merge
from kubetf.core.progress.merge import Held
from kubetf.core.progress.protocol import Report
from kubetf.runtime.progress.gauges import JobSeries


@dataclass
class _Entry:
    uid: str  # the job's
    progress: dict
    version: int = 0  # moves with every report
    stored: int = 0  # the version the job's status holds
    due_at: float | None = None  # when the unwritten progress may be written; None: nothing unwritten
    written_at: float | None = None  # when its progress was last written (by this leader)
    final: bool = False  # a final report is unwritten: it goes first, at once
    released: bool = False  # the budget released its write: the job's next reconcile writes it

    @property
    def unwritten(self) -> bool:
        return self.version > self.stored


class ProgressBook:
    def __init__(
        self,
        config: OperatorConfig,
        clock: Callable[[], float] = time.time,
        wake: Callable[[Key], None] = lambda key: None,
        series: JobSeries | None = None,
    ) -> None:
        """`wake`: reconcile this job (its progress write was released); `series`: the jobs' Prometheus series."""
        self.config, self.clock, self.wake = config, clock, wake
        self.series = series or JobSeries()
        self.lock = threading.Lock()
        self.entries: dict[Key, _Entry] = {}
        self.budget, self.budget_at = float(config.progress_writes_per_second), clock()
        self.changed = threading.Event()
        self.stopped = threading.Event()

    # ------------------------------------------------------------------ the endpoint's side

    def knows(self, key: Key, uid: str) -> bool:
        """Whether progress of this incarnation is held (else its first report starts from the stored status)."""
        with self.lock:
            entry = self.entries.get(key)
            return entry is not None and entry.uid == uid

    def report(
        self, key: Key, uid: str, stored: dict | None, report: Report, role: str, index: int, coordinator: bool,
        run_began: float | None = None,
    ) -> None:  # fmt: skip
        """Fold a report of task `role`-`index` of job `key` (incarnation `uid`) in. `stored`: the job's
        `status.progress` as the API server has it, read when `knows` said no (None when it had none); `run_began`:
        when the job's current run began, as its status says (kubetf.core.goodput.run_began)."""
        now = self.clock()
        with self.lock:
            entry = self.entries.get(key)
            if entry is None or entry.uid != uid:
                entry = self.entries[key] = _Entry(uid, merge.sane(stored))
            entry.progress = merge.merge(entry.progress, report, role, index, coordinator, now, run_began)
            entry.version += 1
            # At most once per progress_write_seconds after its last write; the first and a final one at once.
            last = entry.written_at
            soon = now if last is None or report.final else last + self.config.progress_write_seconds
            entry.due_at = soon if entry.due_at is None else min(entry.due_at, soon)
            entry.final = entry.final or report.final
            progress = entry.progress
        self.series.publish(key, progress)
        self.changed.set()

    # ------------------------------------------------------------------ the reconcile's side

    def held(self, key: Key, uid: str) -> Held | None:
        """The progress held for this incarnation of the job, if any (kubetf.core.plan.Observed.progress)."""
        with self.lock:
            entry = self.entries.get(key)
            if entry is None or entry.uid != uid:
                return None
            return Held(entry.progress, entry.version, entry.released or (entry.final and entry.unwritten))

    def written(self, key: Key, uid: str, version: int) -> None:
        """The job's status now holds `version`: nothing is due unless a newer report came meanwhile (then it waits
        for its own turn, a final one not)."""
        with self.lock:
            entry = self.entries.get(key)
            if entry is None or entry.uid != uid:
                return
            now = self.clock()
            entry.stored, entry.written_at, entry.released = max(entry.stored, version), now, False
            if not entry.unwritten:
                entry.due_at, entry.final = None, False
            elif not entry.final:
                entry.due_at = now + self.config.progress_write_seconds

    def forget(self, key: Key) -> None:
        """The job is gone (or runs elsewhere): its progress and its series too."""
        with self.lock:
            self.entries.pop(key, None)
        self.series.remove(key)

    def clear(self) -> None:
        """The lease is lost: another leader may write meanwhile, so what this one held is outdated."""
        with self.lock:
            self.entries.clear()

    # ------------------------------------------------------------------ the writes, within the budget

    def release(self) -> list[Key]:
        """The jobs whose progress write is due now and fits the budget (final reports first): marked released,
        for the caller to reconcile."""
        now = self.clock()
        with self.lock:
            rate = self.config.progress_writes_per_second
            self.budget = min(rate, self.budget + (now - self.budget_at) * rate)
            self.budget_at = now
            due = [
                (not entry.final, entry.due_at, key)
                for key, entry in self.entries.items()
                if entry.due_at is not None and entry.due_at <= now and not entry.released and entry.unwritten
            ]
            due.sort()
            chosen = [key for _, _, key in due[: max(0, math.floor(self.budget))]]
            for key in chosen:
                self.entries[key].released = True
            self.budget -= len(chosen)
        return chosen

    def next_due(self) -> float | None:
        with self.lock:
            return min(
                (e.due_at for e in self.entries.values() if e.due_at is not None and not e.released), default=None
            )

    def run(self) -> None:
        """The writer's loop (on its own thread): release what is due, reconcile those jobs."""
        while not self.stopped.is_set():
            for key in self.release():
                self.wake(key)
            due = self.next_due()
            wait = 1.0 if due is None else min(1.0, max(0.05, due - self.clock()))
            self.changed.wait(wait)
            self.changed.clear()

    def start(self) -> None:
        threading.Thread(target=self.run, name="kubetf-progress-writes", daemon=True).start()

    def stop(self) -> None:
        self.stopped.set()
        self.changed.set()
