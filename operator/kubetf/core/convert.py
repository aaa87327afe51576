"""Kubeflow `kubeflow.org/v1` TFJob -> TrainingJob, with a note for everything that does not carry over as is.

Kubeflow's defaults (training-operator v1.9.4, `tensorflow_defaults.go`) are made explicit where kubetf's differ:
a replica's restartPolicy defaults to Never there (OnFailure here); cleanPodPolicy to None there (Running here).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from kubetf.core import api

KUBEFLOW_API_VERSION = "kubeflow.org/v1"
KUBEFLOW_PORT_NAME = "tfjob-port"
KUBEFLOW_DEFAULT_PORT = 2222
KUBEFLOW_RESTART_POLICY = "Never"
KUBEFLOW_CONTROLLER = "kubeflow.org/training-operator"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

# The pod labels Kubeflow sets that a template can carry (the same on every pod of a replica type); users select
# on them. `replica-index`, `operator-name`, and `job-role` on worker 0 differ per pod or name Kubeflow's
# operator: see docs/migrating-from-tfjob.md.
LABEL_JOB_NAME = "training.kubeflow.org/job-name"
LABEL_REPLICA_TYPE = "training.kubeflow.org/replica-type"
LABEL_JOB_ROLE = "training.kubeflow.org/job-role"

# Kubeflow's replica types (case-insensitive there) -> TF_CONFIG roles.
ROLE_OF = {"chief": "chief", "master": "chief", "worker": "worker", "ps": "ps", "evaluator": "evaluator"}
RESTART_POLICY_OF = {"OnFailure": "OnFailure", "Never": "Never", "ExitCode": "ExitCode", "Always": "OnFailure"}
RUN_POLICY_FIELDS = ("backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished", "cleanPodPolicy", "suspend")
LEGACY_RUN_POLICY_FIELDS = ("cleanPodPolicy", "ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit")
# Kubeflow's operator gang-scheduled a TFJob's pods through the scheduler its --gang-scheduler-name flag named
# (Volcano, or scheduler-plugins' coscheduler), with runPolicy.schedulingPolicy; a TFJob does not say which.
GANG_SCHEDULERS = {"volcano": "Volcano", "kubernetes": "Kubernetes", "kueue": "Kueue", "none": "None"}
VOLCANO_SCHEDULER = "volcano"
TFJOB_SPEC_FIELDS = ("tfReplicaSpecs", "runPolicy", "successPolicy", "enableDynamicWorker", *LEGACY_RUN_POLICY_FIELDS)


class ConversionError(ValueError):
    """The input is not a TFJob that can be converted."""


@dataclass
class Conversion:
    job: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    gang: str = "None"  # the gang scheduler the job got (schedulingPolicy.gangScheduler), and why
    gang_why: str = ""


def convert(tfjob: Any, strategy: str | None = None, gang_scheduler: str | None = None) -> Conversion:
    """The TrainingJob for a TFJob. `strategy` overrides the one the layout suggests (see `_strategy`);
    `gang_scheduler` (volcano, kubernetes, kueue, none) the gang scheduler chosen from what the TFJob shows (see
    `_gang`): the one Kubeflow's --gang-scheduler-name named, which the TFJob does not say."""
    _check(tfjob, strategy)
    spec = tfjob.get("spec") or {}
    notes: list[str] = []
    metadata = _metadata(tfjob.get("metadata") or {}, notes)
    out_specs, kubeflow_types, ports = _replicas(
        spec["tfReplicaSpecs"], (tfjob.get("metadata") or {}).get("name"), notes
    )
    if sum(r.get("replicas", 1) for r in out_specs.values()) == 1:
        notes.append(
            "spec.tfReplicaSpecs: a single replica: Kubeflow set no TF_CONFIG, kubetf sets one naming only this task"
        )
    success_policy = spec.get("successPolicy") or "ChiefOrWorker0"
    chosen = strategy or _strategy(out_specs, kubeflow_types, success_policy, notes)
    job_spec: dict[str, Any] = {"strategy": chosen, "replicaSpecs": out_specs}
    if len(ports) > 1:
        notes.append(f"containers declare different {KUBEFLOW_PORT_NAME} ports {sorted(ports)}: using {min(ports)}")
    if ports and min(ports) != KUBEFLOW_DEFAULT_PORT:
        job_spec["port"] = min(ports)
    gang, why = _gang(spec, metadata, out_specs, gang_scheduler)
    _run_policy(spec, job_spec, metadata, gang, notes)
    if success_policy == "AllWorkers":
        job_spec["successPolicy"] = "AllWorkers"
    if spec.get("enableDynamicWorker"):
        notes.append("spec.enableDynamicWorker: not carried over; kubetf keeps a fixed set of tasks")
    for unknown in sorted(set(spec) - set(TFJOB_SPEC_FIELDS)):
        notes.append(f"spec.{unknown}: not carried over (not a TFJob field kubetf knows)")
    job = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": metadata, "spec": job_spec}
    return Conversion(job, notes, gang, why)


def _metadata(source: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """Name, namespace, labels and the user's annotations; what the API server set (uid, managedFields...) goes."""
    metadata = {k: copy.deepcopy(source[k]) for k in ("name", "namespace", "labels") if source.get(k)}
    annotations = {k: v for k, v in (source.get("annotations") or {}).items() if k != LAST_APPLIED}
    if annotations:
        metadata["annotations"] = annotations
    return metadata


def _replica(replica: dict[str, Any], path: str, notes: list[str]) -> tuple[dict[str, Any], int | None]:
    template = copy.deepcopy(replica.get("template") or {})
    out: dict[str, Any] = {"replicas": replica.get("replicas", 1)}
    policy = replica.get("restartPolicy") or KUBEFLOW_RESTART_POLICY
    if policy not in RESTART_POLICY_OF:
        raise ConversionError(f"{path}.restartPolicy: unknown value {policy!r} (Always, OnFailure, Never, ExitCode)")
    out["restartPolicy"] = RESTART_POLICY_OF[policy]
    if policy == "Always":
        notes.append(
            f"{path}.restartPolicy: Always became OnFailure (kubetf never re-runs a task that exited 0); "
            "failures are now limited by runPolicy.backoffLimit"
        )
    if policy == "ExitCode":
        notes.append(
            f"{path}.restartPolicy: ExitCode now retries exit codes 128-255 up to runPolicy.backoffLimit "
            "(Kubeflow retried them without limit); 137, 143 and 42 are preemptions and never count"
        )
    pod_spec = template.get("spec") or {}
    if pod_spec.pop("restartPolicy", None) is not None:
        notes.append(f"{path}.template.spec.restartPolicy: dropped; the operator restarts pods itself")
    containers = pod_spec.get("containers") or []
    if containers and not any(c.get("name") == api.TRAINING_CONTAINER for c in containers):
        notes.append(
            f"{path}.template.spec.containers: none is named {api.TRAINING_CONTAINER}: Kubeflow gave TF_CONFIG to "
            f"no container, kubetf gives it to the first ({containers[0].get('name')})"
        )
    port = None
    for container in containers:
        kept = []
        for container_port in container.get("ports") or []:
            if container_port.get("name") == KUBEFLOW_PORT_NAME:
                port = int(container_port.get("containerPort", KUBEFLOW_DEFAULT_PORT))
            else:
                kept.append(container_port)
        if "ports" in container:
            if kept:
                container["ports"] = kept
            else:
                del container["ports"]
    out["template"] = template
    return out, port


def _check(tfjob: Any, strategy: str | None) -> None:
    if not isinstance(tfjob, dict) or tfjob.get("kind") != "TFJob":
        kind = tfjob.get("kind") if isinstance(tfjob, dict) else type(tfjob).__name__
        raise ConversionError(f"expected a Kubeflow TFJob (kind: TFJob), got {kind!r}")
    if tfjob.get("apiVersion") != KUBEFLOW_API_VERSION:
        raise ConversionError(f"apiVersion must be {KUBEFLOW_API_VERSION}, got {tfjob.get('apiVersion')!r}")
    if strategy is not None and strategy not in api.STRATEGIES:
        raise ConversionError(f"strategy {strategy!r}: must be one of {', '.join(api.STRATEGIES)}")
    replica_specs = (tfjob.get("spec") or {}).get("tfReplicaSpecs")
    if not isinstance(replica_specs, dict) or not replica_specs:
        raise ConversionError("spec.tfReplicaSpecs: required, with at least one replica type")


def _replicas(
    replica_specs: dict[str, Any], name: str | None, notes: list[str]
) -> tuple[dict[str, dict[str, Any]], dict[str, str], set[int]]:
    """(the replicaSpecs by role, the Kubeflow replica type of each role, the TF ports their containers declare)."""
    out_specs: dict[str, dict[str, Any]] = {}
    kubeflow_types: dict[str, str] = {}
    ports: set[int] = set()
    for kubeflow_type, replica in replica_specs.items():
        path = f"spec.tfReplicaSpecs.{kubeflow_type}"
        role = ROLE_OF.get(str(kubeflow_type).lower())
        if role is None:
            raise ConversionError(f"{path}: unknown replica type (Kubeflow knows Chief, Master, Worker, PS, Evaluator)")
        if role in out_specs:
            raise ConversionError(f"{path}: a second {role} replica type (Chief and Master are the same role)")
        if str(kubeflow_type).lower() == "master":
            notes.append(f"{path}: Master became chief (TF_CONFIG job name 'chief' instead of 'master')")
        if role == "evaluator":
            notes.append(
                f"{path}: the evaluator is not in the training tasks' TF_CONFIG cluster (Kubeflow listed it there, "
                "which hangs TF2 ParameterServer training)"
            )
        out_specs[role], port = _replica(replica or {}, path, notes)
        labels = out_specs[role]["template"].setdefault("metadata", {}).setdefault("labels", {})
        labels |= {LABEL_JOB_NAME: str(name or ""), LABEL_REPLICA_TYPE: str(kubeflow_type).lower()}
        if role == "chief":
            labels[LABEL_JOB_ROLE] = "master"
        kubeflow_types[role] = str(kubeflow_type)
        if port is not None:
            ports.add(port)
    return out_specs, kubeflow_types, ports


def _run_policy(
    spec: dict[str, Any], job_spec: dict[str, Any], metadata: dict[str, Any], gang: str, notes: list[str]
) -> None:
    run_policy = dict(spec.get("runPolicy") or {})
    for legacy in LEGACY_RUN_POLICY_FIELDS:
        if legacy in spec:  # pre-v1 placement at the top of the spec
            run_policy.setdefault(legacy, spec[legacy])
    carried = {k: run_policy[k] for k in RUN_POLICY_FIELDS if run_policy.get(k) is not None}
    if "ps" in job_spec["replicaSpecs"] and "cleanPodPolicy" not in carried:
        notes.append(
            "spec.runPolicy.cleanPodPolicy: not set, so Kubeflow (default None) left ps pods running after the job "
            "ended; kubetf's default Running stops them (set cleanPodPolicy: None to keep them)"
        )
    scheduling = _scheduling_policy(run_policy.get("schedulingPolicy"), metadata, job_spec, gang, notes)
    if scheduling:
        carried["schedulingPolicy"] = scheduling
    _managed_by(run_policy.get("managedBy"), job_spec, notes)
    for dropped in sorted(set(run_policy) - {*RUN_POLICY_FIELDS, "schedulingPolicy", "managedBy"}):
        notes.append(f"spec.runPolicy.{dropped}: not carried over (kubetf has no equivalent)")
    if carried:
        job_spec["runPolicy"] = carried


def _strategy(
    replica_specs: dict[str, dict[str, Any]], kubeflow_types: dict[str, str], success_policy: str, notes: list[str]
) -> str:
    """The strategy a TFJob's layout implies; a note where the layout fits more than one kind of program.

    PS without a chief is TF1 between-graph training (TF2's ParameterServerStrategy needs a chief to coordinate):
    Independent. PS with a chief is either TF2 ParameterServerStrategy or TF1/Estimator (the chief trains too):
    AllWorkers or a legacy Master says TF1; otherwise ParameterServer, and the user is told how to choose.
    Without PS: MultiWorkerMirrored, whose whole-group restart is also safe for tasks that could restart alone.
    """
    if "ps" not in replica_specs:
        return "MultiWorkerMirrored"
    chief_type = kubeflow_types.get("chief")
    if chief_type is None:
        return "Independent"
    if success_policy == "AllWorkers":
        return "Independent"  # ParameterServer's workers never exit: AllWorkers can only mean TF1
    picked, why = "ParameterServer", "TF2 ParameterServerStrategy: the chief coordinates, workers and ps serve"
    if chief_type.lower() == "master":
        picked, why = "Independent", "the legacy Master type is TF1/Estimator's: every task trains on its own"
    notes.append(
        f"spec.tfReplicaSpecs: PS with {chief_type} fits TF2 ParameterServerStrategy and TF1/Estimator training; "
        f"chose {picked} ({why}); if the program is the other kind, convert again with --strategy "
        f"{'Independent' if picked == 'ParameterServer' else 'ParameterServer'}"
    )
    return picked


def _gang(
    spec: dict[str, Any], metadata: dict[str, Any], replica_specs: dict[str, dict[str, Any]], asked: str | None
) -> tuple[str, str]:
    """(the gang scheduler of the converted job, why): the one asked for; else Volcano when the TFJob's pods name
    it; else Kueue when the TFJob is queued (Kueue's label); else Volcano when its schedulingPolicy has a queue (only
    Volcano's PodGroups took one); else Auto, kubetf's default (the cluster's best: its own gang scheduling where it
    serves it)."""
    policy = (spec.get("runPolicy") or {}).get("schedulingPolicy") or {}
    if asked:
        return GANG_SCHEDULERS[asked], "--gang-scheduler"
    names = {(r["template"].get("spec") or {}).get("schedulerName") for r in replica_specs.values()}
    if VOLCANO_SCHEDULER in names:
        return "Volcano", "its pods name schedulerName volcano"
    if (metadata.get("labels") or {}).get(KUEUE_QUEUE_LABEL):
        return "Kueue", f"it carries the label {KUEUE_QUEUE_LABEL}"
    if policy.get("queue"):
        return "Volcano", "its schedulingPolicy names a queue, which only Volcano's PodGroups took"
    if any(v not in (None, "", {}) for v in policy.values()):
        return "Auto", "a schedulingPolicy and no scheduler named: the cluster's best (--gang-scheduler to choose)"
    return "Auto", "kubetf's default: the cluster's best (--gang-scheduler to choose)"


def _scheduling_policy(
    policy: Any, metadata: dict[str, Any], job_spec: dict[str, Any], gang: str, notes: list[str]
) -> dict[str, Any]:
    """The TrainingJob's schedulingPolicy for the TFJob's, under `gang`; notes for what does not carry over."""
    policy = policy or {}
    out: dict[str, Any] = {"gangScheduler": gang} if gang != "Auto" or policy else {}
    training = sum(r.get("replicas", 1) for role, r in job_spec["replicaSpecs"].items() if role in api.TRAINING_ROLES)
    for key, value in policy.items():
        path = f"spec.runPolicy.schedulingPolicy.{key}"
        if value in (None, "", {}):
            continue
        if gang == "None":
            notes.append(f"{path}: not carried over: no gang scheduler (--gang-scheduler to choose one)")
        elif key == "queue" and gang == "Kueue":
            labels = metadata.setdefault("labels", {})
            if labels.setdefault(KUEUE_QUEUE_LABEL, value) == value:
                notes.append(
                    f"{path}: set as the {KUEUE_QUEUE_LABEL} label: Kueue admits the job from LocalQueue {value}"
                )
            else:
                notes.append(f"{path}: {value} not carried over: the job's {KUEUE_QUEUE_LABEL} label names the queue")
        elif key == "queue" and gang in ("Volcano", "Auto"):
            out["queue"] = value
        elif key == "queue":
            notes.append(f"{path}: {value} not carried over: {gang}'s gang has no queue")
        elif key == "priorityClass":
            job_spec.setdefault("priorityClassName", value)
            notes.append(f"{path}: set as spec.priorityClassName: every pod's, and the gang's PodGroup's")
        elif key == "minAvailable" and gang == "Kueue":
            notes.append(f"{path}: not carried over: Kueue admits all of the job's pods together")
        elif key == "minAvailable":
            if int(value) > training:
                notes.append(
                    f"{path}: {value} counted the evaluator, which kubetf keeps out of the gang: {training}, every "
                    "training task"
                )
            out["minAvailable"] = min(int(value), training)
        elif key == "scheduleTimeoutSeconds" and gang != "Kueue":
            out["scheduleTimeoutSeconds"] = int(value)
            notes.append(f"{path}: a gang not placed in time fails the job (onScheduleTimeout: Fail; or Wait)")
        elif key == "minResources":
            notes.append(f"{path}: not carried over: kubetf sums the gang's requests itself (Volcano's minResources)")
        else:
            notes.append(f"{path}: not carried over (kubetf has no equivalent under {gang})")
    return out


def _managed_by(value: Any, job_spec: dict[str, Any], notes: list[str]) -> None:
    """MultiKueue's hand-off carries over (Kueue's generic adapter dispatches TrainingJobs as it did TFJobs; without
    the queue label the TrainingJob is refused, as nothing would dispatch it: `kubetf validate` says so); Kubeflow's
    own operator is kubetf's now; any other controller has no TrainingJob to run."""
    if not value:
        return
    path = "spec.runPolicy.managedBy"
    if value == api.MANAGED_BY_MULTIKUEUE:
        job_spec["managedBy"] = value
        notes.append(
            f"{path}: set as spec.managedBy: MultiKueue dispatches the TrainingJob to a worker cluster (kubetf on "
            "every cluster, TrainingJob among Kueue's external frameworks: docs/kueue.md, MultiKueue)"
        )
    elif value == KUBEFLOW_CONTROLLER:
        notes.append(f"{path}: {value} dropped: the kubetf operator runs every TrainingJob")
    else:
        notes.append(
            f"{path}: {value} not carried over: a TrainingJob is run by the kubetf operator, or dispatched by "
            f"MultiKueue ({api.MANAGED_BY_MULTIKUEUE}); the kubetf operator of the cluster you apply it to runs the job"
        )
