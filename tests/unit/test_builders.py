import json

import pytest

from kubetf.core import api, builders

from .jobs import VALID_JOBS, container, job, replica


def rendered(document):
    objects = builders.render(document)
    pods = [o for o in objects if o["kind"] == "Pod"]
    services = [o for o in objects if o["kind"] == "Service"]
    pvcs = [o for o in objects if o["kind"] == "PersistentVolumeClaim"]
    return pods, services, pvcs


def env_of(pod):
    training = pod["spec"]["containers"][api.training_container_index(pod["spec"])]
    return {e["name"]: e["value"] for e in training.get("env", [])}


def tf_config_of(pod):
    return json.loads(env_of(pod)["TF_CONFIG"])


def selects(service, pod):
    return all(pod["metadata"]["labels"].get(k) == v for k, v in service["spec"]["selector"].items())


@pytest.mark.parametrize("description,document", VALID_JOBS, ids=[d for d, _ in VALID_JOBS])
def test_names_are_deterministic(description, document):
    first, second = builders.render(document), builders.render(document)
    assert first == second
    pods, _, _ = rendered(document)
    expected = [
        f"mnist-{role}-{i}" for role, spec in document["spec"]["replicaSpecs"].items() for i in range(spec["replicas"])
    ]
    assert sorted(p["metadata"]["name"] for p in pods) == sorted(expected)
    for pod in pods:
        assert pod["spec"]["hostname"] == pod["metadata"]["name"]
        labels = pod["metadata"]["labels"]
        assert pod["metadata"]["name"] == f"mnist-{labels['kubetf.io/role']}-{labels['kubetf.io/index']}"
        assert labels["kubetf.io/job-name"] == "mnist"
        assert labels["kubetf.io/attempt"] == "0"


@pytest.mark.parametrize("description,document", VALID_JOBS, ids=[d for d, _ in VALID_JOBS])
def test_every_tf_config_address_is_a_pod_the_headless_service_selects(description, document):
    pods, services, _ = rendered(document)
    (service,) = services
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    port = document["spec"].get("port", 2222)
    assert [p["port"] for p in service["spec"]["ports"]] == [port]
    by_dns = {
        f"{p['spec']['hostname']}.{p['spec']['subdomain']}.{p['metadata']['namespace']}.svc:{port}": p for p in pods
    }
    for pod in pods:
        config = tf_config_of(pod)
        addresses = [a for members in config["cluster"].values() for a in members]
        assert addresses, pod["metadata"]["name"]
        for address in addresses:
            target = by_dns[address]
            assert target["spec"]["subdomain"] == service["metadata"]["name"]
            assert selects(service, target)
            ports = [p["containerPort"] for c in target["spec"]["containers"] for p in c.get("ports", [])]
            assert port in ports
        # The task's own entry is its own address (an Independent job's evaluator has none: it only reads).
        if config["task"]["type"] in config["cluster"]:
            own = config["cluster"][config["task"]["type"]][config["task"]["index"]]
            assert by_dns[own] is pod
        else:
            assert (document["spec"]["strategy"], config["task"]["type"]) == ("Independent", "evaluator")


@pytest.mark.parametrize("description,document", VALID_JOBS, ids=[d for d, _ in VALID_JOBS])
def test_evaluator_is_outside_the_training_cluster(description, document):
    pods, _, _ = rendered(document)
    for pod in pods:
        config = tf_config_of(pod)
        role = pod["metadata"]["labels"]["kubetf.io/role"]
        if role == "evaluator" and document["spec"]["strategy"] == "Independent":
            # Estimator's evaluator needs the chief in its cluster; it still never joins the training cluster.
            assert config == {"cluster": tf_config_of(pods[0])["cluster"], "task": {"type": "evaluator", "index": 0}}
        elif role == "evaluator":
            assert config == {
                "cluster": {"evaluator": ["mnist-evaluator-0.mnist.team-a.svc:2222"]},
                "task": {"type": "evaluator", "index": 0},
            }
        else:
            assert "evaluator" not in config["cluster"]
            assert set(config["cluster"]) <= {"chief", "worker", "ps"}


def test_tf_config_of_a_parameter_server_job():
    document = job(strategy="ParameterServer", chief=replica(1), worker=replica(2), ps=replica(1), evaluator=replica(1))
    pods, _, _ = rendered(document)
    worker1 = next(p for p in pods if p["metadata"]["name"] == "mnist-worker-1")
    assert tf_config_of(worker1) == {
        "cluster": {
            "chief": ["mnist-chief-0.mnist.team-a.svc:2222"],
            "worker": ["mnist-worker-0.mnist.team-a.svc:2222", "mnist-worker-1.mnist.team-a.svc:2222"],
            "ps": ["mnist-ps-0.mnist.team-a.svc:2222"],
        },
        "task": {"type": "worker", "index": 1},
    }
    for pod in pods:
        assert env_of(pod)["GRPC_FAIL_FAST"] == "use_caller"
        assert env_of(pod)["KUBETF_STRATEGY"] == "ParameterServer"


def test_grpc_fail_fast_only_for_parameter_server():
    pods, _, _ = rendered(job(worker=replica(2)))
    assert all("GRPC_FAIL_FAST" not in env_of(p) for p in pods)


def test_thread_env_follows_the_cpu_limit():
    document = job(
        worker=replica(1, template={"spec": {"containers": [container(resources={"limits": {"cpu": "2500m"}})]}})
    )
    (pod,), _, _ = rendered(document)
    env = env_of(pod)
    assert env["TF_NUM_INTRAOP_THREADS"] == env["TF_NUM_INTEROP_THREADS"] == env["OMP_NUM_THREADS"] == "3"
    (no_limit,), _, _ = rendered(job(worker=replica(1)))
    assert "OMP_NUM_THREADS" not in env_of(no_limit)


@pytest.mark.parametrize("strategy", ["ParameterServer", "Independent"])
def test_jobs_with_ps_servers_get_an_inter_op_thread_per_worker(strategy):
    document = job(strategy=strategy, chief=replica(1), worker=replica(3), ps=replica(1))
    for spec in document["spec"]["replicaSpecs"].values():
        spec["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    pods, _, _ = rendered(document)
    for pod in pods:
        assert env_of(pod)["TF_NUM_INTRAOP_THREADS"] == "1"
        assert env_of(pod)["TF_NUM_INTEROP_THREADS"] == "4"


def test_gpus_shorthand_sets_limits_and_toleration_on_the_training_container():
    document = job(
        strategy="Mirrored",
        chief=replica(
            1, gpus=2, template={"spec": {"containers": [{"name": "sidecar", "image": "busybox:1"}, container()]}}
        ),
    )
    (pod,), _, _ = rendered(document)
    sidecar, training = pod["spec"]["containers"]
    assert training["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert "resources" not in sidecar
    assert "env" not in sidecar
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]


def test_full_gpu_resources_in_the_template_still_work():
    document = job(
        worker=replica(1, template={"spec": {"containers": [container(resources={"limits": {"nvidia.com/gpu": 4}})]}})
    )
    (pod,), _, _ = rendered(document)
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert all(t["key"] != "nvidia.com/gpu" for t in pod["spec"]["tolerations"])


def test_checkpoint_pvc_mount_and_env():
    document = job(chief=replica(1), worker=replica(2))
    document["spec"]["checkpoint"] = {"mountPath": "/ckpt", "size": "10Gi", "storageClassName": "standard"}
    pods, _, (pvc,) = rendered(document)
    assert pvc["metadata"]["name"] == "mnist-checkpoint"
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "10Gi"}},
        "storageClassName": "standard",
    }
    assert "ownerReferences" not in pvc["metadata"]  # retainOnDelete defaults to true
    for pod in pods:
        assert {"name": "kubetf-checkpoint", "persistentVolumeClaim": {"claimName": "mnist-checkpoint"}} in pod["spec"][
            "volumes"
        ]
        assert {"name": "kubetf-checkpoint", "mountPath": "/ckpt"} in pod["spec"]["containers"][0]["volumeMounts"]
        assert env_of(pod)["KUBETF_CHECKPOINT_DIR"] == "/ckpt"


def test_checkpoint_pvc_owned_when_not_retained_and_existing_claim_reused():
    document = job(worker=replica(1))
    document["spec"]["checkpoint"] = {"size": "1Gi", "retainOnDelete": False}
    _, _, (pvc,) = rendered(document)
    assert pvc["metadata"]["ownerReferences"][0]["uid"] == "1234-uid"
    document["spec"]["checkpoint"] = {"existingClaim": "shared-ckpt"}
    (pod,), _, pvcs = rendered(document)
    assert pvcs == []
    assert pod["spec"]["volumes"][-1]["persistentVolumeClaim"]["claimName"] == "shared-ckpt"
    assert env_of(pod)["KUBETF_CHECKPOINT_DIR"] == "/checkpoints"


def test_every_task_knows_its_run_the_jobs_uid_and_an_offline_render_has_none():
    """The trainer's checkpoint fence tells runs of a job apart by it (kubetf_trainer.fence): the same for every task
    and restart of one job object, another for a job made again or dispatched again by MultiKueue."""
    document = job(chief=replica(1), worker=replica(2))
    pods, _, _ = rendered(document)
    assert {env_of(pod)["KUBETF_RUN_ID"] for pod in pods} == {"1234-uid"}
    del document["metadata"]["uid"]
    pods, _, _ = rendered(document)
    assert all("KUBETF_RUN_ID" not in env_of(pod) for pod in pods)


def test_every_child_is_owned_by_the_job():
    document = job(chief=replica(1), worker=replica(1))
    for obj in builders.render(document):
        if obj["kind"] == "PersistentVolumeClaim":
            continue
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner == {
            "apiVersion": "kubetf.io/v1alpha1",
            "kind": "TrainingJob",
            "name": "mnist",
            "uid": "1234-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }


def test_pods_never_restart_in_place_and_have_a_grace_period_for_checkpoints():
    pods, _, _ = rendered(job(chief=replica(1), worker=replica(1)))
    for pod in pods:
        assert pod["spec"]["restartPolicy"] == "Never"
        assert pod["spec"]["terminationGracePeriodSeconds"] >= 60


def test_user_env_is_kept_but_operator_env_wins():
    document = job(
        worker=replica(
            1,
            template={
                "spec": {
                    "containers": [
                        container(env=[{"name": "MY_FLAG", "value": "1"}, {"name": "TF_CONFIG", "value": "stale"}])
                    ]
                }
            },
        )
    )
    (pod,), _, _ = rendered(document)
    names = [e["name"] for e in pod["spec"]["containers"][0]["env"]]
    assert names.count("TF_CONFIG") == 1
    assert env_of(pod)["MY_FLAG"] == "1"
    assert env_of(pod)["TF_CONFIG"] != "stale"


def test_task_env_with_local_addresses():
    document = api.with_defaults(job(worker=replica(2)))
    ports = {("worker", 0): 20000, ("worker", 1): 20001}
    env = builders.task_env(
        document, "worker", 1, address_of=lambda r, i: f"localhost:{ports[(r, i)]}", checkpoint_dir="/tmp/ckpt"
    )
    assert json.loads(env["TF_CONFIG"]) == {
        "cluster": {"worker": ["localhost:20000", "localhost:20001"]},
        "task": {"type": "worker", "index": 1},
    }
    assert env["KUBETF_CHECKPOINT_DIR"] == "/tmp/ckpt"


def test_attempt_label_changes_only_the_label():
    document = api.with_defaults(job(worker=replica(1)))
    first, second = builders.desired_pod(document, "worker", 0, 0), builders.desired_pod(document, "worker", 0, 3)
    assert second["metadata"]["labels"]["kubetf.io/attempt"] == "3"
    second["metadata"]["labels"]["kubetf.io/attempt"] = "0"
    assert first == second


def test_the_training_container_leaves_its_last_log_lines_on_failure_unless_the_template_says_otherwise():
    document = job(
        chief=replica(1),
        worker=replica(1, template={"spec": {"containers": [container(terminationMessagePolicy="File")]}}),
    )
    chief, worker = rendered(document)[0]
    assert chief["spec"]["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert worker["spec"]["containers"][0]["terminationMessagePolicy"] == "File"
