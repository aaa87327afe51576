"""The operator's settings: one object, made by `kubetf operator` from its flags and passed in, never global.

Every default is stated here once; the command line's flags take their defaults from this class.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import uuid
from dataclasses import dataclass

SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
DEFAULT_LEASE_NAMESPACE = "kubetf-system"


@dataclass(frozen=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    # Client-side rate limit of all API traffic (a token bucket, like client-go's QPS and burst).
    qps: float = 300.0
    burst: int = 600
    workers: int = 8  # reconciles run in parallel (one job is never reconciled by two at once)
    # Safety resync of each unfinished job: re-read from the API server, in case a watch missed an event.
    resync_seconds: float = 600.0
    resync_jitter: float = 0.2
    # Pods of one job are created in batches that double from `first_batch` (stopping at the first error), at
    # most `creates_per_reconcile` per turn, so a 1,000-worker job does not hold a worker while others wait.
    first_batch: int = 8
    creates_per_reconcile: int = 64
    # How long a reconcile waits for the watch to deliver the operator's own creates and deletes.
    expectations_timeout: float = 30.0
    # Per-job backoff after a failed reconcile: doubling from the first delay up to the cap.
    error_backoff_first: float = 1.0
    error_backoff_cap: float = 300.0
    # Leader election on a Lease (client-go's protocol): the holder renews every `retry_period`; it stops
    # writing when it could not renew for `renew_deadline`; a standby takes over once the holder's record has
    # not changed for `lease_duration`. renew_deadline < lease_duration keeps two writers from overlapping.
    leader_election: bool = True
    lease_namespace: str = DEFAULT_LEASE_NAMESPACE
    lease_name: str = "kubetf-operator"
    lease_duration: float = 8.0
    renew_deadline: float = 5.0
    retry_period: float = 1.0
    identity: str = ""
    verbose: bool = False

    def with_runtime_defaults(self) -> OperatorConfig:
        """Fill what depends on where the operator runs: its identity and, in a pod, the lease's namespace."""
        identity = self.identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        namespace = self.lease_namespace
        if namespace == DEFAULT_LEASE_NAMESPACE and os.path.exists(SERVICE_ACCOUNT_NAMESPACE):
            with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as handle:
                namespace = handle.read().strip() or namespace
        return dataclasses.replace(self, identity=identity, lease_namespace=namespace)


DEFAULTS = OperatorConfig()
