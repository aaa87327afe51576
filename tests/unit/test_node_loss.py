"""When a node stopped reporting, read from its Node object (kubetf.core.node_loss.lost_since)."""

import threading

import pytest

from kubetf.cluster.cache import Store
from kubetf.core import node_loss
from kubetf.core import status as st
from kubetf.core.config import DEFAULTS
from kubetf.runtime.observer import Observer

pytestmark = pytest.mark.unit

NOW = 1_800_000_000.0
SILENCE = DEFAULTS.node_monitor_grace + 2 * DEFAULTS.node_monitor_period


def node(status: str | None, changed: float | None = None) -> dict:
    if status is None:
        return {"status": {"conditions": []}}
    return {"status": {"conditions": [{"type": "Ready", "status": status,
                                       "lastTransitionTime": st.format_time(changed or NOW)}]}}  # fmt: skip


@pytest.mark.parametrize(
    "found, since",
    [
        (node("True", NOW - 100), None),  # reporting
        (node("False", NOW - 7), NOW - 7),  # its kubelet said NotReady: that is when
        (node("Unknown", NOW - 7), NOW - 7 - SILENCE),  # its last heartbeat was up to grace + two checks before
        (node(None), NOW),  # no Ready condition yet: nothing earlier may be blamed on it
        (None, NOW),  # deleted outright: when it went is not known
    ],
)
def test_since_when_a_node_stopped_reporting(found, since):
    assert node_loss.lost_since(found, NOW, SILENCE) == since


def test_a_node_that_stopped_just_after_a_heartbeat_is_blamed_for_a_failure_right_after_it():
    """The e2e case: the heartbeat, the node stops, its pods' peers fail at once. The node controller sees the
    heartbeat at its next check (up to a period later), and marks the node Unknown at the first check a grace period
    after that (up to a period later still): CI once saw the mark 61 s after the stop, and counted the failure."""
    heartbeat = NOW
    failure = heartbeat + 1
    marked = heartbeat + DEFAULTS.node_monitor_grace + 2 * DEFAULTS.node_monitor_period

    class Nodes:
        def get_node(self, name):
            return node("Unknown", marked)

    observer = Observer(Nodes(), Store(tombstone_seconds=1), None, None, DEFAULTS, clock=lambda: marked + 3)  # type: ignore[arg-type]
    since = observer._read_node("spot-1", marked + 3)
    assert since is not None and since <= failure


def test_a_node_is_read_by_one_reconcile_at_a_time_the_others_take_what_was_read_before():
    entered, release = threading.Event(), threading.Event()

    class Nodes:
        calls = 0

        def get_node(self, name):
            self.calls += 1
            entered.set()
            release.wait(5)
            return node("False", NOW - 7)

    nodes = Nodes()
    deleting = [
        {"metadata": {"name": f"p{i}", "deletionTimestamp": "x"}, "spec": {"nodeName": "spot-1"}} for i in (1, 2)
    ]
    observer = Observer(nodes, Store(tombstone_seconds=1), None, None, DEFAULTS, clock=lambda: NOW)  # type: ignore[arg-type]
    found = []
    reader = threading.Thread(target=lambda: found.append(observer._lost_nodes(deleting[:1], NOW)))
    reader.start()
    assert entered.wait(5)
    # Another job's reconcile while that read is slow: nothing was known of the node yet, and it is not read twice.
    assert observer._lost_nodes(deleting[1:], NOW + 1) == {}
    release.set()
    reader.join(5)
    assert found == [{"spot-1": NOW - 7}]
    assert observer._lost_nodes(deleting, NOW + 2) == {"spot-1": NOW - 7}  # the read serves node_state_seconds
    assert nodes.calls == 1
