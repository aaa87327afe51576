"""Leader election on a Lease, against an in-memory lease API with the API server's conflict rules."""

import copy
import itertools

import pytest
from kubernetes.client.exceptions import ApiException

from kubetf.cluster.leader import LeaderElector
from kubetf.core.config import OperatorConfig

pytestmark = pytest.mark.unit


class LeaseApi:
    """get/create/replace of one Lease, with resourceVersion preconditions; `down` makes every call fail."""

    def __init__(self):
        self.lease = None
        self.versions = itertools.count(1)
        self.down = False

    def _check(self):
        if self.down:
            raise ApiException(status=503, reason="apiserver unavailable")

    def get_lease(self, namespace, name):
        self._check()
        return copy.deepcopy(self.lease)

    def create_lease(self, namespace, body):
        self._check()
        if self.lease is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(next(self.versions))
        return copy.deepcopy(self.lease)

    def replace_lease(self, namespace, name, body):
        self._check()
        if body["metadata"]["resourceVersion"] != self.lease["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(next(self.versions))
        return copy.deepcopy(self.lease)


@pytest.fixture
def world():
    clock = [0.0]
    api = LeaseApi()
    config = OperatorConfig(lease_duration=8, renew_deadline=5, retry_period=1)

    def candidate(name):
        return LeaderElector(api, OperatorConfig(**{**config.__dict__, "identity": name}), clock=lambda: clock[0])

    return clock, api, candidate


def test_one_leader_and_a_standby_that_takes_over_only_after_the_lease_expires(world):
    clock, api, candidate = world
    a, b = candidate("a"), candidate("b")
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    for _ in range(20):  # a renews every second: b never gets it
        clock[0] += 1
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
    # a is SIGKILLed: its record stops changing. b waits lease_duration from when it last saw a change.
    died = clock[0]
    while not b.try_acquire_or_renew():
        clock[0] += 1
    assert 8 <= clock[0] - died <= 9
    assert api.lease["spec"]["holderIdentity"] == "b"
    assert api.lease["spec"]["leaseTransitions"] == 1


def test_a_leader_that_cannot_renew_stops_writing_before_anyone_may_take_over(world):
    clock, api, candidate = world
    a, b = candidate("a"), candidate("b")
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    api.down = True  # a is cut off from the API server (b too, for a while)
    stopped_writing = took_over = None
    for _ in range(30):
        clock[0] += 1
        if clock[0] == 3:
            api.down = False
        for elector in (a, b):
            try:
                if elector is b:
                    elector.try_acquire_or_renew()
            except ApiException:
                pass
        if stopped_writing is None and not a.is_leader():
            stopped_writing = clock[0]
        if took_over is None and b.is_leader():
            took_over = clock[0]
    assert stopped_writing is not None and took_over is not None
    assert stopped_writing < took_over


def test_a_released_lease_is_taken_at_once(world):
    clock, _api, candidate = world
    a, b = candidate("a"), candidate("b")
    a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    a.stop(release=True)
    clock[0] += 1
    assert b.try_acquire_or_renew()


def test_two_candidates_racing_for_a_free_lease_get_one_winner(world):
    _clock, api, candidate = world
    a, b = candidate("a"), candidate("b")
    api.create_lease("ns", {"metadata": {"name": "l"}, "spec": {"holderIdentity": None}})
    stale = api.get_lease("ns", "l")
    assert a.try_acquire_or_renew()
    # b read the lease before a wrote it: its write carries the old resourceVersion and is refused.
    original_get = api.get_lease
    api.get_lease = lambda *_: copy.deepcopy(stale)
    assert not b.try_acquire_or_renew()
    api.get_lease = original_get
    assert api.lease["spec"]["holderIdentity"] == "a"


def test_a_leader_cut_off_briefly_stops_writing_then_resumes_without_a_restart(world):
    clock, api, candidate = world
    a = candidate("a")
    a.try_acquire_or_renew()
    api.down = True
    clock[0] += 6
    assert not a.is_leader()  # no writes while it cannot renew
    api.down = False
    assert a.try_acquire_or_renew()  # nobody took it meanwhile: the same holder goes on
    assert a.is_leader()
    assert api.lease["spec"]["leaseTransitions"] == 0


def test_a_candidate_is_ready_only_once_a_round_has_reached_the_api_server(world):
    """/readyz (runtime.runner): a rolling upgrade counts a new pod as a standby only once it could take over."""
    _clock, api, candidate = world
    a, b = candidate("a"), candidate("b")
    api.down = True
    with pytest.raises(ApiException):
        b.try_acquire_or_renew()
    assert not b.candidate.is_set()
    api.down = False
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()  # the lease is a's: b is a standby that can take over
    assert a.candidate.is_set() and b.candidate.is_set()
