"""The operator's settings: one object, made by `kubetf operator` from its flags and passed in, never global.

Every default is stated here once; the command line's flags take their defaults from this class.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

DEFAULT_LEASE_NAMESPACE = "kubetf-system"


@dataclass(frozen=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = ()  # empty: every namespace; glob patterns (team-*) work too
    # Client-side rate limit of all API traffic (a token bucket, like client-go's QPS and burst).
    qps: float = 300.0
    burst: int = 600
    workers: int = 8  # reconciles run in parallel (one job is never reconciled by two at once)
    # Beside them, workers that take only urgent reconciles (a pod ended, vanished or is being taken away): a
    # preemption behind a burst of new jobs waited for one of `workers` (p99 2.5 s in bench-scale), each busy with
    # a new job's creates for a second or more on a loaded API server.
    urgent_workers: int = 2
    # Safety resync: every job, pod, Workload and PodGroup re-listed from the API server (paged), in case a watch
    # missed an event; the jobs whose state differs from the cache's are reconciled.
    resync_seconds: float = 600.0
    resync_jitter: float = 0.2
    # Pods of one job are created in batches that double from `first_batch` (stopping at the first error), at
    # most `creates_per_reconcile` per turn, so a 1,000-worker job does not hold a worker while others wait.
    first_batch: int = 8
    creates_per_reconcile: int = 64
    # How long a reconcile waits for the watch to deliver the operator's own creates and deletes.
    expectations_timeout: float = 30.0
    # A pod that started, was scheduled or turned ready brings its job's reconcile this much later, so that the few
    # changes its pods go through together cost one reconcile and one status write (the Job controller's
    # syncJobBatchPeriod); a pod that ended, went or is being taken away brings it at once.
    pod_batch_seconds: float = 0.5
    # A new job's first status waits while other new jobs wait for their pods (runtime.executor: in a burst, the
    # creations first), at most this long: then it joins the line of new jobs, so a steady stream never starves it.
    first_status_within: float = 10.0
    # Per-job backoff after a failed reconcile: doubling from the first delay up to the cap; for an error of the
    # cluster that goes away by itself (a 5xx, a webhook it cannot call, a timeout), up to `transient_retry_cap`.
    error_backoff_first: float = 1.0
    error_backoff_cap: float = 300.0
    transient_retry_cap: float = 5.0
    # Kueue's visibility API is read this often for the place of each queued job in its ClusterQueue; the status
    # writes it causes are budgeted (per second, the front of each queue first).
    queue_position_seconds: float = 30.0
    queue_position_writes: float = 2.0
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

    # ---- timing: every delay the operator waits or grants, in seconds
    # API requests: connect and read timeouts. A pod's log comes through its node's kubelet, which may not answer
    # at all (a partitioned node): read with a short timeout, so a reconcile worker is never held for long.
    api_timeout: tuple[float, float] = (5.0, 30.0)
    log_timeout: tuple[float, float] = (2.0, 4.0)
    # After the start, the first re-list comes once the watches run.
    audit_after_start: float = 20.0
    # A deleted object's uid is remembered this long, so a list taken before the deletion cannot bring it back.
    tombstone_seconds: float = 300.0
    # A previous job's Service or PVC still holding a name is usually garbage-collected within seconds.
    name_in_use_recheck: float = 10.0
    # A new job's pod whose shape (all but its job's name) passed a dry run this recently is not dry-run again
    # (kubetf.core.refusals.Admitted): a burst of 200 jobs from one template made 600 dry runs.
    admitted_shape_seconds: float = 10.0
    # A LocalQueue the watch has not shown is read from the API; its absence (or Kueue's) serves this long.
    local_queue_recheck: float = 5.0
    # Which gang schedulers' APIs the cluster serves (API discovery) is read again after this long.
    discovery_seconds: float = 30.0
    # Kueue's visibility API not answering: asked again after this long.
    positions_unavailable_recheck: float = 600.0
    # Nodes: a node's Ready state read from the API serves every job with pods there this long; while a pod is
    # being deleted on a node, its node is looked at again this often (a node that stopped reporting sends no event
    # of its own). The cluster's kube-controller-manager checks the nodes every `node_monitor_period`
    # (--node-monitor-period): it sees a heartbeat at its next check, and marks a node Unknown at the first check
    # `node_monitor_grace` (--node-monitor-grace-period) after it saw the last one. So the node stopped reporting
    # up to the grace period and two check periods before it was marked (`node_silence`).
    node_state_seconds: float = 5.0
    node_check_seconds: float = 10.0
    node_monitor_grace: float = 50.0
    node_monitor_period: float = 5.0
    # A pod unscheduled for less than this is not a reason worth a warning yet (the scheduler retries, an
    # autoscaler adds nodes); an old pod still there this long after its grace period is reported stuck.
    scheduling_grace: float = 30.0
    stuck_margin: float = 15.0
    # A MultiWorkerMirrored group restart in place (kubetf.core.inplace): how long the members of the failed one's
    # group have to exit by themselves (their collectives fail within seconds) before they are recreated instead;
    # their exits meanwhile are that one restart.
    in_place_grace: float = 30.0
    # A MultiWorkerMirrored group restart (kubetf.core.sigterm): seconds after the first member's SIGTERM to look
    # for TensorFlow's "SIGTERM caught" line; the grace period of the rest once it is found; how far before the
    # SIGTERM the log is read from (the clocks of the API server and the node differ).
    sigterm_checks: tuple[float, ...] = (0.0, 2.0, 4.0, 6.0)
    sigterm_stop_grace: int = 1
    sigterm_clock_skew: float = 5.0

    # Progress reports (kubetf.runtime.progress): the port every replica serves (0: off), the URL training pods are
    # given (empty: none, so they report nothing); each job's status.progress written at most once per
    # `progress_write_seconds` (the first and the final report at once), all jobs' within `progress_writes_per_second`;
    # a running job whose step has not moved for `progress_stall_seconds` is TrainingStalled.
    progress_port: int = 8090
    progress_url: str = ""
    progress_write_seconds: float = 30.0
    progress_writes_per_second: float = 5.0
    progress_stall_seconds: float = 600.0
    # Every port of the operator (progress, metrics, healthz: kubetf.runtime.server): connections open at once; those
    # from one address on the progress port (a pod has one); seconds a request's line and headers have to arrive from
    # the connection, and its body from its admission; seconds a client has to take its answer.
    http_connections: int = 1024
    http_connections_per_peer: int = 64
    http_read_timeout: float = 1.0
    http_write_timeout: float = 5.0
    # /metrics (kubetf.runtime.pages): a page is served again, unbuilt, until its build's CPU time is at most this
    # share of the time since it began, so the pages of however many scrapes take at most this share of a core.
    metrics_cpu_share: float = 0.1
    # What the progress endpoint may ask of the API server (TokenReviews of new tokens, a job's stored progress at its
    # first report), per second and in a burst, on its own client: past that, 429. Of it, the TokenReviews of the pods
    # of one namespace (the namespace of the pod a token claims, from the operator's cache) at most these.
    progress_api_qps: float = 50.0
    progress_api_burst: int = 100
    progress_api_namespace_qps: float = 10.0
    progress_api_namespace_burst: int = 20
    # A job whose reconciles failed this many times in a row gets the ReconcileError condition (kubetf.core.failing).
    reconcile_error_after: int = 3

    @property
    def node_silence(self) -> float:
        """How long before being marked Unknown a node may have stopped reporting (see node_monitor_grace)."""
        return self.node_monitor_grace + 2 * self.node_monitor_period

    def list_scopes(self) -> tuple[str, ...]:
        """What to list: each namespace named, or "" (every namespace, then filtered by `serves`) when a pattern
        names them."""
        if not self.namespaces or any(set(n) & set("*?[") for n in self.namespaces):
            return ("",)
        return self.namespaces

    def serves(self, namespace: str) -> bool:
        return not self.namespaces or any(fnmatch.fnmatchcase(namespace, n) for n in self.namespaces)

    def problem(self) -> str | None:
        """What makes these settings unsafe, with the flags to fix; None when they are fine."""
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            return (
                f"--retry-period ({self.retry_period}) < --renew-deadline ({self.renew_deadline}) < --lease-duration "
                f"({self.lease_duration}) is required: a leader must stop writing before a standby may take over"
            )
        if min(*self.api_timeout, *self.log_timeout) <= 0:
            return "--api-timeout and --log-timeout must be positive (CONNECT,READ seconds)"
        if not 0 < self.metrics_cpu_share <= 1:
            return f"--metrics-cpu-share ({self.metrics_cpu_share}) must be more than 0 and at most 1 (a whole core)"
        return None


DEFAULTS = OperatorConfig()
