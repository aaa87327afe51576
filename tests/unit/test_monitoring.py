"""What the chart ships for monitoring: the Grafana dashboard (Grafana's schema, through grafana-foundation-sdk),
the alert rules (`promtool check rules`, and `promtool test rules` proving each alert fires and resolves), the
ServiceMonitor and the scrape annotations; all off by default. Each alert has its runbook line in
docs/operating.md. tests/e2e/test_monitoring.py evaluates every query against a real Prometheus.

promtool comes from Debian's prometheus package (`make tools`: tests/monitoring/install-prometheus.sh); without it
these tests fail, they do not skip."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from grafana_foundation_sdk.cog import plugins
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard

from tests.unit.test_helm import CHART, REPO, Obj, by_kind, find_helm, one, template

pytestmark = pytest.mark.unit

DASHBOARD = CHART / "dashboards" / "kubetf.json"
RULES_TEST = REPO / "tests" / "monitoring" / "rules_test.yaml"
ALL_ON = ("--set", "metrics.dashboard.enabled=true,metrics.prometheusRule.enabled=true",
          "--set", "metrics.serviceMonitor.enabled=true,metrics.scrapeAnnotations=true")  # fmt: skip
# The variables Grafana fills in the panels' queries.
VARIABLES = {"$namespace", "$job", "$metric", "$__rate_interval"}


@pytest.fixture(scope="module")
def helm() -> str:
    found = find_helm()
    if found is None:
        pytest.fail("helm not found: `make tools` installs it under ~/.cache/kubetf/bin")
    return found


def promtool() -> str:
    found = shutil.which("promtool", path=f"{Path.home()}/.cache/kubetf/bin")
    if found is None:
        pytest.fail("promtool not found: `make tools` installs Debian's prometheus package's under ~/.cache/kubetf/bin")
    return found


def generator():
    spec = importlib.util.spec_from_file_location("kubetf_dashboard", REPO / "helm" / "dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rendered_rules(helm: str, *values: str) -> dict:
    rule = one(template(helm, "--set", "metrics.prometheusRule.enabled=true", *values), "PrometheusRule")
    return {"groups": rule["spec"]["groups"]}


def alerts(rules: dict) -> list[Obj]:
    return [rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule]


def panels(board: dict) -> list[Obj]:
    return [p for panel in board["panels"] for p in (panel, *panel.get("panels", []))]


def test_the_dashboard_in_the_chart_is_the_generators_output():
    assert DASHBOARD.read_text() == generator().render(), "run .venv/bin/python helm/dashboard.py"


def test_the_dashboard_follows_grafanas_schema():
    """Read into grafana-foundation-sdk's typed models (its dashboard schema, each panel plugin's options) and
    written back, the JSON is unchanged: no key the schema lacks, none misspelt (a misspelt one is dropped)."""
    plugins.register_default_plugins()
    board = json.loads(DASHBOARD.read_text())
    assert json.loads(json.dumps(Dashboard.from_json(board), cls=JSONEncoder)) == board
    misspelt = json.loads(DASHBOARD.read_text())
    misspelt["panels"][1]["fieldConfig"]["defaults"]["unitt"] = "s"
    assert json.loads(json.dumps(Dashboard.from_json(misspelt), cls=JSONEncoder)) != misspelt
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids))


# Jobs' series without a job label (a histogram per job would grow with the jobs): shown for every job.
FLEET_WIDE = {"kubetf_job_time_to_resume_seconds_bucket"}


def test_every_panel_is_templated_by_namespace_and_job_or_is_the_operators():
    board = json.loads(DASHBOARD.read_text())
    assert {v["name"] for v in board["templating"]["list"]} == {"datasource", "namespace", "job", "metric"}
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows == ["Jobs", "Waiting", "Progress", "Goodput", "Operator"]
    operator = False
    for panel in board["panels"]:
        operator = operator or panel["title"] == "Operator"
        for target in panel.get("targets", []):
            expr = target["expr"]
            assert set(re.findall(r"\$\w+", expr)) <= VARIABLES, expr
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            per_job = [s for s in re.findall(r"kubetf_job_\w+\{[^}]*\}|kubetf_job_\w+", expr) if s not in FLEET_WIDE]
            for selector in per_job:  # a job's series: always for the chosen namespaces and jobs
                assert 'namespace=~"$namespace", job=~"$job"' in selector, (panel["title"], selector)
            fleet = any(name in expr for name in FLEET_WIDE)
            assert operator or per_job or fleet, f"{panel['title']}: a panel above the operator's row shows jobs"


def test_monitoring_is_off_by_default(helm):
    objects = template(helm)
    assert not by_kind(objects, "ConfigMap") + by_kind(objects, "PrometheusRule") + by_kind(objects, "ServiceMonitor")
    assert "annotations" not in one(objects, "Deployment")["spec"]["template"]["metadata"]


def test_the_dashboard_configmap_is_for_grafanas_sidecar(helm):
    folder = "metrics.dashboard.annotations.grafana_folder=kubetf"
    objects = template(helm, "--set", "metrics.dashboard.enabled=true", "--set", folder)
    configmap = one(objects, "ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "kubetf"}
    assert json.loads(configmap["data"]["kubetf.json"]) == json.loads(DASHBOARD.read_text())


def test_the_service_monitor_scrapes_every_replica_through_the_metrics_service_honouring_labels(helm):
    objects = template(
        helm, "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.serviceMonitor.labels.release=prom"
    )
    monitor = one(objects, "ServiceMonitor")
    service = next(s for s in by_kind(objects, "Service") if s["metadata"]["name"] == "kubetf-metrics")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["kubetf-system"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["honorLabels"]) == ("metrics", "/metrics", True)
    assert endpoint["port"] in [p["name"] for p in service["spec"]["ports"]]


def test_scrape_annotations_name_the_metrics_port_beside_the_users_own(helm):
    objects = template(helm, "--set", "metrics.scrapeAnnotations=true,metrics.port=9191", "--set", "podAnnotations.a=b")
    pod = one(objects, "Deployment")["spec"]["template"]
    assert pod["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true", "prometheus.io/port": "9191", "prometheus.io/path": "/metrics", "a": "b",
    }  # fmt: skip
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    assert ports["metrics"] == 9191


def test_the_alert_rules_pass_promtool_and_each_alert_fires_and_resolves(helm, tmp_path):
    rules = rendered_rules(helm)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    checked = subprocess.run([promtool(), "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    shutil.copy(RULES_TEST, tmp_path / "rules_test.yaml")
    tested = subprocess.run([promtool(), "test", "rules", "rules_test.yaml"], cwd=tmp_path, capture_output=True,
                            text=True)  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr

    cases = [case for test in yaml.safe_load(RULES_TEST.read_text())["tests"] for case in test["alert_rule_test"]]
    for alert in alerts(rules):
        name = alert["alert"]
        assert any(c["alertname"] == name and c["exp_alerts"] for c in cases), f"{name} never fires in {RULES_TEST}"
        assert any(
            c["alertname"] == name and not c["exp_alerts"] and c["eval_time"] > min(
                x["eval_time"] for x in cases if x["alertname"] == name and x["exp_alerts"]
            )
            for c in cases
        ), f"{name} never resolves in {RULES_TEST}"  # fmt: skip


def test_the_thresholds_are_values(helm):
    thresholds = {"restarts": "5", "restartWindow": "1h", "queuedSeconds": "60", "memoryRatio": "0.5"}
    values = [f"--set=metrics.prometheusRule.thresholds.{k}={v}" for k, v in thresholds.items()]
    exprs = {a["alert"]: " ".join(a["expr"].split()) for a in alerts(rendered_rules(helm, *values))}
    assert exprs["KubetfJobRestartStorm"].endswith("(increase(kubetf_job_restarts_total[1h]))) >= 5")
    assert exprs["KubetfJobQueuedTooLong"].endswith("> 60")
    assert exprs["KubetfOperatorMemoryNearLimit"].endswith("> 0.5")


def test_every_alert_has_a_runbook_line_in_the_operating_docs(helm):
    operating = (REPO / "docs" / "operating.md").read_text()
    runbook = operating[operating.index("## Alerts") :]
    for alert in alerts(rendered_rules(helm)):
        assert re.search(rf"^\| `{alert['alert']}` \|", runbook, re.M), f"no runbook row for {alert['alert']}"
