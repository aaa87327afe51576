import json
import subprocess
import sys

import pytest
import yaml

from kubetf import api, builders
from kubetf.convert import ConversionError, convert


def tfjob(replica_specs, **spec):
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "dist", "namespace": "ml"},
        "spec": {"tfReplicaSpecs": replica_specs, **spec},
    }


def kf_replica(replicas, restart="OnFailure", port=None, **pod_spec):
    container = {"name": "tensorflow", "image": "tf:2", "command": ["python", "train.py"]}
    if port:
        container["ports"] = [{"name": "tfjob-port", "containerPort": port}]
    return {
        "replicas": replicas,
        "restartPolicy": restart,
        "template": {"spec": {"containers": [container], **pod_spec}},
    }


def kubeflow_topology(document):
    """What Kubeflow's TFJob controller runs: pod {job}-{type}-{index}, TF_CONFIG cluster keyed by the
    lowercased type (Master/Chief both as chief here, since TF2 reads them the same), evaluator excluded
    (kubetf deliberately keeps it out of the training cluster)."""
    name = document["metadata"]["name"]
    port = 2222
    for spec in document["spec"]["tfReplicaSpecs"].values():
        for c in spec["template"]["spec"]["containers"]:
            port = next((p["containerPort"] for p in c.get("ports", []) if p["name"] == "tfjob-port"), port)
    cluster = {}
    for kind, spec in document["spec"]["tfReplicaSpecs"].items():
        role = {"master": "chief"}.get(kind.lower(), kind.lower())
        if role != "evaluator":
            cluster[role] = [f"{name}-{role}-{i}:{port}" for i in range(spec["replicas"])]
    return cluster


KUBEFLOW_JOBS = [
    ("ps", tfjob({"Chief": kf_replica(1), "Worker": kf_replica(2), "PS": kf_replica(2), "Evaluator": kf_replica(1)})),
    ("mwms", tfjob({"Worker": kf_replica(4, port=2223)})),
    ("master", tfjob({"Master": kf_replica(1), "Worker": kf_replica(2)}, runPolicy={"cleanPodPolicy": "None"})),
]


@pytest.mark.parametrize("description,document", KUBEFLOW_JOBS, ids=[d for d, _ in KUBEFLOW_JOBS])
def test_converted_job_runs_the_topology_kubeflow_would(description, document):
    conversion = convert(document)
    assert api.validate(conversion.job) == []
    objects = builders.render(conversion.job)
    pods = [o for o in objects if o["kind"] == "Pod"]
    expected = kubeflow_topology(document)
    for pod in pods:
        env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
        config = json.loads(env["TF_CONFIG"])
        if config["task"]["type"] == "evaluator":
            continue
        short = {role: [a.replace(".dist.ml.svc", "") for a in members] for role, members in config["cluster"].items()}
        assert short == expected
    kubeflow_pods = {address.split(":")[0] for members in expected.values() for address in members}
    ours = {p["metadata"]["name"] for p in pods if p["metadata"]["labels"]["kubetf.io/role"] != "evaluator"}
    assert ours == kubeflow_pods


def test_conversion_carries_run_and_success_policy():
    document = tfjob(
        {"Chief": kf_replica(1, restart="ExitCode"), "Worker": kf_replica(2, restart="Never")},
        runPolicy={
            "backoffLimit": 5,
            "activeDeadlineSeconds": 3600,
            "ttlSecondsAfterFinished": 60,
            "cleanPodPolicy": "All",
            "suspend": True,
        },
        successPolicy="AllWorkers",
    )
    job = convert(document).job
    assert job["spec"]["runPolicy"] == {
        "backoffLimit": 5,
        "activeDeadlineSeconds": 3600,
        "ttlSecondsAfterFinished": 60,
        "cleanPodPolicy": "All",
        "suspend": True,
    }
    assert job["spec"]["successPolicy"] == "AllWorkers"
    assert job["spec"]["replicaSpecs"]["chief"]["restartPolicy"] == "ExitCode"
    assert job["spec"]["replicaSpecs"]["worker"]["restartPolicy"] == "Never"
    assert job["metadata"] == {"name": "dist", "namespace": "ml"}


def test_conversion_notes_what_it_cannot_carry():
    document = tfjob(
        {"Master": kf_replica(1, restart="Always", restartPolicy="Always"), "Worker": kf_replica(1)},
        runPolicy={"schedulingPolicy": {"minAvailable": 2}},
        enableDynamicWorker=True,
    )
    conversion = convert(document)
    notes = "\n".join(conversion.notes)
    assert "Master became chief" in notes
    assert "Always became OnFailure" in notes
    assert "template.spec.restartPolicy: dropped" in notes
    assert "spec.runPolicy.schedulingPolicy: not carried over" in notes
    assert "spec.enableDynamicWorker" in notes
    assert api.validate(conversion.job) == []


@pytest.mark.parametrize(
    "document,message",
    [
        ({"kind": "Deployment"}, "expected a Kubeflow TFJob"),
        ({"apiVersion": "kubeflow.org/v1beta2", "kind": "TFJob"}, "apiVersion must be kubeflow.org/v1"),
        (tfjob({"Launcher": kf_replica(1)}), "spec.tfReplicaSpecs.Launcher: unknown replica type"),
        (tfjob({"Chief": kf_replica(1), "Master": kf_replica(1)}), "a second chief"),
    ],
)
def test_conversion_errors(document, message):
    with pytest.raises(ConversionError, match=message):
        convert(document)


def test_convert_cli(tmp_path):
    path = tmp_path / "tfjob.yaml"
    path.write_text(yaml.safe_dump(KUBEFLOW_JOBS[2][1]))
    result = subprocess.run(
        [sys.executable, "-m", "kubetf.cli", "convert", "-f", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    (job,) = list(yaml.safe_load_all(result.stdout))
    assert job["kind"] == "TrainingJob"
    assert sorted(job["spec"]["replicaSpecs"]) == ["chief", "worker"]
    assert "note: spec.tfReplicaSpecs.Master: Master became chief" in result.stderr
