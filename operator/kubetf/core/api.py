"""The TrainingJob API: names, defaults and validation, all read from the CRD (the single source of truth).

`with_defaults` applies the CRD schema's defaults the way the API server does, so the operator, `kubetf render`
and `kubetf local` see the same job the cluster stores. `validate` runs the schema, the CRD's CEL rules and the
checks only the operator can make, and returns one `Problem` per issue with its field path.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from typing import Any, cast

import celpy
import jsonschema
import yaml

GROUP = "kubetf.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TrainingJob"
PLURAL = "trainingjobs"
CRD_NAME = f"{PLURAL}.{GROUP}"
CRD_FILE = f"{CRD_NAME}.yaml"

# TF_CONFIG's own job names, in the order TF_CONFIG lists them.
ROLES = ("chief", "worker", "ps", "evaluator")
TRAINING_ROLES = ("chief", "worker", "ps")
# Independent: programs that only read TF_CONFIG (TF1 between-graph, Estimator, custom); see policy.restart_targets.
STRATEGIES = ("MultiWorkerMirrored", "ParameterServer", "Mirrored", "Independent")

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_JOB = "kubetf.io/job-name"
LABEL_ROLE = "kubetf.io/role"
LABEL_INDEX = "kubetf.io/index"
LABEL_ATTEMPT = "kubetf.io/attempt"
MANAGER = "kubetf"
# Every pod the operator creates, and nothing else: what its watch asks the API server for.
MANAGED_PODS_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGER},{LABEL_JOB}"

TRAINING_CONTAINER = "tensorflow"
GPU_RESOURCE = "nvidia.com/gpu"
# Kueue's queue label, as on every Kueue job type (kubetf/kueue.py). Its value names a LocalQueue: a DNS-1123
# subdomain, which the chart's ValidatingAdmissionPolicy checks at apply time (CEL in a CRD cannot read labels).
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# spec.managedBy of a job MultiKueue dispatches to a worker cluster (kubetf/core/scheduling/multikueue.py).
MANAGED_BY_MULTIKUEUE = "kueue.x-k8s.io/multikueue"
_QUEUE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

Job = dict[str, Any]


@dataclass(frozen=True, order=True)
class Problem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


@functools.cache
def crd() -> dict[str, Any]:
    text = resources.files("kubetf").joinpath("crd", CRD_FILE).read_text()
    # libyaml when PyYAML has it: every operator process parses the CRD before its first decision (0.08 s of CPU in
    # pure Python, more on a busy machine; 0.006 s in C).
    loaded: dict[str, Any] = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return loaded


def openapi_schema() -> dict[str, Any]:
    for version in crd()["spec"]["versions"]:
        if version["name"] == VERSION:
            schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
            return schema
    raise LookupError(f"CRD has no version {VERSION}")


# ---------------------------------------------------------------- defaults


def with_defaults(job: Job) -> Job:
    """A copy of the job with the CRD's defaults applied, as the API server stores it."""
    result = copy.deepcopy(job)
    _apply_defaults(result, openapi_schema())
    return result


def _apply_defaults(value: Any, schema: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                _apply_defaults(value[name], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for name, item in value.items():
                if name not in schema.get("properties", {}):
                    _apply_defaults(item, extra)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            _apply_defaults(item, schema["items"])


# ---------------------------------------------------------------- accessors over a defaulted job


def name(job: Job) -> str:
    return str(job["metadata"]["name"])


def namespace(job: Job) -> str:
    return str(job["metadata"].get("namespace") or "default")


def strategy(job: Job) -> str:
    return str(job["spec"]["strategy"])


def replica_specs(job: Job) -> dict[str, dict[str, Any]]:
    """Role -> replica spec, in TF_CONFIG order, roles with zero replicas left out."""
    specs = job["spec"]["replicaSpecs"]
    return {role: specs[role] for role in ROLES if role in specs and specs[role]["replicas"] > 0}


def tasks(job: Job) -> list[tuple[str, int]]:
    """Every (role, index) the job runs, chief first."""
    return [(role, i) for role, spec in replica_specs(job).items() for i in range(spec["replicas"])]


def run_policy(job: Job) -> dict[str, Any]:
    policy: dict[str, Any] = job["spec"].get("runPolicy") or {}
    return policy


def training_container_index(pod_spec: dict[str, Any]) -> int:
    containers = pod_spec.get("containers") or []
    for i, container in enumerate(containers):
        if container.get("name") == TRAINING_CONTAINER:
            return i
    return 0


def training_container_status(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The kubelet's status of a pod's training container (its `state`, `lastState`, `restartCount`), if it said."""
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or [{}]
    name = containers[training_container_index(spec)].get("name")
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next((c for c in statuses if c.get("name") == name), None)


def cpu_quantity(value: Any) -> float:
    """A Kubernetes CPU quantity ("2", "500m", 1.5) in cores."""
    text = str(value).strip()
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(m?)", text)
    if not match:
        raise ValueError(f"{text!r} is not a CPU quantity (examples: 2, 1.5, 500m)")
    number = float(match.group(1))
    return number / 1000 if match.group(2) else number


_SUFFIXES = {
    "m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60,
}  # fmt: skip


def quantity(value: Any) -> float:
    """Any Kubernetes resource quantity ("500m", "4Gi", "1e3", 2) in its base unit."""
    text = str(value).strip()
    match = re.fullmatch(r"([+-]?[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?", text)
    if not match:
        raise ValueError(f"{text!r} is not a resource quantity (examples: 500m, 2, 4Gi)")
    return float(match.group(1)) * _SUFFIXES[match.group(2) or ""]


def format_quantity(name: str, value: float) -> str:
    """A quantity in its base unit, written back: CPU in millicores when fractional, the rest whole."""
    if name == "cpu" and value != int(value):
        return f"{math.ceil(value * 1000)}m"
    return str(math.ceil(value))


def cpu_threads(cpu_limit: Any) -> int:
    return max(1, math.ceil(cpu_quantity(cpu_limit)))


# ---------------------------------------------------------------- validation


def validate(document: Any) -> list[Problem]:
    """Every problem with a TrainingJob document: what the API server rejects, then what the operator would."""
    problems = cluster_problems(document)
    if problems:
        return problems
    return operator_problems(with_defaults(document))


def cluster_problems(document: Any) -> list[Problem]:
    """What the API server rejects at `kubectl apply`: identity, the CRD schema and its CEL rules."""
    if not isinstance(document, dict):
        return [Problem("", f"expected a TrainingJob object, got {type(document).__name__}")]
    problems = []
    if document.get("apiVersion") != API_VERSION:
        problems.append(Problem("apiVersion", f"must be {API_VERSION}, got {document.get('apiVersion')!r}"))
    if document.get("kind") != KIND:
        problems.append(Problem("kind", f"must be {KIND}, got {document.get('kind')!r}"))
    metadata = document.get("metadata")
    if not isinstance(metadata, dict) or not metadata.get("name"):
        problems.append(Problem("metadata.name", "required: every TrainingJob needs a name"))
    if problems:
        return problems
    job = with_defaults(document)
    problems = _schema_problems(job)
    problems += [p for p in _cel_problems(job) if p not in problems]
    problems += _queue_label_problems(job)
    return sorted(set(problems), key=lambda p: (p.path, p.message))


def _queue_label_problems(job: Job) -> list[Problem]:
    """What the chart's ValidatingAdmissionPolicies (queue-name-policy.yaml) refuse at create time, offline. (The
    queue label is also fixed while the job runs: only an update of a stored job can break that.)"""
    queue = ((job.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL)
    problems = []
    if queue is not None and not (len(queue) <= 253 and _QUEUE_NAME.match(queue)):
        problems.append(
            Problem(
                f"metadata.labels[{QUEUE_LABEL}]",
                f"{queue!r} is not a LocalQueue name: lowercase letters, digits, '-' and '.', starting and ending with "
                "a letter or digit. Use the name of a LocalQueue in the job's namespace (kubectl get localqueues)",
            )
        )
    if (job.get("spec") or {}).get("managedBy") == MANAGED_BY_MULTIKUEUE and not queue:
        problems.append(
            Problem(
                "spec.managedBy",
                f"{MANAGED_BY_MULTIKUEUE} needs the label {QUEUE_LABEL}, or nothing ever dispatches the job: add the "
                "label, naming a LocalQueue whose ClusterQueue has a MultiKueue admission check, or remove "
                "spec.managedBy to run the job on this cluster",
            )
        )
    return problems


def operator_problems(job: Job) -> list[Problem]:
    """Checks the CRD cannot express; a job failing them ends Failed with no pods."""
    problems = []
    for role, spec in replica_specs(job).items():
        base = f"spec.replicaSpecs.{role}"
        pod_spec = spec["template"]["spec"]
        index = training_container_index(pod_spec)
        container = pod_spec["containers"][index]
        cpath = f"{base}.template.spec.containers[{index}]"
        limits = (container.get("resources") or {}).get("limits") or {}
        if "cpu" in limits:
            try:
                cpu_quantity(limits["cpu"])
            except ValueError as error:
                problems.append(Problem(f"{cpath}.resources.limits.cpu", str(error)))
        gpus = spec.get("gpus")
        if gpus is not None and GPU_RESOURCE in limits and str(limits[GPU_RESOURCE]) != str(gpus):
            problems.append(
                Problem(
                    f"{base}.gpus",
                    f"gpus: {gpus} contradicts resources.limits[{GPU_RESOURCE}]: {limits[GPU_RESOURCE]} "
                    "in the training container; set one of them",
                )
            )
        restart = pod_spec.get("restartPolicy")
        if restart not in (None, "Never"):
            problems.append(
                Problem(
                    f"{base}.template.spec.restartPolicy",
                    f"{restart!r} is not allowed: the operator restarts pods itself (never in place); "
                    f"remove it and set {base}.restartPolicy (Never, OnFailure or ExitCode) instead",
                )
            )
        names = [c.get("name") for c in pod_spec["containers"]]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            problems.append(Problem(f"{base}.template.spec.containers", f"duplicate container name {duplicates[0]!r}"))
    return problems


def _schema_problems(job: Job) -> list[Problem]:
    validator = _validator()
    problems = []
    for error in validator.iter_errors(job):
        problems.append(Problem(_path(error.absolute_path), _schema_message(error)))
    return problems


@functools.cache
def _validator() -> jsonschema.protocols.Validator:
    schema = _to_json_schema(openapi_schema())
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    validator: jsonschema.protocols.Validator = cls(schema)
    return validator


def _to_json_schema(node: Any) -> Any:
    """OpenAPI v3 (Kubernetes flavour) to JSON Schema: nullable, int-or-string, and strict unknown fields
    (what `kubectl apply` enforces with server-side field validation)."""
    if isinstance(node, list):
        return [_to_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: _to_json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes") and k != "nullable"}
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
        if "pattern" in out:
            # A pattern only constrains strings; integers are valid quantities already.
            out["if"] = {"type": "string"}
            out["then"] = {"pattern": out.pop("pattern")}
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"] if isinstance(out["type"], str) else [*out["type"], "null"]
    if (
        out.get("type") == "object"
        and "properties" in out
        and "additionalProperties" not in out
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def _schema_message(error: jsonschema.ValidationError) -> str:
    validator = error.validator
    if validator == "required":
        missing = re.match(r"'([^']+)'", error.message)
        return f"required field {missing.group(1) if missing else ''} is missing".replace("  ", " ")
    if validator == "additionalProperties":
        extra = re.findall(r"'([^']+)'", error.message)
        return f"unknown field {', '.join(extra)}"
    if validator == "enum":
        allowed = ", ".join(str(v) for v in cast(list[Any], error.validator_value))
        return f"unsupported value {error.instance!r}: must be one of {allowed}"
    if validator == "minimum":
        return f"must be at least {error.validator_value}, got {error.instance}"
    if validator == "maximum":
        return f"must be at most {error.validator_value}, got {error.instance}"
    if validator == "type":
        expected = error.validator_value
        expected = " or ".join(expected) if isinstance(expected, list) else expected
        return f"must be of type {expected}, got {type(error.instance).__name__} {error.instance!r}"
    if validator == "minItems":
        return f"must have at least {error.validator_value} item(s)"
    if validator == "minLength":
        return "must not be empty"
    if validator == "minProperties":
        return f"must have at least {error.validator_value} entry"
    if validator == "maxProperties":
        return f"must have at most {error.validator_value} entries"
    if validator == "pattern":
        return f"{error.instance!r} does not match {error.validator_value}"
    return error.message


def _path(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _cel_problems(job: Job) -> list[Problem]:
    problems = []
    for path, schema, rule, value in _cel_rules(job, openapi_schema(), []):
        if "oldSelf" in rule["rule"]:
            continue  # a transition rule: only an update of a stored job has an old object
        try:
            ok = _cel_eval(rule["rule"], value)
        except Exception:  # a rule over a malformed value: the schema error already says why
            continue
        if ok:
            continue
        message = rule.get("message", "")
        if "messageExpression" in rule:
            with contextlib.suppress(Exception):
                message = str(_cel_eval(rule["messageExpression"], value))
        field = _path(path)
        if rule.get("fieldPath"):
            field = _field_path(field, schema, rule["fieldPath"])
        problems.append(Problem(field, message or f"failed rule {rule['rule']}"))
    return problems


def _field_path(field: str, schema: dict[str, Any], relative: str) -> str:
    """A rule's fieldPath (`.replicaSpecs.worker.template`) below `field`, spelt as the API server says it: a key of
    a map (a schema of additionalProperties) in brackets, `spec.replicaSpecs[worker].template`."""
    for name in relative.lstrip(".").split("."):
        if name in schema.get("properties", {}):
            field, schema = f"{field}.{name}" if field else name, schema["properties"][name]
        else:
            field, schema = f"{field}[{name}]", schema.get("additionalProperties") or {}
    return field


def _cel_rules(
    value: Any, schema: dict[str, Any], path: list[Any]
) -> Iterator[tuple[list[Any], dict[str, Any], dict[str, Any], Any]]:
    for rule in schema.get("x-kubernetes-validations", []):
        yield path, schema, rule, value
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                yield from _cel_rules(value[key], sub, [*path, key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, item in value.items():
                yield from _cel_rules(item, extra, [*path, key])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            yield from _cel_rules(item, schema["items"], [*path, i])


@functools.cache
def _cel_program(expression: str) -> Any:
    environment = celpy.Environment()
    return environment.program(environment.compile(expression))


def _cel_eval(expression: str, value: Any) -> Any:
    result = _cel_program(expression).evaluate({"self": celpy.json_to_cel(value)})
    if isinstance(result, celpy.CELEvalError | Exception):
        raise ValueError(str(result))
    return result


# ---------------------------------------------------------------- documents


def load_documents(text: str) -> list[Any]:
    """Every YAML document in the text, empty ones dropped. Raises yaml.YAMLError on malformed YAML."""
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]
