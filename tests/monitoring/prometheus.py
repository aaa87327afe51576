"""A real Prometheus (Debian's package: `make tools`) scraping the installed operator's pods, for the e2e tier.

Debian's build has no Kubernetes service discovery, so this plays the `kubernetes-pods` job's part: it lists the
operator's pods, keeps those the chart annotates `prometheus.io/scrape: "true"`, and writes one target per pod (the
annotated port and path) into a file_sd file, through the API server's pod proxy with the kubeconfig's client
certificate: the static way docs/operating.md#scraping shows. The file is rewritten while it runs, as pods come and
go. Its data lives in the test's temporary directory, kept an hour at most.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.fixture import wait_for

SCRAPE_SECONDS = 2  # short: the test's job lives about a minute


def binary() -> str:
    found = shutil.which("prometheus", path=f"{Path.home()}/.cache/kubetf/bin:{os.environ.get('PATH', '')}")
    if found is None:
        raise RuntimeError("prometheus not found: `make tools` unpacks Debian's package under ~/.cache/kubetf/bin")
    return found


class Prometheus:
    def __init__(self, cluster: Any, namespace: str, directory: Path, rules: dict, port: int) -> None:
        self.cluster, self.namespace, self.directory, self.port = cluster, namespace, directory, port
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None
        self._stop = threading.Event()
        self._targets = ""
        kubeconfig = yaml.safe_load(Path(cluster.kubeconfig).read_text())
        server = urllib.parse.urlsplit(kubeconfig["clusters"][0]["cluster"]["server"])
        self.api_server = server.netloc
        user = kubeconfig["users"][0]["user"]
        for name, data in (
            ("ca.crt", kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"]),
            ("client.crt", user["client-certificate-data"]),
            ("client.key", user["client-key-data"]),
        ):
            (directory / name).write_bytes(base64.b64decode(data))
        (directory / "rules.yaml").write_text(yaml.safe_dump(rules))
        config = {
            "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "scrape_timeout": f"{SCRAPE_SECONDS}s",
                       "evaluation_interval": f"{SCRAPE_SECONDS}s"},
            "rule_files": ["rules.yaml"],
            "scrape_configs": [{
                "job_name": "kubetf", "honor_labels": True, "scheme": "https",
                "tls_config": {"ca_file": "ca.crt", "cert_file": "client.crt", "key_file": "client.key"},
                "file_sd_configs": [{"files": ["targets.json"], "refresh_interval": f"{SCRAPE_SECONDS}s"}],
            }],
        }  # fmt: skip
        (directory / "prometheus.yml").write_text(yaml.safe_dump(config))

    def targets(self) -> list[dict]:
        """What a `kubernetes-pods` job would scrape: the running operator pods annotated for it."""
        pods = self.cluster.core.list_namespaced_pod(self.namespace, label_selector="app.kubernetes.io/name=kubetf")
        found = []
        for pod in pods.items:
            annotations = pod.metadata.annotations or {}
            if pod.metadata.deletion_timestamp or pod.status.phase != "Running":
                continue
            if annotations.get("prometheus.io/scrape") != "true":
                continue
            port = annotations.get("prometheus.io/port", "9090")
            path = annotations.get("prometheus.io/path", "/metrics")
            proxy = f"/api/v1/namespaces/{self.namespace}/pods/{pod.metadata.name}:{port}/proxy{path}"
            labels = {"instance": pod.metadata.name, "pod": pod.metadata.name, "__metrics_path__": proxy}
            found.append({"targets": [self.api_server], "labels": labels})
        return found

    def _write_targets(self) -> None:
        text = json.dumps(self.targets(), sort_keys=True)
        if text != self._targets:
            partial = self.directory / "targets.json.tmp"
            partial.write_text(text)
            partial.replace(self.directory / "targets.json")  # atomic: Prometheus never reads half a file
            self._targets = text

    def _follow_pods(self) -> None:
        while not self._stop.wait(SCRAPE_SECONDS):
            try:
                self._write_targets()
            except Exception:  # the API server restarting: the next round writes them
                continue

    def start(self) -> None:
        self._write_targets()
        log = (self.directory / "prometheus.log").open("ab")
        self.process = subprocess.Popen(
            [binary(), "--config.file=prometheus.yml", "--storage.tsdb.path=data", "--storage.tsdb.retention.time=1h",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            cwd=self.directory, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        threading.Thread(target=self._follow_pods, name="prometheus-targets", daemon=True).start()
        wait_for(self._ready, 60, f"Prometheus ready (log: {self.directory / 'prometheus.log'})")
        wait_for(lambda: self.query("kubetf_leader == 1"), 60, "Prometheus to scrape the leader", interval=0.5)

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"prometheus exited {self.process.returncode}: {self.directory / 'prometheus.log'}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        self._stop.set()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def api(self, path: str, **params: Any) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as response:
            answer = json.loads(response.read())
        if answer.get("status") != "success":
            raise AssertionError(f"{path} {params}: {answer}")
        return answer["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """The expression's value now, or `at` that Unix time."""
        return self.api("query", query=expr, **({"time": at} if at is not None else {}))["result"]

    def query_range(self, expr: str, start: float, end: float) -> list[dict]:
        """Every second: a state one scrape showed holds until the next (a scrape interval later), so each such
        state is at one step or more."""
        return self.api("query_range", query=expr, start=start, end=end, step=1)["result"]

    def rules(self) -> list[dict]:
        return [rule for group in self.api("rules")["groups"] for rule in group["rules"]]

    def settle(self) -> float:
        """A moment a scrape interval from now, once Prometheus has scraped every target after it: a range query
        ending there has its last step after now, so it shows what the targets said up to now."""
        then = time.time() + SCRAPE_SECONDS

        def scraped() -> bool:
            active = self.api("targets")["activeTargets"]
            return bool(active) and all(_epoch(t["lastScrape"]) > then for t in active)

        wait_for(scraped, 30, "a scrape of every target after now", interval=0.5)
        return then


def _epoch(stamp: str) -> float:
    """Prometheus' RFC 3339 time in UTC with nanoseconds (2026-11-28T02:31:07.123456789Z) as Unix seconds."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return dt.datetime.fromisoformat(f"{whole}.{(fraction + '000000')[:6]}+00:00").timestamp()
