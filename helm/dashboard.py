"""The chart's Grafana dashboard, helm/kubetf/dashboards/kubetf.json, written with Grafana's own typed builders
(grafana-foundation-sdk): what it writes follows Grafana's dashboard schema, and the JSON in the chart is this file's
output, never edited by hand (tests/unit/test_monitoring.py fails when they differ).

    .venv/bin/python helm/dashboard.py            # rewrite the JSON
    .venv/bin/python helm/dashboard.py --check    # exit 1 when the committed JSON is stale

Every panel's queries are evaluated against a real Prometheus after a scripted job's life in
tests/e2e/test_monitoring.py; docs/operating.md#the-dashboard shows what they drew.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import bargauge, dashboard, prometheus, timeseries
from grafana_foundation_sdk.builders.common import (
    ReduceDataOptions,
    StackingConfig,
    VizLegendOptions,
    VizTooltipOptions,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    GraphDrawStyle,
    LegendDisplayMode,
    LegendPlacement,
    SortOrder,
    StackingMode,
    TooltipDisplayMode,
    VisibilityMode,
    VizOrientation,
)
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableOption, VariableRefresh

OUT = Path(__file__).resolve().parent / "kubetf" / "dashboards" / "kubetf.json"
UID = "kubetf-training-jobs"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
# The TrainingJobs the panels show: every panel's per-job selector (the series' own `namespace` and `job` labels:
# scrape with honor_labels, docs/operating.md).
JOBS = 'namespace=~"$namespace", job=~"$job"'

def query(expr: str, legend: str, ref: str = "A") -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).range().datasource(DATASOURCE)


def series(title: str, description: str, unit: str, *queries: prometheus.Dataquery, w: int = 8) -> timeseries.Panel:
    panel = timeseries.Panel().title(title).description(description).unit(unit).datasource(DATASOURCE).height(8)
    panel = panel.span(w).fill_opacity(10).line_width(1).show_points(VisibilityMode.NEVER)
    panel = panel.legend(
        VizLegendOptions().show_legend(True).display_mode(LegendDisplayMode.LIST).placement(LegendPlacement.BOTTOM)
    ).tooltip(VizTooltipOptions().mode(TooltipDisplayMode.MULTI).sort(SortOrder.DESCENDING))
    for q in queries:
        panel = panel.with_target(q)
    return panel


def stacked(panel: timeseries.Panel) -> timeseries.Panel:
    return panel.stacking(StackingConfig().mode(StackingMode.NORMAL)).fill_opacity(60)


def bars(title: str, description: str, unit: str, q: prometheus.Dataquery, w: int = 8) -> bargauge.Panel:
    return (
        bargauge.Panel().title(title).description(description).unit(unit).datasource(DATASOURCE).height(8).span(w)
        .orientation(VizOrientation.HORIZONTAL).reduce_options(ReduceDataOptions().calcs(["lastNotNull"]))
        .with_target(q.instant())
    )  # fmt: skip


def variable(name: str, label: str, values: str) -> dashboard.QueryVariable:
    return (
        dashboard.QueryVariable(name).label(label).query(values).datasource(DATASOURCE)
        .multi(True).include_all(True).all_value(".*").refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .current(VariableOption(selected=True, text="All", value="$__all"))
    )  # fmt: skip


def build() -> dict:
    rate = "$__rate_interval"
    board = (
        dashboard.Dashboard("kubetf: TrainingJobs").uid(UID).tags(["kubetf", "training"]).editable()
        .description("TrainingJobs run by the kubetf operator, and the operator itself (docs/operating.md)")
        .time("now-6h", "now").refresh("30s").timezone("browser")
        .with_variable(
            dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
        )
        .with_variable(variable("namespace", "Namespace", "label_values(kubetf_job_status_phase, namespace)"))
        .with_variable(
            variable("job", "TrainingJob", 'label_values(kubetf_job_status_phase{namespace=~"$namespace"}, job)')
        )
        .with_variable(
            dashboard.QueryVariable("metric").label("Training metric").datasource(DATASOURCE)
            .query(f"label_values(kubetf_job_metric{{{JOBS}}}, metric)").refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .current(VariableOption(selected=True, text="loss", value="loss"))
        )
    )  # fmt: skip

    board = board.with_row(dashboard.Row("Jobs"))
    board = board.with_panel(stacked(series(
        "Jobs by phase", "TrainingJobs in each phase (status.phase)", "short",
        query(f"count by (phase) (max by (namespace, job, phase) (kubetf_job_status_phase{{{JOBS}}}))", "{{phase}}"),
    )))  # fmt: skip
    board = board.with_panel(series(
        "Restarts", "Restarts of the jobs by kind: failure (counts against backoffLimit) or disruption (preemption, "
        "eviction, a lost node; never counted against it)", "short",
        query(f"sum by (kind) (max by (namespace, job, kind) (increase(kubetf_job_restarts_total{{{JOBS}}}[{rate}])))",
              "{{kind}}"),
    ).draw_style(GraphDrawStyle.BARS).fill_opacity(80))  # fmt: skip
    board = board.with_panel(series(
        "Unhealthy training", "Running jobs whose loss is NaN or infinite (LossNotFinite) or whose step has not moved "
        "for the stall time (TrainingStalled): they keep running", "short",
        query(f"max by (namespace, job, reason) (kubetf_job_training_unhealthy{{{JOBS}}})",
              "{{namespace}}/{{job}} {{reason}}"),
    ))  # fmt: skip

    board = board.with_row(dashboard.Row("Waiting"))
    board = board.with_panel(stacked(series(
        "Waiting jobs by cause", "Jobs waiting for Kueue's admission (queued), their gang's placement (gangWaiting), "
        "their pods' start (starting) or a restart's replacements (restarting)", "short",
        query("count by (cause) (max by (namespace, job, cause) "
              f"(kubetf_job_waiting_since_timestamp_seconds{{{JOBS}}}))", "{{cause}}"),
        w=12,
    )))  # fmt: skip
    board = board.with_panel(bars(
        "How long each job has waited", "Time since each waiting job's current wait began, by cause", "s",
        query(f"time() - max by (namespace, job, cause) (kubetf_job_waiting_since_timestamp_seconds{{{JOBS}}})",
              "{{namespace}}/{{job}} {{cause}}"),
        w=12,
    ))  # fmt: skip

    board = board.with_row(dashboard.Row("Progress"))
    board = board.with_panel(bars(
        "Progress", "How far each job's training is (its reports: steps, else epochs)", "percentunit",
        query(f"max by (namespace, job) (kubetf_job_progress_ratio{{{JOBS}}})", "{{namespace}}/{{job}}"),
    ).min(0).max(1))  # fmt: skip
    board = board.with_panel(series(
        "Steps per second", "Each job's training rate", "short",
        query(f"max by (namespace, job) (kubetf_job_steps_per_second{{{JOBS}}})", "{{namespace}}/{{job}}"),
    ))  # fmt: skip
    board = board.with_panel(series(
        "Training metric: $metric", "The latest value each job reported of the metric chosen above", "short",
        query(f'max by (namespace, job) (kubetf_job_metric{{{JOBS}, metric=~"$metric"}})', "{{namespace}}/{{job}}"),
    ))  # fmt: skip
    board = board.with_panel(series(
        "Time to completion and to the deadline", "A running job's ETA (time left at its current rate) beside the "
        "time left before its activeDeadlineSeconds (active time only): an ETA above its deadline will not finish",
        "s",
        query(f"max by (namespace, job) (kubetf_job_estimated_completion_timestamp_seconds{{{JOBS}}}) - time()",
              "ETA {{namespace}}/{{job}}"),
        query(f"max by (namespace, job) (kubetf_job_deadline_timestamp_seconds{{{JOBS}}}) - time()",
              "deadline {{namespace}}/{{job}}", "B"),
        w=24,
    ))  # fmt: skip

    board = board.with_row(dashboard.Row("Goodput"))
    board = board.with_panel(bars(
        "Goodput", "The share of each job's wall time that trained, from its creation to now or its end "
        "(status.goodput, docs/restarts.md#goodput)", "percentunit",
        query(f"max by (namespace, job) (kubetf_job_goodput_ratio{{{JOBS}}})", "{{namespace}}/{{job}}"),
    ).min(0).max(1))  # fmt: skip
    board = board.with_panel(stacked(series(
        "Time lost by cause", "Seconds of the jobs' wall time that did not train, by cause: queued, gangWaiting, "
        "starting, restarting, suspended, and redone (steps trained again after resuming from an older checkpoint)",
        "s",
        query(f"sum by (cause) (max by (namespace, job, cause) (kubetf_job_lost_seconds{{{JOBS}}}))", "{{cause}}"),
    )))  # fmt: skip
    board = board.with_panel(series(
        "Time to resume", "From a restart to the first training step after it, by what the restart was (failure, "
        "disruption, a queue's preemption): every job's, the operator keeps no per-job histogram", "s",
        query(f"histogram_quantile(0.5, sum by (le, cause) (rate(kubetf_job_time_to_resume_seconds_bucket[{rate}])))",
              "p50 {{cause}}"),
        query(f"histogram_quantile(0.99, sum by (le, cause) (rate(kubetf_job_time_to_resume_seconds_bucket[{rate}])))",
              "p99 {{cause}}", "B"),
    ))  # fmt: skip

    operator = "and on (instance) kubetf_leader"  # the operator's own targets among everything Prometheus scrapes
    board = board.with_row(dashboard.Row("Operator"))
    board = board.with_panel(series(
        "Leader", "1 for the replica that acts (holds the Lease); the others are standbys", "short",
        query("kubetf_leader", "{{instance}}"),
    ).draw_style(GraphDrawStyle.LINE).min(0).max(1))  # fmt: skip
    board = board.with_panel(series(
        "Reconcile latency", "How long a reconcile of one job took (those that did something)", "s",
        query(f"histogram_quantile(0.5, sum by (le) (rate(kubetf_reconcile_seconds_bucket[{rate}])))", "p50"),
        query(f"histogram_quantile(0.99, sum by (le) (rate(kubetf_reconcile_seconds_bucket[{rate}])))", "p99", "B"),
    ))  # fmt: skip
    board = board.with_panel(series(
        "Reconciles and their errors", "Reconciles per second, and those that raised (retried with backoff)", "ops",
        query(f"sum(rate(kubetf_reconcile_seconds_count[{rate}]))", "reconciles"),
        query(f"sum(rate(kubetf_reconcile_errors_total[{rate}]))", "errors", "B"),
    ))  # fmt: skip
    board = board.with_panel(series(
        "API errors", "Kubernetes API requests that failed, by status code (404 and 409 are mostly expected: "
        "a deleted pod, a create that already happened)", "ops",
        query(f"sum by (code) (rate(kubetf_api_errors_total[{rate}]))", "{{code}}"),
    ))  # fmt: skip
    board = board.with_panel(series(
        "API latency (p99)", "How long the API server took to answer, by verb", "s",
        query(f"histogram_quantile(0.99, sum by (le, verb) (rate(kubetf_api_request_seconds_bucket[{rate}])))",
              "{{verb}}"),
    ))  # fmt: skip
    board = board.with_panel(series(
        "Work queue", "Jobs waiting for a reconcile, and the p99 of their wait by priority", "short",
        query("max(kubetf_workqueue_depth)", "depth"),
        query(f"histogram_quantile(0.99, sum by (le, priority) (rate(kubetf_workqueue_wait_seconds_bucket[{rate}])))",
              "wait p99 {{priority}} (s)", "B"),
    ))  # fmt: skip
    board = board.with_panel(series(
        "Memory", "Each replica's resident memory beside its container's limit (the OOM killer acts at the limit)",
        "bytes",
        query(f"process_resident_memory_bytes {operator}", "{{instance}}"),
        query("kubetf_memory_limit_bytes", "limit {{instance}}", "B"),
        w=12,
    ))  # fmt: skip
    board = board.with_panel(series(
        "Pauses", "p99 of Python's garbage-collection pauses (every thread stopped) and of kopf's event-loop lag",
        "s",
        query(f"histogram_quantile(0.99, sum by (le, generation) (rate(kubetf_gc_pause_seconds_bucket[{rate}])))",
              "GC generation {{generation}}"),
        query(f"histogram_quantile(0.99, sum by (le) (rate(kubetf_event_loop_lag_seconds_bucket[{rate}])))",
              "event loop", "B"),
        w=12,
    ))  # fmt: skip
    built = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    panels = [p for panel in built["panels"] for p in (panel, *panel.get("panels", []))]
    for number, panel in enumerate(panels, 1):  # the builders leave every id 0: Grafana wants them unique
        panel["id"] = number
    return built


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    rendered = render()
    if argv[1:] == ["--check"]:
        if OUT.read_text() != rendered:
            print(f"{OUT} is stale: run .venv/bin/python helm/dashboard.py", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(rendered)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
