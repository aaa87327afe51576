import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kubetf.cli.main import main
from kubetf.core import api

from .jobs import VALID_JOBS, job, replica

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = sorted((ROOT / "manifests" / "samples").glob("*.yaml"))


def problems(document):
    return [str(p) for p in api.validate(document)]


@pytest.mark.parametrize("description,document", VALID_JOBS, ids=[d for d, _ in VALID_JOBS])
def test_valid_jobs_have_no_problems(description, document):
    assert problems(document) == []


@pytest.mark.parametrize("sample", SAMPLES, ids=[s.name for s in SAMPLES])
def test_samples_are_valid(sample, capsys):
    assert main(["validate", "-f", str(sample)]) == 0
    assert capsys.readouterr().out == ""


KUEUE_SAMPLES = sorted((ROOT / "manifests" / "samples" / "kueue").glob("mnist-*.yaml"))


@pytest.mark.parametrize("sample", KUEUE_SAMPLES, ids=[s.name for s in KUEUE_SAMPLES])
def test_kueue_samples_are_valid_and_queued_in_the_demo_local_queue(sample, capsys):
    assert main(["validate", "-f", str(sample)]) == 0
    queues = list(yaml.safe_load_all((sample.parent / "queues.yaml").read_text()))
    (local_queue,) = [q for q in queues if q["kind"] == "LocalQueue"]
    job = yaml.safe_load(sample.read_text())
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == local_queue["metadata"]["name"]


def test_samples_cover_every_strategy():
    strategies = {yaml.safe_load(s.read_text())["spec"]["strategy"] for s in SAMPLES}
    assert strategies == set(api.STRATEGIES)


def broken(mutate):
    document = job(chief=replica(1), worker=replica(2))
    mutate(document)
    return document


BAD_INPUT = [
    (
        "missing image",
        lambda d: d["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0].pop("image"),
        "spec.replicaSpecs.worker.template.spec.containers[0]: required field image is missing",
    ),
    (
        "negative replicas",
        lambda d: d["spec"]["replicaSpecs"]["worker"].update(replicas=-1),
        "spec.replicaSpecs.worker.replicas: must be at least 0, got -1",
    ),
    (
        "unknown role",
        lambda d: d["spec"]["replicaSpecs"].update(Worker=replica(1)),
        "spec.replicaSpecs: unknown role Worker: roles are chief, worker, ps and evaluator",
    ),
    (
        "two chiefs",
        lambda d: d["spec"]["replicaSpecs"]["chief"].update(replicas=2),
        "spec.replicaSpecs: at most one chief",
    ),
    ("name too long", lambda d: d["metadata"].update(name="a" * 56), "metadata.name: the job name is too long"),
    (
        "unknown strategy",
        lambda d: d["spec"].update(strategy="Horovod"),
        "spec.strategy: unsupported value 'Horovod': must be one of MultiWorkerMirrored, ParameterServer, Mirrored, "
        "Independent",
    ),
    (
        "name not a DNS label",
        lambda d: d["metadata"].update(name="1mnist"),
        "metadata.name: the job name must be a DNS-1035 label",
    ),
    (
        "no chief or worker",
        lambda d: d["spec"].update(replicaSpecs={"evaluator": replica(1)}),
        "spec.replicaSpecs: at least one chief or worker replica is required",
    ),
    (
        "ps without ParameterServer",
        lambda d: d["spec"]["replicaSpecs"].update(ps=replica(1)),
        "spec.replicaSpecs: ps replicas only take part in strategy ParameterServer or Independent",
    ),
    (
        "ParameterServer without chief",
        lambda d: (
            d["spec"].update(strategy="ParameterServer"),
            d["spec"]["replicaSpecs"].update(ps=replica(1)),
            d["spec"]["replicaSpecs"].pop("chief"),
        ),
        "spec.replicaSpecs: strategy ParameterServer needs a chief: it runs the coordinator (TF1 between-graph "
        "training, where worker 0 acts as chief, is strategy Independent)",
    ),
    (
        "ParameterServer with AllWorkers",
        lambda d: d["spec"].update(
            strategy="ParameterServer",
            successPolicy="AllWorkers",
            replicaSpecs=d["spec"]["replicaSpecs"] | {"ps": replica(1)},
        ),
        "spec.successPolicy: successPolicy AllWorkers can never succeed under strategy ParameterServer: its workers "
        "serve until stopped and never exit; use ChiefOrWorker0, or strategy Independent if every worker trains and "
        "exits (TF1, Estimator)",
    ),
    (
        "ParameterServer without ps",
        lambda d: d["spec"].update(strategy="ParameterServer"),
        "spec.replicaSpecs: strategy ParameterServer needs at least one ps replica",
    ),
    (
        "Mirrored with two replicas",
        lambda d: d["spec"].update(strategy="Mirrored"),
        "spec.replicaSpecs: strategy Mirrored runs one training replica",
    ),
    (
        "two evaluators",
        lambda d: d["spec"]["replicaSpecs"].update(evaluator=replica(2)),
        "spec.replicaSpecs: at most one evaluator",
    ),
    (
        "negative backoffLimit",
        lambda d: d["spec"].update(runPolicy={"backoffLimit": -1}),
        "spec.runPolicy.backoffLimit: must be at least 0, got -1",
    ),
    (
        "unknown field",
        lambda d: d["spec"].update(runPolicy={"backofLimit": 3}),
        "spec.runPolicy: unknown field backofLimit",
    ),
    (
        "checkpoint without size or claim",
        lambda d: d["spec"].update(checkpoint={"mountPath": "/ckpt"}),
        "spec.checkpoint: set checkpoint.size for a new volume owned by the job, or checkpoint.existingClaim",
    ),
    (
        "bad restartPolicy",
        lambda d: d["spec"]["replicaSpecs"]["worker"].update(restartPolicy="Always"),
        "spec.replicaSpecs.worker.restartPolicy: unsupported value 'Always'",
    ),
    (
        "pod restartPolicy",
        lambda d: d["spec"]["replicaSpecs"]["worker"]["template"]["spec"].update(restartPolicy="OnFailure"),
        "spec.replicaSpecs.worker.template.spec.restartPolicy: 'OnFailure' is not allowed",
    ),
    (
        "gpus contradict limits",
        lambda d: d["spec"]["replicaSpecs"]["worker"].update(
            gpus=1,
            template={
                "spec": {
                    "containers": [{"name": "tensorflow", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 2}}}]
                }
            },
        ),
        "spec.replicaSpecs.worker.gpus: gpus: 1 contradicts resources.limits[nvidia.com/gpu]: 2",
    ),
    (
        "Kubernetes' gang for another scheduler's pods",
        lambda d: (
            d["spec"].update(runPolicy={"schedulingPolicy": {"gangScheduler": "Kubernetes"}}),
            d["spec"]["replicaSpecs"]["worker"]["template"]["spec"].update(schedulerName="volcano"),
        ),
        "spec.replicaSpecs[worker].template.spec.schedulerName: gangScheduler Kubernetes: the worker pods name another "
        "scheduler, and Kubernetes' gang plugin is the default scheduler's: remove schedulerName from the template, "
        "or use that scheduler's gang",
    ),
    (
        "Volcano's gang for another scheduler's pods",
        lambda d: (
            d["spec"].update(runPolicy={"schedulingPolicy": {"gangScheduler": "Volcano"}}),
            d["spec"]["replicaSpecs"]["chief"]["template"]["spec"].update(schedulerName="my-scheduler"),
        ),
        "spec.replicaSpecs[chief].template.spec.schedulerName: gangScheduler Volcano: the chief pods name another "
        "scheduler, and Volcano places only the pods it schedules (the operator sets schedulerName volcano): remove "
        "schedulerName from the template, or use gangScheduler None",
    ),
    (
        "Kubernetes' gang of pods of different priorities",
        lambda d: (
            d["spec"].update(runPolicy={"schedulingPolicy": {"gangScheduler": "Kubernetes"}}),
            d["spec"]["replicaSpecs"]["chief"]["template"]["spec"].update(priorityClassName="high"),
        ),
        "spec.priorityClassName: gangScheduler Kubernetes: the training pods' templates (chief, worker, ps) name "
        "different priorityClassName, and every pod of a gang must have one priority: set spec.priorityClassName "
        "(every pod gets it)",
    ),
    ("wrong kind", lambda d: d.update(kind="TFJob"), "kind: must be TrainingJob, got 'TFJob'"),
]


@pytest.mark.parametrize("description,mutate,expected", BAD_INPUT, ids=[b[0] for b in BAD_INPUT])
def test_bad_input_is_rejected_with_its_field_path(description, mutate, expected):
    found = problems(broken(mutate))
    assert any(p.startswith(expected) for p in found), found


def test_longest_allowed_name_is_accepted_and_one_more_is_not():
    # worker-9 (index 9 of 10 replicas): name + len("-worker-9") must be <= 63.
    ok = job(name="a" * (63 - len("-worker-9")), worker=replica(10))
    assert problems(ok) == []
    too_long = copy.deepcopy(ok)
    too_long["metadata"]["name"] += "a"
    assert any("too long" in p for p in problems(too_long))


def write(tmp_path, text, name="job.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "kubetf.cli", *args], capture_output=True, text=True, check=False)


def test_validate_cli_prints_one_line_per_problem_per_document(tmp_path):
    good = job(worker=replica(2))
    bad = broken(lambda d: (d["spec"].update(strategy="Nope"), d["spec"]["replicaSpecs"]["worker"].update(replicas=-2)))
    path = write(tmp_path, yaml.safe_dump_all([good, bad]))
    result = run_cli("validate", "-f", path)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines == [
        f"{path} document 2 (mnist): spec.replicaSpecs.worker.replicas: must be at least 0, got -2",
        f"{path} document 2 (mnist): spec.strategy: unsupported value 'Nope': must be one of "
        "MultiWorkerMirrored, ParameterServer, Mirrored, Independent",
    ]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "text,message",
    [
        ("spec: [unclosed\n", "malformed YAML at line 2, column 1"),
        ("apiVersion: kubetf.io/v1alpha1\nkind: TrainingJob\n metadata: x\n", "malformed YAML at line 3"),
        ("", "no YAML documents found"),
        ("- just\n- a list\n", "expected a TrainingJob object, got list"),
    ],
)
def test_validate_cli_never_shows_a_traceback(tmp_path, text, message):
    result = run_cli("validate", "-f", write(tmp_path, text))
    assert result.returncode == 1
    assert message in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_validate_cli_missing_file():
    result = run_cli("validate", "-f", "/nonexistent/job.yaml")
    assert result.returncode == 1
    assert result.stderr.strip() == "error: /nonexistent/job.yaml: cannot read: No such file or directory"


def test_defaults_come_from_the_crd():
    defaulted = api.with_defaults(job(worker={"template": {"spec": {"containers": [{"name": "t", "image": "i"}]}}}))
    spec = defaulted["spec"]
    assert spec["replicaSpecs"]["worker"]["replicas"] == 1
    assert spec["replicaSpecs"]["worker"]["restartPolicy"] == "OnFailure"
    assert spec["port"] == 2222
    assert spec["successPolicy"] == "ChiefOrWorker0"
    assert spec["runPolicy"] == {
        "backoffLimit": 3,
        "backoffSeconds": 10,
        "startupTimeoutSeconds": 600,
        "cleanPodPolicy": "Running",
        "suspend": False,
        "nodeLossTimeoutSeconds": 30,
        "forceDeleteOnNodeLoss": True,
        "evaluatorGraceSeconds": 120,
        "schedulingPolicy": {"gangScheduler": "Auto", "onScheduleTimeout": "Fail"},
        "restartInPlace": True,
    }


def test_manifests_carry_the_packaged_crd():
    packaged = (ROOT / "operator" / "kubetf" / "crd" / "trainingjobs.kubetf.io.yaml").read_text()
    assert (ROOT / "manifests" / "crd" / "trainingjobs.kubetf.io.yaml").read_text() == packaged, "run make manifests"


def test_a_gang_that_could_never_be_complete_is_refused_with_its_field():
    document = job(chief=replica(1), worker=replica(2), evaluator=replica(1))
    document["spec"]["runPolicy"] = {"schedulingPolicy": {"minAvailable": 4}}  # 3 training tasks: the evaluator
    problems = [str(p) for p in api.validate(document)]  # is never part of the gang
    assert problems == [
        "spec.runPolicy.schedulingPolicy.minAvailable: minAvailable is more than the job's training tasks (chief, "
        "workers, ps): its gang could never be complete"
    ]
    document["spec"]["runPolicy"]["schedulingPolicy"] = {"minAvailable": 3, "gangScheduler": "Kubernetes", "queue": "q"}
    assert [p.path for p in api.validate(document)] == ["spec.runPolicy.schedulingPolicy.queue"]
    document["spec"]["runPolicy"]["schedulingPolicy"] = {"minAvailable": 3, "gangScheduler": "Volcano", "queue": "q"}
    assert api.validate(document) == []


def gang_job(gang, chief=None, worker=None, ps=None, evaluator=None, priority=None):
    """A ParameterServer job under `gang`, each role's template naming the (schedulerName, priorityClassName) given."""
    document = job(strategy="ParameterServer", chief=replica(1), worker=replica(2), ps=replica(1), evaluator=replica(1))
    for role, names in {"chief": chief, "worker": worker, "ps": ps, "evaluator": evaluator}.items():
        scheduler, priority_class = names or (None, None)
        pod_spec = document["spec"]["replicaSpecs"][role]["template"]["spec"]
        pod_spec.update({k: v for k, v in (("schedulerName", scheduler), ("priorityClassName", priority_class)) if v})
    document["spec"]["runPolicy"] = {"schedulingPolicy": {"gangScheduler": gang}}
    if priority:
        document["spec"]["priorityClassName"] = priority
    return document


# (what, gang, templates, refused at apply): what each gang can place, and what it never could.
GANGS = [
    ("Kubernetes, the default scheduler's pods", "Kubernetes", {}, False),
    ("Kubernetes, pods naming the default scheduler", "Kubernetes",
     {"chief": ("default-scheduler", None), "worker": ("", None)}, False),
    ("Kubernetes, a ps of Volcano's", "Kubernetes", {"ps": ("volcano", None)}, True),
    ("Kubernetes, an evaluator of another scheduler's: never in the gang", "Kubernetes",
     {"evaluator": ("my-scheduler", None)}, False),
    ("Kubernetes, one priority", "Kubernetes",
     {"chief": (None, "high"), "worker": (None, "high"), "ps": (None, "high")}, False),
    ("Kubernetes, a ps of no priority among high ones", "Kubernetes",
     {"chief": (None, "high"), "worker": (None, "high")}, True),
    ("Kubernetes, spec.priorityClassName for every pod", "Kubernetes",
     {"chief": (None, "high"), "worker": (None, "low"), "priority": "high"}, False),
    ("Kubernetes, an evaluator of its own priority", "Kubernetes", {"evaluator": (None, "low")}, False),
    ("Volcano, pods of Volcano's and the default scheduler's", "Volcano",
     {"chief": ("volcano", "high"), "worker": ("default-scheduler", None)}, False),
    ("Volcano, workers of another scheduler's", "Volcano", {"worker": ("my-scheduler", None)}, True),
    ("Auto takes the gang the pods allow, or none", "Auto", {"worker": ("my-scheduler", "low")}, False),
    ("None", "None", {"worker": ("volcano", "low")}, False),
]  # fmt: skip


@pytest.mark.parametrize("what,gang,templates,refused", GANGS, ids=[g[0] for g in GANGS])
def test_a_gang_that_could_never_place_its_pods_is_refused_at_apply_as_the_operator_would(
    what, gang, templates, refused
):
    """The CRD's rules refuse at apply exactly what reconcile would fail with GangSchedulerUnavailable
    (kubetf.core.scheduling.native.unfit), and Volcano's gang for pods another scheduler names."""
    from kubetf.core.scheduling import native

    document = gang_job(gang, **templates)
    found = api.validate(document)
    assert bool(found) == refused, found
    if gang == "Kubernetes":
        assert (native.unfit(api.with_defaults(document)) is not None) == refused


def test_a_role_without_replicas_is_not_in_the_gang():
    document = gang_job("Kubernetes", ps=("volcano", "high"))
    document["spec"]["strategy"] = "Independent"
    document["spec"]["replicaSpecs"]["ps"]["replicas"] = 0
    assert api.validate(document) == []
