"""Restarts in place, pure: a program that fails restarts in its own pod (same node, GPUs, volumes, IP) through
Kubernetes' container restart rules (KEP-5307: beta and on by default since 1.35), instead of a new pod: no new
scheduling decision, no new sandbox, no volumes mounted again.

- Which exits restart in place: those the role's `restartPolicy` retries as a failure (OnFailure: any exit but 0 and
  TensorFlow's preemption code 42, a disruption whose pod is going away; ExitCode: 128-255); never under Never. The
  kubelet restarts the container at once the first time, then with its crash-loop back-off (10 s doubling to 5 min,
  as `backoffSeconds`' default), while the operator counts each exit as a failure against `backoffLimit`, as for a
  recreated pod. A pod that is gone (deleted, evicted, preempted, its node lost) is replaced as always.
- A MultiWorkerMirrored group restart whose cause restarted in place restarts the rest of the group in place too:
  their collectives fail within seconds once a peer is gone (seen: 4.4 s for a 2-worker Keras job), and each program
  exits and restarts in its pod. Every exit of the group's members within `in_place_grace` of the decision is that one
  restart (counted once); a member that has not exited by then is recreated, as before.
- The cluster tells whether it serves the rules: an API server without the feature drops them from the pods it
  creates (`dropped`); the job then recreates its pods and says so (`status.restarts.inPlace`). A kubelet that
  ignores them fails the pod as before, and the pod is recreated.
"""

from __future__ import annotations

from typing import Any

from kubetf.core import api
from kubetf.core.api import Job

Pod = dict[str, Any]

ENABLED, DISABLED, UNSUPPORTED = "Enabled", "Disabled", "Unsupported"
PREEMPTED = 42  # TensorFlow's PreemptionCheckpointHandler: saved on a preemption notice, its pod is going away


def mode(job: Job, status: dict[str, Any]) -> str:
    """Whether the job's failures restart in place: as recorded (`status.restarts.inPlace`), else as it asks."""
    recorded = str((status.get("restarts") or {}).get("inPlace") or "")
    if recorded:
        return recorded
    return ENABLED if api.run_policy(job).get("restartInPlace", True) else DISABLED


def enabled(job: Job, status: dict[str, Any]) -> bool:
    return mode(job, status) == ENABLED


def rules(job: Job, role: str) -> list[dict[str, Any]]:
    """The training container's restart rules for the role's restartPolicy (none: every exit ends the pod)."""
    policy = job["spec"]["replicaSpecs"][role]["restartPolicy"]
    if policy == "OnFailure":
        return [{"action": "Restart", "exitCodes": {"operator": "NotIn", "values": [0, PREEMPTED]}}]
    if policy == "ExitCode":  # 1-127 are permanent: the pod fails, and so does the job
        return [{"action": "Restart", "exitCodes": {"operator": "In", "values": list(range(128, 256))}}]
    return []


def restarts(job: Job, role: str, exit_code: int) -> bool:
    """Whether the role's rules restart its training container in place on this exit code (else the pod ends)."""
    for rule in rules(job, role):
        codes = rule["exitCodes"]
        if (exit_code in codes["values"]) == (codes["operator"] == "In"):
            return True
    return False


ASKED = "kubetf.io/restart-in-place"  # on a pod the operator gave restart rules: the API server must keep them


def apply(pod: Pod, job: Job, role: str) -> None:
    """Give a pod (as builders made it) the restart rules of its role, and say so on it (`dropped` checks)."""
    found = rules(job, role)
    if not found:
        return
    container = pod["spec"]["containers"][api.training_container_index(pod["spec"])]
    container["restartPolicy"] = "Never"  # the API server needs it set beside rules (the pod's own stays Never)
    container["restartPolicyRules"] = found
    pod["metadata"]["annotations"] = {**(pod["metadata"].get("annotations") or {}), ASKED: "true"}


def dropped(created: list[Pod]) -> bool:
    """The API server dropped the restart rules from a pod it created that asked for them: it does not serve them
    (the ContainerRestartRules feature is off, or older than 1.34)."""
    for pod in created:
        if not ((pod.get("metadata") or {}).get("annotations") or {}).get(ASKED):
            continue
        spec = pod.get("spec") or {}
        container = (spec.get("containers") or [{}])[api.training_container_index(spec)]
        if not container.get("restartPolicyRules"):
            return True
    return False


def exits(pod: Pod) -> tuple[int, dict[str, Any] | None]:
    """How often the pod's training container exited while the pod lived on (restarted in place, or about to be),
    and its last exit's record (`terminated`: exitCode, reason, message, finishedAt)."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return 0, None
    found = api.training_container_status(pod)
    if found is None:
        return 0, None
    count = int(found.get("restartCount") or 0)
    terminated = (found.get("state") or {}).get("terminated")
    if terminated:  # exited, not restarted yet
        return count + 1, terminated
    return count, (found.get("lastState") or {}).get("terminated")


def exited(pod: Pod) -> bool:
    """Its training container has just exited and waits to be restarted in its pod: a restart to decide now."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return False
    return any("terminated" in (c.get("state") or {}) for c in status.get("containerStatuses") or [])


def ignored(pod: Pod | None, job: Job, role: str, exit_code: int | None) -> bool:
    """A pod the operator gave restart rules ended on an exit they would have restarted: its kubelet does not serve
    them (older than 1.34, or the feature off on that node). Its job's next pods are recreated as before."""
    if pod is None or exit_code is None or (pod.get("status") or {}).get("phase") != "Failed":
        return False
    if not ((pod.get("metadata") or {}).get("annotations") or {}).get(ASKED):
        return False
    return restarts(job, role, exit_code)
