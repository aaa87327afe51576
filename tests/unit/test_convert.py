import copy
import json
import subprocess
import sys

import pytest
import yaml

from kubetf.core import api, builders, policy
from kubetf.core.convert import ConversionError, convert

CLEAN_PS = "spec.runPolicy.cleanPodPolicy: not set, so Kubeflow (default None) left ps pods running after the job "
CLEAN_PS += "ended; kubetf's default Running stops them (set cleanPodPolicy: None to keep them)"
EVALUATOR_NOTE = (
    "spec.tfReplicaSpecs.Evaluator: the evaluator is not in the training tasks' TF_CONFIG cluster (Kubeflow listed "
    "it there, which hangs TF2 ParameterServer training)"
)


def tfjob(replica_specs, name="dist", **spec):
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"tfReplicaSpecs": replica_specs, **spec},
    }


def kf_replica(replicas, restart="Never", port=None, resources=None, **pod_spec):
    container = {"name": "tensorflow", "image": "tf:2", "command": ["python", "train.py"]}
    if port:
        container["ports"] = [{"name": "tfjob-port", "containerPort": port}]
    if resources:
        container["resources"] = resources
    replica = {"replicas": replicas, "template": {"spec": {"containers": [container], **pod_spec}}}
    if restart is not None:
        replica["restartPolicy"] = restart
    return replica


CPU = {"requests": {"cpu": "1"}, "limits": {"cpu": "2", "memory": "4Gi"}}
GPU = {"limits": {"nvidia.com/gpu": 1}}


def ambiguous(chief_type, picked, why, other):
    return (
        f"spec.tfReplicaSpecs: PS with {chief_type} fits TF2 ParameterServerStrategy and TF1/Estimator training; "
        f"chose {picked} ({why}); if the program is the other kind, convert again with --strategy {other}"
    )


# Kubeflow's own example layouts (training-operator v1.9.4 examples/tensorflow and its docs), and what each must
# become: strategy, what restarts when each task is lost, which tasks' success ends the job, the exact notes.
LAYOUTS = [
    (
        "classic dist-mnist: PS + Worker, TF1 between-graph",
        tfjob({"PS": kf_replica(1, resources=CPU), "Worker": kf_replica(2, restart=None, resources=CPU)}),
        "Independent",
        {("ps", 0): [("ps", 0)], ("worker", 1): [("worker", 1)], ("worker", 0): [("worker", 0)]},
        [("worker", 0)],
        [CLEAN_PS],
    ),
    (
        "dist-mnist v1.9: Chief + PS + Worker, TF2 ParameterServerStrategy",
        tfjob({"Chief": kf_replica(1), "PS": kf_replica(1), "Worker": kf_replica(2)}),
        "ParameterServer",
        {("ps", 0): [("chief", 0), ("ps", 0)], ("worker", 1): [("worker", 1)], ("chief", 0): [("chief", 0)]},
        [("chief", 0)],
        [
            ambiguous(
                "Chief",
                "ParameterServer",
                "TF2 ParameterServerStrategy: the chief coordinates, workers and ps serve",
                "Independent",
            ),
            CLEAN_PS,
        ],
    ),
    (
        "Master + Worker + PS, legacy TF1",
        tfjob(
            {"Master": kf_replica(1), "Worker": kf_replica(2, restart="OnFailure"), "PS": kf_replica(2)},
            runPolicy={"cleanPodPolicy": "All"},
        ),
        "Independent",
        {("ps", 1): [("ps", 1)], ("chief", 0): [("chief", 0)], ("worker", 0): [("worker", 0)]},
        [("chief", 0)],
        [
            "spec.tfReplicaSpecs.Master: Master became chief (TF_CONFIG job name 'chief' instead of 'master')",
            ambiguous(
                "Master",
                "Independent",
                "the legacy Master type is TF1/Estimator's: every task trains on its own",
                "ParameterServer",
            ),
        ],
    ),
    (
        "Estimator: Chief + Worker + PS + Evaluator, AllWorkers",
        tfjob(
            {"Chief": kf_replica(1), "Worker": kf_replica(2), "PS": kf_replica(1), "Evaluator": kf_replica(1)},
            successPolicy="AllWorkers",
            runPolicy={"cleanPodPolicy": "Running"},
        ),
        "Independent",
        {("ps", 0): [("ps", 0)], ("evaluator", 0): [("evaluator", 0)], ("worker", 1): [("worker", 1)]},
        [("chief", 0), ("worker", 0), ("worker", 1)],
        [EVALUATOR_NOTE],
    ),
    (
        "multi-worker: Worker with GPUs, MultiWorkerMirroredStrategy",
        tfjob({"Worker": kf_replica(2, resources=GPU)}, runPolicy={"cleanPodPolicy": "None"}),
        "MultiWorkerMirrored",
        {("worker", 1): [("worker", 0), ("worker", 1)]},
        [("worker", 0)],
        [],
    ),
    (
        "Chief + Worker + Evaluator, MultiWorkerMirroredStrategy",
        tfjob({"Chief": kf_replica(1, restart="OnFailure"), "Worker": kf_replica(3), "Evaluator": kf_replica(1)}),
        "MultiWorkerMirrored",
        {
            ("worker", 2): [("chief", 0), ("worker", 0), ("worker", 1), ("worker", 2)],
            ("evaluator", 0): [("evaluator", 0)],
        },
        [("chief", 0)],
        [EVALUATOR_NOTE],
    ),
    (
        "mnist_with_summaries: one Worker",
        tfjob({"Worker": kf_replica(1)}, runPolicy={"cleanPodPolicy": "None"}),
        "MultiWorkerMirrored",
        {("worker", 0): [("worker", 0)]},
        [("worker", 0)],
        ["spec.tfReplicaSpecs: a single replica: Kubeflow set no TF_CONFIG, kubetf sets one naming only this task"],
    ),
]


def kubeflow_tasks(document):
    """The TF tasks Kubeflow's TFJob runs, pod {job}-{type}-{index}: Master and Chief are both the chief here."""
    tasks = {}
    for kind, spec in document["spec"]["tfReplicaSpecs"].items():
        role = {"master": "chief"}.get(kind.lower(), kind.lower())
        for i in range(spec["replicas"]):
            tasks[(role, i)] = spec
    return tasks


@pytest.mark.parametrize("case", LAYOUTS, ids=[c[0] for c in LAYOUTS])
def test_each_kubeflow_layout_becomes_a_valid_job_with_the_same_tasks_and_rules(case):
    _, document, strategy, restarts, success, notes = case
    conversion = convert(document)
    assert conversion.notes == notes
    job = conversion.job
    assert job["spec"]["strategy"] == strategy
    assert api.validate(job) == []
    defaulted = api.with_defaults(job)

    pods = {p["metadata"]["name"]: p for p in builders.render(job) if p["kind"] == "Pod"}
    expected = kubeflow_tasks(document)
    assert set(pods) == {f"dist-{role}-{i}" for role, i in expected}
    for (role, index), kubeflow_spec in expected.items():
        pod = pods[f"dist-{role}-{index}"]
        container = pod["spec"]["containers"][0]
        # Same program, same resources, same restart rule for failures.
        kubeflow_container = kubeflow_spec["template"]["spec"]["containers"][0]
        assert container["command"] == kubeflow_container["command"]
        assert container.get("resources") == kubeflow_container.get("resources")
        kubeflow_restart = kubeflow_spec.get("restartPolicy") or "Never"  # Kubeflow's default
        assert defaulted["spec"]["replicaSpecs"][role]["restartPolicy"] == kubeflow_restart
        config = json.loads(next(e["value"] for e in container["env"] if e["name"] == "TF_CONFIG"))
        assert config["task"] == {"type": role, "index": index}
        training = {r: [a.split(".")[0] for a in addresses] for r, addresses in config["cluster"].items()}
        assert "evaluator" not in training or role == "evaluator"
        if role != "evaluator":
            assert training == {
                r: [f"dist-{r}-{i}" for i in range(len(v))] for r, v in _by_role(expected).items() if r != "evaluator"
            }
        labels = pod["metadata"]["labels"]
        assert labels["training.kubeflow.org/job-name"] == "dist"
        assert labels["training.kubeflow.org/replica-type"] in {k.lower() for k in document["spec"]["tfReplicaSpecs"]}
    for (role, index), targets in restarts.items():
        assert policy.restart_targets(defaulted, role, index) == targets
    assert policy.success_tasks(defaulted) == success


def _by_role(tasks):
    roles = {}
    for role, _ in tasks:
        roles[role] = roles.get(role, 0) + 1
    return {role: list(range(count)) for role, count in roles.items()}


@pytest.mark.parametrize(
    "kubeflow,ours",
    [
        (None, "Never"),
        ("Never", "Never"),
        ("OnFailure", "OnFailure"),
        ("ExitCode", "ExitCode"),
        ("Always", "OnFailure"),
    ],
)
def test_every_restart_policy_carries_over_with_kubeflows_default(kubeflow, ours):
    conversion = convert(tfjob({"Worker": kf_replica(2, restart=kubeflow)}))
    assert conversion.job["spec"]["replicaSpecs"]["worker"]["restartPolicy"] == ours
    assert conversion.notes == {
        "Always": [
            "spec.tfReplicaSpecs.Worker.restartPolicy: Always became OnFailure (kubetf never re-runs a task that "
            "exited 0); failures are now limited by runPolicy.backoffLimit"
        ],
        "ExitCode": [
            "spec.tfReplicaSpecs.Worker.restartPolicy: ExitCode now retries exit codes 128-255 up to "
            "runPolicy.backoffLimit (Kubeflow retried them without limit); 137, 143 and 42 are preemptions and "
            "never count"
        ],
    }.get(kubeflow, [])


def test_strategy_option_settles_the_ambiguous_layout():
    document = tfjob({"Chief": kf_replica(1), "PS": kf_replica(1), "Worker": kf_replica(2)})
    conversion = convert(document, strategy="Independent")
    assert conversion.job["spec"]["strategy"] == "Independent"
    assert conversion.notes == [CLEAN_PS]
    defaulted = api.with_defaults(conversion.job)
    assert policy.restart_targets(defaulted, "ps", 0) == [("ps", 0)]


def test_a_strategy_that_cannot_run_the_layout_is_refused_by_validation():
    document = tfjob({"PS": kf_replica(1), "Worker": kf_replica(2)})
    problems = [str(p) for p in api.validate(convert(document, strategy="ParameterServer").job)]
    assert problems == [
        "spec.replicaSpecs: strategy ParameterServer needs a chief: it runs the coordinator (TF1 between-graph "
        "training, where worker 0 acts as chief, is strategy Independent)"
    ]


def test_run_policy_carries_over_or_is_explained_field_by_field():
    document = tfjob(
        {"Chief": kf_replica(1, restart="ExitCode"), "Worker": kf_replica(2, restart="OnFailure")},
        runPolicy={
            "backoffLimit": 5,
            "activeDeadlineSeconds": 3600,
            "ttlSecondsAfterFinished": 60,
            "cleanPodPolicy": "All",
            "suspend": True,
            "managedBy": "kubeflow.org/training-operator",
            "schedulingPolicy": {
                "minAvailable": 3,
                "queue": "team-a",
                "minResources": {"cpu": "3"},
                "priorityClass": "high",
                "scheduleTimeoutSeconds": 120,
            },
        },
        successPolicy="AllWorkers",
    )
    conversion = convert(document)
    job = conversion.job
    assert job["spec"]["runPolicy"] == {
        "backoffLimit": 5,
        "activeDeadlineSeconds": 3600,
        "ttlSecondsAfterFinished": 60,
        "cleanPodPolicy": "All",
        "suspend": True,
        # A queue in schedulingPolicy was Volcano's (Kubeflow gave it to Volcano's PodGroup): Volcano's gang it is.
        "schedulingPolicy": {"gangScheduler": "Volcano", "minAvailable": 3, "queue": "team-a",
                             "scheduleTimeoutSeconds": 120},
    }  # fmt: skip
    assert (conversion.gang, conversion.gang_why) == (
        "Volcano", "its schedulingPolicy names a queue, which only Volcano's PodGroups took"
    )  # fmt: skip
    assert job["spec"]["successPolicy"] == "AllWorkers"
    assert "labels" not in job["metadata"]  # no Kueue label: on a cluster without Kueue the job could not run
    assert job["spec"]["priorityClassName"] == "high"
    assert conversion.notes == [
        "spec.tfReplicaSpecs.Chief.restartPolicy: ExitCode now retries exit codes 128-255 up to "
        "runPolicy.backoffLimit (Kubeflow retried them without limit); 137, 143 and 42 are preemptions and never count",
        "spec.runPolicy.schedulingPolicy.minResources: not carried over: kubetf sums the gang's requests itself "
        "(Volcano's minResources)",
        "spec.runPolicy.schedulingPolicy.priorityClass: set as spec.priorityClassName: every pod's, and the gang's "
        "PodGroup's",
        "spec.runPolicy.schedulingPolicy.scheduleTimeoutSeconds: a gang not placed in time fails the job "
        "(onScheduleTimeout: Fail; or Wait)",
        "spec.runPolicy.managedBy: kubeflow.org/training-operator dropped: the kubetf operator runs every TrainingJob",
    ]
    assert api.validate(job) == []


def test_a_gang_with_no_scheduler_named_is_the_clusters_best():
    document = tfjob({"Worker": kf_replica(2)}, runPolicy={"schedulingPolicy": {"minAvailable": 2}})
    conversion = convert(document)
    assert conversion.job["spec"]["runPolicy"]["schedulingPolicy"] == {"gangScheduler": "Auto", "minAvailable": 2}
    assert conversion.notes == [] and conversion.gang == "Auto"


def test_volcano_pods_keep_their_gang_with_its_queue_and_the_evaluator_left_out_of_it():
    worker = kf_replica(2)
    worker["template"]["spec"]["schedulerName"] = "volcano"
    document = tfjob(
        {"Chief": kf_replica(1), "Worker": worker, "Evaluator": kf_replica(1)},
        runPolicy={"schedulingPolicy": {"minAvailable": 4, "queue": "team-gpu"}},
    )
    conversion = convert(document)
    policy = conversion.job["spec"]["runPolicy"]["schedulingPolicy"]
    assert policy == {"gangScheduler": "Volcano", "minAvailable": 3, "queue": "team-gpu"}
    assert conversion.gang_why == "its pods name schedulerName volcano"
    assert conversion.notes == [
        "spec.tfReplicaSpecs.Evaluator: the evaluator is not in the training tasks' TF_CONFIG cluster (Kubeflow "
        "listed it there, which hangs TF2 ParameterServer training)",
        "spec.runPolicy.schedulingPolicy.minAvailable: 4 counted the evaluator, which kubetf keeps out of the gang: "
        "3, every training task",
    ]
    assert api.validate(conversion.job) == []


def test_the_gang_scheduler_kubeflow_was_told_can_be_named():
    document = tfjob({"Worker": kf_replica(2)}, runPolicy={"schedulingPolicy": {"minAvailable": 2, "queue": "q"}})
    conversion = convert(document, gang_scheduler="kubernetes")
    assert conversion.job["spec"]["runPolicy"]["schedulingPolicy"] == {"gangScheduler": "Kubernetes",
                                                                        "minAvailable": 2}  # fmt: skip
    assert conversion.notes == ["spec.runPolicy.schedulingPolicy.queue: q not carried over: Kubernetes's gang has no "
                                "queue"]  # fmt: skip
    none = convert(document, gang_scheduler="none")
    assert none.job["spec"]["runPolicy"] == {"schedulingPolicy": {"gangScheduler": "None"}}
    assert none.notes == [
        "spec.runPolicy.schedulingPolicy.minAvailable: not carried over: no gang scheduler (--gang-scheduler to "
        "choose one)",
        "spec.runPolicy.schedulingPolicy.queue: not carried over: no gang scheduler (--gang-scheduler to choose one)",
    ]


def test_the_queue_label_wins_over_a_different_scheduling_policy_queue():
    document = tfjob({"Worker": kf_replica(2)}, runPolicy={"schedulingPolicy": {"queue": "volcano-q"}})
    document["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    conversion = convert(document)
    assert conversion.job["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "team-a"}
    assert conversion.notes == [
        "spec.runPolicy.schedulingPolicy.queue: volcano-q not carried over: the job's kueue.x-k8s.io/queue-name "
        "label names the queue"
    ]


def test_multikueue_keeps_dispatching_a_queued_job():
    document = tfjob({"Worker": kf_replica(2)}, runPolicy={"managedBy": "kueue.x-k8s.io/multikueue"})
    document["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    conversion = convert(document)
    assert conversion.job["spec"]["managedBy"] == "kueue.x-k8s.io/multikueue"
    assert conversion.job["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "team-a"}
    assert conversion.gang == "Kueue"
    assert conversion.notes == [
        "spec.runPolicy.managedBy: set as spec.managedBy: MultiKueue dispatches the TrainingJob to a worker cluster "
        "(kubetf on every cluster, TrainingJob among Kueue's external frameworks: docs/kueue.md, MultiKueue)"
    ]
    assert api.validate(conversion.job) == []


def test_a_multikueue_job_without_a_queue_is_not_converted_and_says_what_to_do(tmp_path):
    """Nothing would ever dispatch it (nor the TFJob it came from): the TrainingJob would be refused at apply."""
    document = tfjob({"Worker": kf_replica(2)}, runPolicy={"managedBy": "kueue.x-k8s.io/multikueue"})
    path = tmp_path / "tfjob.yaml"
    path.write_text(yaml.safe_dump(document))
    result = kubetf("convert", "-f", str(path))
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"{path} (dist): not converted: the TrainingJob would be invalid: spec.managedBy: kueue.x-k8s.io/multikueue "
        "needs the label kueue.x-k8s.io/queue-name, or nothing ever dispatches the job: add the label, naming a "
        "LocalQueue whose ClusterQueue has a MultiKueue admission check, or remove spec.managedBy to run the job on "
        "this cluster",
        "1 TFJob(s): 0 converted cleanly, 0 converted with notes, 1 not converted",
    ]


def test_another_controllers_managed_by_is_not_carried_over():
    conversion = convert(tfjob({"Worker": kf_replica(2)}, runPolicy={"managedBy": "example.com/scheduler"}))
    assert "managedBy" not in conversion.job["spec"]
    assert conversion.notes == [
        "spec.runPolicy.managedBy: example.com/scheduler not carried over: a TrainingJob is run by the kubetf "
        "operator, or dispatched by MultiKueue (kueue.x-k8s.io/multikueue); the kubetf operator of the cluster you "
        "apply it to runs the job"
    ]


def test_metadata_labels_annotations_and_kubeflow_pod_labels():
    document = tfjob({"Chief": kf_replica(1), "Worker": kf_replica(2)})
    document["metadata"] |= {
        "labels": {"team": "vision", "kueue.x-k8s.io/queue-name": "gpus"},
        "annotations": {"owner": "ana", "kubectl.kubernetes.io/last-applied-configuration": "{...}"},
        "uid": "abc",
        "resourceVersion": "42",
        "managedFields": [{}],
    }
    document["status"] = {"conditions": []}
    conversion = convert(document)
    assert conversion.job["metadata"] == {
        "name": "dist",
        "namespace": "ml",
        "labels": {"team": "vision", "kueue.x-k8s.io/queue-name": "gpus"},
        "annotations": {"owner": "ana"},
    }
    assert conversion.notes == []
    pods = {p["metadata"]["name"]: p for p in builders.render(conversion.job) if p["kind"] == "Pod"}
    assert {k: v for k, v in pods["dist-chief-0"]["metadata"]["labels"].items() if "kubeflow" in k} == {
        "training.kubeflow.org/job-name": "dist",
        "training.kubeflow.org/replica-type": "chief",
        "training.kubeflow.org/job-role": "master",
    }
    assert pods["dist-worker-1"]["metadata"]["labels"]["training.kubeflow.org/replica-type"] == "worker"
    assert "training.kubeflow.org/job-role" not in pods["dist-worker-1"]["metadata"]["labels"]


def test_ports_and_containers():
    document = tfjob({"Worker": kf_replica(2, port=2223)})
    sidecar = {"name": "log-shipper", "image": "fluent:1"}
    document["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] = "trainer"
    document["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"].append(sidecar)
    conversion = convert(document)
    assert conversion.job["spec"]["port"] == 2223
    container = conversion.job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    assert "ports" not in container
    assert conversion.notes == [
        "spec.tfReplicaSpecs.Worker.template.spec.containers: none is named tensorflow: Kubeflow gave TF_CONFIG to "
        "no container, kubetf gives it to the first (trainer)"
    ]


def test_conversion_notes_what_it_cannot_carry():
    document = tfjob(
        {"Worker": kf_replica(2, restart="OnFailure", restartPolicy="Always")},
        runPolicy={"cleanPodPolicy": "None", "futureField": 1},
        enableDynamicWorker=True,
        elasticPolicy={},
    )
    conversion = convert(document)
    assert conversion.notes == [
        "spec.tfReplicaSpecs.Worker.template.spec.restartPolicy: dropped; the operator restarts pods itself",
        "spec.runPolicy.futureField: not carried over (kubetf has no equivalent)",
        "spec.enableDynamicWorker: not carried over; kubetf keeps a fixed set of tasks",
        "spec.elasticPolicy: not carried over (not a TFJob field kubetf knows)",
    ]
    assert api.validate(conversion.job) == []


@pytest.mark.parametrize(
    "document,message",
    [
        ({"kind": "Deployment"}, "expected a Kubeflow TFJob \\(kind: TFJob\\), got 'Deployment'"),
        ({"apiVersion": "kubeflow.org/v1beta2", "kind": "TFJob"}, "apiVersion must be kubeflow.org/v1"),
        (tfjob({"Launcher": kf_replica(1)}), "spec.tfReplicaSpecs.Launcher: unknown replica type"),
        (tfjob({"Chief": kf_replica(1), "Master": kf_replica(1)}), "a second chief"),
        (tfjob({"Worker": kf_replica(1, restart="Sometimes")}), "Worker.restartPolicy: unknown value 'Sometimes'"),
    ],
)
def test_conversion_errors(document, message):
    with pytest.raises(ConversionError, match=message):
        convert(document)


def kubetf(*args, stdin=None):
    return subprocess.run(
        [sys.executable, "-m", "kubetf.cli", *args], capture_output=True, text=True, check=False, input=stdin
    )


def test_convert_cli_one_file(tmp_path):
    path = tmp_path / "tfjob.yaml"
    path.write_text(yaml.safe_dump(LAYOUTS[2][1]))
    result = kubetf("convert", "-f", str(path))
    assert result.returncode == 0, result.stderr
    (job,) = list(yaml.safe_load_all(result.stdout))
    assert job["kind"] == "TrainingJob"
    assert sorted(job["spec"]["replicaSpecs"]) == ["chief", "ps", "worker"]
    lines = result.stderr.splitlines()
    assert lines[0].endswith(f"{path} (dist): gang scheduling: Auto (kubetf's default: the cluster's best "
                             "(--gang-scheduler to choose))")  # fmt: skip
    assert f"{path} (dist): note: spec.tfReplicaSpecs.Master: Master became chief" in lines[1]
    assert lines[-1] == "1 TFJob(s): 0 converted cleanly, 1 converted with notes, 0 not converted"


def test_convert_cli_bulk_directory_stream_and_list(tmp_path):
    source = tmp_path / "jobs"
    (source / "team-b").mkdir(parents=True)
    clean = tfjob({"Worker": kf_replica(2)}, name="clean", runPolicy={"cleanPodPolicy": "Running"})
    noted = tfjob({"PS": kf_replica(1), "Worker": kf_replica(2)}, name="tf1")
    (source / "a.yaml").write_text(yaml.safe_dump_all([clean, {"apiVersion": "v1", "kind": "ConfigMap"}]))
    listed = {"apiVersion": "v1", "kind": "List", "items": [noted, tfjob({"Launcher": kf_replica(1)}, name="bad")]}
    (source / "team-b" / "list.json").write_text(json.dumps(listed))
    (source / "broken.yml").write_text("spec: [unclosed\n")
    (source / "README.md").write_text("not read")
    duplicate = copy.deepcopy(clean)
    result = kubetf("convert", "-f", str(source), "-f", "-", stdin=yaml.safe_dump(duplicate))
    assert result.returncode == 1
    names = [j["metadata"]["name"] for j in yaml.safe_load_all(result.stdout)]
    assert names == ["clean", "tf1"]
    err = result.stderr.splitlines()
    assert f"{source}/a.yaml document 2: skipped: kind ConfigMap is not a TFJob" in err
    assert any(line.startswith(f"{source}/broken.yml: malformed YAML") for line in err)
    assert (
        f"{source}/team-b/list.json item 2 (bad): not converted: spec.tfReplicaSpecs.Launcher: unknown replica type "
        "(Kubeflow knows Chief, Master, Worker, PS, Evaluator)" in err
    )
    assert f"{source}/team-b/list.json item 1 (tf1): note: {CLEAN_PS}" in err
    assert f"- (clean): not converted: ml/clean was already converted from {source}/a.yaml document 1 (clean)" in err
    assert err[-1] == (
        "5 TFJob(s): 1 converted cleanly, 1 converted with notes, 3 not converted; 1 other document(s) skipped"
    )


def test_convert_cli_writes_one_file_per_job(tmp_path):
    jobs = [tfjob({"Worker": kf_replica(2)}, name=n, runPolicy={"cleanPodPolicy": "None"}) for n in ("a", "b")]
    jobs[1]["metadata"]["namespace"] = "other"
    result = kubetf("convert", "-f", "-", "-o", str(tmp_path / "out"), "--strategy", "Independent",
                    stdin=yaml.safe_dump_all(jobs))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    for namespace, name in (("ml", "a"), ("other", "b")):
        written = yaml.safe_load((tmp_path / "out" / namespace / f"{name}.yaml").read_text())
        assert written["metadata"]["name"] == name
        assert written["spec"]["strategy"] == "Independent"
    assert result.stderr.splitlines()[-1] == "2 TFJob(s): 2 converted cleanly, 0 converted with notes, 0 not converted"


def test_convert_cli_needs_one_source():
    result = kubetf("convert")
    assert result.returncode == 1
    assert result.stderr == (
        "error: give the TFJobs to convert with -f FILE|DIRECTORY|- (repeatable) or --from-cluster\n"
    )
    result = kubetf("convert", "-f", "-", "-n", "team-a", stdin="")
    assert result.returncode == 1
    assert result.stderr == (
        "error: -n/--namespace and --kubeconfig choose what --from-cluster reads: add --from-cluster\n"
    )
