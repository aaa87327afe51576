"""Kubeflow's training-operator v1.9.4, run out of cluster as a process against a test cluster, for
`make bench-compare`.

The binary and the TFJob CRD come from the Go module proxy (tests/bench/training-operator.sh, cached under
~/.cache/kubetf/training-operator-v1.9.4/). Out of cluster the operator cannot turn its webhook cert rotation off:
it needs the Secret `training-operator-webhook-cert` in $MY_POD_NAMESPACE and tls.crt/tls.key in
/tmp/k8s-webhook-server/serving-certs before it starts, so both are made here from a self-signed CA. No
ValidatingWebhookConfiguration is installed, so the API server never calls its webhook: TFJobs are created as
they are written and the operator's own defaulting applies.
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "training-operator.sh"
VERSION = "v1.9.4"
GROUP, API_VERSION, PLURAL, KIND = "kubeflow.org", "v1", "tfjobs", "TFJob"
JOB_LABEL = "training.kubeflow.org/job-name"
CRD_NAME = "tfjobs.kubeflow.org"
CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
SECRET = "training-operator-webhook-cert"
SERVICE = "training-operator"  # --webhook-service-name default: the cert is for training-operator.<ns>.svc
OPERATOR_NAMESPACE = "kubetf-bench-kubeflow"


def build() -> Path:
    """The training-operator binary (built once, about 5 min on 2 cores, then cached)."""
    out = subprocess.run(["bash", str(SCRIPT), "build"], check=True, stdout=subprocess.PIPE, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def crd_path() -> Path:
    out = subprocess.run(["bash", str(SCRIPT), "crd"], check=True, stdout=subprocess.PIPE, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def install_crd(kubeconfig: str, api: client.ApiClient) -> None:
    """The TFJob CRD from the module, applied server-side (611 KB: too big for the last-applied annotation)."""
    kubectl = shutil.which("kubectl", path=f"{Path.home() / '.cache/kubetf/bin'}{os.pathsep}{os.environ['PATH']}")
    if not kubectl:
        raise RuntimeError("kubectl not found (tests/cluster/local-cluster.sh tools)")
    subprocess.run(
        [kubectl, "--kubeconfig", kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(crd_path())],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    ext = client.ApiextensionsV1Api(api)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        conditions = ext.read_custom_resource_definition(CRD_NAME).status.conditions or []
        if any(c.type == "Established" and c.status == "True" for c in conditions):
            return
        time.sleep(0.2)
    raise TimeoutError(f"CRD {CRD_NAME} not established")


def _self_signed(namespace: str, directory: Path) -> dict[str, bytes]:
    """A CA and a server cert for training-operator.<namespace>.svc signed by it, as the cert rotator would make."""
    dns = f"{SERVICE}.{namespace}.svc"

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, cwd=directory, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650", "-subj", "/CN=training-operator-ca",
            "-keyout", "ca.key", "-out", "ca.crt")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={dns}", "-addext", f"subjectAltName=DNS:{dns}",
            "-addext", "extendedKeyUsage=serverAuth", "-keyout", "tls.key", "-out", "tls.csr")  # fmt: skip
    openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "3650", "-copy_extensions", "copy", "-out", "tls.crt")  # fmt: skip
    return {name: (directory / name).read_bytes() for name in ("ca.crt", "ca.key", "tls.crt", "tls.key")}


def prepare_certs(api: client.ApiClient, namespace: str = OPERATOR_NAMESPACE) -> None:
    """The namespace, the webhook cert Secret, and the serving certs on disk, unless already there."""
    core = client.CoreV1Api(api)
    try:
        core.create_namespace({"metadata": {"name": namespace}})
    except ApiException as error:
        if error.status != 409:
            raise
    try:
        secret = core.read_namespaced_secret(SECRET, namespace)
        data = {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}
    except ApiException as error:
        if error.status != 404:
            raise
        data = {}
    if not all(data.get(k) for k in ("ca.crt", "ca.key", "tls.crt", "tls.key")):
        data = _self_signed(namespace, Path(tempfile.mkdtemp()))
        body = {
            "metadata": {"name": SECRET, "namespace": namespace},
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }
        try:
            core.create_namespaced_secret(namespace, body)
        except ApiException as error:
            if error.status != 409:
                raise
            core.replace_namespaced_secret(SECRET, namespace, body)
    CERT_DIR.mkdir(parents=True, exist_ok=True)
    for name in ("tls.crt", "tls.key", "ca.crt"):
        (CERT_DIR / name).write_bytes(data[name])


def _die_with_parent() -> None:
    """In the child: SIGTERM when the benchmark dies, so no operator is left acting on the cluster."""
    import ctypes
    import signal

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TrainingOperator:
    """`training-operator.v1 --enable-scheme=tfjob` as a process, otherwise with its default settings (1 reconcile
    thread, 20 QPS / 30 burst, all namespaces, no leader election)."""

    def __init__(self, binary: Path, kubeconfig: str, log_path: Path, namespace: str = OPERATOR_NAMESPACE) -> None:
        self.binary, self.kubeconfig, self.log_path, self.namespace = binary, kubeconfig, log_path, namespace
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 120) -> None:
        probe, metrics, webhook = _free_port(), _free_port(), _free_port()
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                str(self.binary),
                "--enable-scheme=tfjob",
                f"--metrics-bind-address=127.0.0.1:{metrics}",
                f"--health-probe-bind-address=127.0.0.1:{probe}",
                f"--webhook-server-port={webhook}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "KUBECONFIG": self.kubeconfig, "MY_POD_NAMESPACE": self.namespace},
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"training-operator exited with {self.process.returncode}; log: {self.log_path}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{probe}/readyz", timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"training-operator not ready in {timeout:.0f}s; log: {self.log_path}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def tfjob(namespace: str, name: str, template: dict[str, Any], chief: int = 1, workers: int = 4) -> dict[str, Any]:
    """A TFJob of the given shape; everything else left to the operator's defaults."""
    return {
        "apiVersion": f"{GROUP}/{API_VERSION}",
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "tfReplicaSpecs": {
                "Chief": {"replicas": chief, "template": template},
                "Worker": {"replicas": workers, "template": template},
            }
        },
    }


def children(job: dict[str, Any]) -> list[dict[str, Any]]:
    """What training-operator creates for a created TFJob (one pod and one headless Service per replica, labelled
    and owned the same way, TF_CONFIG included), for the raw API baseline of the same objects."""
    import copy
    import json

    meta = job["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    owner = {
        "apiVersion": f"{GROUP}/{API_VERSION}",
        "kind": KIND,
        "name": name,
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    specs = job["spec"]["tfReplicaSpecs"]
    cluster = {
        rtype.lower(): [f"{name}-{rtype.lower()}-{i}.{namespace}.svc:2222" for i in range(spec["replicas"])]
        for rtype, spec in specs.items()
    }
    objects: list[dict[str, Any]] = []
    for rtype, spec in specs.items():
        for index in range(spec["replicas"]):
            child = f"{name}-{rtype.lower()}-{index}"
            labels = {
                "training.kubeflow.org/operator-name": "tfjob-controller",
                JOB_LABEL: name,
                "training.kubeflow.org/replica-type": rtype.lower(),
                "training.kubeflow.org/replica-index": str(index),
            }
            if rtype == "Chief":
                labels["training.kubeflow.org/job-role"] = "master"
            metadata = {"name": child, "namespace": namespace, "labels": labels, "ownerReferences": [owner]}
            pod_spec = copy.deepcopy(spec["template"]["spec"])
            pod_spec["restartPolicy"] = "Never"
            container = pod_spec["containers"][0]
            tf_config = {"cluster": cluster, "task": {"type": rtype.lower(), "index": index}, "environment": "cloud"}
            container["env"] = [*(container.get("env") or []), {"name": "TF_CONFIG", "value": json.dumps(tf_config)}]
            container["ports"] = [{"name": "tfjob-port", "containerPort": 2222, "protocol": "TCP"}]
            objects.append({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec})
            objects.append(
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": copy.deepcopy(metadata),
                    "spec": {
                        "clusterIP": "None",
                        "selector": labels,
                        "ports": [{"name": "tfjob-port", "port": 2222, "targetPort": 2222}],
                    },
                }
            )
    return objects
