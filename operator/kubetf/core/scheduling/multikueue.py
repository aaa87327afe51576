"""MultiKueue's manager, pure: a job with `spec.managedBy: kueue.x-k8s.io/multikueue` runs on a worker cluster that
Kueue chooses (its generic adapter for external frameworks copies the job there and its status back). On the manager
the operator makes the job's Workload (kubetf.core.scheduling.workload) and no pod, and never writes the job's status
once Kueue dispatched it: from then on its status is Kueue's copy of the worker's. The Workload follows that copy:
PodsReady, and finished when the copy says the job ended. Evicted (the worker evicted it, or was lost), its quota
goes back at once: no pod of it runs here, and a lost worker's copy would never say its pods stopped; Kueue then
removes the worker's copy once it reaches that worker again (docs/kueue.md: a lost worker).

A job that can never be dispatched says so (`NotDispatched`) while nothing was dispatched: without a queue label
nothing queues it; admitted by a ClusterQueue without a MultiKueue admission check, nothing sends it anywhere.
"""

from __future__ import annotations

from collections.abc import Collection

from kubetf.core import api
from kubetf.core import status as st
from kubetf.core.scheduling import kueue
from kubetf.core.scheduling import workload as wl
from kubetf.core.scheduling.seam import Gate, Placing, Remains, Situation
from kubetf.core.types import Job, Pod, Resource, Write

NAME = "MultiKueue"
RESOURCES: tuple[Resource, ...] = (wl.WORKLOADS,)
RUNS_PODS = False
POD_ANNOTATIONS: tuple[str, ...] = ()
# spec.managedBy: unset means this operator runs the job; MultiKueue's, another cluster.
MANAGED_BY = api.MANAGED_BY_MULTIKUEUE
NOT_DISPATCHED = "NotDispatched"


def dispatched(job: Job) -> bool:
    """MultiKueue runs the job on a worker cluster: here only its Workload."""
    return (job.get("spec") or {}).get("managedBy") == MANAGED_BY


def cluster(s: Situation) -> str | None:
    """The worker cluster Kueue dispatched the job to (the Workload's status.clusterName), if any."""
    workload = s.admission.workload if s.admission is not None else None
    return ((workload or {}).get("status") or {}).get("clusterName") or None


def undispatchable(s: Situation) -> str | None:
    """Why nothing will ever dispatch the job, while nothing was: no queue label, or a queue that admits it here
    without a MultiKueue admission check (no cluster named)."""
    if kueue.queue_name(s.job) is None:
        return (
            f"spec.managedBy is {MANAGED_BY} but the job has no label {api.QUEUE_LABEL}: nothing queues it, so "
            "MultiKueue never dispatches it. Add the label, naming a LocalQueue whose ClusterQueue has a MultiKueue "
            "admission check; or, to run it on this cluster, delete the job and create it again without spec.managedBy "
            "(it cannot change)"
        )
    admission = s.admission
    if admission is not None and admission.admitted and cluster(s) is None:
        queue = admission.cluster_queue or admission.local_queue
        return (
            f"Kueue admitted the job's Workload here, but ClusterQueue {queue} has no MultiKueue admission check: no "
            "worker cluster will run it. Give that ClusterQueue a MultiKueue admission check; or delete the job and "
            "create it again without spec.managedBy (it cannot change)"
        )
    return None


# ---------------------------------------------------------------------- the seam (kubetf.core.scheduling)


def gate(s: Situation) -> Gate | None:
    """Its pods are never here; it says so only when nothing will ever run them (`undispatchable`)."""
    why = undispatchable(s)
    return Gate(NOT_DISPATCHED, why, warning=True, queued=False) if why else None


def regroup(s: Situation, restarted: set[tuple[str, int]]) -> None:
    return None


def join(s: Situation, pod: Pod, role: str) -> None:
    return None


def place(s: Situation) -> Placing:
    """The job's Workload: made while it has none, following the job, PodsReady from the copied status, the quota
    given back at once after an eviction (no pod of it runs here)."""
    found = Placing()
    admission = s.admission
    if admission is None or not admission.installed:
        return found
    workload = admission.workload
    if workload is None:
        made = kueue.build(s.job, admission, s.config)
        found.create = [made] if made is not None else []
        return found
    suspended = bool(api.run_policy(s.job).get("suspend"))
    found.writes += kueue.follow(s.job, admission, s.config, suspended)
    found.writes += kueue.status_writes(s.job, admission, s.now, s.status, release=admission.evicted)
    return found


def finish(s: Situation) -> list[Write]:
    """The worker's copy ended (its status, copied here, says so): the Workload finished at once."""
    workload = s.admission.workload if s.admission is not None else None
    if workload is None:
        return []
    message = (st.current_condition(s.status) or {}).get("message") or ""
    return wl.goodbye(workload, "Succeeded" if s.status.get("phase") == st.SUCCEEDED else "Failed", message, s.now)


def farewell(r: Remains) -> list[Write]:
    return []  # the job's Workloads are Kueue's integration's to let go (kueue.farewell)


def release(pods: list[Pod], lost_nodes: Collection[str]) -> list[Pod]:
    return []
