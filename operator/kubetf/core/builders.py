"""Pure functions from a TrainingJob to the objects that run it: pods, the headless Service, the checkpoint PVC.

No I/O here. Every function takes the job as the API server stores it (defaults applied: `api.with_defaults`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from kubetf.core import api
from kubetf.core.api import Job
from kubetf.core.progress import identity

# Enough for one training step plus a checkpoint save after SIGTERM (PreemptionCheckpointHandler).
DEFAULT_TERMINATION_GRACE_SECONDS = 120
CHECKPOINT_VOLUME = "kubetf-checkpoint"
PROGRESS_VOLUME = "kubetf-progress"
PROGRESS_TOKEN_SECONDS = 3600  # the kubelet rotates it at 80%; the endpoint caches a review until it expires
PORT_NAME = "tf"
NODE_LOSS_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")

AddressOf = Callable[[str, int], str]


def pod_name(job_name: str, role: str, index: int) -> str:
    return f"{job_name}-{role}-{index}"


def service_name(job: Job) -> str:
    return api.name(job)


def pvc_name(job: Job) -> str:
    existing = (job["spec"].get("checkpoint") or {}).get("existingClaim")
    return str(existing) if existing else f"{api.name(job)}-checkpoint"


def dns_address(job: Job) -> AddressOf:
    """Stable `host:port` of a task: the pod's hostname under the job's headless Service."""
    job_name, namespace, port = api.name(job), api.namespace(job), job["spec"]["port"]

    def address(role: str, index: int) -> str:
        return f"{pod_name(job_name, role, index)}.{job_name}.{namespace}.svc:{port}"

    return address


def cluster_spec(job: Job, address_of: AddressOf) -> dict[str, list[str]]:
    """The training cluster: chief, worker and ps tasks. The evaluator is never part of it (tensorflow#46169)."""
    return {
        role: [address_of(role, i) for i in range(spec["replicas"])]
        for role, spec in api.replica_specs(job).items()
        if role in api.TRAINING_ROLES
    }


def tf_config(job: Job, role: str, index: int, address_of: AddressOf | None = None) -> dict[str, Any]:
    address_of = address_of or dns_address(job)
    if role == "evaluator" and api.strategy(job) == "Independent":
        # Estimator's evaluator refuses a cluster without the chief (RunConfig: 'must have one "chief" node'); it
        # reads the training cluster, never joins it, and no training task's cluster lists it.
        return {"cluster": cluster_spec(job, address_of), "task": {"type": role, "index": index}}
    if role == "evaluator":
        return {"cluster": {"evaluator": [address_of(role, index)]}, "task": {"type": role, "index": index}}
    return {"cluster": cluster_spec(job, address_of), "task": {"type": role, "index": index}}


def task_env(
    job: Job,
    role: str,
    index: int,
    address_of: AddressOf | None = None,
    checkpoint_dir: str | None = None,
) -> dict[str, str]:
    """Every environment variable the operator sets on a task's training container.

    `address_of` and `checkpoint_dir` let `kubetf local` run the same task on localhost ports and a local directory.
    """
    spec = job["spec"]
    env = {
        "TF_CONFIG": json.dumps(tf_config(job, role, index, address_of), separators=(",", ":")),
        "KUBETF_JOB_NAME": api.name(job),
        "KUBETF_ROLE": role,
        "KUBETF_INDEX": str(index),
        "KUBETF_STRATEGY": api.strategy(job),
    }
    checkpoint = spec.get("checkpoint")
    if checkpoint_dir or checkpoint:
        env["KUBETF_CHECKPOINT_DIR"] = checkpoint_dir or checkpoint["mountPath"]
    uid = job["metadata"].get("uid")
    if uid:
        # Which run of the job this is (every restart of its pods is the same; a job made again, or dispatched again
        # by MultiKueue to another cluster, is a new one): the trainer library lets one run at a time write a
        # checkpoint directory that runs share (kubetf_trainer.fence). None offline: no job object yet.
        env["KUBETF_RUN_ID"] = uid
    limits = (training_container(job, role).get("resources") or {}).get("limits") or {}
    if "cpu" in limits:
        threads = api.cpu_threads(limits["cpu"])
        inter_op = threads
        if "ps" in api.replica_specs(job):
            # A ps/worker server runs one op per connected worker at once: fewer inter-op threads deadlock it.
            workers = api.replica_specs(job).get("worker", {}).get("replicas", 0)
            inter_op = max(threads, workers + 1)
        # TensorFlow sizes its pools from the host's cores, not the cgroup quota (tensorflow#17206).
        env |= {
            "TF_NUM_INTRAOP_THREADS": str(threads),
            "TF_NUM_INTEROP_THREADS": str(inter_op),
            "OMP_NUM_THREADS": str(threads),
        }
    if api.strategy(job) == "ParameterServer":
        env["GRPC_FAIL_FAST"] = "use_caller"
    return env


def training_container(job: Job, role: str) -> dict[str, Any]:
    """The role's training container as written in its template (the one named tensorflow, else the first)."""
    pod_spec = job["spec"]["replicaSpecs"][role]["template"]["spec"]
    container: dict[str, Any] = pod_spec["containers"][api.training_container_index(pod_spec)]
    return container


def labels(job: Job) -> dict[str, str]:
    return {api.LABEL_MANAGED_BY: api.MANAGER, api.LABEL_JOB: api.name(job)}


def pod_labels(job: Job, role: str, index: int, attempt: int) -> dict[str, str]:
    return labels(job) | {api.LABEL_ROLE: role, api.LABEL_INDEX: str(index), api.LABEL_ATTEMPT: str(attempt)}


def owner_references(job: Job) -> list[dict[str, Any]]:
    """The job as controller owner; empty offline, where the job has no uid yet."""
    uid = job["metadata"].get("uid")
    if not uid:
        return []
    return [
        {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "name": api.name(job),
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def _metadata(job: Job, name: str, extra_labels: dict[str, str] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": api.namespace(job),
        "labels": labels(job) | (extra_labels or {}),
    }
    owners = owner_references(job)
    if owners:
        metadata["ownerReferences"] = owners
    return metadata


def desired_pod(job: Job, role: str, index: int, attempt: int = 0, progress_url: str = "") -> dict[str, Any]:
    """The pod of task `role`-`index`; with `progress_url`, where and with which token it reports its progress. Its
    scheduler integrations then put it where they place pods (kubetf.core.scheduling: `join`)."""
    spec = job["spec"]
    replica = spec["replicaSpecs"][role]
    template = copy.deepcopy(replica["template"])
    template_meta = template.get("metadata") or {}
    pod_spec: dict[str, Any] = template["spec"]
    job_name = api.name(job)

    metadata = _metadata(job, pod_name(job_name, role, index))
    metadata["labels"] = dict(template_meta.get("labels") or {}) | pod_labels(job, role, index, attempt)
    if template_meta.get("annotations"):
        metadata["annotations"] = dict(template_meta["annotations"])
    if spec.get("priorityClassName"):
        pod_spec["priorityClassName"] = spec["priorityClassName"]

    # The operator owns restarts: pods never restart in place, so group restarts and counting are possible.
    pod_spec["restartPolicy"] = "Never"
    pod_spec["hostname"] = pod_name(job_name, role, index)
    pod_spec["subdomain"] = service_name(job)
    pod_spec.setdefault("terminationGracePeriodSeconds", DEFAULT_TERMINATION_GRACE_SECONDS)
    pod_spec.setdefault("enableServiceLinks", False)

    container = pod_spec["containers"][api.training_container_index(pod_spec)]
    _training_container(container, job, role, index)
    _tolerations(pod_spec, container, job, replica.get("gpus"))
    if spec.get("checkpoint"):
        _checkpoint_volume(pod_spec, container, job)
    if progress_url:
        _progress_reports(pod_spec, container, progress_url)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def _training_container(container: dict[str, Any], job: Job, role: str, index: int) -> None:
    ours = task_env(job, role, index)
    container["env"] = [e for e in container.get("env") or [] if e.get("name") not in ours] + [
        {"name": key, "value": value} for key, value in ours.items()
    ]
    # A program that fails leaves its last log lines as the termination message: the restart's reason quotes them.
    container.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
    port = job["spec"]["port"]
    ports = [p for p in container.get("ports") or [] if p.get("containerPort") != port]
    container["ports"] = [*ports, {"name": PORT_NAME, "containerPort": port, "protocol": "TCP"}]


def _tolerations(pod_spec: dict[str, Any], container: dict[str, Any], job: Job, gpus: int | None) -> None:
    # A lost node's pods are evicted after nodeLossTimeoutSeconds, not Kubernetes' 300 s: a training task on a
    # node that stopped reporting is lost to its peers long before that.
    tolerations = pod_spec.setdefault("tolerations", [])
    for taint in NODE_LOSS_TAINTS:
        if not any(t.get("key") == taint for t in tolerations):
            seconds = api.run_policy(job)["nodeLossTimeoutSeconds"]
            tolerations.append(
                {"key": taint, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}
            )
    if gpus:
        container.setdefault("resources", {}).setdefault("limits", {})[api.GPU_RESOURCE] = gpus
        if not any(t.get("key") == api.GPU_RESOURCE for t in tolerations):
            tolerations.append({"key": api.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})


def _checkpoint_volume(pod_spec: dict[str, Any], container: dict[str, Any], job: Job) -> None:
    pod_spec["volumes"] = [v for v in pod_spec.get("volumes") or [] if v.get("name") != CHECKPOINT_VOLUME] + [
        {"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": pvc_name(job)}}
    ]
    mounts = [m for m in container.get("volumeMounts") or [] if m.get("name") != CHECKPOINT_VOLUME]
    mount_path = job["spec"]["checkpoint"]["mountPath"]
    container["volumeMounts"] = [*mounts, {"name": CHECKPOINT_VOLUME, "mountPath": mount_path}]


def _progress_reports(pod_spec: dict[str, Any], container: dict[str, Any], url: str) -> None:
    """A token only the progress endpoint accepts (its audience), bound to this pod and rotated by the kubelet: the
    pod can report for its own job and do nothing else with it (kubetf.runtime.progress)."""
    token = {"audience": identity.AUDIENCE, "expirationSeconds": PROGRESS_TOKEN_SECONDS, "path": "token"}
    volume = {"name": PROGRESS_VOLUME, "projected": {"sources": [{"serviceAccountToken": token}]}}
    pod_spec["volumes"] = [v for v in pod_spec.get("volumes") or [] if v.get("name") != PROGRESS_VOLUME] + [volume]
    mounts = [m for m in container.get("volumeMounts") or [] if m.get("name") != PROGRESS_VOLUME]
    container["volumeMounts"] = [*mounts, {"name": PROGRESS_VOLUME, "mountPath": identity.TOKEN_PATH, "readOnly": True}]
    ours = {"KUBETF_PROGRESS_URL": url, "KUBETF_PROGRESS_TOKEN_FILE": f"{identity.TOKEN_PATH}/token"}
    container["env"] = [e for e in container["env"] if e.get("name") not in ours] + [
        {"name": key, "value": value} for key, value in ours.items()
    ]


def desired_pods(
    job: Job, attempts: dict[tuple[str, int], int] | None = None, progress_url: str = ""
) -> list[dict[str, Any]]:
    attempts = attempts or {}
    return [desired_pod(job, role, i, attempts.get((role, i), 0), progress_url) for role, i in api.tasks(job)]


def desired_service(job: Job) -> dict[str, Any]:
    """One headless Service: every pod's `hostname.subdomain` resolves, ready or not, so tasks find each other
    while the cluster is still starting."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, service_name(job)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {api.LABEL_JOB: api.name(job)},
            "ports": [{"name": PORT_NAME, "port": job["spec"]["port"], "targetPort": job["spec"]["port"]}],
        },
    }


def desired_pvc(job: Job) -> dict[str, Any] | None:
    """The checkpoint PVC the job owns, or None (no checkpoint, or an existing claim).

    A PVC kept on delete (`retainOnDelete`) carries no owner reference, so the garbage collector leaves it.
    """
    checkpoint = job["spec"].get("checkpoint")
    if not checkpoint or checkpoint.get("existingClaim"):
        return None
    metadata = _metadata(job, pvc_name(job))
    if checkpoint.get("retainOnDelete", True):
        metadata.pop("ownerReferences", None)
    spec: dict[str, Any] = {
        "accessModes": list(checkpoint["accessModes"]),
        "resources": {"requests": {"storage": str(checkpoint["size"])}},
    }
    if checkpoint.get("storageClassName"):
        spec["storageClassName"] = checkpoint["storageClassName"]
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata, "spec": spec}


def render(job: Job) -> list[dict[str, Any]]:
    """Everything the operator creates for a fresh job, in creation order."""
    job = api.with_defaults(job)
    objects: list[dict[str, Any]] = []
    pvc = desired_pvc(job)
    if pvc:
        objects.append(pvc)
    objects.append(desired_service(job))
    objects.extend(desired_pods(job))
    return objects
