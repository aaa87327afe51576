"""A node that stops reporting: its pods are force-deleted, and a restart it caused counts as a disruption.

A node that vanishes without a word is marked Unknown only after the node controller's grace period
(kube-controller-manager --node-monitor-grace-period, 50 s by default). MultiWorkerMirrored peers crash on the
lost collective well before that, and their exit is all the operator saw: the restart is counted as a failure.
The restart waits for every old pod anyway (policy.barrier), so the cause is settled once the node is known lost:
if it stopped reporting before the failure, the failure followed from it and the restart is a disruption. A
failure that came first was the program's own (a traceback), and stays one: it counts against backoffLimit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubetf.core import api
from kubetf.core import status as st
from kubetf.core.api import Job
from kubetf.core.plan import Event
from kubetf.core.status import TaskView

Pod = dict[str, Any]


def node(pod: Pod) -> str | None:
    return (pod.get("spec") or {}).get("nodeName")


def force_deletions(
    job: Job, pods: list[Pod], delete: list[Pod], lost_nodes: Mapping[str, float]
) -> tuple[list[Pod], list[Pod], list[Event]]:
    """Split the deletions: (those through the kubelet, those forced, the ForceDeleted events). Pods on a lost
    node, being deleted already or to be deleted, are forced (unless the job opts out): their kubelet will never
    confirm a graceful deletion, and a replacement waits until the old pod is gone."""
    if not api.run_policy(job)["forceDeleteOnNodeLoss"]:
        return delete, [], []
    doomed = [p for p in pods if st.is_deleting(p)] + delete
    forced = [p for p in doomed if node(p) in lost_nodes]
    events = [
        Event("Warning", "ForceDeleted", f"{p['metadata']['name']}: node {node(p)} stopped reporting and cannot "
              "confirm the deletion")
        for p in forced
    ]  # fmt: skip
    return [p for p in delete if not any(p is f for f in forced)], forced, events


def next_look(pods: list[Pod], lost_nodes: Mapping[str, float], now: float, every: float) -> float | None:
    """When to look again at the nodes of pods being deleted elsewhere: a node that stops reporting sends no event
    of its own."""
    waiting_on = {node(p) for p in pods if st.is_deleting(p)} - set(lost_nodes) - {None}
    return now + every if waiting_on else None


def caused_restart(views: dict[str, TaskView], status: dict[str, Any], lost_nodes: Mapping[str, float]) -> str | None:
    """When the restart counted as a failure followed the loss of an old pod's node: recount it as a disruption
    in `status` and return the condition's message; None when it was no such restart."""
    restarts = status["restarts"]
    failed_at = st.parse_time(restarts.get("lastTime"))
    if restarts.get("lastKind") != "Failure" or failed_at is None:
        return None
    lost = [p for v in views.values() for p in v.stale if lost_nodes.get(node(p) or "", failed_at + 1) <= failed_at]
    if not lost:
        return None
    pod_name, lost_node = lost[0]["metadata"]["name"], node(lost[0])
    restarts["failures"] = max(0, restarts.get("failures", 0) - 1)
    restarts["disruptions"] = restarts.get("disruptions", 0) + 1
    restarts["lastKind"] = "Disruption"
    restarts["lastReason"] = (
        f"{pod_name} Disrupted: NodeLost: node {lost_node} stopped reporting (the failures of its peers followed)"
    )
    status.pop("restartAfter", None)  # no failure backoff for a disruption
    return f"{restarts['lastReason']}; counted as a disruption"


def lost_since(node_: dict[str, Any] | None, now: float, silence: float) -> float | None:
    """Since when a node has stopped reporting, from the Node object; None while it is Ready. Gone (None), or with
    no Ready condition: `now`, as when it went is not known and no earlier failure may be blamed on it. Unknown:
    the node controller noticed at most `silence` (its grace period and two check periods) after the last
    heartbeat, and the earliest is taken: a failure that may have followed the loss is not held against the job.
    False: the kubelet itself said NotReady."""
    conditions = ((node_ or {}).get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is not None and ready.get("status") == "True":
        return None
    changed = st.parse_time((ready or {}).get("lastTransitionTime"))
    if changed is None:
        return now
    return changed - silence if ready and ready.get("status") == "Unknown" else changed
