"""Who sent a report: the pod its token is bound to, as the API server says (a TokenReview), at a bounded cost.

A token is first read for what it claims (kubetf.core.progress.identity.claims: a JWT for our audience, not expired,
bound to a pod the operator runs): anything else is refused without asking the API server, so junk costs nothing.
A token that passes is reviewed on the endpoint's own client and within its own budget (a token bucket that never
waits: past it the answer is 429, retry), never on the reconcilers' rate limiter. Answers are cached: a valid token
until it expires (at most an hour), a refused one for a minute, so a program with a stale token does not cost a
review per request. The cache is bounded.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from kubetf.cluster import metrics
from kubetf.cluster.kube import RateLimiter
from kubetf.core.progress import identity
from kubetf.core.progress.identity import Reporter
from kubetf.runtime.server import Answer

log = logging.getLogger("kubetf.progress")

MAX_CACHED = 100_000  # token reviews kept
VALID_FOR_AT_MOST = 3600.0
REFUSED_FOR = 60.0


class Authenticator:
    def __init__(
        self,
        review: Callable[[str], dict[str, Any]],
        budget: RateLimiter,
        known_pod: Callable[[str], bool],
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`review`: a TokenReview's status for a token (on the endpoint's own client); `budget`: reviews allowed;
        `known_pod`: whether a pod uid is one of the operator's pods."""
        self.review, self.budget, self.known_pod, self.clock = review, budget, known_pod, clock
        self.lock = threading.Lock()
        self.cache: OrderedDict[str, tuple[float, Reporter | None]] = OrderedDict()  # sha256 -> (until, pod)

    def authenticate(self, authorization: str | None) -> Reporter | Answer:
        """The pod that sent the request, or the answer refusing it."""
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return Answer(401, f"no bearer token: send the projected token of audience {identity.AUDIENCE}")
        now = self.clock()
        claims = identity.claims(token, now)
        if isinstance(claims, str):
            return Answer(401, claims)
        if not self.known_pod(claims.pod_uid):
            return Answer(403, f"the token is bound to pod uid {claims.pod_uid}, not a pod of a TrainingJob")
        digest = hashlib.sha256(token.encode()).hexdigest()
        with self.lock:
            cached = self.cache.get(digest)
        if cached is not None and cached[0] > now:
            return cached[1] or Answer(401, f"the token is not valid for {identity.AUDIENCE}, or not bound to a pod")
        if not self.budget.try_acquire():
            metrics.TOKEN_REVIEWS.labels(result="over budget").inc()
            return Answer(429, "too many new tokens to review at once: retry in a second", retry_after=1)
        try:
            reporter = identity.reporter(self.review(token))
        except Exception as error:  # the API server unreachable or overloaded: the client retries
            metrics.TOKEN_REVIEWS.labels(result="error").inc()
            log.warning("could not review a progress token: %s", error)
            return Answer(503, "could not review the token now: retry")
        metrics.TOKEN_REVIEWS.labels(result="valid" if reporter else "refused").inc()
        until = min(claims.expires, now + VALID_FOR_AT_MOST) if reporter else now + REFUSED_FOR
        self._remember(digest, until, reporter, now)
        if reporter is None:
            return Answer(401, f"the token is not valid for {identity.AUDIENCE}, or not bound to a pod")
        return reporter

    def _remember(self, digest: str, until: float, reporter: Reporter | None, now: float) -> None:
        with self.lock:
            self.cache[digest] = (until, reporter)
            self.cache.move_to_end(digest)
            if len(self.cache) > MAX_CACHED:
                for key in [k for k, (valid, _) in self.cache.items() if valid <= now]:
                    del self.cache[key]
                while len(self.cache) > MAX_CACHED:
                    self.cache.popitem(last=False)

    def forget(self) -> None:
        """The lease lost: another leader reviews anew (the pods may have changed meanwhile)."""
        with self.lock:
            self.cache.clear()
