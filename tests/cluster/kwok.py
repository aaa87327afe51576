"""Fake nodes (kwok) of the local cluster, for tests and benchmarks (see tests/cluster/README.md, "Fake nodes").

A fake node `kwok-node-<i>` is a real Node object whose Lease, status and pods kwok keeps as a kubelet would,
without containers. It carries the label, annotation and NoSchedule taint `kwok.x-k8s.io/node=fake`, so only
pods that tolerate the taint land there; `on_fake_nodes(pod_spec)` makes a pod spec do that (and select them).
kwok runs such a pod at once (phase Running, Ready, a pod IP from 10.160.0.0/12); it ends it when asked through
the annotations below (or when a test patches the pod's status itself, as tests/integration/conftest.py `exit`).

A *dedicated* fake node (`ensure_dedicated_node`) is one test's own: a fake node of a chosen name and GPU count that
also carries the label and NoSchedule taint `kwok.kubetf.io/dedicated=<its name>`, so that only the pods
`on_dedicated_node` made land there, never other tests' pods on fake nodes (whose GPUs it would count otherwise).
"""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "local-cluster.sh"
LOCAL_KUBECONFIG = Path(os.environ.get("KUBETF_CLUSTER_DIR", "/var/lib/kubetf-cluster")) / "admin.kubeconfig"

FAKE_NODE_KEY = "kwok.x-k8s.io/node"
FAKE_NODE_PREFIX = "kwok-node-"
FAKE_NODE_SELECTOR = {FAKE_NODE_KEY: "fake"}
FAKE_NODE_TOLERATION = {"key": FAKE_NODE_KEY, "operator": "Exists", "effect": "NoSchedule"}
FAKE_POD_NETWORK = "10.160.0.0/12"
# kwok-stages.yaml `pod-exit`: a Running pod with this annotation ends with that exit code (Succeeded for "0",
# Failed otherwise), after the Go duration in EXIT_AFTER ("30s"; counted from when kwok saw it Running).
EXIT_CODE = "kwok.kubetf.io/exit-code"
EXIT_AFTER = "kwok.kubetf.io/exit-after"
DEDICATED_KEY = "kwok.kubetf.io/dedicated"  # a dedicated node's label and taint; the value is the node's name


def on_fake_nodes(pod_spec: dict[str, Any]) -> dict[str, Any]:
    """A copy of `pod_spec` that tolerates the fake nodes' taint and selects them."""
    spec = copy.deepcopy(pod_spec)
    spec.setdefault("nodeSelector", {}).update(FAKE_NODE_SELECTOR)
    tolerations = spec.setdefault("tolerations", [])
    if FAKE_NODE_TOLERATION not in tolerations:
        tolerations.append(dict(FAKE_NODE_TOLERATION))
    return spec


def on_dedicated_node(pod_spec: dict[str, Any], node: str) -> dict[str, Any]:
    """A copy of `pod_spec` that tolerates the dedicated fake node `node` (and the fake nodes' taint) and selects it
    alone."""
    spec = on_fake_nodes(pod_spec)
    spec["nodeSelector"][DEDICATED_KEY] = node
    spec["tolerations"].append({"key": DEDICATED_KEY, "operator": "Equal", "value": node, "effect": "NoSchedule"})
    return spec


def is_local(kubeconfig: str) -> bool:
    """Is this the kubeconfig of the cluster tests/cluster/local-cluster.sh runs (where kwok can be started)?"""
    first = kubeconfig.split(os.pathsep)[0]
    return Path(first).resolve() == LOCAL_KUBECONFIG.resolve()


def names(count: int) -> list[str]:
    return [f"{FAKE_NODE_PREFIX}{i}" for i in range(count)]


def ready_fake_nodes(core: Any) -> list[str]:
    """Names of the fake nodes whose Ready condition is True (`core`: a kubernetes.client.CoreV1Api)."""
    nodes = core.list_node(label_selector=f"{FAKE_NODE_KEY}=fake").items
    return sorted(
        n.metadata.name
        for n in nodes
        if any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
    )


def _script(kubeconfig: str, *args: str, timeout: float) -> None:
    if not is_local(kubeconfig):
        raise RuntimeError(
            f"fake nodes are made by tests/cluster/local-cluster.sh; KUBECONFIG={kubeconfig} is another cluster. "
            f"Run kwok there yourself: nodes {FAKE_NODE_PREFIX}0..N-1 annotated, labelled and tainted "
            f"{FAKE_NODE_KEY}=fake (the taint NoSchedule), kwok with --manage-nodes-with-annotation-selector="
            f"{FAKE_NODE_KEY}=fake --config tests/cluster/kwok-stages.yaml"
        )
    result = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"local-cluster.sh {' '.join(args)} exited {result.returncode}:\n{result.stderr[-3000:]}")


def ensure_fake_nodes(kubeconfig: str, core: Any, count: int) -> list[str]:
    """kwok-node-0..count-1, Ready: added to the local cluster when missing (kwok built and started on first use,
    a stopped one started again); on another cluster they must already be there."""
    wanted = names(count)
    if not set(wanted) <= set(ready_fake_nodes(core)):
        # cold: builds kwok (minutes), then seconds
        _script(kubeconfig, "fake-nodes", str(count), timeout=1800)
    missing = set(wanted) - set(ready_fake_nodes(core))
    if missing:
        raise RuntimeError(f"fake nodes not Ready: {sorted(missing)}")
    return wanted


def stop_fake_node(kubeconfig: str, *nodes: str) -> None:
    """The node vanishes abruptly: kwok stops managing it (its label kwok.kubetf.io/managed becomes "false"): no
    more Lease renewals, node or pod updates. The node lifecycle controller marks it NotReady (Ready Unknown) about
    50 s later (node-monitor-grace-period), taints it node.kubernetes.io/unreachable, and taint eviction deletes its
    pods after their tolerationSeconds; nothing confirms those deletions, so the pods stay Terminating, as on a
    real lost node."""
    _script(kubeconfig, "fake-node-stop", *nodes, timeout=120)


def start_fake_node(kubeconfig: str, *nodes: str) -> None:
    """kwok manages the node again: Ready within seconds; pods left Terminating on it are then deleted."""
    _script(kubeconfig, "fake-node-start", *nodes, timeout=120)


def ensure_dedicated_node(kubeconfig: str, core: Any, name: str, gpus: int) -> str:
    """The dedicated fake node `name` advertising `gpus` nvidia.com/gpu, Ready (made, or made anew when it has another
    size; kwok built and started on first use). Another cluster must have it already."""
    if not is_local(kubeconfig):
        node = next(iter(core.list_node(field_selector=f"metadata.name={name}").items), None)
        labels = (node.metadata.labels or {}) if node else {}
        if labels.get(DEDICATED_KEY) != name or (node.status.allocatable or {}).get("nvidia.com/gpu") != str(gpus):
            raise RuntimeError(
                f"KUBECONFIG={kubeconfig} is not the local cluster: add the fake node {name} yourself (kwok), with "
                f"{gpus} nvidia.com/gpu, the fake nodes' label, annotation and taint {FAKE_NODE_KEY}=fake, and the "
                f"label and NoSchedule taint {DEDICATED_KEY}={name} (tests/cluster/local-cluster.sh dedicated-node)"
            )
        return name
    _script(kubeconfig, "dedicated-node", name, str(gpus), timeout=1800)  # cold: builds kwok (minutes), then ~1 s
    if name not in ready_fake_nodes(core):
        raise RuntimeError(f"dedicated fake node {name} not Ready")
    return name


def delete_dedicated_nodes(kubeconfig: str, *nodes: str) -> None:
    """Delete dedicated fake nodes (pods still bound there are force-deleted first: nobody would confirm them); on
    another cluster they are left as they were found."""
    if nodes and is_local(kubeconfig):
        _script(kubeconfig, "dedicated-node-delete", *nodes, timeout=300)
