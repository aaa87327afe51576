"""kopf wiring, and nothing else: watch events of TrainingJobs, of what the scheduler integrations made for them
(kubetf.core.scheduling.RESOURCES: PodGroups, Workloads), and of Kueue's LocalQueues go to the controller. The
operator's pods, the most numerous and the most often changed, it watches itself (kubetf.cluster.podwatch).

The handlers are async and do no I/O (the controller only updates its cache and queue), so kopf's event loop is
never blocked; reconciles run on the controller's own threads. The watches of what the operator makes are filtered
by the API server (kopf's label selectors): the operator neither receives nor keeps the cluster's other Workloads.
Without Kueue in the cluster kopf watches neither of its kinds, and starts when their CRDs appear.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import kopf
from kopf._core.reactor.inventory import ResourceMemories, ResourceMemory
from kubernetes import client

from kubetf.cluster import metrics
from kubetf.cluster.kube import PAGE_SIZE
from kubetf.core import api, scheduling
from kubetf.core.scheduling import workload as kueue
from kubetf.core.types import Resource
from kubetf.runtime.controller import Controller


class NoDiffBase(kopf.DiffBaseStorage):
    """No diff base. kopf builds one at every event of every object (a deep copy of it, status removed) for
    changing handlers (on.create, on.update) to compare against, and keeps it in an annotation; the operator has
    only event handlers, which never read it. Under load those copies were a third of kopf's share of the
    operator's CPU (py-spy, 1,000 jobs finishing)."""

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        """Nothing to keep (kopf calls it only after changing handlers ran)."""


class NoMemories(ResourceMemories):
    """kopf keeps a memory per object it watches until the object is deleted (its memo, error throttler, daemons and
    indexes: five objects and their dicts and sets each), for handler kinds the operator has none of: it has only
    event handlers, which read the event. At 4,000 jobs that was 28,000 memories (a heap census); without them an
    operator with 2,000 running jobs takes about 10 MiB less (`make bench-scale`). Each event gets a fresh one
    instead, forgotten after it; so where kopf's own processing of an object fails (not a handler: kopf logs an event
    handler's error and goes on), its retry delays start again from the first (1 s) at each event. kopf takes the
    object as `kopf.run(memories=...)` but exports no class for it: this subclasses its private inventory's, which
    tests/unit/test_kopf_memories.py checks against the installed kopf."""

    async def recall(self, raw_body: Any, *, memobase: Any = None, noticed_by_listing: bool = False,
                     ephemeral: bool = False) -> ResourceMemory:  # fmt: skip
        return await super().recall(raw_body, memobase=memobase, noticed_by_listing=noticed_by_listing, ephemeral=True)


def settings() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.persistence.diffbase_storage = NoDiffBase()
    # kopf would post its own Events (a handler's failure, as a Warning on the job) through its own client, outside
    # the leader lease that guards every write of the operator's (kubetf.cluster.kube): a standby, or a leader that
    # lost the lease, could write. The handlers only hand each event over; kopf logs what fails, and the operator's
    # own Events say what happens to a job.
    settings.posting.enabled = False
    settings.watching.chunk_size = PAGE_SIZE
    # kopf keeps one task per object, holding its last event, until it has idled this long (default 5 s): at a
    # restart it lists every job, Workload and PodGroup within seconds, each event alive meanwhile. The handlers only
    # hand the event over, so a worker has nothing to wait for (when kopf still watched the pods too, a restart
    # among 2,000 jobs peaked at 202 MiB with 0.5 s, 182 MiB with 0.05 s: `make bench-scale ARGS="--until-restart"`).
    settings.queueing.idle_timeout = 0.05
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 30
    # kopf retries a failed request, a watch's too, after 1, 1, 2, 3, 5, 8, 13, 21 s: a watch broken by an API
    # server restart would come back up to 21 s after the server. Every second instead, for as long in all.
    settings.networking.error_backoffs = [1.0] * 54
    return settings


LAG_PROBE_PERIOD = 0.1
probes: set[asyncio.Task[None]] = set()  # the running probe (a task with no reference may be collected)


async def _probe_lag() -> None:
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + LAG_PROBE_PERIOD
        await asyncio.sleep(LAG_PROBE_PERIOD)
        metrics.EVENT_LOOP_LAG.observe(max(0.0, loop.time() - due))


def registry(controller: Controller) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
        """The credentials `kube.load_config` loaded (in-cluster, or --kubeconfig): kopf's watches and the
        operator's own client always talk to the same cluster as the same user."""
        config = client.Configuration.get_default_copy()
        header = config.get_api_key_with_prefix("BearerToken") or config.get_api_key_with_prefix("authorization")
        scheme, _space, token = str(header or "").rpartition(" ")
        return kopf.ConnectionInfo(
            server=config.host,
            ca_path=config.ssl_ca_cert,
            insecure=not config.verify_ssl,
            username=config.username or None,
            password=config.password or None,
            scheme=scheme or None,
            token=token or None,
            certificate_path=config.cert_file,
            private_key_path=config.key_file,
            trust_env=settings.networking.trust_env,
        )

    @kopf.on.startup(registry=registry)
    async def probe_the_loop(**_: Any) -> None:
        """kubetf_event_loop_lag_seconds: how late this loop runs a probe due every 100 ms. Every watch event goes
        through it, so anything that blocks it (it should be nothing: the handlers do no I/O) shows here."""
        probes.add(asyncio.get_running_loop().create_task(_probe_lag()))

    @kopf.on.event(api.GROUP, api.VERSION, api.PLURAL, registry=registry)
    async def job_event(event: kopf.RawEvent, **_: Any) -> None:
        controller.job_event(event["type"], event["object"])

    # What the scheduler integrations make for the jobs (kubetf.core.scheduling.RESOURCES: a gang's PodGroups, the
    # Workloads): only the operator's own (a label the API server filters by). kopf watches an API only once the
    # cluster serves it.
    ours = {api.LABEL_MANAGED_BY: api.MANAGER}
    for resource in scheduling.RESOURCES:
        _watch_owned(registry, controller, resource, ours)

    @kopf.on.event(kueue.GROUP, kueue.VERSION, "localqueues", registry=registry)
    async def local_queue_event(event: kopf.RawEvent, **_: Any) -> None:
        controller.local_queue_event(event["type"], event["object"])

    return registry


def _watch_owned(registry: kopf.OperatorRegistry, controller: Controller, resource: Resource, labels: Any) -> None:
    async def owned_event(event: kopf.RawEvent, **_: Any) -> None:
        controller.owned_event(event["type"], event["object"], resource)

    handler = f"{resource.plural}.{resource.group}_event"
    kopf.on.event(resource.group, resource.version, resource.plural, labels=labels, registry=registry, id=handler)(
        owned_event
    )
