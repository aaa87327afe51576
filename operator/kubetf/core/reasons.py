"""Every reason a user can see on a TrainingJob, with what it means and what to do about it. Standard library only.

- `OPERATOR`: the reasons the operator writes itself, in the job's condition (`status.reason`, the REASON column of
  `kubectl get tj -o wide`) and in the Events it posts on the job;
- `KUBERNETES`: the scheduler's and the kubelet's own words, which become the condition's reason (and a Warning
  event) while a pod cannot start: the first word of `kubetf.status.pending_reason`;
- `CAUSES`: what follows `Disrupted: ` in `status.restarts.lastReason` and in a Restarting condition's message,
  from Kubernetes, Kueue or the operator.

docs/status-reasons.md shows these as tables (`python -m kubetf.core.reasons` prints them) and a unit test keeps the two
equal; another scans the operator's source for every reason it can write and finds it here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reason:
    seen: str  # where it shows: the phases whose condition carries it, the Event's type
    meaning: str
    action: str


WARNING_WAIT = "condition (Pending or Restarting), Warning event"

OPERATOR: dict[str, Reason] = {
    "CreatedPods": Reason(
        "Normal event",
        "The operator created the pods named in the message.",
        "Nothing.",
    ),
    "PodsStarting": Reason(
        "condition (Pending or Restarting), Normal event",
        "The job's pods exist but not all of them run yet; nothing is wrong so far.",
        "Wait. If it lasts, `kubectl describe pod` a pod that is not Running; `startupTimeoutSeconds` (600 s) ends "
        "the wait with `StartupTimeout`.",
    ),
    "PodsTerminating": Reason(
        "condition (Pending or Restarting), Normal event",
        "Old pods of a restart are still terminating within their grace period; their replacements are created "
        "once they are gone.",
        "Wait: a program that saves a checkpoint on SIGTERM may use its whole `terminationGracePeriodSeconds` "
        "(120 s unless the template sets it).",
    ),
    "PodStuckTerminating": Reason(
        WARNING_WAIT,
        "An old pod is still there 15 s past its grace period (its node is lost, its kubelet wedged, or a "
        "finalizer holds it); the message names the pod and its node. Its replacement waits.",
        "`kubectl get node NODE` and the pod's `metadata.finalizers`. On a lost node the operator force-deletes "
        "the pod unless `forceDeleteOnNodeLoss: false`; force-delete it yourself only if the node is really gone.",
    ),
    "AllPodsRunning": Reason(
        "condition (Running), Normal event",
        "Every pod that has not finished runs; the message says how many are not ready yet and how many finished.",
        "Nothing.",
    ),
    "Queued": Reason(
        "condition (Queued), Normal event",
        "Kueue has not admitted the job's Workload yet: the job has no pod and holds no quota. The message names "
        "the LocalQueue, the ClusterQueue, the Workload, the place in the queue and Kueue's own words.",
        "Wait, or free quota in the ClusterQueue (`kubectl get workloads -n NS`). No timeout counts while queued.",
    ),
    "PriorityClassNotFound": Reason(
        "condition (Queued), Warning event",
        "The WorkloadPriorityClass named by the label `kueue.x-k8s.io/priority-class` (or the PriorityClass of "
        "`spec.priorityClassName`) does not exist: the job's Workload cannot be made without its priority.",
        "Create the class or fix the label or field (`kubectl get workloadpriorityclasses,priorityclasses`); the "
        "operator reads it again every few seconds.",
    ),
    "LocalQueueNotFound": Reason(
        "condition (Queued), Warning event",
        "The LocalQueue named by the label `kueue.x-k8s.io/queue-name` does not exist in the job's namespace.",
        "Create the LocalQueue or fix the label (`kubectl get localqueues -n NS`); the job goes on as soon as "
        "the LocalQueue exists.",
    ),
    "KueueNotInstalled": Reason(
        "Warning event",
        "The job carries a queue label but the cluster serves no Kueue API: its pods run at once, without queueing.",
        "Install Kueue, or remove the label.",
    ),
    "CreateRejected": Reason(
        WARNING_WAIT,
        "The API server refused to create a pod, the Service or the PVC for now (an exhausted ResourceQuota, Pod "
        "Security, a LimitRange, an admission webhook or policy); the message quotes it. Retried with backoff (1 s "
        "doubling to 5 min); `startupTimeoutSeconds` counts from the first refusal (`status.createRejectedSince`).",
        "What the message says after `To fix:`: free quota or raise the namespace's ResourceQuota, meet the "
        "namespace's Pod Security level, or ask the cluster's admins about the webhook or policy.",
    ),
    "CreateUnavailable": Reason(
        "condition (Pending, Restarting or Queued), Warning event",
        "The API server, or an admission webhook it calls, could not answer a create (a 5xx, a timeout, "
        "`failed calling webhook`). Retried at most 5 s apart; the time does not count against "
        "`startupTimeoutSeconds`.",
        "Usually nothing: the job goes on once the API answers. If it lasts, look at the webhook the message "
        "names (Kueue's: `kubectl -n kueue-system get pods`).",
    ),
    "NameInUse": Reason(
        WARNING_WAIT,
        "The name of the job's Service or checkpoint PVC is held by another object: a previous job's of the "
        "same name, still being deleted, or one this job does not own. Looked at again at most 10 s apart; "
        "`startupTimeoutSeconds` counts from the first refusal.",
        "Wait for the previous job's objects to go; delete the object the message names if it is a leftover.",
    ),
    "Disrupted": Reason(
        "condition (Restarting), Warning event",
        "A pod was preempted, evicted or deleted, or its node shut down (`restarts.lastReason` says which, see "
        "the causes below): restarted at once, counted in `restarts.disruptions`, never against `backoffLimit`.",
        "Nothing: training resumes from the last checkpoint. If it repeats, find out who preempts (PriorityClass, "
        "Kueue); `maxDisruptions` caps them.",
    ),
    "Failed": Reason(
        "condition (Restarting or Failed), Warning event",
        "The program failed: the message has the exit code and its last log line. Restarting: restarted after "
        "`backoffSeconds` (doubling), counted in `restarts.failures`. Failed: the role's `restartPolicy` is Never.",
        "Read the message and `kubetf logs NAME`; fix the program or its input.",
    ),
    "NodeLost": Reason(
        "condition (Restarting), Warning event",
        "A restart first counted as a failure turned out to follow a lost node (an old pod of the restart was on "
        "a node that stopped reporting): counted as a disruption instead, with no failure backoff.",
        "Nothing for the job; look at the node (`kubectl get node NODE`).",
    ),
    "Succeeded": Reason(
        "condition (Succeeded), Normal event",
        "The chief (or worker 0 without a chief; every chief and worker with `successPolicy: AllWorkers`) exited "
        "0; `cleanPodPolicy` stops what still runs (an evaluator after `evaluatorGraceSeconds`, to finish its last "
        "evaluation).",
        "Nothing: the model is where the program saved it.",
    ),
    "Suspended": Reason(
        "condition (Suspended), Normal event",
        "`runPolicy.suspend` is true: the pods are deleted, the counters kept; time suspended does not count.",
        "Set `runPolicy.suspend: false` to resume.",
    ),
    "Resumed": Reason(
        "Normal event",
        "`runPolicy.suspend` went back to false: the job creates its pods again.",
        "Nothing.",
    ),
    "InvalidSpec": Reason(
        "condition (Failed), Warning event",
        "The spec passed the CRD's checks but not the operator's (`gpus` contradicts the template's limits, a "
        "pod-level `restartPolicy`, a malformed CPU limit, two containers of one name), or the API server refused "
        "the Service or the PVC as invalid. The job creates nothing more.",
        "Fix the field the message names (`kubetf validate -f JOB.yaml` says it offline), then delete and "
        "re-apply the job.",
    ),
    "InvalidPodTemplate": Reason(
        "condition (Failed), Warning event",
        "The API server's dry run refused a pod (such as `memory: 4GB`); the message names the replica and the "
        "field. The job creates nothing more.",
        "Fix `spec.replicaSpecs.ROLE.template`, then delete and re-apply the job.",
    ),
    "StartupTimeout": Reason(
        "condition (Failed), Warning event",
        "A pod was not running `startupTimeoutSeconds` after it could start (its creation, or the job's admission "
        "by Kueue), or the pods could not be created for that long; the message ends with the last reason.",
        "Fix that reason (see the Kubernetes words below), then delete and re-apply the job; raise "
        "`startupTimeoutSeconds` if the pods just need longer.",
    ),
    "DeadlineExceeded": Reason(
        "condition (Failed), Warning event",
        "The job was active longer than `activeDeadlineSeconds` (time queued or suspended not counted).",
        "Raise `activeDeadlineSeconds`; a job created again with the same checkpoint volume resumes from it.",
    ),
    "BackoffLimitExceeded": Reason(
        "condition (Failed), Warning event",
        "The program failed again after `backoffLimit` failure restarts.",
        "Read the message and `kubetf logs NAME`; fix the program. Raise `backoffLimit` only for failures that "
        "pass by themselves.",
    ),
    "PermanentFailure": Reason(
        "condition (Failed), Warning event",
        "`restartPolicy: ExitCode` and an exit code from 1 to 127: the program declared the failure permanent.",
        "Fix the program or its input; `restartPolicy: OnFailure` if such failures can pass.",
    ),
    "MaxDisruptionsExceeded": Reason(
        "condition (Failed), Warning event",
        "A disruption beyond `runPolicy.maxDisruptions`.",
        "Raise or unset `maxDisruptions`, or find out who keeps preempting the job.",
    ),
    "ForceDeleted": Reason(
        "Warning event",
        "A pod being deleted on a node that stopped reporting (NotReady, unreachable or gone) was force-deleted: "
        "no kubelet would ever confirm the deletion.",
        "Look at the node; `forceDeleteOnNodeLoss: false` makes the job wait instead.",
    ),
    "SigtermIgnored": Reason(
        "Normal event",
        "TensorFlow's MultiWorkerMirroredStrategy took a member's SIGTERM (`SIGTERM caught at`) and nothing in the "
        "program acts on it: the rest of the group is stopped at once (1 s grace period), not after 120 s.",
        "Nothing; to save a checkpoint on SIGTERM use `PreemptionCheckpointHandler` (trainer_image/README.md).",
    ),
    "LossNotFinite": Reason(
        "`TrainingUnhealthy` condition, Warning event",
        "The latest loss the program reported (or any metric named `*loss`, training or evaluation) is NaN or "
        "infinite: the training diverged. The job keeps running.",
        "Lower the learning rate, clip gradients or check the data; delete or suspend the job to stop it.",
    ),
    "TrainingStalled": Reason(
        "`TrainingUnhealthy` condition, Warning event",
        "A running job's step and epoch have not moved for `--progress-stall-seconds` (10 minutes): the program "
        "hangs (a collective waiting on a peer, an input pipeline) or stopped reporting. The job keeps running.",
        "`kubetf logs JOB` and the pods' events; a stuck collective usually needs a restart (delete the pod).",
    ),
    "Healthy": Reason(
        "`TrainingUnhealthy` condition turned False",
        "A job that was `LossNotFinite` or `TrainingStalled` advances again with a finite loss.",
        "Nothing.",
    ),
    "GangWaiting": Reason(
        "condition (Pending or Restarting), Normal event",
        "The job's training tasks wait to be placed together (gang scheduling by Kubernetes' own Workload API or by "
        "Volcano): none of them holds a node's resources until `minAvailable` of them fit at once. The message has "
        "the PodGroup, since when it waits and the scheduler's own words.",
        "Wait, or make room (the message says what does not fit); `scheduleTimeoutSeconds` bounds the wait "
        "(docs/gang-scheduling.md).",
    ),
    "EvaluatorPending": Reason(
        "condition (Running), Normal event (Warning once the scheduler or the kubelet says why)",
        "Every training task runs; the evaluator (in no gang, holding no task back) does not yet: the message says why",
        "Nothing while it starts; if it lasts, make room for it. `startupTimeoutSeconds` bounds its wait.",
    ),
    "NotDispatched": Reason(
        "condition (Pending) on MultiKueue's manager, Warning event",
        "`spec.managedBy: kueue.x-k8s.io/multikueue`, but nothing will dispatch the job: no queue label, or a "
        "ClusterQueue that admitted it without a MultiKueue admission check.",
        "Add the label (a ClusterQueue with a MultiKueue check); or create the job again without `spec.managedBy`.",
    ),
    "GangScheduleTimeout": Reason(
        "condition (Failed, or Pending with `onScheduleTimeout: Wait`), Warning event",
        "The job's gang was not placed within `runPolicy.schedulingPolicy.scheduleTimeoutSeconds` of the moment its "
        "pods could start (time queued by Kueue or suspended does not count).",
        "Make room for the whole gang, lower `minAvailable`, or raise the timeout; `onScheduleTimeout: Wait` keeps "
        "the job waiting instead of failing it.",
    ),
    "GangSchedulerUnavailable": Reason(
        "condition (Failed), Warning event",
        "The job asks for a gang scheduler the cluster does not have (`runPolicy.schedulingPolicy.gangScheduler`): "
        "Volcano not installed, Kubernetes' Workload API not served (1.37 with the GenericWorkload gate), or Kueue "
        "for a job without a queue label. Nothing was created.",
        "Use `gangScheduler: Auto` (the best the cluster has), or install what it names, then create the job again.",
    ),
    "PodNameInUse": Reason(
        WARNING_WAIT,
        "A pod with the name of one of the job's pods exists and is not the job's (its controller reference names "
        "something else, or nothing), though it may carry the job's labels. The operator never deletes a pod that is "
        "not its job's: that task waits until the name is free.",
        "Find out whose pod it is (`kubectl get pod NAME -o yaml`); delete it, or create the job under another name.",
    ),
    "ReconcileError": Reason(
        "`ReconcileError` condition, Warning event",
        "The operator's last reconciles of the job failed (3 in a row, `--reconcile-error-after`); the message has the "
        "API server's own words (a webhook that refuses a delete, a quota, the API server unavailable). The operator "
        "retries with backoff: at most 5 s apart for an error of the cluster that passes by itself, doubling to 5 "
        "minutes otherwise.",
        "Fix what the message names if it is yours (a webhook or a policy that refuses the operator); else wait: the "
        "condition turns False (`Reconciled`) with the first reconcile that succeeds.",
    ),
    "Reconciled": Reason(
        "`ReconcileError` condition turned False",
        "A job whose reconciles had failed was reconciled again.",
        "Nothing.",
    ),
}

KUBERNETES: dict[str, Reason] = {
    "Unschedulable": Reason(
        WARNING_WAIT,
        "The scheduler cannot place a pod that waited 30 s for a node (counted from the admission under Kueue): "
        "`Insufficient nvidia.com/gpu` or cpu, no node matching its selector or tolerating its taints, a PVC "
        "missing or unbound.",
        "Read the message; `kubectl describe pod POD`. Ask for less, add nodes, fix the selector or tolerations, "
        "create the PVC.",
    ),
    "SchedulingGated": Reason(
        WARNING_WAIT,
        "A pod still has a scheduling gate 30 s after it could start (not Kueue's while queued: that is `Queued`).",
        "`kubectl get pod POD -o jsonpath='{.spec.schedulingGates}'`: find who set the gate and why it stays.",
    ),
    "SchedulerError": Reason(
        WARNING_WAIT,
        "The scheduler failed on the pod (an error of its own or of a plugin); it tries again.",
        "Look at the scheduler's log if it lasts.",
    ),
    "ImagePullBackOff": Reason(
        WARNING_WAIT,
        "The kubelet cannot pull the image and waits between attempts (a wrong name or tag, a private registry, "
        "no network).",
        "Fix the image or the template's `imagePullSecrets`; `kubectl describe pod POD` shows the pull error.",
    ),
    "ErrImagePull": Reason(
        WARNING_WAIT,
        "The latest pull of the image failed.",
        "As for `ImagePullBackOff`.",
    ),
    "InvalidImageName": Reason(
        WARNING_WAIT,
        "The image reference cannot be parsed.",
        "Fix `image` in the template.",
    ),
    "ErrImageNeverPull": Reason(
        WARNING_WAIT,
        "`imagePullPolicy: Never` and the image is not on the node.",
        "Load the image onto the node, or change `imagePullPolicy`.",
    ),
    "CreateContainerConfigError": Reason(
        WARNING_WAIT,
        "The container's configuration cannot be made: a missing ConfigMap or Secret (or key), a bad env reference.",
        "Create what the message names, or fix the reference.",
    ),
    "CreateContainerError": Reason(
        WARNING_WAIT,
        "The container runtime could not create the container (a bad mount, a name conflict).",
        "Read the message; `kubectl describe pod POD`.",
    ),
    "RunContainerError": Reason(
        WARNING_WAIT,
        "The container runtime could not start the container (such as a command the image does not have).",
        "Fix `command`/`args` or the image.",
    ),
}

CAUSES: dict[str, Reason] = {
    "PodDeleted": Reason(
        "`Disrupted: PodDeleted: ...`",
        "Someone other than the operator deleted a pod of the running job.",
        "Nothing; if it repeats, find who deletes pods (`kubectl get events`, the audit log).",
    ),
    "PreemptionByScheduler": Reason(
        "`Disrupted: PreemptionByScheduler: ...`",
        "The scheduler preempted the pod for a pod of higher priority.",
        "Give the job a higher `priorityClassName`, or let it be.",
    ),
    "EvictionByEvictionAPI": Reason(
        "`Disrupted: EvictionByEvictionAPI: ...`",
        "The pod was evicted through the Eviction API (`kubectl drain`, a descheduler, an autoscaler).",
        "Nothing.",
    ),
    "DeletionByTaintManager": Reason(
        "`Disrupted: DeletionByTaintManager: ...`",
        "Taint eviction deleted the pod: its node has a NoExecute taint it does not tolerate (not-ready or "
        "unreachable after `nodeLossTimeoutSeconds`).",
        "Look at the node.",
    ),
    "DeletionByPodGC": Reason(
        "`Disrupted: DeletionByPodGC: ...`",
        "The pod garbage collector deleted the pod (its Node object is gone).",
        "Look at the node.",
    ),
    "TerminationByKubelet": Reason(
        "`Disrupted: TerminationByKubelet: ...`",
        "The kubelet stopped the pod (node-pressure eviction, node shutdown).",
        "Look at the node's conditions.",
    ),
    "Evicted": Reason(
        "`Disrupted: Evicted: ...`",
        "The kubelet evicted the pod because its node ran short of memory or disk.",
        "Look at the node; requests close to the real use keep the pod from going first.",
    ),
    "NodeShutdown": Reason(
        "`Disrupted: NodeShutdown: ...`",
        "The pod's node shut down (graceful node shutdown).",
        "Nothing.",
    ),
    "Shutdown": Reason(
        "`Disrupted: Shutdown: ...`",
        "The pod's node shut down (the kubelet's older word).",
        "Nothing.",
    ),
    "Terminated": Reason(
        "`Disrupted: Terminated: ...`",
        "The kubelet terminated the pod for its node (node shutdown).",
        "Nothing.",
    ),
    "NodeLost": Reason(
        "`Disrupted: NodeLost: ...`",
        "The pod's node stopped reporting (its kubelet or its machine is gone).",
        "Look at the node (`kubectl get node NODE`).",
    ),
    "NodeRejected": Reason(
        "`Disrupted: NodeRejected: WORD: ...`",
        "The kubelet refused the pod before any container ran; the next word (below) says why.",
        "Usually the node's trouble: look at it.",
    ),
    "UnexpectedAdmissionError": Reason(
        "`Disrupted: NodeRejected: UnexpectedAdmissionError: ...`",
        "The kubelet's admission of the pod failed unexpectedly (often a device plugin).",
        "Look at the node's device plugin.",
    ),
    "OutOf<resource>": Reason(
        "`Disrupted: NodeRejected: OutOfnvidia.com/gpu: ...`",
        "The node no longer had the resource (`OutOfcpu`, `OutOfnvidia.com/gpu`) when the kubelet admitted the "
        "pod, such as a device plugin that lost its devices.",
        "Look at the node's device plugin.",
    ),
    "NodeAffinity": Reason(
        "`Disrupted: NodeRejected: NodeAffinity: ...`",
        "The node's labels no longer match the pod's node affinity when the kubelet admits it.",
        "Nothing, unless it repeats: then the node's labels.",
    ),
    "NodeSelectorMismatching": Reason(
        "`Disrupted: NodeRejected: NodeSelectorMismatching: ...`",
        "The node's labels no longer match the pod's node selector when the kubelet admits it.",
        "Nothing, unless it repeats: then the node's labels.",
    ),
    "Taint": Reason(
        "`Disrupted: NodeRejected: Taint: ...`",
        "The node has a taint the pod does not tolerate when the kubelet admits it.",
        "Nothing, unless it repeats: then the node's taints.",
    ),
    "DisruptionTarget": Reason(
        "`Disrupted: DisruptionTarget: ...`",
        "The pod got a `DisruptionTarget` condition without a reason.",
        "Nothing.",
    ),
    # Kueue stops a queued job's pods through its Workload (core.scheduling.workload.Admission.eviction): the whole job
    # restarts once, waits in its queue and resumes from its checkpoint once admitted again.
    "Preempted": Reason(
        "`Disrupted: Preempted by Kueue: ...`",
        "Kueue preempted the job's Workload for one of higher priority, or to reclaim quota its cohort lent; the "
        "whole job restarts once and is Queued again.",
        "Nothing: it resumes from the checkpoint once Kueue admits it again.",
    ),
    "PodsReadyTimeout": Reason(
        "`Disrupted: PodsReadyTimeout by Kueue: ...`",
        "Kueue's `waitForPodsReady`: the job's pods were not all ready within its timeout after the admission (or "
        "after a pod was lost); Kueue requeues it after a backoff.",
        "Why the pods did not start: the job's earlier conditions (Unschedulable, ImagePullBackOff, ...).",
    ),
    "AdmissionCheck": Reason(
        "`Disrupted: AdmissionCheck by Kueue: ...`",
        "An admission check of the ClusterQueue asked to retry (a MultiKueue worker lost the job or evicted it); "
        "Kueue requeues it after a backoff.",
        "Nothing, unless it repeats: then `kubectl describe workload` for the check's message.",
    ),
    "Deactivated": Reason(
        "`Disrupted: Deactivated by Kueue: ...` (or `DeactivatedDueTo...`)",
        "The job's Workload was deactivated (`spec.active: false`): by someone, by Kueue past its requeuing limit "
        "or `maximumExecutionTimeSeconds`, or after a rejected admission check. It waits until it is active again.",
        "`kubectl patch workload NAME --type=merge -p '{\"spec\":{\"active\":true}}'` once the cause is fixed.",
    ),
    "ClusterQueueStopped": Reason(
        "`Disrupted: ClusterQueueStopped by Kueue: ...` (or `LocalQueueStopped`)",
        "An admin stopped the queue with `stopPolicy: HoldAndDrain`.",
        "Nothing: the job waits until the queue runs again.",
    ),
    "NodeFailures": Reason(
        "`Disrupted: NodeFailures by Kueue: ...`",
        "Kueue's topology-aware scheduling found a node assigned to the job failed; the job is queued again at once.",
        "Nothing: it resumes from the checkpoint on other nodes.",
    ),
    "WorkloadDeleted": Reason(
        "`Disrupted: WorkloadDeleted: ...`",
        "The job's Workload was deleted while its pods ran.",
        "Nothing: the operator makes a new Workload once the pods are gone, and the job waits in its queue.",
    ),
    "NotAdmitted": Reason(
        "`Disrupted: NotAdmitted: ...`",
        "The job's pods ran while its Workload was no longer admitted, without an eviction.",
        "Nothing, unless it repeats: then Kueue's log.",
    ),
    "NoWorkload": Reason(
        "`Disrupted: NoWorkload: ...`",
        "A queued job had pods but no Workload of its own: pods created under Kueue's pod integration, before the "
        "operator made Workloads (docs/kueue.md, moving from the pod integration). They stop once; the job waits "
        "in its queue under its own Workload.",
        "Nothing.",
    ),
}

# The tables of docs/status-reasons.md, in order: (the heading above the table, its reasons).
GROUPS: tuple[tuple[str, dict[str, Reason]], ...] = (
    ("Reasons the operator writes", OPERATOR),
    ("Reasons from Kubernetes: a pod that cannot start", KUBERNETES),
    ("Causes of a disruption, in restarts.lastReason", CAUSES),
)

# Every reason a condition or an Event can carry.
REASONS: dict[str, Reason] = OPERATOR | KUBERNETES

HEADER = ("reason", "seen as", "what it means", "what to do")


def markdown_table(reasons: dict[str, Reason]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for name, reason in reasons.items():
        lines.append(f"| `{name}` | {reason.seen} | {reason.meaning} | {reason.action} |")
    return "\n".join(lines)


def markdown() -> str:
    """The tables of docs/status-reasons.md, each under its heading."""
    return "\n\n".join(f"## {title}\n\n{markdown_table(reasons)}" for title, reasons in GROUPS) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
