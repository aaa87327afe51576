"""Creates the real API server refuses, a previous job's children still in the way, and events that must not be
lost (issue 9, items 1, 3 (Service/PVC side) and 11)."""

import time

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kubetf.core import api
from tests.cluster.fixture import wait_for

from .conftest import replica


def mwms_spec(workers=2, **run_policy):
    return {
        "strategy": "MultiWorkerMirrored",
        "replicaSpecs": {"chief": replica(1), "worker": replica(workers)},
        "runPolicy": {"backoffSeconds": 1, **run_policy},
    }


def current(status):
    return next(c for c in status["conditions"] if c["status"] == "True")


def wait_reason(cluster, namespace, name, reason, timeout=20):
    return wait_for(
        lambda: (s := cluster.status(namespace, name)).get("reason") == reason and s,
        timeout,
        lambda: f"{name} to have reason {reason} (status: {cluster.status(namespace, name)})",
    )


def services(cluster, namespace):
    return [s.metadata.name for s in cluster.core.list_namespaced_service(namespace).items]


def quota(cluster, namespace, pods):
    """A ResourceQuota of `pods` pods, once the quota controller has filled its status (admission refuses every pod
    of a namespace whose quota has no status yet). The controller holds new quotas while it re-syncs its monitors
    (after API resources come or go), which took over 20 s once on a busy machine."""
    body = {"metadata": {"name": "pods"}, "spec": {"hard": {"pods": str(pods)}}}
    try:
        cluster.core.create_namespaced_resource_quota(namespace, body)
    except ApiException as error:
        if error.status != 409:
            raise
        cluster.core.patch_namespaced_resource_quota("pods", namespace, body)
    wait_for(
        lambda: (
            (cluster.core.read_namespaced_resource_quota("pods", namespace).status.hard or {}).get("pods") == str(pods)
        ),
        60,
        f"the quota of {pods} pods in force",
    )


def test_invalid_pod_template_fails_before_any_child_exists(cluster, namespace):
    spec = mwms_spec(cleanPodPolicy="None")  # a pod created and then failed would stay: none may exist
    spec["checkpoint"] = {"size": "1Gi"}
    spec["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"memory": "4GB"}}
    cluster.create_job(namespace, "bad-mem", spec)
    status = cluster.wait_phase(namespace, "bad-mem", "Failed")
    assert status["reason"] == "InvalidPodTemplate"
    message = current(status)["message"]
    assert message.startswith("replica worker: the API server refused pod bad-mem-worker-1: ")
    assert "quantities must match the regular expression" in message  # the API server's own words
    assert "spec.replicaSpecs.worker.template.spec.containers[0].resources.limits.memory='4GB'" in message
    assert cluster.pods(namespace, "bad-mem") == {}
    assert services(cluster, namespace) == []
    assert cluster.core.list_namespaced_persistent_volume_claim(namespace).items == []
    event = cluster.wait_event(namespace, "bad-mem", "InvalidPodTemplate")
    assert "limits.memory='4GB'" in event["message"]


def test_exhausted_quota_keeps_job_pending_with_a_warning_and_retries(cluster, namespace):
    quota(cluster, namespace, 2)
    cluster.create_job(namespace, "quota", mwms_spec(workers=3))
    status = wait_reason(cluster, namespace, "quota", "CreateRejected")
    assert status["phase"] == "Pending"
    message = current(status)["message"]
    assert "exceeded quota: pods" in message and "raise the namespace's ResourceQuota" in message
    assert len(cluster.pods(namespace, "quota")) == 2
    event = cluster.wait_event(namespace, "quota", "CreateRejected")
    assert "exceeded quota" in event["message"]
    quota(cluster, namespace, 4)
    pods = cluster.wait_pods(namespace, "quota", lambda p: len(p) == 4, "all 4 pods once the quota allows", 40)
    assert sorted(pods) == ["quota-chief-0", "quota-worker-0", "quota-worker-1", "quota-worker-2"]
    status = wait_reason(cluster, namespace, "quota", "PodsStarting")
    assert "createRejectedSince" not in status
    cluster.run_all(namespace, "quota", 4)
    status = cluster.wait_phase(namespace, "quota", "Running")
    assert status["restarts"]["total"] == 0


def test_pod_security_denial_keeps_job_pending_until_the_namespace_allows_it(cluster, namespace):
    enforce = "pod-security.kubernetes.io/enforce"
    cluster.core.patch_namespace(namespace, {"metadata": {"labels": {enforce: "restricted"}}})
    cluster.create_job(namespace, "psa", mwms_spec())
    status = wait_reason(cluster, namespace, "psa", "CreateRejected")
    message = current(status)["message"]
    assert 'violates PodSecurity "restricted:latest"' in message
    assert "make the template meet the namespace's Pod Security level" in message
    # Refused at the dry run: nothing half-created.
    assert cluster.pods(namespace, "psa") == {} and services(cluster, namespace) == []
    cluster.wait_event(namespace, "psa", "CreateRejected")
    cluster.core.patch_namespace(namespace, {"metadata": {"labels": {enforce: "baseline"}}})
    cluster.wait_pods(namespace, "psa", lambda p: len(p) == 3, "the pods once the namespace allows them", 40)
    assert services(cluster, namespace) == ["psa"]


def test_startup_timeout_covers_rejected_creates(cluster, namespace):
    quota(cluster, namespace, 0)
    cluster.create_job(namespace, "never", mwms_spec(startupTimeoutSeconds=3))
    status = wait_reason(cluster, namespace, "never", "CreateRejected")
    assert status["createRejectedSince"]
    status = cluster.wait_phase(namespace, "never", "Failed", timeout=15)
    assert status["reason"] == "StartupTimeout"
    message = current(status)["message"]
    assert message.startswith("pods could not be created for startupTimeoutSeconds=3: ")
    assert "exceeded quota" in message
    # Nothing could be created, not even what a pod would need: the dry run was refused first.
    assert cluster.pods(namespace, "never") == {} and services(cluster, namespace) == []
    cluster.wait_event(namespace, "never", "StartupTimeout")


def test_recreated_job_waits_for_the_previous_jobs_service(cluster, namespace):
    old = cluster.create_job(namespace, "again", mwms_spec())
    cluster.wait_pods(namespace, "again", lambda p: len(p) == 3, "the first job's pods")
    # The previous job's Service is held while the garbage collector deletes it (a finalizer stands in for a slow
    # collector); its pods, never scheduled, go at once.
    cluster.core.patch_namespaced_service("again", namespace, {"metadata": {"finalizers": ["kubetf.io/test-hold"]}})
    cluster.custom.delete_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, "again")
    wait_for(lambda: cluster.job(namespace, "again") is None, 10, "the first job gone")
    wait_for(
        lambda: cluster.core.read_namespaced_service("again", namespace).metadata.deletion_timestamp,
        30,
        "the previous job's Service being deleted by the garbage collector",
    )
    wait_for(lambda: cluster.pods(namespace, "again") == {}, 30, "the previous job's pods gone")
    new = cluster.create_job(namespace, "again", mwms_spec())
    status = wait_reason(cluster, namespace, "again", "NameInUse")
    assert status["phase"] == "Pending"
    assert current(status)["message"].startswith(
        "waiting to create Service again: Service again of a previous job is still being deleted"
    )
    assert cluster.pods(namespace, "again") == {}  # no pod before the job's own Service exists
    cluster.wait_event(namespace, "again", "NameInUse")
    cluster.core.patch_namespaced_service("again", namespace, {"metadata": {"finalizers": None}})
    cluster.wait_pods(namespace, "again", lambda p: len(p) == 3, "the new job's pods", 30)
    service = cluster.core.read_namespaced_service("again", namespace)
    assert [o.uid for o in service.metadata.owner_references] == [new["metadata"]["uid"]]
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    status = wait_reason(cluster, namespace, "again", "PodsStarting")
    assert status["restarts"]["total"] == 0


def test_events_are_posted_before_the_status_says_what_they_say_but_a_restarts_after_its_deletes(cluster, namespace):
    """Whoever sees a job Running in its status finds its AllPodsRunning event already there: the operator posts
    first, so a crash between the two writes can repeat an event but never lose one. (Posted after, this fails only
    when the read falls between the two writes: a check of the order, not a proof of it; the unit tests check the
    calls.) A restart is stored before its pods are touched and its event goes out after its deletes: the status
    shows it first, then the old pods marked for deletion, then the event, once."""
    cluster.create_job(namespace, "order", mwms_spec())
    cluster.run_all(namespace, "order", 3)

    def running():
        status = cluster.status(namespace, "order")
        return (status, cluster.events(namespace, "order")) if status.get("phase") == "Running" else None

    _, events = wait_for(running, 30, "the job Running in its status", interval=0.005)
    assert "AllPodsRunning" in [e["reason"] for e in events]
    old = {p["metadata"]["uid"] for p in cluster.pods(namespace, "order").values()}
    cluster.exit(cluster.pods(namespace, "order")["order-worker-1"], 1)

    def restarting():
        status = cluster.status(namespace, "order")
        return status if status.get("phase") == "Restarting" else None

    status = wait_for(restarting, 15, "the restart in the status", interval=0.005)
    assert status["reason"] == "Failed"

    def warned():
        warnings = [e["reason"] for e in cluster.events(namespace, "order") if e["type"] == "Warning"]
        return warnings or None

    assert wait_for(warned, 15, "the restart's event") == ["Failed"]
    pods = cluster.core.list_namespaced_pod(namespace, label_selector=f"{api.LABEL_JOB}=order").items
    still = [p for p in pods if p.metadata.uid in old]
    assert all(p.metadata.deletion_timestamp for p in still), [p.metadata.name for p in still]


def test_a_pod_webhook_that_cannot_be_called_is_named_at_once_and_the_job_goes_on_when_it_is_gone(cluster, namespace):
    """A ValidatingWebhookConfiguration on pods (failurePolicy Fail) whose service is down, as Kueue's own webhook is
    while its pod restarts: every pod create answers 500 "failed calling webhook". It applies to this test's
    namespace only."""
    admission = client.AdmissionregistrationV1Api(cluster.api_client)
    name = f"kubetf-test-down-{namespace}"
    admission.create_validating_webhook_configuration(
        {
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "down.kubetf.io",
                    "clientConfig": {"service": {"name": "nobody-home", "namespace": namespace, "path": "/validate"}},
                    "rules": [
                        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
                    ],
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 2,
                }
            ],
        }
    )
    try:
        created = time.monotonic()
        cluster.create_job(namespace, "blocked", mwms_spec(startupTimeoutSeconds=5))
        status = wait_reason(cluster, namespace, "blocked", "CreateUnavailable", timeout=10)
        print(f"\nthe webhook named in the condition {time.monotonic() - created:.2f}s after the job was created")
        message = current(status)["message"]
        assert 'failed calling webhook "down.kubetf.io"' in message, message
        assert status["phase"] == "Pending" and "createRejectedSince" not in status
        event = cluster.wait_event(namespace, "blocked", "CreateUnavailable")
        assert "down.kubetf.io" in event["message"]
        # Longer than its startupTimeoutSeconds, watched the whole time: the cluster's fault is not the job's.
        while time.monotonic() - created < 8:
            assert cluster.status(namespace, "blocked")["phase"] == "Pending"
            time.sleep(0.2)
    finally:
        admission.delete_validating_webhook_configuration(name)
    removed = time.monotonic()
    cluster.wait_pods(namespace, "blocked", lambda p: len(p) == 3, "the job's pods once the webhook is gone", 10)
    print(f"webhook removed -> the job's 3 pods exist: {time.monotonic() - removed:.2f}s")
    assert cluster.status(namespace, "blocked")["restarts"]["total"] == 0
