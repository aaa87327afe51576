"""TrainingJobs for unit tests: every strategy and role mix."""

import copy
from typing import Any


def container(image: str = "kubetf/trainer:0.1.0", **extra: Any) -> dict[str, Any]:
    return {"name": "tensorflow", "image": image, "command": ["python", "train.py"], **extra}


def replica(replicas: int = 1, **extra: Any) -> dict[str, Any]:
    spec = {"replicas": replicas, "template": {"spec": {"containers": [container()]}}}
    spec.update(extra)
    return spec


def job(name: str = "mnist", strategy: str = "MultiWorkerMirrored", namespace: str = "team-a", **specs: Any) -> dict:
    return {
        "apiVersion": "kubetf.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": namespace, "uid": "1234-uid"},
        "spec": {"strategy": strategy, "replicaSpecs": copy.deepcopy(specs)},
    }


def with_spec(document: dict, **spec: Any) -> dict:
    document["spec"].update(spec)
    return document


# (description, job): valid jobs covering every strategy and role mix.
VALID_JOBS = [
    ("mwms workers only", job(worker=replica(2))),
    ("mwms chief and workers", job(chief=replica(1), worker=replica(3))),
    ("mwms with evaluator", job(chief=replica(1), worker=replica(2), evaluator=replica(1))),
    ("mwms single worker", job(worker=replica(1))),
    (
        "ps full",
        job(strategy="ParameterServer", chief=replica(1), worker=replica(2), ps=replica(2), evaluator=replica(1)),
    ),
    ("ps minimal", job(strategy="ParameterServer", chief=replica(1), worker=replica(1), ps=replica(1))),
    ("independent tf1 between-graph", job(strategy="Independent", worker=replica(2), ps=replica(1))),
    (
        "independent estimator, all workers",
        with_spec(
            job(strategy="Independent", chief=replica(1), worker=replica(2), ps=replica(2), evaluator=replica(1)),
            successPolicy="AllWorkers",
        ),
    ),
    ("mirrored chief", job(strategy="Mirrored", chief=replica(1, gpus=2))),
    ("mirrored worker with evaluator", job(strategy="Mirrored", worker=replica(1), evaluator=replica(1))),
]
