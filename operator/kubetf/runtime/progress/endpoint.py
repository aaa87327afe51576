"""What a progress report must be to be taken, in the order it is checked: the leader's to take (a standby and a
leader still priming its cache answer 503: retry), for our path, from a pod whose token the API server vouches for
(kubetf.runtime.progress.auth), a pod of a TrainingJob owned by it (by uid, kubetf.core.progress.identity), and
only then a body that parses. The job a report is for is the reporting pod's, whatever the body says. What is
taken goes into the book (kubetf.runtime.progress.book); the job's own status write carries it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubetf.cluster.cache import Key, Store
from kubetf.cluster.kube import RateLimiter
from kubetf.core import goodput
from kubetf.core.progress import identity
from kubetf.core.progress.protocol import PATH, ReportError, parse_report
from kubetf.runtime.progress.auth import Authenticator
from kubetf.runtime.progress.book import ProgressBook
from kubetf.runtime.server import Answer, Head

log = logging.getLogger("kubetf.progress")


@dataclass(frozen=True)
class Ticket:
    """A request whose head was admitted: the job and task it reports for."""

    key: Key
    uid: str  # the job's
    role: str
    index: int
    coordinator: bool


class ProgressEndpoint:
    def __init__(
        self,
        review: Callable[[str], dict[str, Any]],
        read_progress: Callable[[Key, str], dict | None],
        budget: RateLimiter,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`review`: a TokenReview's status for a token; `read_progress(key, uid)`: that job's `status.progress` as
        the API server has it. Both on the endpoint's own client, within `budget`: what the endpoint may ask of the
        API server, never the reconcilers' share."""
        self.read_progress, self.budget = read_progress, budget
        self.authenticator = Authenticator(review, budget, self._known_pod, clock)
        self.store: Store | None = None  # set when this replica leads and its cache is primed
        self.book: ProgressBook | None = None
        self.is_leader: Callable[[], bool] = lambda: False

    def lead(self, store: Store, book: ProgressBook, is_leader: Callable[[], bool]) -> None:
        """Start accepting: the leader's cache and book, and how to tell it still leads."""
        self.store, self.book, self.is_leader = store, book, is_leader

    def leadership(self, held: bool) -> None:
        """The lease lost: the tokens reviewed are forgotten (the next leader reviews anew)."""
        if not held:
            self.authenticator.forget()

    def _known_pod(self, uid: str) -> bool:
        return self.store is not None and self.store.knows_pod(uid)

    def admit(self, head: Head) -> Answer | Ticket:
        """Everything that can be checked before the body is read."""
        if head.target.split("?")[0] != PATH:
            return Answer(404, f"POST {PATH}")
        if head.method != "POST":
            return Answer(405, f"POST {PATH}")
        store = self.store
        if store is None or self.book is None or not self.is_leader():
            return Answer(503, "this operator replica is not the leader: retry")
        reporter = self.authenticator.authenticate(head.headers.get("authorization"))
        if isinstance(reporter, Answer):
            return reporter
        found = store.pod_by_uid(reporter.uid)
        key, pod = found if found is not None else (None, None)
        job = store.job(key) if key is not None else None
        if key is None or job is None:
            return Answer(403, f"pod {reporter.namespace}/{reporter.pod} is not a pod of a TrainingJob")
        task = identity.task(reporter, pod, job)
        if isinstance(task, str):
            return Answer(403, task)
        role, index = task
        return Ticket(key, job["metadata"]["uid"], role, index, identity.coordinator(job) == (role, index))

    def accept(self, ticket: Ticket, body: bytes) -> Answer:
        try:
            report = parse_report(body)
        except ReportError as error:
            return Answer(error.status, error.reason)
        store, book = self.store, self.book
        if store is None or book is None or not self.is_leader():
            return Answer(503, "this operator replica is not the leader any more: retry")
        stored = None
        cached = (store.job(ticket.key) or {}).get("status") or {}
        if cached.get("progress") and not book.knows(ticket.key, ticket.uid):
            # The first report since this replica leads: it goes on from the stored progress, whose history the
            # cache does not keep (kubetf.cluster.cache.slim_job), so it is read once.
            if not self.budget.try_acquire():
                return Answer(429, "too many jobs to read at once: retry in a second", retry_after=1)
            try:
                stored = self.read_progress(ticket.key, ticket.uid)
            except Exception as error:
                log.warning("%s/%s: could not read status.progress (%s)", *ticket.key, error)
                return Answer(503, "could not read the job's progress now: retry")
        book.report(ticket.key, ticket.uid, stored, report, ticket.role, ticket.index, ticket.coordinator,
                    goodput.run_began(cached))  # fmt: skip
        return Answer(204)
