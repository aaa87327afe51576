"""`kubetf tensorboard JOB`: TensorBoard on the job's logs, on this machine's port.

The trainer library writes TensorBoard logs to the checkpoint volume (`$KUBETF_CHECKPOINT_DIR/tensorboard`). This
starts one pod that mounts that volume read-only and runs TensorBoard from the job's own image (the trainer image
has it), forwards a local port to it through the API server, prints the URL, and deletes the pod on exit. The pod
is owned by the job, so it goes with the job if this command is killed before it can clean up.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from typing import Any, TextIO

from kubernetes import client
from kubernetes.stream import portforward

from kubetf.cli.jobctl import JobError
from kubetf.cluster.kube import Kube, Obj
from kubetf.core import api, builders

PORT = 6006
READY_TIMEOUT = 180.0


def tensorboard_pod(job: Obj, image: str | None = None) -> Obj:
    """The pod that serves the job's TensorBoard logs, read-only; JobError when the job keeps no logs."""
    job = api.with_defaults(job)
    checkpoint = job["spec"].get("checkpoint")
    if not checkpoint:
        raise JobError(
            f"trainingjob {api.namespace(job)}/{api.name(job)} has no spec.checkpoint: its TensorBoard logs are "
            "written to the checkpoint volume, so there is nothing to show"
        )
    mount = checkpoint["mountPath"]
    if image is None:
        role = "chief" if "chief" in api.replica_specs(job) else "worker"
        template = job["spec"]["replicaSpecs"][role]["template"]["spec"]
        image = template["containers"][api.training_container_index(template)]["image"]
    owner = {"apiVersion": f"{api.GROUP}/{api.VERSION}", "kind": api.KIND, "name": api.name(job),
             "uid": job["metadata"]["uid"]}  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{api.name(job)[:50]}-tensorboard",
            "namespace": api.namespace(job),
            "labels": {"kubetf.io/tensorboard": api.name(job)},
            "ownerReferences": [owner],
        },
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "tensorboard",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": [
                        "tensorboard",
                        "--logdir",
                        f"{mount}/tensorboard",
                        "--host",
                        "0.0.0.0",
                        "--port",
                        str(PORT),
                    ],
                    "ports": [{"name": "tensorboard", "containerPort": PORT}],
                    "readinessProbe": {"tcpSocket": {"port": PORT}, "periodSeconds": 1},
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                    "volumeMounts": [{"name": "logs", "mountPath": mount, "readOnly": True}],
                }
            ],
            "volumes": [
                {"name": "logs", "persistentVolumeClaim": {"claimName": builders.pvc_name(job), "readOnly": True}}
            ],
        },
    }


def run(kube: Kube, namespace: str, name: str, local_port: int, image: str | None, out: TextIO) -> int:
    job = kube.get_job(namespace, name)
    if job is None:
        raise JobError(f"trainingjob {namespace}/{name} not found")
    pod = tensorboard_pod(job, image)
    pod_name = pod["metadata"]["name"]
    listener = socket.create_server(("127.0.0.1", local_port))  # a port in use fails before anything is created
    forwards = _OpenForwards()
    _stop_on_signals()
    try:  # from here a signal at any point still deletes the pod
        _delete(kube, namespace, pod_name)
        _wait(lambda: kube.get_pod(namespace, pod_name) is None, 60, f"an earlier {pod_name} to go")
        kube.create(pod)
        out.write(f"starting TensorBoard for {namespace}/{name} in pod {pod_name} ...\n")
        out.flush()
        _wait(lambda: _ready(kube.get_pod(namespace, pod_name)), READY_TIMEOUT, f"pod {pod_name} to be ready")
        port = listener.getsockname()[1]
        out.write(f"TensorBoard: http://127.0.0.1:{port}/  (Ctrl-C stops it and deletes the pod)\n")
        out.flush()
        while True:
            connection, _ = listener.accept()
            threading.Thread(
                target=_forward, args=(kube, namespace, pod_name, connection, forwards), daemon=True
            ).start()
    except KeyboardInterrupt:
        return 0
    finally:
        listener.close()
        forwards.close_all()
        with contextlib.suppress(Exception):
            _delete(kube, namespace, pod_name)
            out.write(f"deleted pod {pod_name}\n")
            out.flush()  # before the port-forward threads go down with the interpreter


def _stop_on_signals() -> None:
    """Ctrl-C and SIGTERM (`kill`) alike stop it and delete the pod. Also when a shell started it in the background:
    SIGINT is then ignored from the start, and Python raises no KeyboardInterrupt for it (CI ran it so)."""

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, stop)


def _delete(kube: Kube, namespace: str, pod_name: str) -> None:
    kube.delete_pod({"metadata": {"name": pod_name, "namespace": namespace}}, 0)


def _ready(pod: Obj | None) -> bool:
    if pod is None:
        raise JobError("the TensorBoard pod is gone")
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        raise JobError(f"the TensorBoard pod ended: {status.get('phase')} (kubectl logs {pod['metadata']['name']})")
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise JobError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.5)


class _OpenForwards:
    """The port-forwards open now. The client's port-forward threads are not daemons: one left open (a browser's
    keep-alive connection) kept the process alive after Ctrl-C until the kubelet dropped the stream."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open: set[Any] = set()
        self.closed = False

    def add(self, forward: Any) -> bool:
        with self.lock:
            if not self.closed:
                self.open.add(forward)
            return not self.closed

    def discard(self, forward: Any) -> None:
        with self.lock:
            self.open.discard(forward)

    def close_all(self) -> None:
        with self.lock:
            self.closed = True
            forwards, self.open = list(self.open), set()
        for forward in forwards:
            with contextlib.suppress(Exception):
                forward.close()


def _forward(kube: Kube, namespace: str, pod_name: str, connection: socket.socket, forwards: _OpenForwards) -> None:
    """One local connection, relayed to the pod's port through its own port-forward stream, on an API client of its
    own: the client's stream functions swap its request method for a websocket one while they run, and a call made
    meanwhile on the shared client (the pod's deletion at Ctrl-C) went through it and failed."""
    own = client.CoreV1Api(client.ApiClient(kube.core.api_client.configuration))
    forward = portforward(own.connect_get_namespaced_pod_portforward, pod_name, namespace, ports=str(PORT))
    if not forwards.add(forward):  # Ctrl-C came while it opened
        forward.close()
        connection.close()
        return
    remote = forward.socket(PORT)
    remote.setblocking(True)

    def pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    back = threading.Thread(target=pump, args=(remote, connection), daemon=True)
    back.start()
    pump(connection, remote)
    back.join(30)
    for end in (connection, remote):
        with contextlib.suppress(OSError):
            end.close()
    with contextlib.suppress(Exception):
        forward.close()
    forwards.discard(forward)
