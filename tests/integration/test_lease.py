"""The operator loses its lease while a restart falls due: nothing it had to do is dropped. Once it holds the lease
again, it reconciles every job from a fresh read, and the decisions refused meanwhile run at once.

The lease is taken away the way another candidate would take it (its record rewritten, then renewed by the test
for as long as it needs), so the order is deterministic: the restart is decided and recorded while the operator
leads, its failure backoff falls due while it does not, and it leads again only after that.
"""

import datetime as dt
import os
import time

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kubetf.core import config
from tests.cluster.fixture import wait_for

from .conftest import LEASE_NAME, ps_spec

# How many times the whole sequence runs: once in `make test`; KUBETF_LEASE_RUNS=20 for the proof of no flake.
RUNS = int(os.environ.get("KUBETF_LEASE_RUNS", "1"))
BACKOFF_SECONDS = 4
REPLACED_WITHIN = 5.0


def micro_time() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Thief:
    """Another candidate that holds the operator's Lease while the test says so."""

    def __init__(self, cluster) -> None:
        self.api = client.CoordinationV1Api(cluster.api_client)
        self.namespace, self.name = config.DEFAULT_LEASE_NAMESPACE, LEASE_NAME

    def renew(self) -> None:
        # The operator may write the Lease between our read and our replace (renewing it while it still leads, or
        # trying to take it back): a 409 then, and we read again, as any candidate does.
        for _ in range(10):
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
            lease.spec.holder_identity = "thief"
            lease.spec.lease_duration_seconds = 3
            lease.spec.renew_time = micro_time()
            try:
                self.api.replace_namespaced_lease(self.name, self.namespace, lease)
                return
            except ApiException as error:
                if error.status != 409:
                    raise
        raise AssertionError("the Lease changed under every one of 10 renewals")

    def holder(self) -> str:
        return self.api.read_namespaced_lease(self.name, self.namespace).spec.holder_identity or ""


@pytest.mark.parametrize("run", range(RUNS))
def test_a_restart_due_while_the_lease_is_lost_happens_once_it_is_held_again(
    cluster, short_lease_operator, namespace, run
):
    operator = short_lease_operator
    name = f"ps-{run}"
    cluster.create_job(namespace, name, ps_spec(backoffSeconds=BACKOFF_SECONDS))
    cluster.run_all(namespace, name, 4)
    cluster.wait_phase(namespace, name, "Running")
    worker = cluster.live_pods(namespace, name)[f"{name}-worker-1"]
    cluster.exit(worker, 1)
    status = cluster.wait_phase(namespace, name, "Restarting")
    due = dt.datetime.fromisoformat(status["restartAfter"].replace("Z", "+00:00")).timestamp()
    thief = Thief(cluster)
    thief.renew()
    wait_for(lambda: operator.role() == "ok standby", 10, "the operator to stop writing", interval=0.1)
    # The backoff falls due while the thief holds the lease: nothing may be created meanwhile.
    while time.time() < due + 1:
        thief.renew()
        assert f"{name}-worker-1" not in cluster.live_pods(namespace, name), "created without the lease"
        time.sleep(0.5)
    # The thief stops renewing: the operator takes the lease back once it expires.
    wait_for(lambda: operator.role() == "ok leader", 15, "the operator to hold the lease again", interval=0.05)
    leading_again = time.monotonic()
    wait_for(
        lambda: f"{name}-worker-1" in cluster.live_pods(namespace, name),
        REPLACED_WITHIN,
        "the replacement, once the operator leads again",
        interval=0.05,
    )
    print(f"\nlease held again -> replacement created: {time.monotonic() - leading_again:.2f}s")
    assert cluster.status(namespace, name)["restarts"]["failures"] == 1
