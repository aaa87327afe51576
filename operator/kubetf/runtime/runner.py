"""`kubetf operator`: health and metrics endpoints, leader election, then the cache, the controller and kopf.

A standby (every replica but the leader) only takes part in the election: it watches nothing and writes nothing.
Once it holds the lease it lists the jobs and pods, starts reconciling and starts kopf's watches. A leader that
cannot renew its lease stops writing at once (its watches and cache go on); when it holds the lease again it
reconciles every job from a fresh read, the decisions its lost lease refused first.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qs

import kopf
from prometheus_client import REGISTRY

from kubetf.cluster import metrics
from kubetf.cluster.cache import Key
from kubetf.cluster.kube import Kube
from kubetf.cluster.leader import LeaderElector
from kubetf.cluster.workqueue import WorkQueue
from kubetf.core.config import DEFAULT_LEASE_NAMESPACE, OperatorConfig
from kubetf.core.progress.identity import AUDIENCE
from kubetf.core.progress.protocol import MAX_BODY
from kubetf.runtime import handlers
from kubetf.runtime.controller import Controller
from kubetf.runtime.heap import ShortFullCollections
from kubetf.runtime.memory_limit import MemoryLimit
from kubetf.runtime.pages import SharedPages
from kubetf.runtime.progress.auth import Budget
from kubetf.runtime.progress.endpoint import ProgressEndpoint
from kubetf.runtime.server import Answer, Head, Limits, Server, Wait
from kubetf.runtime.status_series import StatusSeries

log = logging.getLogger("kubetf.operator")


SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def where_it_runs(config: OperatorConfig) -> OperatorConfig:
    """Fill what depends on where the operator runs: its identity and, in a pod, the lease's namespace."""
    identity = config.identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    namespace = config.lease_namespace
    if namespace == DEFAULT_LEASE_NAMESPACE and os.path.exists(SERVICE_ACCOUNT_NAMESPACE):
        with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as handle:
            namespace = handle.read().strip() or namespace
    return dataclasses.replace(config, identity=identity, lease_namespace=namespace)


def run(config: OperatorConfig, liveness_port: int, metrics_port: int, log_format: str = "json") -> int:
    config = where_it_runs(config)
    kopf.configure(log_format=kopf.LogFormat[log_format.upper()], verbose=config.verbose)
    # kopf logs every handler call at INFO: thousands of lines a minute for a busy operator's events.
    logging.getLogger("kopf.objects").setLevel(logging.DEBUG if config.verbose else logging.WARNING)
    if metrics_port:
        _serve_metrics(metrics_port, config)
    elector = None
    if config.leader_election:
        lease_client = Kube(qps=5, burst=10, timeout=(2, config.renew_deadline), instance=config.identity)
        elector = LeaderElector(lease_client, config)
    serving = threading.Event()  # set once the leader's cache is primed and its workers run
    endpoint = progress_endpoint(config)
    if liveness_port:
        _serve_health(
            liveness_port,
            config,
            lambda: elector is None or elector.alive(),
            lambda: elector.candidate.is_set() if elector is not None else serving.is_set(),
            lambda: _role(elector, serving),
        )
    where = ", ".join(config.namespaces) or "all namespaces"
    if elector is not None:
        log.info("kubetf operator %s: standby until it holds lease %s/%s (serving %s)",
                 config.identity, config.lease_namespace, config.lease_name, where)  # fmt: skip
        if not _wait_for_leadership(elector):
            return 0
    else:
        log.info("kubetf operator %s serving %s (no leader election)", config.identity, where)
        metrics.LEADER.set(1)  # it acts: the one operator of its jobs, as a leader is
    kube = Kube(
        config.qps, config.burst, config.api_timeout, may_write=elector.is_leader if elector else None,
        instance=config.identity, log_timeout=config.log_timeout,
    )  # fmt: skip
    controller = Controller(kube, config)

    def acting() -> bool:
        return serving.is_set() and (elector is None or elector.is_leader())

    endpoint.lead(controller.store, controller.book, acting)
    REGISTRY.register(StatusSeries(controller.store.job_versions, acting))
    if elector is not None:

        def leadership(held: bool) -> None:
            controller.leadership(held)
            endpoint.leadership(held)

        elector.on_change = leadership
    threading.Thread(target=controller.run, args=(serving,), name="kubetf-start", daemon=True).start()
    threading.Thread(
        target=_once_serving, args=(serving, _quiet(controller.queue)), name="kubetf-heap-start", daemon=True
    ).start()
    clusterwide, namespaces = kopf_scope(config)
    try:
        kopf.run(
            registry=handlers.registry(controller),
            settings=handlers.settings(),
            memories=handlers.NoMemories(),
            standalone=True,
            clusterwide=clusterwide,
            namespaces=namespaces,
        )
    finally:
        controller.stop()
        if elector is not None:
            elector.stop(release=True)
    return 0


def progress_endpoint(config: OperatorConfig) -> ProgressEndpoint:
    """The progress endpoint, on its own API client and budget (never the reconcilers'); with a port, served by
    every replica at once: a standby and a leader still priming its cache answer 503, and the pod retries."""
    client = Kube(
        config.progress_api_qps, config.progress_api_burst, config.api_timeout, instance=config.identity
    )  # fmt: skip

    def read_progress(key: Key, uid: str) -> dict | None:
        job = client.get_job(*key)
        if job is None or job["metadata"].get("uid") != uid:
            return None
        progress = (job.get("status") or {}).get("progress")
        return progress if isinstance(progress, dict) else None

    endpoint = ProgressEndpoint(
        lambda token: client.review_token(token, AUDIENCE),
        read_progress,
        Budget(config.progress_api_qps, config.progress_api_burst),
        lambda: Budget(config.progress_api_namespace_qps, config.progress_api_namespace_burst),
    )
    if config.progress_port:
        limits = dataclasses.replace(
            _port_limits(config),
            per_peer=config.http_connections_per_peer,
            reserved=config.http_connections // 4,
            max_body=MAX_BODY,
            slow_threads=4,
        )
        Server(
            config.progress_port, endpoint.admit, endpoint.accept, limits, name="progress", trusted=endpoint.trusted
        ).start()
    return endpoint


def kopf_scope(config: OperatorConfig) -> tuple[bool, list[str]]:
    """kopf's (clusterwide, namespaces). Named namespaces are watched one by one; with a pattern (or none) every
    namespace is, and the controller keeps what it serves. kopf resolves a pattern by listing namespaces twice (then
    again to start its watch) and ignores those only the second list shows: a namespace created in between, at the
    start or when that watch expires, would never be served."""
    scopes = config.list_scopes()
    return (True, []) if scopes == ("",) else (False, list(scopes))


# A quiet second: no more reconciles began in it than this (the progress writes of all jobs come 5 a second).
QUIET_RECONCILES = 10


def _quiet(queue: WorkQueue[Key]) -> Callable[[], bool]:
    """Whether at most QUIET_RECONCILES reconciles began since the last time it was asked."""
    seen = queue.handed_out()

    def quiet() -> bool:
        nonlocal seen
        now = queue.handed_out()
        began, seen = now - seen, now
        return began <= QUIET_RECONCILES

    return quiet


def _once_serving(serving: threading.Event, quiet: Callable[[], bool]) -> None:
    """Full collections kept short (runtime.heap) from when the cache is primed: starting makes a heap of garbage
    that the first complete collection takes away; the later ones wait for the reconcilers to be `quiet`."""
    serving.wait()
    ShortFullCollections(quiet=quiet).start()


def _role(elector: LeaderElector | None, serving: threading.Event) -> str:
    """What /healthz says: standby, starting (the lease held, the cache being primed) or leader (acting)."""
    if elector is not None and not elector.is_leader():
        return "standby"
    return "leader" if serving.is_set() else "starting"


def _wait_for_leadership(elector: LeaderElector) -> bool:
    """Run the election in the background; block until elected (True) or told to stop (False)."""
    elector.start()
    stopped = threading.Event()

    def stop(signum: int, _frame: Any) -> None:
        stopped.set()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not elector.elected.wait(0.2):
            if stopped.is_set():
                elector.stop(release=False)
                return False
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return True


def _get(answers: Mapping[str, Callable[[Mapping[str, list[str]]], Answer | Wait]]) -> Callable[[Head], Answer | Wait]:
    """A port that serves GET on the given paths; each answer gets the request's query."""
    paths = " or ".join(answers)

    def admit(head: Head) -> Answer | Wait:
        path, _, query = head.target.partition("?")
        answer = answers.get(path)
        if answer is None:
            return Answer(404, f"GET {paths}")
        if head.method != "GET":
            return Answer(405, f"GET {paths}")
        return answer(parse_qs(query))

    return admit


# Connections from one address to /metrics (a Prometheus scrapes one page at a time) and to /healthz (the kubelet's
# liveness and readiness probes come from its node together): every other address has as many of its own.
METRICS_PER_PEER = 8
HEALTH_PER_PEER = 4


def _port_limits(config: OperatorConfig, **fields: Any) -> Limits:
    return Limits(
        max_connections=config.http_connections,
        read_timeout=config.http_read_timeout,
        write_timeout=config.http_write_timeout,
        **fields,
    )


def _serve_metrics(port: int, config: OperatorConfig) -> Server:
    """Prometheus /metrics, on the operator's bounded server (runtime.server), like every port of it; each page built
    once for every scrape that asks meanwhile (runtime.pages)."""
    REGISTRY.register(MemoryLimit())
    pages = SharedPages(config.metrics_cpu_share)

    def metrics(query: Mapping[str, list[str]]) -> Wait:
        """Every series, or only the samples `name[]` names (as prometheus_client's own handler: `?name[]=kubetf_jobs`):
        a whole page grows with the jobs' own series, a scrape of one family costs that family only."""
        selection = tuple(sorted(set(query.get("name[]") or [])))
        return Wait(lambda: pages.answer(selection))

    limits = _port_limits(config, per_peer=METRICS_PER_PEER, threads=1, slow_threads=1)
    return Server(port, _get({"/metrics": metrics}), _no_body, limits, name="metrics").start()


def _serve_health(
    port: int, config: OperatorConfig, healthy: Callable[[], bool], ready: Callable[[], bool], role: Callable[[], str]
) -> None:
    """/healthz: 200 while the election loop runs (a standby is healthy too); the body says which one it is.
    /readyz: 200 once the operator can take over, its election having reached the API server (without an election:
    once it serves); a rolling upgrade replaces the next old pod only then. A server of its own (its own thread,
    connections and pool), so no load on the other ports can keep the kubelet's probes waiting."""

    def health(_query: Mapping[str, list[str]]) -> Answer:
        return Answer(200, content=f"ok {role()}\n".encode()) if healthy() else Answer(500, content=b"unhealthy\n")

    def readiness(_query: Mapping[str, list[str]]) -> Answer:
        return Answer(200, content=f"ok {role()}\n".encode()) if ready() else Answer(503, content=b"not yet\n")

    answers = {"/healthz": health, "/readyz": readiness}
    limits = _port_limits(config, per_peer=HEALTH_PER_PEER, threads=1, slow_threads=1)
    Server(port, _get(answers), _no_body, limits, name="healthz").start()


def _no_body(_ticket: object, _body: bytes) -> Answer:
    return Answer(400, "this port takes no request body")
