"""The progress endpoint: training pods POST their reports (kubetf.core.progress, protocol v1); the leader folds
them into each job's `status.progress`, written at most once per job per `progress_write_seconds` and within a
budget of writes per second for all jobs together, so 10,000 reporting jobs cost a small share of the API.

Who may report: a token the API server issued for the audience kubetf.io/progress and bound to a pod (a
projected service account token, which the kubelet rotates), checked with a TokenReview and cached until it
expires. The pod must be one of the operator's own, of that uid: its job is the one it reports for, whatever the
body says. Training pods get no API rights for this.

Every replica serves the port; only the leader accepts (a standby answers 503, and the client retries). Reports
between a lost lease and the new leader's first write are lost; nothing is written by two operators, as every
write goes through the leader's guarded API client.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubetf.cluster import metrics
from kubetf.cluster.cache import Key, Store
from kubetf.cluster.kube_api import KubeApi
from kubetf.core import api
from kubetf.core import progress as pg
from kubetf.core.config import OperatorConfig

log = logging.getLogger("kubetf.progress")

PATH = "/v1/progress"
MAX_TOKENS = 100_000  # cached token reviews; expired ones are dropped beyond this


@dataclass(frozen=True)
class Answer:
    status: int
    error: str | None = None

    def body(self) -> bytes:
        return json.dumps({"error": self.error}).encode() if self.error else b""


class ProgressEndpoint:
    def __init__(self, config: OperatorConfig, clock: Callable[[], float] = time.time) -> None:
        self.config, self.clock = config, clock
        self.lock = threading.Lock()
        self.kube: KubeApi | None = None  # set when this replica leads and its cache is primed
        self.store: Store | None = None
        self.is_leader: Callable[[], bool] = lambda: False
        self.tokens: dict[str, tuple[float, pg.Reporter | None]] = {}  # sha256 of a token -> (valid until, pod)
        self.current: dict[Key, dict[str, Any]] = {}  # the latest progress of each job that reported
        self.due: dict[Key, float] = {}  # a job's unwritten progress -> when it may be written
        self.written: dict[Key, float] = {}  # when each job's progress was last written
        self.writing: dict[Key, dict[str, Any]] = {}  # taken by the writer, its write not yet answered
        self.budget, self.budget_at = float(config.progress_writes_per_second), clock()
        self.wake = threading.Event()
        self.stopped = threading.Event()

    def lead(self, kube: KubeApi, store: Store, is_leader: Callable[[], bool]) -> None:
        """Start accepting: the leader's API client and cache."""
        self.kube, self.store, self.is_leader = kube, store, is_leader

    # ------------------------------------------------------------------ a report

    def receive(self, authorization: str | None, body: bytes) -> Answer:
        kube, store = self.kube, self.store
        if kube is None or store is None or not self.is_leader():
            return Answer(503, "this operator replica is not the leader: retry")
        if len(body) > pg.MAX_BODY:
            return Answer(413, f"a report is at most {pg.MAX_BODY} bytes, this one has {len(body)}")
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return Answer(401, f"no bearer token: send the projected token of audience {pg.AUDIENCE}")
        reporter = self._reporter(kube, token.strip())
        if reporter is None:
            return Answer(401, f"the token is not valid for {pg.AUDIENCE}, or not bound to a pod")
        task = pg.task_of(reporter.pod, api.ROLES)
        key = (reporter.namespace, task[0]) if task else None
        job = store.job(key) if key else None
        if task is None or key is None or job is None or not store.still_there(key, reporter.pod, reporter.uid):
            return Answer(403, f"pod {reporter.namespace}/{reporter.pod} is not a running pod of a TrainingJob")
        try:
            report = pg.parse_report(body)
        except pg.ReportError as error:
            return Answer(error.status, error.reason)
        _, role, index = task
        with self.lock:
            known = key in self.current
        if not known:  # the cache keeps no history (kubetf.cluster.cache.slim_job): read it once per leadership
            stored = kube.get_job(*key) or job
            with self.lock:
                self.current.setdefault(key, (stored.get("status") or {}).get("progress") or {})
        now = self.clock()
        with self.lock:
            self.current[key] = pg.merge(self.current[key], report, role, index, pg.coordinator(job, role, index), now)
            first = key not in self.written
            soon = now if first or report.final else self.written[key] + self.config.progress_write_seconds
            self.due[key] = min(self.due.get(key, soon), soon)
        _gauges(key, self.current[key])
        self.wake.set()
        return Answer(204)

    def _reporter(self, kube: KubeApi, token: str) -> pg.Reporter | None:
        digest = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock()
        with self.lock:
            cached = self.tokens.get(digest)
        if cached is not None and cached[0] > now:
            return cached[1]
        reporter = pg.reporter(kube.review_token(token, pg.AUDIENCE))
        # A valid token until it expires (bound tokens also end with their pod, which the cache check catches); a
        # refused one for a minute, so a program with a stale token cannot make a TokenReview per request.
        until = min(_expiry(token, now), now + 3600) if reporter else now + 60
        with self.lock:
            if len(self.tokens) > MAX_TOKENS:
                self.tokens = {d: v for d, v in self.tokens.items() if v[0] > now}
            self.tokens[digest] = (until, reporter)
        return reporter

    # ------------------------------------------------------------------ the writes

    def write_due(self) -> int:
        """Write the progress of the jobs whose turn it is, within the budget; the number written."""
        kube, store = self.kube, self.store
        if kube is None or store is None or not self.is_leader():
            return 0
        now = self.clock()
        with self.lock:
            rate = self.config.progress_writes_per_second
            self.budget = min(rate, self.budget + (now - self.budget_at) * rate)
            self.budget_at = now
            ready = sorted((at, key) for key, at in self.due.items() if at <= now)[: max(0, math.floor(self.budget))]
            batch = [(key, self.current[key]) for _, key in ready]
            for key, progress in batch:
                del self.due[key]
                self.written[key] = now
                self.writing[key] = progress
            self.budget -= len(batch)
        for key, progress in batch:
            job = store.job(key)
            try:
                if job is not None:
                    kube.patch_job_status(job, {"progress": progress})
            except Exception as error:  # the next report brings it again; the job itself is unaffected
                log.warning("%s/%s: could not write status.progress (%s)", *key, error)
            finally:
                with self.lock:
                    if self.writing.get(key) is progress:
                        del self.writing[key]
        return len(batch)

    def unwritten(self, key: Key) -> dict[str, Any] | None:
        """The job's progress when some of it may not be on the API server yet (due, or its write in flight): the
        executor's status write carries it. A pod reports before it exits, so the write that says its job ended
        also says how far it got (no Succeeded at 90% until the next progress write)."""
        with self.lock:
            return self.current.get(key) if key in self.due or key in self.writing else None

    def written_with_status(self, key: Key, progress: dict[str, Any]) -> None:
        """The executor wrote `progress` (from `unwritten`): not due any more, unless a newer report came since."""
        with self.lock:
            if self.current.get(key) is progress:
                self.due.pop(key, None)
                self.written[key] = self.clock()

    def next_due(self) -> float | None:
        with self.lock:
            return min(self.due.values(), default=None)

    def leadership(self, held: bool) -> None:
        """The lease lost: another leader may write progress meanwhile, so what this one kept is outdated."""
        if not held:
            with self.lock:
                self.current.clear()
                self.due.clear()
                self.written.clear()
                self.writing.clear()

    def forget(self, key: Key) -> None:
        """The job is gone: its progress and its gauges too."""
        with self.lock:
            self.current.pop(key, None)
            self.due.pop(key, None)
            self.written.pop(key, None)
            self.writing.pop(key, None)
        _remove_gauges(key)

    def run_writer(self) -> None:
        while not self.stopped.is_set():
            self.write_due()
            due = self.next_due()
            wait = 1.0 if due is None else min(1.0, max(0.05, due - self.clock()))
            self.wake.wait(wait)
            self.wake.clear()

    # ------------------------------------------------------------------ HTTP

    def serve(self, port: int) -> ThreadingHTTPServer:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path != PATH:
                    return self._answer(Answer(404, f"POST {PATH}"))
                length = int(self.headers.get("Content-Length") or 0)
                if length > pg.MAX_BODY:
                    return self._answer(Answer(413, f"a report is at most {pg.MAX_BODY} bytes, this one has {length}"))
                self._answer(endpoint.receive(self.headers.get("Authorization"), self.rfile.read(length)))

            def _answer(self, answer: Answer) -> None:
                body = answer.body()
                self.send_response(answer.status)
                if body:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass  # one line per report would drown the operator's log

        server = ThreadingHTTPServer(("", port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="kubetf-progress", daemon=True).start()
        threading.Thread(target=self.run_writer, name="kubetf-progress-writer", daemon=True).start()
        return server


def _expiry(token: str, now: float) -> float:
    """The `exp` of a JWT the API server already authenticated (read, not verified); an hour when unreadable."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return float(claims["exp"])
    except (IndexError, ValueError, KeyError, TypeError):
        return now + 3600


def _gauges(key: Key, progress: dict[str, Any]) -> None:
    namespace, job = key
    percent = progress.get("percent")
    if isinstance(percent, (int, float)):
        metrics.JOB_PROGRESS.labels(namespace, job).set(percent / 100)
    rate = progress.get("stepsPerSecond")
    if isinstance(rate, (int, float)):
        metrics.JOB_STEPS_PER_SECOND.labels(namespace, job).set(rate)
    for name, value in (progress.get("metrics") or {}).items():
        number = pg.NON_FINITE.get(value, value) if isinstance(value, str) else value
        if isinstance(number, (int, float)):
            metrics.JOB_METRIC.labels(namespace, job, name).set(number)


def _remove_gauges(key: Key) -> None:
    for gauge in (metrics.JOB_PROGRESS, metrics.JOB_STEPS_PER_SECOND):
        with contextlib.suppress(KeyError):
            gauge.remove(*key)
    for reason in pg.HEALTH_REASONS:
        with contextlib.suppress(KeyError):
            metrics.JOB_HEALTH.remove(*key, reason)
    for labels in [s.labels for m in metrics.JOB_METRIC.collect() for s in m.samples]:
        if (labels.get("namespace"), labels.get("job")) == key:
            with contextlib.suppress(KeyError):
                metrics.JOB_METRIC.remove(labels["namespace"], labels["job"], labels["metric"])
