"""The one module that talks to the Kubernetes API (the official client, called from threads only).

Objects go in and come out as plain dicts, the shape the builders and the status code use. Every write is
idempotent: creating what exists is success (names are deterministic), deleting what is gone is success.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from kubetf import api, metrics

log = logging.getLogger("kubetf.kube")

Obj = dict[str, Any]


class RateLimiter:
    """Client-side token bucket (like client-go's QPS/burst), so a burst of jobs cannot flood the API server."""

    def __init__(self, qps: float, burst: int) -> None:
        self.qps, self.burst = qps, burst
        self.tokens = float(burst)
        self.stamp = time.monotonic()
        self.lock = threading.Lock()

    def acquire(self) -> None:
        while True:
            with self.lock:
                now = time.monotonic()
                self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.qps)
                self.stamp = now
                if self.tokens >= 1:
                    self.tokens -= 1
                    return
                wait = (1 - self.tokens) / self.qps
            time.sleep(wait)


def load_config(kubeconfig: str | None = None) -> None:
    """In-cluster config inside a pod, else the kubeconfig (KUBECONFIG or ~/.kube/config)."""
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
    else:
        config.load_kube_config(config_file=kubeconfig)


class Kube:
    def __init__(self, qps: float = 50, burst: int = 100, timeout: tuple[float, float] = (5, 30)) -> None:
        configuration = client.Configuration.get_default_copy()
        configuration.connection_pool_maxsize = 32
        self.api_client = client.ApiClient(configuration)
        self.core = client.CoreV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)
        self.limiter = RateLimiter(qps, burst)
        self.timeout = timeout
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="kubetf-api")
        self.instance = socket.gethostname()

    def _call(self, verb: str, resource: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self.limiter.acquire()
        try:
            response = fn(*args, _preload_content=False, _request_timeout=self.timeout, **kwargs)
        except ApiException as error:
            metrics.API_ERRORS.labels(verb=verb, resource=resource, code=str(error.status)).inc()
            raise
        return json.loads(response.data) if response.data else None

    def _get(self, resource: str, fn: Any, *args: Any) -> Obj | None:
        """Read one object; None when it does not exist."""
        try:
            found: Obj = self._call("get", resource, fn, *args)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return found

    # ------------------------------------------------------------------ TrainingJobs

    def get_job(self, namespace: str, name: str) -> Obj | None:
        return self._get(
            api.PLURAL, self.custom.get_namespaced_custom_object, api.GROUP, api.VERSION, namespace, api.PLURAL, name
        )

    def patch_job_status(self, job: Obj, patch: Obj) -> Obj | None:
        """Merge-patch the status subresource; None when the job is gone."""
        meta = job["metadata"]
        try:
            updated: Obj = self._call(
                "patch", f"{api.PLURAL}/status", self.custom.patch_namespaced_custom_object_status,
                api.GROUP, api.VERSION, meta["namespace"], api.PLURAL, meta["name"], {"status": patch},
            )  # fmt: skip
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return updated

    def delete_job(self, namespace: str, name: str, uid: str | None = None) -> bool:
        """Delete a job (its children go with it); with `uid`, only that incarnation. False when not there."""
        body: Obj = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self._call(
                "delete", api.PLURAL, self.custom.delete_namespaced_custom_object,
                api.GROUP, api.VERSION, namespace, api.PLURAL, name, body=body,
            )  # fmt: skip
        except ApiException as error:
            if error.status in (404, 409):
                return False
            raise
        return True

    def create_job(self, job: Obj) -> Obj:
        namespace = job["metadata"].get("namespace") or "default"
        created: Obj = self._call(
            "create", api.PLURAL, self.custom.create_namespaced_custom_object,
            api.GROUP, api.VERSION, namespace, api.PLURAL, job,
        )  # fmt: skip
        return created

    # ------------------------------------------------------------------ children

    def list_pods(self, namespace: str, job_name: str) -> list[Obj]:
        result = self._call(
            "list", "pods", self.core.list_namespaced_pod, namespace, label_selector=f"{api.LABEL_JOB}={job_name}"
        )
        items: list[Obj] = result["items"]
        return items

    def create(self, obj: Obj) -> Obj | None:
        """Create a Pod, Service or PVC. Returns the object, or None when one of that name already exists."""
        kind, namespace = obj["kind"], obj["metadata"]["namespace"]
        create = {
            "Pod": self.core.create_namespaced_pod,
            "Service": self.core.create_namespaced_service,
            "PersistentVolumeClaim": self.core.create_namespaced_persistent_volume_claim,
        }[kind]
        try:
            created: Obj = self._call("create", kind.lower(), create, namespace, obj)
        except ApiException as error:
            if error.status == 409:
                return None
            if error.status == 403 and "NamespaceTerminating" in str(error.body):
                return None  # the namespace and the job in it are going away
            raise
        return created

    def create_all(self, objects: Iterable[Obj]) -> list[Obj]:
        """Create in parallel; returns those this call created (a name already taken is for the next reconcile)."""
        return [created for created in self.pool.map(self.create, objects) if created is not None]

    def delete_pods(self, pods: Iterable[Obj]) -> None:
        list(self.pool.map(self.delete_pod, pods))

    def delete_pod(self, pod: Obj) -> None:
        """Delete exactly this pod (uid precondition), with its own grace period so it can save a checkpoint."""
        meta = pod["metadata"]
        body = {"preconditions": {"uid": meta["uid"]}} if meta.get("uid") else {}
        try:
            self._call("delete", "pods", self.core.delete_namespaced_pod, meta["name"], meta["namespace"], body=body)
        except ApiException as error:
            if error.status not in (404, 409):  # gone, or already replaced by a newer pod of that name
                raise

    def get_pod(self, namespace: str, name: str) -> Obj | None:
        return self._get("pods", self.core.read_namespaced_pod, name, namespace)

    def pod_log(self, namespace: str, name: str, follow: bool = False, container: str | None = None) -> Any:
        """The pod's log as a stream of bytes lines (follow: until the container ends)."""
        self.limiter.acquire()
        response = self.core.read_namespaced_pod_log(
            name, namespace, container=container, follow=follow, _preload_content=False,
            _request_timeout=(self.timeout[0], None) if follow else self.timeout,
        )  # fmt: skip
        return response

    def list_events(self, namespace: str, name: str) -> list[Obj]:
        result = self._call(
            "list", "events", self.core.list_namespaced_event, namespace, field_selector=f"involvedObject.name={name}"
        )
        items: list[Obj] = result["items"]
        return items

    # ------------------------------------------------------------------ events

    def event(self, job: Obj, type_: str, reason: str, message: str) -> None:
        meta = job["metadata"]
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": api.API_VERSION,
                "kind": api.KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "source": {"component": "kubetf-operator"},
            "reportingComponent": "kubetf.io/operator",
            "reportingInstance": self.instance,
        }
        try:
            self._call("create", "events", self.core.create_namespaced_event, meta["namespace"], body)
        except ApiException as error:  # an event is never worth failing a reconcile for
            log.warning("could not record event %s on %s/%s: %s", reason, meta["namespace"], meta["name"], error)
