"""Proves the test cluster is a real Kubernetes: containers, pod network, DNS, GC, GPU scheduling, CRD schemas,
shared storage. Runs on whatever `kube_cluster` gives (the local cluster, kind, a real one)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tests.cluster.fixture import wait_for
from tests.cluster.kwok import FAKE_NODE_KEY

pytestmark = pytest.mark.e2e

IMAGE = "kubetf/python-base:bookworm"
CRD_GROUP = "smoke.kubetf.test"


@pytest.fixture(scope="module")
def api(kube_cluster) -> client.ApiClient:
    return config.new_client_from_config(config_file=kube_cluster.kubeconfig)


@pytest.fixture(scope="module")
def core(api) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture(scope="module")
def ns(core) -> Iterator[str]:
    name = f"smoke-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name}})
    wait_for(lambda: _has_default_sa(core, name), 60, f"the default service account in {name}")
    yield name
    core.delete_namespace(name)


def _has_default_sa(core: client.CoreV1Api, ns: str) -> bool:
    try:
        core.read_namespaced_service_account("default", ns)
        return True
    except ApiException:
        return False


def pod_manifest(name: str, script: str, **spec: Any) -> dict:
    container = {
        "name": "main",
        "image": IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3", "-c", script],
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": spec.pop("labels", {"app": name})},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True},
            "containers": [container],
            **spec,
        },
    }


def run_pod(core: client.CoreV1Api, ns: str, name: str, script: str, timeout: float = 120, **spec: Any):
    """Create a pod and wait for it to finish; return (pod, logs)."""
    core.create_namespaced_pod(ns, pod_manifest(name, script, **spec))
    pod = wait_for(lambda: _finished(core, ns, name), timeout, f"pod {name} to finish")
    return pod, core.read_namespaced_pod_log(name, ns)


def _finished(core: client.CoreV1Api, ns: str, name: str):
    pod = core.read_namespaced_pod(name, ns)
    return pod if pod.status.phase in ("Succeeded", "Failed") else None


def _running_ready(core: client.CoreV1Api, ns: str, name: str):
    pod = core.read_namespaced_pod(name, ns)
    ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
    if pod.status.phase in ("Succeeded", "Failed"):
        pytest.fail(f"pod {name} ended: {pod.status}")
    return pod if ready else None


def assert_succeeded(pod, logs: str) -> None:
    assert pod.status.phase == "Succeeded", f"{pod.metadata.name}: {pod.status.phase}\n{logs}\n{pod.status}"


def test_pod_runs_and_exits_with_its_code(core, ns):
    pod, logs = run_pod(core, ns, "exit-3", "import sys; print('hello from a pod'); sys.exit(3)")
    assert pod.status.phase == "Failed"
    terminated = pod.status.container_statuses[0].state.terminated
    assert terminated.exit_code == 3
    assert "hello from a pod" in logs
    pod, logs = run_pod(core, ns, "exit-0", "import os; print('uid', os.getuid())")
    assert_succeeded(pod, logs)
    assert pod.status.container_statuses[0].state.terminated.exit_code == 0
    assert "uid 1000" in logs


SERVER = """
import http.server, socket
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("hello from " + socket.gethostname()).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
http.server.ThreadingHTTPServer(("", 8080), H).serve_forever()
"""


@pytest.fixture(scope="module")
def web(core, ns) -> client.V1Pod:
    """An HTTP server pod `web` behind a headless service `web-headless` (hostname/subdomain, as kubetf pods are)
    and a ClusterIP service `web-svc`."""
    manifest = pod_manifest(
        "web",
        SERVER,
        hostname="web",
        subdomain="web-headless",
        container={
            "ports": [{"containerPort": 8080}],
            "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
        },
    )
    manifest["spec"]["restartPolicy"] = "Always"
    core.create_namespaced_pod(ns, manifest)
    core.create_namespaced_service(
        ns,
        {
            "metadata": {"name": "web-headless"},
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {"app": "web"},
                "ports": [{"port": 8080}],
            },
        },
    )
    core.create_namespaced_service(
        ns,
        {
            "metadata": {"name": "web-svc"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    return wait_for(lambda: _running_ready(core, ns, "web"), 120, "pod web to be ready")


def test_two_pods_talk_over_the_pod_network(core, ns, web):
    # pod to pod directly, then through the ClusterIP service (kube-proxy), which may need a moment after the
    # endpoints appear for its rules to be synced: retried for a bounded time
    script = f"""
import time, urllib.request
print(urllib.request.urlopen("http://{web.status.pod_ip}:8080/", timeout=10).read().decode())
deadline = time.monotonic() + 30
while True:
    try:
        print(urllib.request.urlopen("http://web-svc/", timeout=5).read().decode())
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.2)
"""
    pod, logs = run_pod(core, ns, "client", script)
    assert_succeeded(pod, logs)
    assert logs.count("hello from web") == 2, logs
    assert pod.status.pod_ip != web.status.pod_ip


def test_dns_resolves_headless_names_and_the_api_server(core, ns, web):
    script = f"""
import json, socket, ssl, urllib.request
print("web", socket.gethostbyname("web.web-headless.{ns}.svc.cluster.local"))
print("short", socket.gethostbyname("web.web-headless"))
print("kubernetes.default", socket.gethostbyname("kubernetes.default"))
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
ctx = ssl.create_default_context(cafile=sa + "/ca.crt")
request = urllib.request.Request("https://kubernetes.default.svc/version",
                                 headers={{"Authorization": "Bearer " + open(sa + "/token").read()}})
print("version", json.load(urllib.request.urlopen(request, context=ctx, timeout=10))["gitVersion"])
"""
    pod, logs = run_pod(core, ns, "dns", script)
    assert_succeeded(pod, logs)
    lines = dict(line.split(" ", 1) for line in logs.strip().splitlines())
    assert lines["web"] == web.status.pod_ip
    assert lines["short"] == web.status.pod_ip
    service_ip = core.read_namespaced_service("kubernetes", "default").spec.cluster_ip
    assert lines["kubernetes.default"] == service_ip
    assert lines["version"].startswith("v1.")


def test_garbage_collector_deletes_owned_pod(core, ns):
    owner = core.create_namespaced_config_map(ns, {"metadata": {"name": "owner"}})
    manifest = pod_manifest("owned", "import time; time.sleep(3600)")
    manifest["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    ]
    core.create_namespaced_pod(ns, manifest)
    core.delete_namespaced_config_map("owner", ns, propagation_policy="Background")

    def gone() -> bool:
        try:
            core.read_namespaced_pod("owned", ns)
            return False
        except ApiException as error:
            return error.status == 404

    wait_for(gone, 90, "the garbage collector to delete the owned pod")


def test_gpu_requests_are_scheduled_for_real(core, ns):
    # real nodes only: kwok's fake nodes (tests/cluster/kwok.py) advertise GPUs too, behind a taint
    nodes = [n for n in core.list_node().items if FAKE_NODE_KEY not in (n.metadata.labels or {})]
    capacity = max(int(n.status.allocatable.get("nvidia.com/gpu", "0")) for n in nodes)
    assert capacity >= 1, "no node advertises nvidia.com/gpu"
    # One GPU fits (the others may be in use by tests beside this one), more than the node has never does.
    gpu = {"resources": {"limits": {"nvidia.com/gpu": "1"}}}
    pod, logs = run_pod(core, ns, "gpu-fits", "print('ok')", container=gpu)
    assert_succeeded(pod, logs)

    too_many = {"resources": {"limits": {"nvidia.com/gpu": str(capacity + 1)}}}
    core.create_namespaced_pod(ns, pod_manifest("gpu-too-many", "print('never')", container=too_many))

    def unschedulable():
        pod = core.read_namespaced_pod("gpu-too-many", ns)
        return next(
            (c for c in pod.status.conditions or [] if c.type == "PodScheduled" and c.reason == "Unschedulable"), None
        )

    condition = wait_for(unschedulable, 60, "the scheduler to mark the pod Unschedulable")
    assert "nvidia.com/gpu" in condition.message
    pod = core.read_namespaced_pod("gpu-too-many", ns)
    assert pod.status.phase == "Pending" and not pod.spec.node_name


def test_api_server_enforces_crd_schema(api, ns):
    ext = client.ApiextensionsV1Api(api)
    custom = client.CustomObjectsApi(api)
    name = f"widgets.{CRD_GROUP}"
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "required": ["size"],
                "properties": {
                    "size": {"type": "integer", "minimum": 1, "maximum": 10},
                    "min": {"type": "integer"},
                    "max": {"type": "integer"},
                },
                "x-kubernetes-validations": [
                    {
                        "rule": "!has(self.min) || !has(self.max) || self.min <= self.max",
                        "message": "min must not exceed max",
                    }
                ],
            }
        },
    }
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {
            "group": CRD_GROUP,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}],
        },
    }
    try:
        ext.delete_custom_resource_definition(name)
        wait_for(lambda: _crd_absent(ext, name), 60, "the old test CRD to go")
    except ApiException as error:
        assert error.status == 404
    ext.create_custom_resource_definition(crd)
    try:
        wait_for(lambda: _crd_established(ext, name), 60, "the CRD to be established")

        def create(spec: dict):
            body = {
                "apiVersion": f"{CRD_GROUP}/v1",
                "kind": "Widget",
                "metadata": {"name": uuid.uuid4().hex[:8]},
                "spec": spec,
            }
            return custom.create_namespaced_custom_object(CRD_GROUP, "v1", ns, "widgets", body)

        # the discovery cache of a fresh CRD can lag a moment: retry the valid create until it is served
        wait_for(lambda: _try(create, {"size": 3}), 30, "a valid Widget to be accepted")
        for spec, expected in [
            ({"size": "three"}, "spec.size"),
            ({"size": 11}, "spec.size"),
            ({}, "spec.size"),
            ({"size": 2, "min": 5, "max": 1}, "min must not exceed max"),
        ]:
            with pytest.raises(ApiException) as raised:
                create(spec)
            assert raised.value.status == 422, raised.value.body
            assert expected in raised.value.body, raised.value.body
    finally:
        ext.delete_custom_resource_definition(name)


def _try(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args) or True
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def _crd_established(ext, name: str) -> bool:
    conditions = ext.read_custom_resource_definition(name).status.conditions or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


def _crd_absent(ext, name: str) -> bool:
    try:
        ext.read_custom_resource_definition(name)
        return False
    except ApiException as error:
        return error.status == 404


def _bound(core, ns: str, name: str):
    pvc = core.read_namespaced_persistent_volume_claim(name, ns)
    return pvc if pvc.status.phase == "Bound" else None


@pytest.mark.parametrize("mode", ["ReadWriteMany", "ReadWriteOnce"])
def test_claim_data_written_by_one_pod_is_read_by_the_next(core, ns, mode):
    claim = f"data-{mode.lower()}"
    core.create_namespaced_persistent_volume_claim(
        ns,
        {
            "metadata": {"name": claim},
            "spec": {"accessModes": [mode], "resources": {"requests": {"storage": "1Gi"}}},  # the default class
        },
    )
    pvc = wait_for(lambda: _bound(core, ns, claim), 60, f"claim {claim} to be bound")
    volume = {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}
    mount = {"volumeMounts": [{"name": "data", "mountPath": "/data"}]}
    token = uuid.uuid4().hex
    pod, logs = run_pod(
        core, ns, f"writer-{mode.lower()}", f"open('/data/ckpt', 'w').write('{token}')", container=mount, **volume
    )
    assert_succeeded(pod, logs)
    pod, logs = run_pod(
        core, ns, f"reader-{mode.lower()}", "print(open('/data/ckpt').read())", container=mount, **volume
    )
    assert_succeeded(pod, logs)
    assert token in logs

    # the volume follows the class's reclaim policy once the claim and its pods are gone
    volume_name = pvc.spec.volume_name
    policy = client.CoreV1Api(core.api_client).read_persistent_volume(volume_name).spec.persistent_volume_reclaim_policy
    for name in (f"writer-{mode.lower()}", f"reader-{mode.lower()}"):
        core.delete_namespaced_pod(name, ns)
    core.delete_namespaced_persistent_volume_claim(claim, ns)
    if policy == "Delete":

        def volume_gone() -> bool:
            try:
                core.read_persistent_volume(volume_name)
                return False
            except ApiException as error:
                return error.status == 404

        wait_for(volume_gone, 90, f"volume {volume_name} to be deleted with its claim")
