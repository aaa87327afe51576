"""What TensorFlow needs when a task ends: success, disruption or failure, and what to restart.

Pure rules shared by the operator and `kubetf local` (see ../shared/notes/tensorflow.md for the why).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubetf.core import api, inplace
from kubetf.core import status as st
from kubetf.core.api import Job
from kubetf.core.status import COMPLETED, CREATED, TaskView

Task = tuple[str, int]

# Exit codes of a process stopped by a signal: a disruption only when something outside stopped the pod (it was
# deleted, evicted, preempted, its node shut down). Without such a sign, a liveness probe, an OOM in a child or the
# program itself killed it: a failure, or a hung program would restart forever without reaching backoffLimit.
SIGNAL_EXIT_CODES = {137: "killed (SIGKILL)", 143: "terminated (SIGTERM)"}
# TensorFlow's PreemptionCheckpointHandler exits 42 after saving a checkpoint on a preemption notice: always one.
PREEMPTED_EXIT_CODE = 42
# Pod status reasons the kubelet uses when it stops a pod for the node's sake (pressure eviction, node shutdown).
DISRUPTION_POD_REASONS = {"Terminated", "NodeShutdown", "Evicted", "NodeLost", "Shutdown"}
# Pod status reasons of a kubelet that refused a pod before it ran (admission): the node's trouble, not the
# program's. `OutOf<resource>` (OutOfcpu, OutOfnvidia.com/gpu: a device plugin that lost its devices) is matched by
# prefix.
NODE_REJECTION_REASONS = {"UnexpectedAdmissionError", "NodeAffinity", "NodeSelectorMismatching", "Taint"}
MAX_BACKOFF_SECONDS = 300


class Outcome(enum.Enum):
    SUCCEEDED = "Succeeded"
    DISRUPTED = "Disrupted"  # preemption, eviction, deletion: restart, count as a disruption
    FAILED = "Failed"  # the program's fault: restart under backoffLimit, per restartPolicy
    PERMANENT = "PermanentFailure"  # restartPolicy ExitCode and an exit code 1-127: fail the job


@dataclass(frozen=True)
class Termination:
    outcome: Outcome
    reason: str
    exit_code: int | None = None
    in_place: bool = False  # the program exited and its pod lives on: the kubelet restarts it (kubetf.core.inplace)


def classify_exit(
    exit_code: int, restart_policy: str, *, oom_killed: bool = False, stopped_from_outside: bool = False
) -> Termination:
    """A finished training process, from its exit code and whether something outside stopped it."""
    if exit_code == 0:
        return Termination(Outcome.SUCCEEDED, "exited 0", 0)
    if exit_code == PREEMPTED_EXIT_CODE:
        return Termination(Outcome.DISRUPTED, f"exit code {exit_code}: preempted (checkpoint saved)", exit_code)
    if exit_code in SIGNAL_EXIT_CODES and stopped_from_outside and not oom_killed:
        return Termination(Outcome.DISRUPTED, f"exit code {exit_code}: {SIGNAL_EXIT_CODES[exit_code]}", exit_code)
    reason = f"exit code {exit_code}" + (" (OOMKilled)" if oom_killed else "")
    if exit_code in SIGNAL_EXIT_CODES and not oom_killed:
        reason += f": {SIGNAL_EXIT_CODES[exit_code]} with no eviction, preemption or deletion of the pod"
    if restart_policy == "ExitCode" and 1 <= exit_code <= 127:
        return Termination(Outcome.PERMANENT, reason + ": permanent under restartPolicy ExitCode", exit_code)
    return Termination(Outcome.FAILED, reason, exit_code)


def classify_signal(signal_number: int, restart_policy: str) -> Termination:
    """A local process killed by a signal (`kubetf local` stops its processes by exit, never by signal, so the
    signal came from outside: the machine's OOM killer aside, what a deleted pod is in a cluster)."""
    return classify_exit(128 + signal_number, restart_policy, stopped_from_outside=True)


def disruption_reason(pod: Mapping[str, Any]) -> str | None:
    """Why a pod is being taken away from outside (the scheduler's preemption, an eviction, a node shutdown), or
    None. (Kueue stops a whole job through its Workload: kubetf.core.reconcile.)"""
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            return f"{condition.get('reason', 'DisruptionTarget')}: {condition.get('message', '')}".rstrip(": ")
    if status.get("phase") == "Failed" and status.get("reason") in DISRUPTION_POD_REASONS:
        return f"{status['reason']}: {status.get('message', '')}".rstrip(": ")
    if status.get("phase") == "Failed" and _rejected_by_node(pod):
        return f"NodeRejected: {status['reason']}: {status.get('message', '')}".rstrip(": ")
    return None


def _rejected_by_node(pod: Mapping[str, Any]) -> bool:
    """The kubelet refused the pod at admission: it failed without any container having run."""
    reason = str((pod.get("status") or {}).get("reason") or "")
    if not (reason in NODE_REJECTION_REASONS or reason.startswith("OutOf")):
        return False
    return not any(
        (c.get("state") or {}).get("terminated") for c in (pod.get("status") or {}).get("containerStatuses") or []
    )


def classify_pod(pod: dict[str, Any], restart_policy: str) -> Termination | None:
    """How a pod's task ended, or None while it has not."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    disruption = disruption_reason(pod)
    if phase not in ("Succeeded", "Failed"):
        return Termination(Outcome.DISRUPTED, disruption) if disruption and phase != "Running" else None
    terminated = _training_container_terminated(pod)
    if phase == "Succeeded":
        return Termination(Outcome.SUCCEEDED, "exited 0", 0)
    if disruption:
        return Termination(Outcome.DISRUPTED, disruption, terminated.get("exitCode") if terminated else None)
    if not terminated:
        return Termination(Outcome.FAILED, status.get("reason") or status.get("message") or "pod failed")
    termination = classify_exit(
        int(terminated.get("exitCode", 1)),
        restart_policy,
        oom_killed=terminated.get("reason") == "OOMKilled",
        stopped_from_outside=bool((pod.get("metadata") or {}).get("deletionTimestamp")),
    )
    last_words = _last_line(terminated.get("message"))
    if last_words and termination.outcome in (Outcome.FAILED, Outcome.PERMANENT):
        return dataclasses.replace(termination, reason=f"{termination.reason}: {last_words}")
    return termination


def _last_line(message: str | None, limit: int = 200) -> str:
    """The last line a failed program left (its termination message: a traceback ends with the exception)."""
    lines = [line.strip() for line in (message or "").splitlines() if line.strip()]
    return lines[-1][:limit] if lines else ""


def _training_container_terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    found = api.training_container_status(pod)
    terminated: dict[str, Any] | None = (found.get("state") or {}).get("terminated") if found is not None else None
    return terminated


def ended(job: Job, views: dict[str, TaskView]) -> list[tuple[TaskView, Termination]]:
    """The tasks whose current pod ended abnormally or vanished; those that exited 0 become Completed."""
    result = []
    for view in views.values():
        how = termination(job, view) if view.state != COMPLETED else None
        if how is not None and how.outcome is Outcome.SUCCEEDED:
            view.state = COMPLETED
        elif how is not None:
            result.append((view, how))
    return result


def termination(job: Job, view: TaskView) -> Termination | None:
    """How the task's current pod ended (or vanished, or is being taken away); None while it runs."""
    restart_policy = job["spec"]["replicaSpecs"][view.role]["restartPolicy"]
    pod = view.pod
    if pod is None:
        if view.state == CREATED:
            return Termination(Outcome.DISRUPTED, "PodDeleted: the pod was deleted while the job ran")
        return None
    how = classify_pod(pod, restart_policy)
    if how is not None:
        return how
    exits, last = inplace.exits(pod)
    # An exit its rules do not restart (0, say) ends the pod: its phase, a moment later, says how (the kubelet may
    # report the container's end first; taken for a success then, the job's cleanup deleted the pod still Running).
    code = int(last.get("exitCode", 1)) if last is not None else None
    if last is not None and code is not None and exits > view.exits and not st.is_deleting(pod) and (
        inplace.restarts(job, view.role, code)
    ):
        oom = last.get("reason") == "OOMKilled"
        ended = classify_exit(code, restart_policy, oom_killed=oom)
        words = _last_line(last.get("message"))
        said = f"{ended.reason}: {words}" if words and ended.outcome is Outcome.FAILED else ended.reason
        return dataclasses.replace(ended, reason=said, in_place=True)
    reason = disruption_reason(pod)
    if st.is_deleting(pod):
        # Only stale pods are deleted by the operator while a job runs: anyone else's deletion is a disruption.
        return Termination(Outcome.DISRUPTED, reason or "PodDeleted: the pod is being deleted")
    return Termination(Outcome.DISRUPTED, reason) if reason else None


# Who restarts together, by strategy: when a task of the role on the left ends abnormally, every task of the roles
# on the right restarts with it (the task itself always does). Anything not listed restarts alone. Both the
# restart targets and the barrier (whose old pods must be gone before a replacement starts) come from this table.
#
# MultiWorkerMirrored: collectives need every peer, so the whole chief+worker group; a finished peer is in it too
# (the new group needs it, and a program resumes from its checkpoint, so it exits again at once). ParameterServer:
# a worker rejoins alone; a lost ps loses variables the coordinator (chief) holds handles to, so the ps and the
# chief. The evaluator is a sidecar and restarts alone. Independent (chiefly TF1 between-graph training, whose
# MonitoredTrainingSession survives a lost ps or worker) and Mirrored (one task): every task alone, as Kubeflow's
# TFJob restarts them.
RESTART_GROUPS: dict[str, dict[str, tuple[str, ...]]] = {
    "MultiWorkerMirrored": {"chief": ("chief", "worker"), "worker": ("chief", "worker")},
    "ParameterServer": {"ps": ("chief",)},
}


def restart_targets(job: Job, role: str, index: int) -> list[Task]:
    """The tasks to restart together when (role, index) ended abnormally, in the job's order (chief first)."""
    roles = RESTART_GROUPS.get(api.strategy(job), {}).get(role, ())
    return [task for task in api.tasks(job) if task[0] in roles or task == (role, index)]


def barrier(job: Job, role: str, index: int) -> list[Task]:
    """The tasks whose old pods must all be gone before (role, index)'s replacement is created: every task it may
    be restarted together with, either way round. A new MultiWorkerMirrored chief that met a worker of the old group
    (still terminating, still resolvable through the headless Service) would crash, and a new ps must never get
    variables from an old chief."""
    groups = RESTART_GROUPS.get(api.strategy(job), {})
    mine = groups.get(role, ())
    return [t for t in api.tasks(job) if t == (role, index) or t[0] in mine or role in groups.get(t[0], ())]


def success_tasks(job: Job) -> list[Task]:
    """The tasks whose exit 0 means the job succeeded (successPolicy).

    ChiefOrWorker0: the chief, else worker 0, which is TF1's chief (is_chief) in a layout without one. AllWorkers:
    every chief and worker, meaningful where workers exit when done (MultiWorkerMirrored, Independent); the CRD
    refuses it for ParameterServer, whose workers serve until stopped. ps tasks never count: they serve forever
    (TF1's `server.join()` and TF2's alike) and cleanPodPolicy stops them.
    """
    specs = api.replica_specs(job)
    if job["spec"]["successPolicy"] == "AllWorkers":
        return [task for task in api.tasks(job) if task[0] in ("chief", "worker")]
    if "chief" in specs:
        return [("chief", 0)]
    return [("worker", 0)]


def succeeded(job: Job, completed: set[Task]) -> bool:
    return all(task in completed for task in success_tasks(job))


def backoff_seconds(job: Job, failures: int) -> float:
    """Delay before restarting after the n-th failure (1-based): exponential, capped."""
    base = api.run_policy(job)["backoffSeconds"]
    return float(min(MAX_BACKOFF_SECONDS, base * 2 ** max(0, failures - 1)))


@dataclass(frozen=True)
class Decision:
    restart: bool
    reason: str


def decide(
    job: Job, role: str, termination: Termination, failures: int, disruptions: int, capped: bool = True
) -> Decision:
    """Restart or fail, after a task ended abnormally. `failures`/`disruptions` are the counts before this one.
    `capped` False: a disruption that maxDisruptions does not limit (a queue took the whole job back: it waits its
    turn again and resumes from its checkpoint; it never fails for it)."""
    restart_policy = job["spec"]["replicaSpecs"][role]["restartPolicy"]
    policy = api.run_policy(job)
    if termination.outcome is Outcome.DISRUPTED:
        cap = policy.get("maxDisruptions")
        if capped and cap is not None and disruptions >= cap:
            return Decision(False, f"MaxDisruptionsExceeded: {termination.reason} (runPolicy.maxDisruptions={cap})")
        return Decision(True, f"Disrupted: {termination.reason}")
    if termination.outcome is Outcome.PERMANENT:
        return Decision(False, f"PermanentFailure: {termination.reason}")
    if restart_policy == "Never":
        return Decision(False, f"Failed: {termination.reason} (restartPolicy Never)")
    limit = policy["backoffLimit"]
    if failures >= limit:
        return Decision(False, f"BackoffLimitExceeded: {termination.reason} after {failures} restart(s)")
    return Decision(True, f"Failed: {termination.reason}")
