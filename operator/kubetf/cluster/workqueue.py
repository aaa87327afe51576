"""Generic controller machinery, nothing about TrainingJobs: a work queue and expectations (as in client-go).

- `WorkQueue`: each key is queued at most once, at the most urgent priority it was asked for; a key is never
  handed to two workers at once (added again while being processed, it comes back once it is done); wakeups at
  a given time; per-key exponential backoff after errors; workers that take only keys up to a priority, so urgent
  work never waits for a worker busy with other work.
- `Expectations`: the creates and deletes a controller made and its watch has not shown yet, so that it never
  acts on a cache that has not seen its own writes.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)


class ShutDown(Exception):
    """The queue was shut down: workers stop."""


class WorkQueue(Generic[Key]):
    def __init__(
        self,
        backoff_first: float = 1.0,
        backoff_cap: float = 300.0,
        clock: Callable[[], float] = time.time,
        on_wait: Callable[[int, float], None] = lambda priority, seconds: None,
    ) -> None:
        """`on_wait(priority, seconds)`: called as a key is handed out, with how long it waited for a worker at the
        priority it is handed out at (client-go's workqueue_queue_duration_seconds, by priority)."""
        self.clock, self.on_wait = clock, on_wait
        self.backoff_first, self.backoff_cap = backoff_first, backoff_cap
        lock = threading.Lock()
        self.cond = threading.Condition(lock)  # workers wait on this one ...
        self.reserved_cond = threading.Condition(lock)  # ... workers that take only urgent keys on this one ...
        self.reserved_for = -1  # ... keys of this priority or more urgent (set by `get(most=...)`)
        self.timer_cond = threading.Condition(lock)  # ... the timer thread on this one
        self.seq = itertools.count()
        self.ready: list[tuple[int, int, Key]] = []  # (priority, sequence, key): lower runs first
        self.queued: dict[Key, tuple[int, int]] = {}  # the live entry of each queued key
        self.queued_at: dict[int, int] = {}  # how many keys are queued at each priority
        self.ready_since: dict[Key, float] = {}  # since when each queued key waits at its priority
        self.processing: set[Key] = set()
        self.again: dict[Key, int] = {}  # added while processing: queued when done, at this priority
        self.timers: list[tuple[float, int, Key, int]] = []  # (when, sequence, key, priority)
        self.due: dict[tuple[Key, int], float] = {}  # earliest wakeup per key and priority
        self.failures: dict[Key, int] = {}
        self.given = 0
        self.stopped = False
        self.timer_thread = threading.Thread(target=self._timer_loop, name="workqueue-timers", daemon=True)
        self.timer_thread.start()

    def __len__(self) -> int:
        with self.cond:
            return len(self.queued)

    def waiting(self, most: int, besides: Key) -> bool:
        """Whether a key other than `besides` waits for a worker at priority `most` or more urgent."""
        with self.cond:
            count = sum(n for priority, n in self.queued_at.items() if priority <= most)
            own = self.queued.get(besides)
            return count - (own is not None and own[0] <= most) > 0

    def handed_out(self) -> int:
        """How many keys were handed to workers since the queue began: how busy it is, read twice."""
        with self.cond:
            return self.given

    def add(self, key: Key, priority: int) -> None:
        with self.cond:
            self._add(key, priority)

    def _add(self, key: Key, priority: int) -> None:
        if key in self.processing:
            self.again[key] = min(priority, self.again.get(key, priority))
            return
        current = self.queued.get(key)
        if current is not None and current[0] <= priority:
            return
        if current is not None:
            self.queued_at[current[0]] -= 1
        entry = (priority, next(self.seq))
        self.queued[key] = entry
        self.queued_at[priority] = self.queued_at.get(priority, 0) + 1
        self.ready_since[key] = self.clock()  # its wait at this priority starts
        heapq.heappush(self.ready, (*entry, key))
        self.cond.notify()
        if priority <= self.reserved_for:
            self.reserved_cond.notify()

    def at(self, when: float, key: Key, priority: int) -> None:
        """Add `key` at `when` (clock time), unless an earlier wakeup of that priority is already set."""
        with self.cond:
            current = self.due.get((key, priority))
            if current is not None and current <= when:
                return
            self.due[(key, priority)] = when
            heapq.heappush(self.timers, (when, next(self.seq), key, priority))
            self.timer_cond.notify()

    def cancel_at(self, key: Key, priority: int, when: float) -> None:
        """Take back the wakeup `at(when, key, priority)` set, if it is still the one due (its heap entry is then
        skipped). A later wakeup `at` refused for it is gone too: the caller sets again what it still needs."""
        with self.cond:
            if self.due.get((key, priority)) == when:
                del self.due[(key, priority)]

    def get(self, most: int | None = None) -> tuple[Key, int]:
        """The next key to process, most urgent first (FIFO within a priority); blocks. Call `done` after. With
        `most`, only a key of that priority or more urgent (the queue's reserved workers all pass the same)."""
        with self.cond:
            if most is not None:
                self.reserved_for = most
            while True:
                if self.stopped:
                    raise ShutDown
                while self.ready and (most is None or self.ready[0][0] <= most):
                    priority, seq, key = heapq.heappop(self.ready)
                    if self.queued.get(key) == (priority, seq):
                        del self.queued[key]
                        self.queued_at[priority] -= 1
                        self.processing.add(key)
                        self.given += 1
                        self.on_wait(priority, self.clock() - self.ready_since.pop(key))
                        return key, priority
                (self.cond if most is None else self.reserved_cond).wait()

    def done(self, key: Key) -> None:
        with self.cond:
            self.processing.discard(key)
            priority = self.again.pop(key, None)
            if priority is not None:
                self._add(key, priority)

    def retry(self, key: Key, priority: int, cap: float | None = None) -> float:
        """After a failed run: add `key` again after its next backoff delay (doubling per failure, at most `cap`
        when given, else the queue's cap)."""
        with self.cond:
            failures = self.failures.get(key, 0)
            self.failures[key] = failures + 1
        delay = min(cap or self.backoff_cap, self.backoff_first * 2**failures)
        self.at(self.clock() + delay, key, priority)
        return delay

    def forget(self, key: Key) -> None:
        """A successful run: the key's backoff starts over."""
        with self.cond:
            self.failures.pop(key, None)

    def shutdown(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
            self.reserved_cond.notify_all()
            self.timer_cond.notify_all()

    def _timer_loop(self) -> None:
        with self.cond:
            while not self.stopped:
                now = self.clock()
                while self.timers and self.timers[0][0] <= now:
                    when, _, key, priority = heapq.heappop(self.timers)
                    if self.due.get((key, priority)) == when:
                        del self.due[(key, priority)]
                        self._add(key, priority)
                wait = (self.timers[0][0] - now) if self.timers else None
                self.timer_cond.wait(timeout=min(wait, 60.0) if wait is not None else None)


@dataclass
class _Pending:
    creations: set[str] = field(default_factory=set)  # names of objects created, not yet seen
    deletions: set[str] = field(default_factory=set)  # uids of objects deleted, not yet seen going
    deadline: float = 0.0


class Expectations(Generic[Key]):
    """Per key, the writes the watch has yet to show. Expired after `timeout` (a lost event must not block a key
    forever: the controller then acts on what it has, and its next resync re-reads the API).

    A key that came up while it waited is deferred (`defer`) and handed back by the `observe` that completes its
    writes: both under one lock, so the event that completes them can never slip in between the check and the
    record of the wait (it would find nothing deferred, and the key would sleep until the timeout).
    """

    def __init__(self, timeout: float = 30.0, clock: Callable[[], float] = time.time) -> None:
        self.timeout, self.clock = timeout, clock
        self.lock = threading.Lock()
        self.pending: dict[Key, _Pending] = {}
        self.deferred: dict[Key, int] = {}  # key -> the most urgent priority it was deferred at

    def expect(self, key: Key, creations: Iterable[str] = (), deletions: Iterable[str] = ()) -> None:
        creations, deletions = list(creations), list(deletions)
        if not creations and not deletions:
            return  # nothing new: a wait under way keeps its deadline
        with self.lock:
            entry = self.pending.setdefault(key, _Pending())
            entry.creations.update(creations)
            entry.deletions.update(deletions)
            entry.deadline = self.clock() + self.timeout
            if not entry.creations and not entry.deletions:
                del self.pending[key]

    def observe(self, key: Key, name: str, uid: str, gone: bool) -> int | None:
        """The watch showed object `name`/`uid` (`gone`: being deleted or deleted). When that completed the key's
        expectations and the key was deferred meanwhile: the priority to queue it at again."""
        with self.lock:
            entry = self.pending.get(key)
            if entry is None:
                return None
            entry.creations.discard(name)
            if gone:
                entry.deletions.discard(uid)
            if entry.creations or entry.deletions:
                return None
            del self.pending[key]
            return self.deferred.pop(key, None)

    def cancel_creations(self, key: Key, names: Iterable[str]) -> None:
        """Creates that did not happen (the API server refused them): nothing to wait for."""
        self._cancel(key, creations=names)

    def cancel_deletions(self, key: Key, uids: Iterable[str]) -> None:
        """Deletes that did not happen (a 503, a webhook): nothing to wait for, as the Job controller's
        DeletionObserved after a failed delete; the retry deletes them again."""
        self._cancel(key, deletions=uids)

    def _cancel(self, key: Key, creations: Iterable[str] = (), deletions: Iterable[str] = ()) -> None:
        with self.lock:
            entry = self.pending.get(key)
            if entry is None:
                return
            entry.creations.difference_update(creations)
            entry.deletions.difference_update(deletions)
            if not entry.creations and not entry.deletions:
                del self.pending[key]

    def defer(self, key: Key, priority: int) -> float | None:
        """While the key waits for its writes to show: record that it came up (at `priority`) and return the clock
        time it stops waiting. None: nothing pending, go ahead."""
        with self.lock:
            entry = self.pending.get(key)
            if entry is not None and self.clock() >= entry.deadline:
                del self.pending[key]
                entry = None
            if entry is None:
                self.deferred.pop(key, None)
                return None
            self.deferred[key] = min(priority, self.deferred.get(key, priority))
            return entry.deadline

    def forget(self, key: Key) -> None:
        with self.lock:
            self.pending.pop(key, None)
            self.deferred.pop(key, None)
