"""Who sent a report: the pod its token is bound to, as the API server says (a TokenReview), at a bounded cost shared
fairly between namespaces.

A token is first read for what it claims (kubetf.core.progress.identity.claims: a JWT for our audience, not expired,
bound to a pod the operator runs): anything else is refused without asking the API server, so junk costs nothing.
A token seen before is answered from the cache: a valid one until it expires (at most an hour), a refused one for a
minute, so a program with a stale token does not cost a review per request, and a reporter already heard never
waits for a review again. A new token is reviewed on the endpoint's own client (never the reconcilers' rate
limiter), within the endpoint's budget (a token bucket that never waits: past it, 429 and retry), shared fairly
between the namespaces of the pods the tokens claim (a claim read from the token, but its namespace from the
operator's own cache of its pods): within its own share (`namespace_budget`) a namespace may take the budget's last
token; past its share, only while half of the budget's burst stays for the others. A tenant forging tokens for its
own pods takes at most what the others leave, never their share: they always find half a burst and the rate that
refills it.
The review itself is slow work (kubetf.runtime.server.Slow): it runs on the port's pool for it, never ahead of
the reporters already heard. The caches are bounded.
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
from kubetf.core.progress import identity
from kubetf.core.progress.identity import Reporter
from kubetf.runtime.server import Answer, Slow

log = logging.getLogger("kubetf.progress")

MAX_CACHED = 100_000  # valid tokens kept (one per reporting pod, renewed by the kubelet about hourly)
MAX_REFUSED = 10_000  # refused tokens kept: a flood of forged ones turns them over within a minute anyway
MAX_NAMESPACES = 10_000  # namespaces' budgets kept
VALID_FOR_AT_MOST = 3600.0
REFUSED_FOR = 60.0


class Budget:
    """A token bucket that never waits (as client-go's QPS and burst, without the wait): `take(keep)` takes a token
    only if `keep` more stay in it."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.qps, self.burst, self.clock = qps, burst, clock
        self.tokens, self.at = float(burst), clock()
        self.lock = threading.Lock()

    def take(self, keep: float = 0.0) -> bool:
        with self.lock:
            now = self.clock()
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.qps)
            self.at = now
            if self.tokens < 1 + keep:
                return False
            self.tokens -= 1
            return True

    def try_acquire(self) -> bool:
        return self.take()


class Authenticator:
    def __init__(
        self,
        review: Callable[[str], dict[str, Any]],
        budget: Budget,
        pod_namespace: Callable[[str], str | None],
        namespace_budget: Callable[[], Budget] = lambda: Budget(10.0, 20),
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`review`: a TokenReview's status for a token (on the endpoint's own client); `budget`: reviews allowed;
        `pod_namespace`: the namespace of one of the operator's pods by its uid (None: not one of them);
        `namespace_budget`: a namespace's own share of `budget`, made when it first needs one."""
        self.review, self.budget, self.pod_namespace, self.clock = review, budget, pod_namespace, clock
        self.namespace_budget = namespace_budget
        self.lock = threading.Lock()
        self.valid: OrderedDict[bytes, tuple[float, Reporter]] = OrderedDict()  # sha256 -> (until, pod)
        self.refused: OrderedDict[bytes, float] = OrderedDict()  # sha256 -> until, in that order (one lifetime)
        self.namespaces: OrderedDict[str, Budget] = OrderedDict()  # least recently used first

    def authenticate(self, authorization: str | None) -> Reporter | Answer | Slow:
        """The pod that sent the request, or the answer refusing it; or the review that will say (slow work)."""
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return Answer(401, f"no bearer token: send the projected token of audience {identity.AUDIENCE}")
        now = self.clock()
        claims = identity.claims(token, now)
        if isinstance(claims, str):
            return Answer(401, claims)
        namespace = self.pod_namespace(claims.pod_uid)
        if namespace is None:
            return Answer(403, f"the token is bound to pod uid {claims.pod_uid}, not a pod of a TrainingJob")
        digest = hashlib.sha256(token.encode()).digest()
        with self.lock:
            valid = self.valid.get(digest)
            if valid is not None and valid[0] > now:
                return valid[1]
            refused = self.refused.get(digest)
            if refused is not None and refused > now:
                return _refused()
            within_share = self._namespace_budget(namespace).take()
        if not self.budget.take(keep=0 if within_share else self.budget.burst / 2):
            metrics.TOKEN_REVIEWS.labels(result="over budget").inc()
            if within_share:
                return Answer(429, "too many new tokens to review at once: retry in a second", retry_after=1)
            return Answer(
                429,
                f"namespace {namespace} has used its share of token reviews, the rest is kept for the other "
                "namespaces: retry in a second",
                retry_after=1,
            )
        return Slow(lambda: self._review(token, digest, claims.expires))

    def _namespace_budget(self, namespace: str) -> Budget:
        """(Under the lock.) The least recently used go first: a forgotten budget starts full again, which takes
        more namespaces than the cluster is likely to have."""
        budget = self.namespaces.pop(namespace, None) or self.namespace_budget()
        self.namespaces[namespace] = budget
        while len(self.namespaces) > MAX_NAMESPACES:
            self.namespaces.popitem(last=False)
        return budget

    def _review(self, token: str, digest: bytes, expires: float) -> Reporter | Answer:
        try:
            reporter = identity.reporter(self.review(token))
        except Exception as error:  # the API server unreachable or overloaded: the client retries
            metrics.TOKEN_REVIEWS.labels(result="error").inc()
            log.warning("could not review a progress token: %s", error)
            return Answer(503, "could not review the token now: retry")
        metrics.TOKEN_REVIEWS.labels(result="valid" if reporter else "refused").inc()
        now = self.clock()
        with self.lock:
            if reporter is None:
                self.refused[digest] = now + REFUSED_FOR
                self.refused.move_to_end(digest)
                while self.refused and (len(self.refused) > MAX_REFUSED or next(iter(self.refused.values())) <= now):
                    self.refused.popitem(last=False)
            else:
                self.valid[digest] = (min(expires, now + VALID_FOR_AT_MOST), reporter)
                self.valid.move_to_end(digest)
                if len(self.valid) > MAX_CACHED:
                    for key in [k for k, (until, _) in self.valid.items() if until <= now]:
                        del self.valid[key]
                    while len(self.valid) > MAX_CACHED:
                        self.valid.popitem(last=False)
        return reporter or _refused()

    def forget(self) -> None:
        """The lease lost: another leader reviews anew (the pods may have changed meanwhile)."""
        with self.lock:
            self.valid.clear()
            self.refused.clear()


def _refused() -> Answer:
    return Answer(401, f"the token is not valid for {identity.AUDIENCE}, or not bound to a pod")
