"""`kubetf convert --from-cluster` against a real API server serving Kubeflow's TFJob CRD (v1.9.4, from its Go
module; no Kubeflow operator): the TFJobs of the cluster become a TrainingJob stream the API server accepts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from tests.cluster.fixture import wait_for

KUBEFLOW_MODULE = "github.com/kubeflow/training-operator@v1.9.4"
TFJOB_CRD = "tfjobs.kubeflow.org"


def tfjob_crd_file() -> Path:
    """Kubeflow's TFJob CRD from the Go module cache, downloaded through the module proxy when missing."""
    result = subprocess.run(
        ["go", "mod", "download", "-json", KUBEFLOW_MODULE], capture_output=True, text=True, timeout=600, check=False
    )
    if result.returncode != 0:
        pytest.fail(f"go mod download {KUBEFLOW_MODULE} failed:\n{result.stdout}\n{result.stderr}")
    return Path(json.loads(result.stdout)["Dir"]) / "manifests" / "base" / "crds" / "kubeflow.org_tfjobs.yaml"


@pytest.fixture(scope="module")
def tfjob_api(cluster, kube_cluster):
    # Server-side: the CRD is too large for the last-applied annotation of a client-side apply.
    kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(tfjob_crd_file()))

    def established():
        status = cluster.ext.read_custom_resource_definition(TFJOB_CRD).status
        return any(c.type == "Established" and c.status == "True" for c in status.conditions or [])

    wait_for(established, 60, "Kubeflow's TFJob CRD established")
    return cluster


@pytest.fixture
def two_namespaces(tfjob_api):
    names = [f"conv-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    for name in names:
        tfjob_api.core.create_namespace({"metadata": {"name": name}})
    yield names
    for name in names:
        tfjob_api.core.delete_namespace(name)


def kubeflow_replica(replicas, restart="OnFailure"):
    container = {"name": "tensorflow", "image": "kubetf/trainer:0.1.0", "args": ["python", "/opt/train.py"]}
    return {"replicas": replicas, "restartPolicy": restart, "template": {"spec": {"containers": [container]}}}


def create_tfjob(cluster, namespace, name, replica_specs, **spec):
    body = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": namespace, "labels": {"team": "vision"}},
        "spec": {"tfReplicaSpecs": replica_specs, **spec},
    }
    cluster.custom.create_namespaced_custom_object("kubeflow.org", "v1", namespace, "tfjobs", body)


def kubetf(cluster, *args):
    return subprocess.run(
        [sys.executable, "-m", "kubetf.cli", "convert", "--from-cluster", "--kubeconfig", cluster.kubeconfig, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=dict(os.environ),
    )


def test_convert_from_cluster_prints_the_stream_and_the_summary(tfjob_api, two_namespaces):
    cluster = tfjob_api
    first, second = sorted(two_namespaces)
    create_tfjob(cluster, first, "dist-mnist", {"PS": kubeflow_replica(1), "Worker": kubeflow_replica(2)})
    create_tfjob(
        cluster,
        first,
        "ps-tf2",
        {"Chief": kubeflow_replica(1), "PS": kubeflow_replica(1), "Worker": kubeflow_replica(2)},
        runPolicy={"cleanPodPolicy": "Running"},
    )
    create_tfjob(cluster, second, "multi-worker", {"Worker": kubeflow_replica(2)}, runPolicy={"cleanPodPolicy": "None"})
    too_long = "a" * 56  # a valid TFJob name; {name}-worker-0 is over the 63 characters of a pod name
    create_tfjob(cluster, second, too_long, {"Worker": kubeflow_replica(2)})

    result = kubetf(cluster)
    assert result.returncode == 1, result.stderr
    jobs = [j for j in yaml.safe_load_all(result.stdout) if j["metadata"]["namespace"] in two_namespaces]
    assert [(j["metadata"]["namespace"], j["metadata"]["name"], j["spec"]["strategy"]) for j in jobs] == [
        (first, "dist-mnist", "Independent"),
        (first, "ps-tf2", "ParameterServer"),
        (second, "multi-worker", "MultiWorkerMirrored"),
    ]
    err = result.stderr.splitlines()
    assert f"tfjob {first}/ps-tf2: note: spec.tfReplicaSpecs: PS with Chief fits TF2 ParameterServerStrategy" in (
        "\n".join(err)
    )
    assert any(
        line.startswith(f"tfjob {second}/{too_long}: not converted: the TrainingJob would be invalid: metadata.name")
        for line in err
    ), err
    print("\n" + result.stderr)

    # One namespace, and every converted job is one the API server takes.
    result = kubetf(cluster, "-n", second)
    assert result.stderr.splitlines()[-1] == (
        "2 TFJob(s): 1 converted cleanly, 0 converted with notes, 1 not converted"
    )
    result = kubetf(cluster, "-n", first)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[-1] == (
        "2 TFJob(s): 0 converted cleanly, 2 converted with notes, 0 not converted"
    )
    for job in yaml.safe_load_all(result.stdout):
        try:
            cluster.custom.create_namespaced_custom_object(
                "kubetf.io", "v1alpha1", first, "trainingjobs", job, dry_run="All", field_validation="Strict"
            )
        except ApiException as error:
            pytest.fail(f"the API server refused converted {job['metadata']['name']}: {error.body}")
