"""The API server restarted while jobs run (stopped and started again, as a control-plane upgrade does): the
operator resumes without restarting itself and loses no event.

Nothing changes a pod while the API server is down, so the operator's own path to it is cut a little longer (as a
load balancer in front of it may lag): pods end after the API server is back but before the operator can see
them. Its watches then cannot resume (the restarted API server has none of the old versions) and list again; one
of the pods is deleted, and a list never shows a deletion.
"""

import time
import uuid

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kubetf.core.scheduling import workload as kueue
from tests.cluster.fixture import wait_for

from .conftest import ApiPath, Operator, mwms_spec, ps_spec, restart_apiserver

pytestmark = pytest.mark.serial  # the API server restarts: every other test would lose it too

# As long as a control-plane upgrade may keep it away: longer than the lease's renew deadline (the operator stops
# writing meanwhile), and long enough for a client's reconnect backoff to have grown.
DOWN_SECONDS = 15
RUN_POLICY = {"backoffSeconds": 0}
MWMS = mwms_spec(**RUN_POLICY)
PS = ps_spec(**RUN_POLICY)
JOBS = {"failed": MWMS, "deleted": PS, "calm-mwms": MWMS, "calm-ps": PS}


def uids(pods):
    return {name: pod["metadata"]["uid"] for name, pod in pods.items()}


def test_api_server_restarted_the_operator_resumes_at_once_and_acts_on_pods_that_ended_meanwhile(
    kueue, cluster, operator, namespace, tmp_path
):
    path = ApiPath(cluster.kubeconfig, tmp_path)
    operator.stop()  # the tier's operator gives the lease up: this one reaches the API server through `path`
    behind = Operator(path.kubeconfig, tmp_path / "operator.log")
    try:
        behind.start()
        check(cluster, namespace, path, behind)
        the_cluster_recovered(cluster)  # Kueue lost its lease too, and its aggregated visibility API must come back
    finally:
        behind.stop()
        operator.start()


def the_cluster_recovered(cluster):
    """After the restart Kueue's visibility API is served again, and so a namespace can be deleted (the namespace
    controller needs every aggregated API's discovery)."""
    registration = client.ApiregistrationV1Api(cluster.api_client)

    def visibility_available() -> bool:
        service = registration.read_api_service(f"{kueue.VISIBILITY_VERSION}.{kueue.VISIBILITY_GROUP}")
        return any(c.type == "Available" and c.status == "True" for c in service.status.conditions or [])

    wait_for(visibility_available, 60, "Kueue's visibility APIService Available again")
    name = f"it-deleted-{uuid.uuid4().hex[:6]}"
    cluster.core.create_namespace({"metadata": {"name": name}})
    cluster.core.delete_namespace(name)

    def gone() -> bool:
        try:
            cluster.core.read_namespace(name)
        except ApiException as error:
            return error.status == 404
        return False

    wait_for(gone, 60, f"namespace {name} deleted")


def check(cluster, namespace, path, behind):
    for name, spec in JOBS.items():
        cluster.create_job(namespace, name, spec)
    for name, spec in JOBS.items():
        cluster.run_all(namespace, name, sum(r["replicas"] for r in spec["replicaSpecs"].values()))
    for name in JOBS:
        cluster.wait_phase(namespace, name, "Running")
    before = {name: cluster.live_pods(namespace, name) for name in JOBS}
    pid = behind.process.pid
    old_worker = before["deleted"]["deleted-worker-0"]["metadata"]["uid"]

    path.cut()
    restart_apiserver(cluster.kubeconfig, DOWN_SECONDS)
    cluster.exit(before["failed"]["failed-worker-1"], 1)
    cluster.delete_pod(before["deleted"]["deleted-worker-0"])
    path.heal()
    back = time.monotonic()

    def acted() -> dict[str, bool]:
        failed = cluster.live_pods(namespace, "failed")
        deleted = cluster.live_pods(namespace, "deleted")
        return {
            "failure counted": cluster.status(namespace, "failed")["restarts"]["failures"] == 1,
            "group recreated": len(failed) == 3
            and not set(uids(failed).values()) & set(uids(before["failed"]).values()),
            "disruption counted": cluster.status(namespace, "deleted")["restarts"]["disruptions"] == 1,
            "worker recreated": uids(deleted).get("deleted-worker-0") not in (None, old_worker),
        }

    while not all((state := acted()).values()):
        if time.monotonic() - back > 60:
            pytest.fail(f"the operator did not act on both pods within 60s: {state}")
        time.sleep(0.05)
    resumed = time.monotonic() - back
    print(f"the operator acted on both pods {resumed:.1f}s after it could reach the API server again")
    assert behind.process.pid == pid and behind.process.poll() is None, "the operator did not restart"
    assert behind.role() == "ok leader"

    # Only what ended was restarted: the deleted worker's peers and the other jobs are untouched.
    assert {n: u for n, u in uids(cluster.live_pods(namespace, "deleted")).items() if n != "deleted-worker-0"} == {
        n: u for n, u in uids(before["deleted"]).items() if n != "deleted-worker-0"
    }
    for name in ("calm-mwms", "calm-ps"):
        assert uids(cluster.live_pods(namespace, name)) == uids(before[name]), name
        status = cluster.status(namespace, name)
        assert (status["phase"], status["restarts"]["total"]) == ("Running", 0), name
    # And its watches work again: the replacements' start is seen.
    for name, count in (("failed", 3), ("deleted", 4)):
        cluster.run_all(namespace, name, count)
        cluster.wait_phase(namespace, name, "Running")
