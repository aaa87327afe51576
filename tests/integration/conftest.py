"""Integration tier: the operator, as a process, against a real kube-apiserver (no mocks).

Pods are never scheduled here (an unknown schedulerName), so no kubelet touches them: tests set pod status the
way the kubelet and the scheduler would, as envtest-style tests do.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, watch
from kubernetes import config as kubeconfig
from kubernetes.client.exceptions import ApiException

from kubetf.core import api, config
from tests.cluster import kwok
from tests.cluster.fixture import KubeCluster, wait_for
from tests.cluster.session import once, undo_at_end

ROOT = Path(__file__).resolve().parents[2]
UNSCHEDULED = "kubetf-test-unscheduled"
# Each xdist worker (gw0, gw1, ...; "main" without xdist) runs its own operator, on its own Lease, serving only the
# namespaces its tests create: it-<worker>-<random>. Workers run side by side without seeing each other's jobs.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
LEASE_NAME = f"kubetf-it-{WORKER}"
NAMESPACE_PREFIX = f"it-{WORKER}-"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report carries the operator's log lines about its namespace: CI prints only the report,
    and a timeout alone does not say what the operator did meanwhile."""
    report = yield
    fixtures = getattr(item, "funcargs", {})
    operator = fixtures.get("short_lease_operator") or fixtures.get("operator")
    namespace = fixtures.get("namespace")
    if report.failed and isinstance(operator, Operator) and isinstance(namespace, str) and operator.log_path.exists():
        lines = operator.log_path.read_text(errors="replace").splitlines()
        about = [line for line in lines if namespace in line][-80:]
        report.sections.append((f"operator log about {namespace} ({operator.log_path})", "\n".join(about)))
        report.sections.append(("operator log, last lines", "\n".join(lines[-30:])))
    return report


def pytest_collection_modifyitems(items):
    for item in items:
        if "/tests/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


class Cluster:
    """Thin test helpers over the official client, returning plain dicts."""

    def __init__(self, kubeconfig_path: str) -> None:
        self.kubeconfig = kubeconfig_path
        self.api_client = kubeconfig.new_client_from_config(config_file=kubeconfig_path)
        self.core = client.CoreV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)
        self.scheduling = client.SchedulingV1Api(self.api_client)
        self.ext = client.ApiextensionsV1Api(self.api_client)

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        """kubectl against this cluster, as a user types it (`kubectl get tj` shows the CRD's printer columns)."""
        return KubeCluster(self.kubeconfig, local=False).kubectl(*args, check=check, timeout=timeout)

    @staticmethod
    def raw(response) -> Any:
        return json.loads(response.data) if response.data else None

    def install_crd(self) -> None:
        crd = yaml.safe_load((ROOT / "manifests" / "crd" / f"{api.CRD_NAME}.yaml").read_text())
        # Every xdist worker does this at its start: a write lost to another worker's (409: Conflict, or
        # AlreadyExists) is read and written again, as optimistic concurrency asks.
        for attempt in range(10):
            try:
                existing = self.ext.read_custom_resource_definition(api.CRD_NAME)
            except ApiException as error:
                if error.status != 404:
                    raise
                existing = None
            try:
                if existing is None:
                    crd["metadata"].pop("resourceVersion", None)
                    self.ext.create_custom_resource_definition(crd)
                else:
                    crd["metadata"]["resourceVersion"] = existing.metadata.resource_version
                    self.ext.replace_custom_resource_definition(api.CRD_NAME, crd)
                break
            except ApiException as error:
                if error.status != 409 or attempt == 9:
                    raise

        def established():
            status = self.ext.read_custom_resource_definition(api.CRD_NAME).status
            return any(c.type == "Established" and c.status == "True" for c in status.conditions or [])

        wait_for(established, 30, "the CRD to be established")

    def make_queue_name_policy(self) -> list[tuple[str, str]]:
        """The chart's ValidatingAdmissionPolicies and their bindings, which check the Kueue queue label at apply
        time, each unless it exists (an installed chart's, another run's): the (kind, name) of those made here."""
        admission = client.AdmissionregistrationV1Api(self.api_client)
        made = []
        for document in queue_name_policy_documents():
            try:
                getattr(admission, f"create_{admission_kind(document['kind'])}")(document)
                made.append((document["kind"], document["metadata"]["name"]))
            except ApiException as error:
                if error.status != 409:
                    raise
        return made

    def refuses(self, job: dict) -> bool:
        """The API server refuses to create the job (a server-side dry run: nothing is stored)."""
        try:
            self.custom.create_namespaced_custom_object(
                api.GROUP, api.VERSION, job["metadata"]["namespace"], api.PLURAL, job, dry_run="All"
            )
        except ApiException as error:
            if error.status != 422:
                raise
            return True
        return False

    # --- jobs
    def create_job(self, namespace: str, name: str, spec: dict, **metadata: Any) -> dict:
        body = {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "metadata": {"name": name, "namespace": namespace, **metadata},
            "spec": spec,
        }
        return self.raw(
            self.custom.create_namespaced_custom_object(
                api.GROUP, api.VERSION, namespace, api.PLURAL, body, _preload_content=False
            )
        )

    def job(self, namespace: str, name: str) -> dict | None:
        try:
            return self.raw(
                self.custom.get_namespaced_custom_object(
                    api.GROUP, api.VERSION, namespace, api.PLURAL, name, _preload_content=False
                )
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def status(self, namespace: str, name: str) -> dict:
        return (self.job(namespace, name) or {}).get("status") or {}

    def statuses(self, namespace: str) -> dict[str, dict]:
        """Every job's status in the namespace, from one list."""
        items = self.raw(
            self.custom.list_namespaced_custom_object(
                api.GROUP, api.VERSION, namespace, api.PLURAL, _preload_content=False
            )
        )["items"]
        return {j["metadata"]["name"]: j.get("status") or {} for j in items}

    def patch_spec(self, namespace: str, name: str, spec: dict) -> None:
        self.custom.patch_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name, {"spec": spec})

    def wait_phase(self, namespace: str, name: str, phase: str, timeout: float = 20) -> dict:
        return wait_for(
            lambda: (s := self.status(namespace, name)).get("phase") == phase and s,
            timeout,
            lambda: f"{name} to be {phase} (status: {self.status(namespace, name)})",
        )

    # --- pods
    def pods(self, namespace: str, job: str) -> dict[str, dict]:
        items = self.raw(
            self.core.list_namespaced_pod(namespace, label_selector=f"{api.LABEL_JOB}={job}", _preload_content=False)
        )["items"]
        return {p["metadata"]["name"]: p for p in items}

    def describe(self, namespace: str, job: str) -> str:
        """The job's phase and condition, and each pod's attempt, phase, node and deletion: what a failed wait shows."""
        status = self.status(namespace, job)
        condition = next((c for c in status.get("conditions") or [] if c.get("type") == status.get("phase")), {})
        pods = [
            f"{name} attempt {(p['metadata'].get('labels') or {}).get(api.LABEL_ATTEMPT)} "
            f"{(p.get('status') or {}).get('phase')} on {(p.get('spec') or {}).get('nodeName')}"
            + (
                f" deleting since {p['metadata']['deletionTimestamp']}"
                if p["metadata"].get("deletionTimestamp")
                else ""
            )
            for name, p in sorted(self.pods(namespace, job).items())
        ]
        events = [f"{e.get('reason')}: {e.get('message')}" for e in self.events(namespace, job)[-8:]]
        return (
            f"job {status.get('phase')} ({status.get('reason')}: {condition.get('message')}), "
            f"restarts {status.get('restarts')}; pods: {'; '.join(pods)}; last events: {' | '.join(events)}"
        )

    def live_pods(self, namespace: str, job: str) -> dict[str, dict]:
        return {n: p for n, p in self.pods(namespace, job).items() if not p["metadata"].get("deletionTimestamp")}

    def live_pods_by_job(self, namespace: str) -> dict[str, dict[str, dict]]:
        """Job name -> its live pods, from one list of the namespace's pods."""
        items = self.raw(self.core.list_namespaced_pod(namespace, _preload_content=False))["items"]
        found: dict[str, dict[str, dict]] = {}
        for pod in items:
            job = (pod["metadata"].get("labels") or {}).get(api.LABEL_JOB)
            if job and not pod["metadata"].get("deletionTimestamp"):
                found.setdefault(job, {})[pod["metadata"]["name"]] = pod
        return found

    def pods_created(self, namespace: str, job: str, until: Any, then: float, timeout: float = 30) -> list[str]:
        """The job's pods created (watch ADDED events, from now) while waiting until `until()` holds and `then`
        seconds more: a negative check watched over its whole window, not a sleep before a look."""
        listed = self.core.list_namespaced_pod(namespace, label_selector=f"{api.LABEL_JOB}={job}")
        created: list[str] = []
        broken: list[Exception] = []
        stream = watch.Watch()

        def record() -> None:
            try:
                for event in stream.stream(
                    self.core.list_namespaced_pod, namespace, label_selector=f"{api.LABEL_JOB}={job}",
                    resource_version=listed.metadata.resource_version, timeout_seconds=int(timeout + then) + 5,
                ):  # fmt: skip
                    if event["type"] == "ADDED":
                        created.append(event["object"].metadata.name)
            except Exception as error:  # the connection dropped (after the window: the namespace's teardown)
                broken.append(error)

        watcher = threading.Thread(target=record, daemon=True)
        watcher.start()
        wait_for(until, timeout, "the condition before the watched window")
        time.sleep(then)  # the watch runs meanwhile: anything created in the window is recorded
        # A watch that ended within the window would have missed what came after: the check would prove nothing.
        assert watcher.is_alive() and not broken, f"the watch of {job}'s pods ended within the window: {broken}"
        stream.stop()
        return created

    def set_status(self, pod: dict, status: dict) -> None:
        meta = pod["metadata"]
        # The answer read, not parsed into the client's models (a Configuration per object: most of a test's CPU).
        # The uid is a precondition: a pod made since under the same name (the next attempt) answers 422.
        _ = self.core.patch_namespaced_pod_status(
            meta["name"], meta["namespace"], {"metadata": {"uid": meta["uid"]}, "status": status},
            _preload_content=False,
        ).data  # fmt: skip

    @staticmethod
    def _container_status(pod: dict, state: dict, ready: bool) -> list[dict]:
        container = pod["spec"]["containers"][0]
        return [
            {
                "name": container["name"],
                "image": container["image"],
                "imageID": "",
                "ready": ready,
                "restartCount": 0,
                "state": state,
            }
        ]

    def run(self, pod: dict) -> None:
        """What the kubelet reports for a started pod."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.set_status(
            pod,
            {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
                "containerStatuses": self._container_status(pod, {"running": {"startedAt": now}}, True),
            },
        )

    def wait_pods(self, namespace: str, job: str, predicate, what: str, timeout: float = 15) -> dict[str, dict]:
        """The job's live pods, once `predicate(pods)` holds."""

        def check():
            pods = self.live_pods(namespace, job)
            return pods if predicate(pods) else None

        return wait_for(check, timeout, lambda: f"{what}: {self.describe(namespace, job)}")

    def run_all(self, namespace: str, job: str, count: int) -> None:
        pods = self.wait_pods(namespace, job, lambda p: len(p) == count, f"{count} live pods of {job}", 20)
        for pod in pods.values():
            if (pod.get("status") or {}).get("phase") in (None, "Pending"):
                self.run(pod)

    def exit(self, pod: dict, code: int, reason: str | None = None, conditions: tuple[dict, ...] = ()) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        terminated = {
            "exitCode": code,
            "startedAt": now,
            "finishedAt": now,
            "reason": reason or ("Completed" if code == 0 else "Error"),
        }
        self.set_status(
            pod,
            {
                "phase": "Succeeded" if code == 0 else "Failed",
                "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now}, *conditions],
                "containerStatuses": self._container_status(pod, {"terminated": terminated}, False),
            },
        )

    def delete_pod(self, pod: dict) -> None:
        meta = pod["metadata"]
        _ = self.core.delete_namespaced_pod(meta["name"], meta["namespace"], _preload_content=False).data

    def wait_event(self, namespace: str, name: str, reason: str, type_: str = "Warning") -> dict:
        """The job's event of that reason and type (a wait: a restart's or a failure's event goes out after its
        deletes, and some events go with writes no status shows)."""

        def find():
            return next((e for e in self.events(namespace, name) if e["reason"] == reason and e["type"] == type_), None)

        return wait_for(find, 10, f"a {type_} event {reason} on {name}")

    def events(self, namespace: str, name: str) -> list[dict]:
        items = self.raw(
            self.core.list_namespaced_event(
                namespace, field_selector=f"involvedObject.name={name}", _preload_content=False
            )
        )["items"]
        return items


# The integration tier's operators: this worker's Lease and namespaces, the operator's own lease timings (8/5/1 s).
# Not shorter for every test: with a 2 s renew deadline, one slow renewal on a loaded 2-core machine cost the
# shared operator its lease, and the tests of that worker waited for it (CI run 23).
TEST_FLAGS = ("--lease-name", LEASE_NAME, "--namespace", f"{NAMESPACE_PREFIX}*")
# For the tests about leases (a lost lease, a takeover): a killed or stalled leader is replaced in about 3 s.
SHORT_LEASE_FLAGS = (*TEST_FLAGS, "--lease-duration", "3", "--renew-deadline", "2", "--retry-period", "0.5")
AS_INSTALLED = ()  # the benchmarks': the operator's defaults (every namespace, the default Lease, its timings)


def _port_block() -> Iterator[int]:
    """This test process's own 1,000 ports, just below the kernel's ephemeral range: no outgoing connection is given
    one of them between a check and an operator's bind (CI run 40: a port found free by binding port 0 was in use by
    the time the operator bound it), and each xdist worker has its own block, so two never pick the same port."""
    try:
        ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768  # Linux's default
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...; "" outside xdist
    index = int(worker[2:]) + 1 if worker.startswith("gw") else 0
    top = ephemeral - 1000 * index
    return iter(range(top - 1000, top))


_PORTS = _port_block()


def free_port() -> int:
    """A local port no process listens on, for an operator this process starts (its health, metrics and progress)."""
    for port in _PORTS:
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind(("127.0.0.1", port))
            return port
    raise RuntimeError("this test process used up its block of 1,000 local ports")


class Operator:
    """`kubetf operator` as a real process, as it runs in a cluster, against the test cluster's kubeconfig. It takes
    part in the leader election on the default Lease, as an operator started on a laptop would."""

    def __init__(
        self, kubeconfig: str, log_path: Path, metrics_port: int = 0, flags: tuple[str, ...] = TEST_FLAGS
    ) -> None:
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.metrics_port = metrics_port  # 0: /metrics off
        self.flags = flags  # () for the operator's defaults, as installed (every namespace, the default Lease)
        self.process: subprocess.Popen | None = None
        self.port = 0
        self.progress_port = 0  # where it takes training pods' progress reports

    def start(self, leader: bool = True, timeout: float = 30) -> None:
        """Start it; wait until it serves /healthz and, with `leader`, until it holds the lease."""
        self.launch()
        wanted = ("ok leader",) if leader else ("ok leader", "ok starting", "ok standby")
        wait_for(lambda: self.role() in wanted, timeout, f"the operator's /healthz to say {' or '.join(wanted)}")

    def launch(self) -> None:
        """Start the process and return at once, as a Deployment starts a replacement."""
        core = client.CoreV1Api(kubeconfig.new_client_from_config(config_file=self.kubeconfig))
        try:  # the leader election's Lease lives in the operator's namespace, as when installed
            core.create_namespace({"metadata": {"name": config.DEFAULT_LEASE_NAMESPACE}})
        except ApiException as error:
            if error.status != 409:
                raise
        self.port, self.progress_port = free_port(), free_port()
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kubetf.cli",
                "operator",
                "--kubeconfig",
                self.kubeconfig,
                "--liveness-port",
                str(self.port),
                "--metrics-port",
                str(self.metrics_port),
                "--log-format",
                "full",
                "--progress-port",
                str(self.progress_port),
                *self.flags,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def report(self, token: str | None, body: bytes) -> tuple[int, str]:
        """POST a progress report as a training pod does: (HTTP status, body)."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.progress_port}/v1/progress", data=body, method="POST",
            headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def role(self) -> str:
        """ "ok leader", "ok starting" (leader, cache being primed), "ok standby", or "" while it does not answer."""
        if self.process is None or self.process.poll() is not None:
            pytest.fail(f"operator exited with {self.process and self.process.returncode}; log: {self.log_path}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1) as response:
                return response.read().decode().strip()
        except OSError:
            return ""

    def ready(self) -> bool:
        """/readyz answers 200: the readiness probe's word (it can take over: its election reached the API server)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1) as response:
                return response.status == 200
        except OSError:
            return False

    def metric(self, name: str) -> float:
        """The value of a sample (no labels) on the operator's /metrics (it must run with a metrics port)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            for line in response.read().decode().splitlines():
                if line.startswith(f"{name} "):
                    return float(line.split()[1])
        pytest.fail(f"no sample {name} on the operator's /metrics")

    def metric_total(
        self, name: str, exclude: dict[str, str] | None = None, only: dict[str, str] | None = None
    ) -> float:
        """The sum of a metric's samples over its labels, but those whose labels include all of `exclude`, and (with
        `only`) those whose labels do not include all of `only`."""
        total = 0.0
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            for line in response.read().decode().splitlines():
                if not line.startswith(f"{name}{{") and not line.startswith(f"{name} "):
                    continue
                labels = line[line.find("{") + 1 : line.find("}")] if "{" in line else ""
                if exclude and all(f'{k}="{v}"' in labels for k, v in exclude.items()):
                    continue
                if only and not all(f'{k}="{v}"' in labels for k, v in only.items()):
                    continue
                total += float(line.rsplit(" ", 1)[1])
        return total

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()


def restart_apiserver(kubeconfig: str, down: int = 0) -> None:
    """Stop kube-apiserver, keep it stopped `down` seconds, start it again; return once it is ready
    (local-cluster.sh apiserver-restart)."""
    if not kwok.is_local(kubeconfig):
        pytest.fail(f"only the local cluster's API server can be restarted by a test; KUBECONFIG={kubeconfig}")
    result = subprocess.run(
        ["bash", str(kwok.SCRIPT), "apiserver-restart", "--down", str(down)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"local-cluster.sh apiserver-restart exited {result.returncode}:\n{result.stderr[-3000:]}")
    print(result.stderr.strip())


class ApiPath:
    """A TCP path to the API server that a test can cut and heal, as a load balancer in front of it would be
    (TLS passes through untouched: the local API server's certificate names 127.0.0.1). `kubeconfig` goes this way."""

    def __init__(self, kubeconfig_path: str, directory: Path) -> None:
        document = yaml.safe_load(Path(kubeconfig_path).read_text())
        server = urllib.parse.urlsplit(document["clusters"][0]["cluster"]["server"])
        self.target = (server.hostname or "", server.port or 443)
        self.listener = socket.create_server(("127.0.0.1", 0))
        for entry in document["clusters"]:
            entry["cluster"]["server"] = f"https://127.0.0.1:{self.listener.getsockname()[1]}"
        self.kubeconfig = str(directory / "through-api-path.kubeconfig")
        Path(self.kubeconfig).write_text(yaml.safe_dump(document))
        self.lock = threading.Lock()
        self.open = True
        self.sockets: set[socket.socket] = set()
        threading.Thread(target=self._accept, name="api-path", daemon=True).start()

    def cut(self) -> None:
        """Every connection ends, and new ones are closed as soon as they are made, until `heal`."""
        with self.lock:
            self.open = False
            sockets = list(self.sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def heal(self) -> None:
        with self.lock:
            self.open = True

    def _accept(self) -> None:
        while True:
            downstream, _ = self.listener.accept()
            with self.lock:
                is_open = self.open
            upstream = None
            if is_open:
                with contextlib.suppress(OSError):
                    upstream = socket.create_connection(self.target, timeout=5)
                    upstream.settimeout(None)  # watches stay quiet for minutes
            if upstream is None:
                downstream.close()
                continue
            with self.lock:
                self.sockets |= {downstream, upstream}
            for source, sink in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        with self.lock:
            self.sockets -= {source, sink}
        source.close()  # each direction's thread closes the socket it read from


@pytest.fixture(scope="session")
def cluster(kube_cluster) -> Cluster:
    cluster = Cluster(kube_cluster.kubeconfig)
    cluster.install_crd()
    return cluster


@pytest.fixture(scope="package", autouse=True)
def queue_name_policy(cluster, request) -> None:
    """The integration tier's copy of the chart's admission policy (a chart already installed has its own), made
    once per run and deleted at its end."""
    with once(request.config, "queue-name-policy") as first:
        if first and (made := cluster.make_queue_name_policy()):
            # Only what this run made: another run on the same cluster may be using the others.
            undo_at_end(request.config, "delete-queue-name-policy", kubeconfig=cluster.kubeconfig, made=made)
            # The API server enforces a new policy a moment after it is made: every policy made must refuse.
            wait_for(lambda: all(cluster.refuses(job) for job in queue_policy_probes()), 30, "the policies enforced")


def _installed_operators(cluster: Cluster) -> list[Any]:
    """kubetf operators running in the cluster (the chart's Deployment, e.g. left by `make demo`)."""
    apps = client.AppsV1Api(cluster.api_client)
    return [d for d in apps.list_deployment_for_all_namespaces(label_selector="app.kubernetes.io/name=kubetf").items]


def pause_installed_operators(cluster: Cluster) -> list[tuple[str, str, int]]:
    """Scale installed kubetf operators (the chart's, e.g. left by `make demo`) to zero and wait until they have
    stopped: they serve every namespace, the tier's too. Returns (namespace, name, replicas) to restore."""
    apps = client.AppsV1Api(cluster.api_client)
    paused = [(d.metadata.namespace, d.metadata.name, d.spec.replicas) for d in _installed_operators(cluster)]
    for namespace, name, _ in paused:
        apps.patch_namespaced_deployment_scale(name, namespace, {"spec": {"replicas": 0}})
    for namespace, name, _ in paused:
        wait_for(
            lambda n=namespace: (
                not cluster.core.list_namespaced_pod(n, label_selector="app.kubernetes.io/name=kubetf").items
            ),
            60,
            f"the installed operator {namespace}/{name} stopped",
        )
    return paused


def resume_installed_operators(cluster: Cluster, paused: list[tuple[str, str, int]]) -> None:
    """Scale what pause_installed_operators paused back to its replicas."""
    apps = client.AppsV1Api(cluster.api_client)
    for namespace, name, replicas in paused:
        apps.patch_namespaced_deployment_scale(name, namespace, {"spec": {"replicas": replicas}})


@pytest.fixture(scope="package")
def operator(cluster, tmp_path_factory, request):
    """This worker's operator under test. An installed one is scaled to zero for the run (two operators on the
    same jobs would each act) and back at its end."""
    with once(request.config, "pause-installed-operators") as first:
        if first:
            for namespace, name, replicas in pause_installed_operators(cluster):
                undo_at_end(
                    request.config, "scale", kubeconfig=cluster.kubeconfig, namespace=namespace, name=name,
                    replicas=replicas,
                )  # fmt: skip
    log_path = tmp_path_factory.mktemp("operator") / "operator.log"
    process = Operator(cluster.kubeconfig, log_path, metrics_port=free_port())
    process.start()
    yield process
    process.stop()
    print(f"operator log: {log_path}")


@pytest.fixture
def short_lease_operator(cluster, operator, tmp_path):
    """In place of this worker's operator for one test, the same on short lease timings (SHORT_LEASE_FLAGS)."""
    operator.stop()  # gives the lease up: the short-lease one takes it at once
    short = Operator(cluster.kubeconfig, tmp_path / "short-lease-operator.log", flags=SHORT_LEASE_FLAGS)
    short.start()
    try:
        yield short
    finally:
        short.stop()
        operator.start()


@pytest.fixture
def namespace(cluster, operator):
    name = f"{NAMESPACE_PREFIX}{uuid.uuid4().hex[:8]}"
    cluster.core.create_namespace({"metadata": {"name": name}})

    def default_service_account():
        try:
            return cluster.core.read_namespaced_service_account("default", name)
        except ApiException:
            return None

    wait_for(default_service_account, 30, f"the default ServiceAccount in {name}")
    yield name
    cluster.core.delete_namespace(name)


@pytest.fixture
def unserved_namespace(cluster, operator):
    """A namespace no operator serves (outside every test operator's pattern; an installed one is paused for the run:
    the `operator` fixture), where a test writes a job's status itself, as the operator would."""
    name = f"unserved-{WORKER}-{uuid.uuid4().hex[:8]}"
    cluster.core.create_namespace({"metadata": {"name": name}})
    yield name
    cluster.core.delete_namespace(name)


def queue_name_policy_documents() -> list[dict]:
    path = ROOT / "manifests" / "operator" / "30-queue-name-policy.yaml"
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def queue_policy_probes() -> list[dict]:
    """A TrainingJob each admission policy refuses at create time: a queue label that cannot name a LocalQueue, and
    MultiKueue's managedBy without a queue."""
    container = {"name": "tensorflow", "image": "kubetf/python-base:bookworm"}
    spec = {"replicaSpecs": {"worker": {"template": {"spec": {"containers": [container]}}}}}
    probe = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "probe", "namespace": "default"}}
    return [
        {**probe, "metadata": {**probe["metadata"], "labels": {api.QUEUE_LABEL: "Not_A_Queue"}}, "spec": spec},
        {**probe, "spec": {**spec, "managedBy": api.MANAGED_BY_MULTIKUEUE}},
    ]


def admission_kind(kind: str) -> str:
    """The client's method suffix for a ValidatingAdmissionPolicy or its Binding."""
    return "validating_admission_policy" + ("_binding" if kind.endswith("Binding") else "")


def pod_template(command=("python", "train.py"), **spec: Any) -> dict:
    return {
        "spec": {
            "schedulerName": UNSCHEDULED,
            "containers": [{"name": "tensorflow", "image": "kubetf/python-base:bookworm", "command": list(command)}],
            **spec,
        }
    }


def replica(replicas: int = 1, **extra: Any) -> dict:
    return {"replicas": replicas, "template": pod_template(), **extra}


def mwms_spec(**run_policy: Any) -> dict:
    """A 1 chief + 2 worker MultiWorkerMirrored job (failure backoff 1 s unless `run_policy` says otherwise)."""
    return {
        "strategy": "MultiWorkerMirrored",
        "replicaSpecs": {"chief": replica(1), "worker": replica(2)},
        "runPolicy": {"backoffSeconds": 1, **run_policy},
    }


def ps_spec(**run_policy: Any) -> dict:
    """A chief + 2 workers + 1 ps ParameterServer job (failure backoff 1 s unless `run_policy` says otherwise)."""
    return {
        "strategy": "ParameterServer",
        "replicaSpecs": {"chief": replica(1), "worker": replica(2), "ps": replica(1)},
        "runPolicy": {"backoffSeconds": 1, **run_policy},
    }
