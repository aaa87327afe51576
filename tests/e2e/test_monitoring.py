"""What the chart ships for monitoring, proven on a real Prometheus (Debian's package) scraping the installed chart's
operator: a job queues in Kueue, starts, diverges (a NaN loss), fails once, is disrupted once and succeeds, beside a
job whose gang cannot be placed and one the API server refuses; then every panel's query of the installed dashboard
and every alert rule of the chart is evaluated over that life, and each must return the series it should. A metric
renamed in the operator (or a query that misnames one) leaves a panel or a rule without its series: the test fails.

The rules are the chart's template with thresholds a minute-long life can cross (queued or gang-waiting 3 s, 2
restarts, 1% of the memory limit); tests/monitoring/rules_test.yaml proves the defaults with promtool. The test
drives each step and waits until Prometheus has seen the state it leaves before it goes on (the init container holds
the pod Pending, a pod ignoring SIGTERM holds the restart): no state is left to a scrape's luck.

With KUBETF_DASHBOARD_PICTURES=DIR the panels' results are drawn there (tests/monitoring/pictures.py; docs/images
holds the ones docs/operating.md shows); they are always saved to .test-results/monitoring/panels.json.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kubetf.core.scheduling import workload as kueue
from tests.cluster.fixture import wait_for
from tests.cluster.queues import Queue, make_flavor
from tests.integration.conftest import free_port
from tests.monitoring.prometheus import Prometheus

from .conftest import OPERATOR_NAMESPACE, RELEASE, ROOT, helm

IMAGE = "kubetf/trainer:0.1.0"
# Thresholds a minute-long life crosses (the chart's defaults are hours; promtool proves those).
# The deadline's margin is short: the alert fires on its other clause, an ETA past the deadline.
TEST_THRESHOLDS = {"restarts": 2, "restartWindow": "10m", "queuedSeconds": 3, "gangWaitingSeconds": 3,
                   "deadlineSeconds": 60, "memoryRatio": "0.01"}  # fmt: skip
DEADLINE = 400  # activeDeadlineSeconds of the life: its ETA (about 500 s at 2 steps a second) is past it
# Grafana's variables, as a user choosing the test's namespace would have them.
RATE_INTERVAL = "10s"  # Grafana's $__rate_interval at a 2 s scrape interval is 8 s

# Each step of the life is the test's. Every run reports 2 steps a second out of 1,000 (an ETA of about 500 s, past
# its deadline) and exits with the code the test writes into /tmp/exit (the container's own: a new run has none).
# The job's first run reports a NaN loss (it diverged); every later one holds its pod's deletion (SIGTERM ignored)
# until the test tells it to exit. A run counts the runs before it in its pod (/scratch, an emptyDir a restart in the
# same pod keeps) and in the pods before it (its attempt): the failure's restart is the same whether it recreates
# the pod or restarts the program in it.
PROGRAM = """
import os, signal, sys, time
from kubetf_trainer.report import flush, report

before = len(os.listdir("/scratch"))
open(f"/scratch/{before}", "w").close()
run = int(os.environ["ATTEMPT"]) + before
if run:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
step = 0
while not os.path.exists("/tmp/exit"):
    step += 1
    report(step=100 * run + step, steps=1000, stepsPerSecond=2.0,
           metrics={"loss": 1.0 / step if run else float("nan")})
    flush()
    time.sleep(0.5)
flush()
sys.exit(int(open("/tmp/exit").read()))
"""
# The job's first pod stays Pending (starting) until the test lets it go.
GATE = """
import os, time
while os.environ["ATTEMPT"] == "0" and not os.path.exists("/tmp/go"):
    time.sleep(0.2)
"""


def container(name: str, program: str) -> dict:
    return {
        "name": name, "image": IMAGE, "imagePullPolicy": "IfNotPresent", "command": ["python", "-c", program],
        "env": [{"name": "ATTEMPT", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['kubetf.io/attempt']"}}}],
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
    }  # fmt: skip


def life_job(queue: Queue) -> dict:
    program = {**container("tensorflow", PROGRAM), "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}
    scratch = [{"name": "scratch", "emptyDir": {}}]
    template = {"spec": {"initContainers": [container("gate", GATE)], "containers": [program], "volumes": scratch,
                         "terminationGracePeriodSeconds": 300}}  # fmt: skip
    return {
        "strategy": "MultiWorkerMirrored",
        "replicaSpecs": {"worker": {"replicas": 1, "template": template}},
        "runPolicy": {"backoffSeconds": 0, "activeDeadlineSeconds": DEADLINE},
    }


def gang_job() -> dict:
    """Two workers of 64 GPUs each, placed together by Volcano or not at all: the node has 12."""
    sleeper = {"name": "tensorflow", "image": IMAGE, "command": ["sleep", "3600"]}
    return {
        "strategy": "MultiWorkerMirrored",
        "replicaSpecs": {"worker": {"replicas": 2, "gpus": 64, "template": {"spec": {"containers": [sleeper]}}}},
        "runPolicy": {"schedulingPolicy": {"gangScheduler": "Volcano"}},
    }


def refused_job() -> dict:
    """A pod template the API server refuses (`4GB` is no quantity): Failed, InvalidPodTemplate, an API error."""
    bad = {"name": "tensorflow", "image": IMAGE, "resources": {"limits": {"memory": "4GB"}}}
    return {"replicaSpecs": {"worker": {"replicas": 1, "template": {"spec": {"containers": [bad]}}}}}


def rendered_rules() -> dict:
    values = [f"--set=metrics.prometheusRule.thresholds.{k}={v}" for k, v in TEST_THRESHOLDS.items()]
    show = ("--show-only", "templates/prometheus-rule.yaml", "--set", "metrics.prometheusRule.enabled=true")
    out = helm("template", RELEASE, "helm/kubetf", "--namespace", OPERATOR_NAMESPACE, *show, *values).stdout
    return {"groups": yaml.safe_load(out)["spec"]["groups"]}


@pytest.fixture
def prometheus(installed, tmp_path) -> Iterator[Prometheus]:
    started = Prometheus(installed, OPERATOR_NAMESPACE, tmp_path, rendered_rules(), free_port())
    started.start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def queue(installed, kueue, namespace) -> Iterator[Queue]:
    """A ClusterQueue with no CPU quota yet: what is queued in it waits until the test gives it some."""
    make_flavor(installed)
    made = Queue(installed, namespace, gpus=0, cpu="0")
    yield made
    made.delete()


def running(pod: dict) -> bool:
    return pod["status"].get("phase") == "Running"


def life_pod(cluster, namespace: str, holds, what: str) -> dict:
    """life's pod, once `holds(pod)`."""

    def check(pods: dict[str, dict]) -> bool:
        pod = pods.get("life-worker-0")
        return pod is not None and not pod["metadata"].get("deletionTimestamp") and holds(pod)

    return cluster.wait_pods(namespace, "life", check, f"life's pod: {what}", 90)["life-worker-0"]


def exec_in(cluster, namespace: str, pod: str, container: str, code: str) -> None:
    cluster.kubectl("exec", "-n", namespace, pod, "-c", container, "--", "python", "-c", code)


def give_quota(cluster, queue: Queue, cpu: str) -> None:
    spec = queue.cq()["spec"]
    for flavor in spec["resourceGroups"][0]["flavors"]:
        for resource in flavor["resources"]:
            if resource["name"] == "cpu":
                resource["nominalQuota"] = cpu
    cluster.custom.patch_cluster_custom_object(
        kueue.GROUP, kueue.VERSION, "clusterqueues", queue.name, {"spec": {"resourceGroups": spec["resourceGroups"]}}
    )


def test_every_panel_and_alert_answers_from_a_real_prometheus_over_a_jobs_life(
    installed, volcano, namespace, queue, prometheus
):
    cluster, ns = installed, namespace
    installed_objects(cluster)
    dashboard = json.loads(installed_dashboard(cluster))
    rules = {r["alert"]: r["expr"] for g in rendered_rules()["groups"] for r in g["rules"]}
    start = time.time()
    mine = f'namespace="{ns}"'

    def sees(expr: str, what: str, timeout: float = 90) -> list[dict]:
        return wait_for(lambda: prometheus.query(expr), timeout, f"Prometheus to see {what}: {expr}", interval=0.5)

    fired_at: dict[str, float] = {}

    def fires(alert: str, job: str, timeout: float = 90) -> None:
        """The alert's expression returns the job's series (its `for` aside: promtool tests that); when it did."""

        def check() -> list[dict]:
            now = time.time()
            found = [r for r in mine_only(prometheus.query(rules[alert], now), ns) if r["metric"].get("job") == job]
            fired_at[alert] = now
            return found

        wait_for(check, timeout, f"{alert} to fire for {job}", interval=0.5)

    cluster.create_job(ns, "life", life_job(queue), labels={kueue.QUEUE_LABEL: queue.local})
    cluster.create_job(ns, "gang", gang_job())
    cluster.create_job(ns, "refused", refused_job())

    # queued: no quota in its ClusterQueue
    sees(f'kubetf_job_waiting_since_timestamp_seconds{{{mine}, job="life", cause="queued"}}', "life queued")
    fires("KubetfJobQueuedTooLong", "life")
    # starting: admitted, its pod held Pending by the gate
    give_quota(cluster, queue, "1")
    sees(f'kubetf_job_waiting_since_timestamp_seconds{{{mine}, job="life", cause="starting"}}', "life starting")
    life_pod(cluster, ns, lambda pod: "running" in (pod["status"].get("initContainerStatuses") or [{}])[0].get(
        "state", {}), "its gate running")  # fmt: skip
    exec_in(cluster, ns, "life-worker-0", "gate", "open('/tmp/go', 'w')")
    # running, diverged (a NaN loss), its ETA past its deadline
    sees(f'kubetf_job_training_unhealthy{{{mine}, job="life", reason="LossNotFinite"}}', "life's NaN loss")
    sees(f'kubetf_job_estimated_completion_timestamp_seconds{{{mine}, job="life"}}', "life's ETA")
    fires("KubetfJobTrainingUnhealthy", "life")
    fires("KubetfJobDeadlineNear", "life")
    # a failure: restarted at once; the next run's loss is finite again
    exec_in(cluster, ns, "life-worker-0", "tensorflow", "open('/tmp/exit', 'w').write('1')")
    sees(f'kubetf_job_restarts_total{{{mine}, job="life", kind="failure"}} == 1', "life's failure restart")
    wait_for(lambda: not prometheus.query(f'kubetf_job_training_unhealthy{{{mine}, job="life"}}'), 90,
             "life healthy again", interval=0.5)  # fmt: skip
    # a disruption: its pod deleted, the restart held while the pod ignores SIGTERM
    deleted = life_pod(cluster, ns, running, "running")["metadata"]["uid"]
    cluster.core.delete_namespaced_pod("life-worker-0", ns)
    sees(f'kubetf_job_waiting_since_timestamp_seconds{{{mine}, job="life", cause="restarting"}}', "life restarting")
    exec_in(cluster, ns, "life-worker-0", "tensorflow", "open('/tmp/exit', 'w').write('143')")
    sees(f'kubetf_job_restarts_total{{{mine}, job="life", kind="disruption"}} == 1', "life's disruption restart")
    fires("KubetfJobRestartStorm", "life")
    life_pod(cluster, ns, lambda pod: pod["metadata"]["uid"] != deleted and running(pod), "its replacement running")
    exec_in(cluster, ns, "life-worker-0", "tensorflow", "open('/tmp/exit', 'w').write('0')")
    sees(f'kubetf_job_status_phase{{{mine}, job="life", phase="Succeeded"}}', "life succeeded")
    # beside it: a gang that cannot be placed, a job refused
    fires("KubetfJobGangWaitingTooLong", "gang")
    sees(f'kubetf_job_status_phase{{{mine}, job="refused", phase="Failed"}}', "refused failed")
    end = prometheus.settle()
    print(f"\nthe scripted life took {end - start:.0f}s")

    results = evaluate_panels(prometheus, dashboard, ns, start, end)
    save(results)
    for title, expected in expected_panels(ns).items():
        assert title in results, f"no panel {title!r} in the dashboard"
        for ref, wanted in expected.items():
            got = results[title]["targets"][ref]["series"]
            assert wanted(got), f"{title} ({ref}): {results[title]['targets'][ref]['expr']} returned {got}"
    for title, panel in results.items():  # and nothing else comes back empty
        for ref, target in panel["targets"].items():
            assert target["series"], f"{title} ({ref}) returned nothing: {target['expr']}"

    # every rule: each metric it reads has the series it names; the alerts crossed during the life fired, and those
    # whose cause ended resolved; the operator had a leader throughout
    for alert, expr in rules.items():
        for selector in selectors(expr):
            assert prometheus.query_range(selector, start, end), f"{alert}: {selector} has no series"
    # evaluated again now, each at the moment it fired: what Prometheus keeps says so too
    assert set(fired_at) == {"KubetfJobQueuedTooLong", "KubetfJobTrainingUnhealthy", "KubetfJobDeadlineNear",
                             "KubetfJobRestartStorm", "KubetfJobGangWaitingTooLong"}  # fmt: skip
    for alert, at in fired_at.items():
        assert mine_only(prometheus.query(rules[alert], at), ns), f"{alert} did not fire at {at}: {rules[alert]}"
    for alert in ("KubetfJobQueuedTooLong", "KubetfJobTrainingUnhealthy", "KubetfJobDeadlineNear"):
        still = [r for r in mine_only(prometheus.query(rules[alert], end), ns) if r["metric"]["job"] == "life"]
        assert not still, f"{alert} did not resolve: {still}"
    assert prometheus.query_range(rules["KubetfOperatorMemoryNearLimit"], start, end)
    assert not prometheus.query_range(rules["KubetfOperatorNoLeader"], start, end)
    assert all(rule["health"] == "ok" for rule in prometheus.rules()), prometheus.rules()


def installed_objects(cluster) -> None:
    """`helm install` with all three on made them (CRDs of the Prometheus operator applied first)."""
    for plural in ("servicemonitors", "prometheusrules"):
        found = cluster.custom.list_namespaced_custom_object("monitoring.coreos.com", "v1", OPERATOR_NAMESPACE, plural)
        assert [o["metadata"]["name"] for o in found["items"]] == [f"{RELEASE}-operator"], plural


def installed_dashboard(cluster) -> str:
    configmap = cluster.core.read_namespaced_config_map(f"{RELEASE}-dashboard", OPERATOR_NAMESPACE)
    assert configmap.metadata.labels["grafana_dashboard"] == "1"
    return configmap.data["kubetf.json"]


def substitute(expr: str, namespace: str) -> str:
    for name, value in (("$__rate_interval", RATE_INTERVAL), ("$namespace", namespace), ("$job", ".*"),
                        ("$metric", "loss")):  # fmt: skip
        expr = expr.replace(name, value)
    return expr


def evaluate_panels(prometheus: Prometheus, dashboard: dict, namespace: str, start: float, end: float) -> dict:
    results = {}
    for panel in dashboard["panels"]:
        if not panel.get("targets"):
            continue
        targets = {}
        for target in panel["targets"]:
            expr = substitute(target["expr"], namespace)
            series = prometheus.query_range(expr, start, end)
            targets[target["refId"]] = {"expr": expr, "legend": target.get("legendFormat", ""), "series": series}
        title = panel["title"].replace("$metric", "loss")
        defaults = panel["fieldConfig"]["defaults"]
        results[title] = {"type": panel["type"], "unit": defaults.get("unit", ""), "custom": defaults.get("custom", {}),
                          "gridPos": panel["gridPos"], "targets": targets, "start": start, "end": end}  # fmt: skip
    return results


def labels(series: list[dict], name: str) -> set[str]:
    return {s["metric"].get(name, "") for s in series}


def jobs(series: list[dict]) -> set[str]:
    return labels(series, "job")


def expected_panels(ns: str) -> dict:
    """The series each per-job panel must return after the life, by panel and query."""
    return {
        "Jobs by phase": {
            "A": lambda s: {"Queued", "Pending", "Running", "Restarting", "Succeeded", "Failed"} <= labels(s, "phase")
        },
        "Restarts": {
            "A": lambda s: (
                labels(s, "kind") == {"failure", "disruption"}
                and all(max(float(v) for _, v in x["values"]) >= 1 for x in s)
            )
        },
        "Unhealthy training": {
            "A": lambda s: ("life", "LossNotFinite") in {(x["metric"]["job"], x["metric"]["reason"]) for x in s}
        },
        "Waiting jobs by cause": {
            "A": lambda s: {"queued", "gangWaiting", "starting", "restarting"} <= labels(s, "cause")
        },
        "How long each job has waited": {
            "A": lambda s: (
                {("life", "queued"), ("gang", "gangWaiting")} <= {(x["metric"]["job"], x["metric"]["cause"]) for x in s}
            )
        },
        "Progress": {"A": lambda s: jobs(s) == {"life"} and all(0 < float(v) < 0.5 for _, v in s[0]["values"])},
        "Steps per second": {
            "A": lambda s: jobs(s) == {"life"} and all(1.5 < float(v) <= 2 for _, v in s[0]["values"])
        },
        "Training metric: loss": {"A": lambda s: jobs(s) == {"life"} and "NaN" in {v for _, v in s[0]["values"]}},
        "Time to completion and to the deadline": {
            "A": lambda s: jobs(s) == {"life"} and all(float(v) > 0 for _, v in s[0]["values"]),  # the ETA
            "B": lambda s: jobs(s) == {"life"} and all(0 < float(v) <= DEADLINE for _, v in s[0]["values"]),
        },
        "Goodput": {
            "A": lambda s: "life" in jobs(s)
            and 0 < float(next(x for x in s if x["metric"]["job"] == "life")["values"][-1][1]) < 1
        },
        "Time lost by cause": {
            "A": lambda s: {"queued", "gangWaiting", "starting", "restarting"} <= labels(s, "cause")
        },
        "Time to resume": {
            "A": lambda s: {"failure", "disruption"} <= labels(s, "cause"),
            "B": lambda s: {"failure", "disruption"} <= labels(s, "cause"),
        },
        "API errors": {"A": lambda s: bool(labels(s, "code"))},  # the refused job's dry run, at least
        "Memory": {"B": lambda s: {v for x in s for _, v in x["values"]} == {str(512 * 1024 * 1024)}},
    }


def selectors(expr: str) -> list[str]:
    """The metric selectors an expression reads, without their ranges: `name{matchers}` or `name`."""
    found = re.findall(r"\b((?:kubetf|process)_[a-z_]+)(\{[^}]*\})?", expr)
    return sorted({name + matchers for name, matchers in found})


def mine_only(series: list[dict], namespace: str) -> list[dict]:
    """The test's own jobs' series among every job's (other tests' jobs run beside it); the operator's are all."""
    return [s for s in series if s["metric"].get("namespace", namespace) == namespace]


def save(results: dict) -> None:
    out = ROOT / ".test-results" / "monitoring"
    out.mkdir(parents=True, exist_ok=True)
    (out / "panels.json").write_text(json.dumps(results))
    pictures = os.environ.get("KUBETF_DASHBOARD_PICTURES")
    if pictures:
        from tests.monitoring import pictures as draw

        draw.render(results, Path(pictures))
