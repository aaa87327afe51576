"""Kubeflow `kubeflow.org/v1` TFJob -> TrainingJob, with a note for everything that cannot be carried over."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from kubetf import api

KUBEFLOW_API_VERSION = "kubeflow.org/v1"
KUBEFLOW_PORT_NAME = "tfjob-port"
KUBEFLOW_DEFAULT_PORT = 2222

# Kubeflow's replica types (case-insensitive there) -> TF_CONFIG roles.
ROLE_OF = {"chief": "chief", "master": "chief", "worker": "worker", "ps": "ps", "evaluator": "evaluator"}
RESTART_POLICY_OF = {"OnFailure": "OnFailure", "Never": "Never", "ExitCode": "ExitCode", "Always": "OnFailure"}
RUN_POLICY_FIELDS = ("backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished", "cleanPodPolicy", "suspend")


class ConversionError(ValueError):
    """The input is not a TFJob that can be converted."""


@dataclass
class Conversion:
    job: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def convert(tfjob: Any) -> Conversion:
    if not isinstance(tfjob, dict) or tfjob.get("kind") != "TFJob":
        raise ConversionError("expected a Kubeflow TFJob (kind: TFJob)")
    if tfjob.get("apiVersion") != KUBEFLOW_API_VERSION:
        raise ConversionError(f"apiVersion must be {KUBEFLOW_API_VERSION}, got {tfjob.get('apiVersion')!r}")
    spec = tfjob.get("spec") or {}
    replica_specs = spec.get("tfReplicaSpecs")
    if not isinstance(replica_specs, dict) or not replica_specs:
        raise ConversionError("spec.tfReplicaSpecs: required, with at least one replica type")

    notes: list[str] = []
    metadata = {k: v for k, v in (tfjob.get("metadata") or {}).items() if k in ("name", "namespace", "labels")}
    out_specs: dict[str, dict[str, Any]] = {}
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
        out_specs[role], port = _replica(replica or {}, path, notes)
        if port is not None:
            ports.add(port)

    job_spec: dict[str, Any] = {"strategy": _strategy(out_specs, notes), "replicaSpecs": out_specs}
    if len(ports) > 1:
        notes.append(f"containers declare different {KUBEFLOW_PORT_NAME} ports {sorted(ports)}: using {min(ports)}")
    if ports and min(ports) != KUBEFLOW_DEFAULT_PORT:
        job_spec["port"] = min(ports)

    run_policy = dict(spec.get("runPolicy") or {})
    for legacy in ("cleanPodPolicy", "ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit"):
        if legacy in spec:  # pre-v1 placement at the top of the spec
            run_policy.setdefault(legacy, spec[legacy])
    carried = {k: run_policy[k] for k in RUN_POLICY_FIELDS if run_policy.get(k) is not None}
    if carried:
        job_spec["runPolicy"] = carried
    for dropped in sorted(set(run_policy) - set(RUN_POLICY_FIELDS)):
        notes.append(f"spec.runPolicy.{dropped}: not carried over (kubetf has no equivalent)")
    if spec.get("successPolicy") == "AllWorkers":
        job_spec["successPolicy"] = "AllWorkers"
    if spec.get("enableDynamicWorker"):
        notes.append("spec.enableDynamicWorker: not carried over; kubetf keeps a fixed set of tasks")

    job = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": metadata, "spec": job_spec}
    return Conversion(job, notes)


def _replica(replica: dict[str, Any], path: str, notes: list[str]) -> tuple[dict[str, Any], int | None]:
    template = copy.deepcopy(replica.get("template") or {})
    out: dict[str, Any] = {"replicas": replica.get("replicas", 1)}
    policy = replica.get("restartPolicy")
    if policy is not None:
        if policy not in RESTART_POLICY_OF:
            raise ConversionError(f"{path}.restartPolicy: unknown value {policy!r}")
        out["restartPolicy"] = RESTART_POLICY_OF[policy]
        if policy == "Always":
            notes.append(
                f"{path}.restartPolicy: Always became OnFailure (kubetf never re-runs a task that exited 0); "
                "failures are now limited by runPolicy.backoffLimit"
            )
    pod_spec = template.get("spec") or {}
    if pod_spec.pop("restartPolicy", None) is not None:
        notes.append(f"{path}.template.spec.restartPolicy: dropped; the operator restarts pods itself")
    port = None
    for container in pod_spec.get("containers") or []:
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


def _strategy(replica_specs: dict[str, dict[str, Any]], notes: list[str]) -> str:
    if "ps" in replica_specs:
        if "chief" not in replica_specs:
            notes.append(
                "spec.tfReplicaSpecs: PS without Chief is a TF1 (Estimator) layout; TF2's ParameterServerStrategy "
                "needs a chief to run the coordinator: add a chief replica"
            )
        return "ParameterServer"
    notes.append(
        "spec.strategy: MultiWorkerMirrored chosen (no PS replicas); it decides what restarts together, "
        "so set it to the strategy the program uses"
    )
    return "MultiWorkerMirrored"
