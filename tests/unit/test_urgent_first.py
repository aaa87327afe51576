"""While a restart's reconcile runs, new jobs' writes wait for it (cluster.kube.UrgentFirst), at most a bound."""

import threading
import time
from types import SimpleNamespace

import pytest

from kubetf.cluster.kube import Kube

pytestmark = pytest.mark.unit


class Sent:
    """Stands in for a generated API method: records that the call left."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def __call__(self, *args, **kwargs):
        self.event.set()
        return SimpleNamespace(data=b"")


def urgent_reconcile(kube: Kube):
    """An urgent reconcile on a thread of its own, running until the returned event is set."""
    entered, finish = threading.Event(), threading.Event()

    def run():
        with kube.urgent():
            entered.set()
            finish.wait(30)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert entered.wait(5)
    return finish, thread


def test_a_new_jobs_write_waits_for_a_running_restart_and_leaves_when_it_ends():
    kube = Kube(qps=1000, burst=1000)
    finish, restart = urgent_reconcile(kube)
    create = Sent()
    writer = threading.Thread(target=kube._call, args=("create", "pods", create), daemon=True)
    writer.start()
    assert not create.event.wait(0.5), "a new job's create left while a restart ran"

    # Meanwhile the restart's own parallel calls, reads and the lease's renewal leave at once.
    delete, listing, lease = Sent(), Sent(), Sent()
    kube.urgent_pool.submit(kube._call, "delete", "pods", delete).result(timeout=5)
    kube._call("list", "pods", listing)
    kube._call("update", "leases", lease)
    assert delete.event.is_set() and listing.event.is_set() and lease.event.is_set()

    finish.set()
    restart.join(5)
    assert create.event.wait(5), "the create did not leave once the restart ended"


def test_a_write_waits_for_restarts_no_longer_than_the_hold():
    kube = Kube(qps=1000, burst=1000)
    kube.first.hold = 0.3
    finish, restart = urgent_reconcile(kube)
    create = Sent()
    start = time.monotonic()
    kube._call("create", "pods", create)
    assert create.event.is_set() and time.monotonic() - start >= 0.3
    finish.set()
    restart.join(5)
