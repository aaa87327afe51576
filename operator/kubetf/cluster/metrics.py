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
API_SECONDS = Histogram(
    "kubetf_api_request_seconds",
    "How long the Kubernetes API took to answer a request (sent to answer read, errors too; the client's own rate "
    "limit and urgent-first waits not included), by verb and resource",
    ["verb", "resource"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
QUEUE_DEPTH = Gauge("kubetf_workqueue_depth", "Jobs waiting for a reconcile")
QUEUE_WAIT = Histogram(
    "kubetf_workqueue_wait_seconds",
    "How long a job ready for a reconcile waited for a worker, by priority (urgent, follow, normal, report)",
    ["priority"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
LEADER = Gauge("kubetf_leader", "1 while this operator holds the leader lease")
API_WRITES_HELD = Counter(
    "kubetf_api_writes_held_seconds_total",
    "Seconds writes other than a restart's waited for urgent reconciles (a restart's calls go first)",
)
FIRST_STATUSES_HELD = Counter(
    "kubetf_first_statuses_held_total",
    "New jobs' first statuses (with their events) held while other new jobs waited for their pods",
)
API_ERRORS = Counter("kubetf_api_errors_total", "Kubernetes API errors", ["verb", "resource", "code"])
CACHED_PODS = Gauge("kubetf_cached_pods", "Pods in the operator's cache: its own (the watch is filtered server-side)")
REQUESTS = Counter(
    "kubetf_http_requests_total", "Requests the operator's ports answered, by port and status", ["port", "code"]
)
CONNECTIONS = Gauge("kubetf_http_connections", "Connections open to each of the operator's ports", ["port"])
CLOSED = Counter(
    "kubetf_http_connections_closed_total",
    "Connections the operator's ports closed without a whole answer, by port and why: `unanswered` (past the "
    "connection limits while as many were being refused already), `write timeout` (the client did not take the "
    "answer in time)",
    ["port", "reason"],
)
TOKEN_REVIEWS = Counter(
    "kubetf_progress_token_reviews_total",
    "TokenReviews of progress tokens, by result (valid, refused, over budget, error)",
    ["result"],
)
EVENT_LOOP_LAG = Histogram(
    "kubetf_event_loop_lag_seconds",
    "How late kopf's event loop ran a probe due every 100 ms (a blocked loop delays every watch)",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
TIME_TO_RESUME = Histogram(
    "kubetf_job_time_to_resume_seconds",
    "From a restart (a failure, a disruption, a queue's preemption) to the first training step after it, by cause",
    ["cause"],
    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600),
)
