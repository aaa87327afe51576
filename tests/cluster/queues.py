"""Kueue's objects for tests on a real cluster: a ResourceFlavor, a ClusterQueue with GPU quota and its LocalQueue,
and the readings tests make of them (used by the integration and e2e tiers)."""

from __future__ import annotations

import uuid
from typing import Any

from kubernetes.client.exceptions import ApiException

from kubetf.core.scheduling import workload as kueue
from tests.cluster.fixture import wait_for

GROUP, VERSION = kueue.GROUP, kueue.VERSION
FLAVOR = "kubetf-test-flavor"


def _object(kind: str, name: str, **rest: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": {"name": name}, **rest}


def make_flavor(cluster: Any) -> None:
    """The ResourceFlavor every test queue uses (kept: cluster-scoped and the same for every test)."""
    try:
        cluster.custom.create_cluster_custom_object(
            GROUP, VERSION, "resourceflavors", _object("ResourceFlavor", FLAVOR)
        )
    except ApiException as error:
        if error.status != 409:
            raise


class Queue:
    """A ClusterQueue with `gpus` nvidia.com/gpu and `cpu` (preempting lower priorities within it), and its
    LocalQueue `local`."""

    def __init__(self, cluster: Any, namespace: str, gpus: int, cpu: str = "100", local: str = "team-a") -> None:
        self.cluster, self.namespace = cluster, namespace
        self.name = f"cq-{uuid.uuid4().hex[:6]}"
        self.local = local
        resources = [
            {"name": "cpu", "nominalQuota": cpu},
            {"name": "memory", "nominalQuota": "100Gi"},
            {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)},
        ]
        spec = {
            "namespaceSelector": {},
            "preemption": {"withinClusterQueue": "LowerPriority"},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                    "flavors": [{"name": FLAVOR, "resources": resources}],
                }
            ],
        }
        cluster.custom.create_cluster_custom_object(
            GROUP, VERSION, "clusterqueues", _object("ClusterQueue", self.name, spec=spec)
        )
        local = _object("LocalQueue", self.local, spec={"clusterQueue": self.name})
        cluster.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "localqueues", local)
        wait_for(self._active, 30, f"ClusterQueue {self.name} active")

    def _active(self) -> bool:
        status = self.cq().get("status") or {}
        return any(c["type"] == "Active" and c["status"] == "True" for c in status.get("conditions") or [])

    def cq(self) -> dict[str, Any]:
        return self.cluster.custom.get_cluster_custom_object(GROUP, VERSION, "clusterqueues", self.name)

    def gpus_in_use(self) -> int:
        for flavor in (self.cq().get("status") or {}).get("flavorsReservation") or []:
            for resource in flavor.get("resources") or []:
                if resource["name"] == "nvidia.com/gpu":
                    return int(resource.get("total") or 0)
        return 0

    def workload(self, job: dict) -> dict | None:
        """The job's Workload (`job`: as created, with its uid)."""
        try:
            return self.cluster.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "workloads", kueue.workload_name(job)
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def explain(self, job: dict) -> str:
        """What holds the quota: the job's Workload (finalizers, deletion, conditions, owners) and its pods."""
        workload = self.workload(job)
        if workload is None:
            state = "its Workload is gone"
        else:
            meta, status = workload["metadata"], workload.get("status") or {}
            conditions = {c["type"]: f"{c['status']} {c.get('reason')}" for c in status.get("conditions") or []}
            state = (
                f"Workload finalizers {meta.get('finalizers')}, deleting since {meta.get('deletionTimestamp')}, "
                f"{len(meta.get('ownerReferences') or [])} owners, conditions {conditions}"
            )
        selector = f"kubetf.io/job-name={job['metadata']['name']}"
        pods = self.cluster.core.list_namespaced_pod(self.namespace, label_selector=selector).items
        left = [f"{p.metadata.name} {p.status.phase} finalizers {p.metadata.finalizers}" for p in pods]
        return f"{state}; its pods left: {left}; ClusterQueue status {self.cq().get('status')}"

    def delete(self) -> None:
        self.cluster.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, "localqueues", self.local)
        self.cluster.custom.delete_cluster_custom_object(GROUP, VERSION, "clusterqueues", self.name)


def priority_classes(cluster: Any, **values: int) -> None:
    """WorkloadPriorityClasses name=value (kept: cluster-scoped, the same for every test)."""
    for name, value in values.items():
        body = _object("WorkloadPriorityClass", name, value=value)
        try:
            cluster.custom.create_cluster_custom_object(GROUP, VERSION, "workloadpriorityclasses", body)
        except ApiException as error:
            if error.status != 409:
                raise


def admitted(cluster: Any, namespace: str, job: str, count: int, what: str, timeout: float) -> dict[str, dict]:
    """The job's `count` live pods: the operator creates them once Kueue has admitted the job."""
    return cluster.wait_pods(namespace, job, lambda p: len(p) == count, what, timeout)


def is_admitted(workload: dict | None) -> bool:
    conditions = ((workload or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Admitted" and c["status"] == "True" for c in conditions)


def finish_jobs(cluster: Any, namespace: str, timeout: float = 30) -> None:
    """Delete the namespace's jobs while the operator runs: it lets their Workloads go (their finalizer)."""
    for name in cluster.statuses(namespace):
        cluster.custom.delete_namespaced_custom_object("kubetf.io", "v1alpha1", namespace, "trainingjobs", name)
    wait_for(lambda: not cluster.core.list_namespaced_pod(namespace).items, timeout, f"every pod in {namespace} gone")
