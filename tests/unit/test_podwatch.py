"""The operator's own pod watch (kubetf.cluster.podwatch): every event handed over in order, each watch going on
from the last version seen (a bookmark's too), a list again when the API server no longer has that version, and a
failed watch tried again from where it was."""

import threading

import pytest
import urllib3

from kubetf.cluster import podwatch
from kubetf.cluster.kube_api import Expired
from kubetf.cluster.podwatch import PodWatch

from .fake_api import FakeApi

pytestmark = pytest.mark.unit


def event(kind, name, version):
    return {"type": kind, "object": {"metadata": {"name": name, "resourceVersion": str(version)}}}


def bookmark(version):
    return {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": str(version)}}}


class Watching:
    """A PodWatch on the fake API, run on the test's thread until its scripted watches are used up."""

    def __init__(self, *watches, relisted_at=500):
        self.api = FakeApi(clock=lambda: 0.0)
        self.api.pod_watches = list(watches)
        self.delivered, self.relists = [], []
        self.stopping = threading.Event()
        self.relisted_at = relisted_at
        self.watch = PodWatch(self.api, "team-a", 100, self.deliver, self.relist, self.stopping)

    def deliver(self, kind, pod):
        self.delivered.append((kind, pod["metadata"]["name"]))

    def relist(self, namespace):
        self.relists.append(namespace)
        return self.relisted_at

    def run(self):
        watch_pods = self.api.watch_pods

        def last_one_stops(namespace, version, seconds):
            if not self.api.pod_watches:
                self.stopping.set()
                return iter(())
            return watch_pods(namespace, version, seconds)

        self.api.watch_pods = last_one_stops
        self.watch.run()
        return self


def test_every_event_is_handed_over_in_order_and_the_next_watch_goes_on_from_the_last_version():
    first = [event("ADDED", "a", 101), event("MODIFIED", "a", 102), bookmark(110)]
    second = [event("DELETED", "a", 111)]
    watching = Watching(first, second).run()
    assert watching.delivered == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]
    assert watching.api.watched_from == [100, 110]  # from the priming list's version, then from the bookmark's
    assert watching.relists == []


def test_a_version_the_api_server_no_longer_has_lists_again_and_watches_from_that_list():
    watching = Watching(Expired("too old resource version: 100 (400)"), [event("MODIFIED", "a", 501)]).run()
    assert watching.relists == ["team-a"]
    assert watching.api.watched_from == [100, 500]
    assert watching.delivered == [("MODIFIED", "a")]


def test_a_failed_watch_is_tried_again_from_where_it_was(monkeypatch):
    monkeypatch.setattr(podwatch, "RETRY_SECONDS", 0.0)
    broken = urllib3.exceptions.ProtocolError("Connection broken: the API server restarted")
    watching = Watching([event("ADDED", "a", 101)], broken, [event("MODIFIED", "a", 102)]).run()
    assert watching.api.watched_from == [100, 101, 101]
    assert watching.delivered == [("ADDED", "a"), ("MODIFIED", "a")]
    assert watching.relists == []
