"""Prometheus metrics of the operator (served by `kubetf operator --metrics-port`)."""

from prometheus_client import Counter, Gauge, Histogram

JOBS = Gauge("kubetf_jobs", "TrainingJobs by phase", ["phase"])
RESTARTS = Counter("kubetf_restarts_total", "Restarts by kind (failure or disruption)", ["kind"])
RECONCILE_SECONDS = Histogram(
    "kubetf_reconcile_seconds",
    "Time to reconcile one TrainingJob",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
RECONCILE_ERRORS = Counter("kubetf_reconcile_errors_total", "Reconciles that raised")
API_REQUESTS = Counter("kubetf_api_requests_total", "Kubernetes API requests sent", ["verb", "resource"])
QUEUE_DEPTH = Gauge("kubetf_workqueue_depth", "Jobs waiting for a reconcile")
LEADER = Gauge("kubetf_leader", "1 while this operator holds the leader lease")
API_ERRORS = Counter("kubetf_api_errors_total", "Kubernetes API errors", ["verb", "resource", "code"])
CACHED_PODS = Gauge("kubetf_cached_pods", "Pods in the operator's cache: its own (the watch is filtered server-side)")
JOB_PROGRESS = Gauge("kubetf_job_progress_ratio", "A job's training progress, 0 to 1", ["namespace", "job"])
JOB_STEPS_PER_SECOND = Gauge("kubetf_job_steps_per_second", "A job's training steps per second", ["namespace", "job"])
JOB_METRIC = Gauge("kubetf_job_metric", "The latest value of a metric a job reports", ["namespace", "job", "metric"])
JOB_HEALTH = Gauge(
    "kubetf_job_training_unhealthy",
    "1 while a running job's training is unhealthy, by reason",
    ["namespace", "job", "reason"],
)
