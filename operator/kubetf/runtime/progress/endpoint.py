"""What a progress report must be to be taken, in the order it is checked: the leader's to take (a standby and a
leader still priming its cache answer 503: retry), for our path, from a pod whose token the API server vouches for
(kubetf.runtime.progress.auth), a pod of a TrainingJob owned by it (by uid, kubetf.core.progress.identity), and
only then a body that parses. The job a report is for is the reporting pod's, whatever the body says. What is
taken goes into the book (kubetf.runtime.progress.book); the job's own status write carries it.

The address a report came from is remembered for a while (`trusted`): the server keeps some of its connections for
such peers, so that a flood of connections from elsewhere never shuts out the reporters already heard.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubetf.cluster.cache import Key, Store
from kubetf.core import goodput
from kubetf.core.progress import identity
from kubetf.core.progress.identity import Reporter
from kubetf.core.progress.protocol import PATH, Report, ReportError, parse_report
from kubetf.runtime.progress.auth import Authenticator, Budget
from kubetf.runtime.progress.book import ProgressBook
from kubetf.runtime.server import Answer, Head, Slow

log = logging.getLogger("kubetf.progress")

TRUSTED_FOR = 600.0  # seconds a peer stays trusted after a report taken from it
MAX_TRUSTED = 100_000


@dataclass(frozen=True)
class Ticket:
    """A request whose head was admitted: the job and task it reports for."""

    key: Key
    uid: str  # the job's
    role: str
    index: int
    coordinator: bool
    peer: str = ""  # the address it came from


class ProgressEndpoint:
    def __init__(
        self,
        review: Callable[[str], dict[str, Any]],
        read_progress: Callable[[Key, str], dict | None],
        budget: Budget,
        namespace_budget: Callable[[], Budget] = lambda: Budget(10.0, 20),
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`review`: a TokenReview's status for a token; `read_progress(key, uid)`: that job's `status.progress` as
        the API server has it. Both on the endpoint's own client, within `budget`: what the endpoint may ask of the
        API server, never the reconcilers' share, shared fairly between namespaces (`namespace_budget`: each one's
        share, kubetf.runtime.progress.auth)."""
        self.read_progress, self.budget, self.clock = read_progress, budget, clock
        self.authenticator = Authenticator(review, budget, self._pod_namespace, namespace_budget, clock)
        self.peers_lock = threading.Lock()
        self.peers: OrderedDict[str, float] = OrderedDict()  # address -> until when it is trusted
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

    def _pod_namespace(self, uid: str) -> str | None:
        """The namespace of the operator's pod of that uid, not being deleted; None when it has none such."""
        store = self.store
        found = store.pod_by_uid(uid) if store is not None and store.knows_pod(uid) else None
        return found[0][0] if found is not None else None

    def trusted(self, peer: str) -> bool:
        """Whether a report was taken from this address lately (kubetf.runtime.server: the reserved connections)."""
        with self.peers_lock:
            until = self.peers.get(peer)
        return until is not None and until > self.clock()

    def _heard(self, peer: str) -> None:
        with self.peers_lock:
            self.peers[peer] = self.clock() + TRUSTED_FOR
            self.peers.move_to_end(peer)
            while len(self.peers) > MAX_TRUSTED:
                self.peers.popitem(last=False)

    def admit(self, head: Head) -> Answer | Ticket | Slow:
        """Everything that can be checked before the body is read; a token not seen before is reviewed as slow
        work."""
        if head.target.split("?")[0] != PATH:
            return Answer(404, f"POST {PATH}")
        if head.method != "POST":
            return Answer(405, f"POST {PATH}")
        store = self.store
        if store is None or self.book is None or not self.is_leader():
            return Answer(503, "this operator replica is not the leader: retry")
        reporter = self.authenticator.authenticate(head.headers.get("authorization"))
        if isinstance(reporter, Slow):
            review = reporter.work
            return Slow(lambda: self._admit(head, review()))
        return self._admit(head, reporter)

    def _admit(self, head: Head, reporter: Reporter | Answer) -> Answer | Ticket:
        store = self.store
        if isinstance(reporter, Answer):
            return reporter
        if store is None:
            return Answer(503, "this operator replica is not the leader: retry")
        found = store.pod_by_uid(reporter.uid)
        key, pod = found if found is not None else (None, None)
        job = store.job(key) if key is not None else None
        if key is None or job is None:
            return Answer(403, f"pod {reporter.namespace}/{reporter.pod} is not a pod of a TrainingJob")
        task = identity.task(reporter, pod, job)
        if isinstance(task, str):
            return Answer(403, task)
        role, index = task
        return Ticket(key, job["metadata"]["uid"], role, index, identity.coordinator(job) == (role, index), head.peer)

    def accept(self, ticket: Ticket, body: bytes) -> Answer | Slow:
        try:
            report = parse_report(body)
        except ReportError as error:
            return Answer(error.status, error.reason)
        store, book = self.store, self.book
        if store is None or book is None or not self.is_leader():
            return Answer(503, "this operator replica is not the leader any more: retry")
        cached = (store.job(ticket.key) or {}).get("status") or {}
        began = goodput.run_began(cached)  # the first report after it starts a run (kubetf.core.progress.merge)
        if cached.get("progress") and not book.knows(ticket.key, ticket.uid):
            # The first report since this replica leads: it goes on from the stored progress, whose history the
            # cache does not keep (kubetf.cluster.cache.slim_job), so it is read once (slow work).
            if not self.budget.try_acquire():
                return Answer(429, "too many jobs to read at once: retry in a second", retry_after=1)
            return Slow(lambda: self._take_stored(ticket, report, book, began))
        return self._take(ticket, None, report, book, began)

    def _take_stored(self, ticket: Ticket, report: Report, book: ProgressBook, began: float | None) -> Answer:
        try:
            stored = self.read_progress(ticket.key, ticket.uid)
        except Exception as error:
            log.warning("%s/%s: could not read status.progress (%s)", *ticket.key, error)
            return Answer(503, "could not read the job's progress now: retry")
        return self._take(ticket, stored, report, book, began)

    def _take(
        self, ticket: Ticket, stored: dict | None, report: Report, book: ProgressBook, began: float | None
    ) -> Answer:
        book.report(ticket.key, ticket.uid, stored, report, ticket.role, ticket.index, ticket.coordinator, began)
        if ticket.peer:
            self._heard(ticket.peer)
        return Answer(204)
