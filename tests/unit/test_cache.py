"""The watch cache: slim objects, versions, and resyncs that repair a watch gap."""

import json

import pytest

from kubetf.cluster.cache import Store, slim_pod
from kubetf.core import policy
from kubetf.core import status as st
from kubetf.core.scheduling import gangs
from kubetf.core.scheduling.volcano import GROUP_ANNOTATION

pytestmark = pytest.mark.unit

KEY = ("team-a", "mnist")


def pod(name="mnist-worker-0", version=10, **status):
    return {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": f"uid-{name}",
            "resourceVersion": str(version),
            "labels": {"kubetf.io/job-name": "mnist", "kubetf.io/role": "worker", "kubetf.io/index": "0"},
            "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}] * 20,
        },
        "spec": {
            "containers": [{"name": "tensorflow", "image": "x", "env": [{"name": "TF_CONFIG", "value": "{}" * 500}]}],
            "nodeName": "node-1",
            "volumes": [{"name": "v", "emptyDir": {}}] * 10,
        },
        "status": {"phase": "Running", **status},
    }


def test_slim_pods_keep_what_the_decisions_read_and_little_else():
    evicted = pod(
        conditions=[
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "EvictionByEvictionAPI",
                "message": "m",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
        containerStatuses=[{"name": "tensorflow", "state": {"terminated": {"exitCode": 137}}, "imageID": "sha"}],
    )
    slim = slim_pod(evicted)
    assert policy.disruption_reason(slim) == policy.disruption_reason(evicted)
    assert policy.classify_pod(slim, "OnFailure") == policy.classify_pod(evicted, "OnFailure")
    assert st.pod_task(slim) == st.pod_task(evicted)
    assert len(json.dumps(slim)) < len(json.dumps(evicted)) / 4


def test_slim_pods_keep_their_gangs_podgroup_in_either_scheduler():
    native, volcano, plain = pod(), pod(), pod()
    native["spec"]["schedulingGroup"] = {"podGroupName": "mnist-gang-0"}
    volcano["metadata"]["annotations"] = {GROUP_ANNOTATION: "mnist-gang-1", "other": "x" * 100}
    assert gangs.pod_group_of(slim_pod(native)) == "mnist-gang-0"
    assert gangs.pod_group_of(slim_pod(volcano)) == "mnist-gang-1"
    assert slim_pod(volcano)["metadata"]["annotations"] == {GROUP_ANNOTATION: "mnist-gang-1"}
    assert gangs.pod_group_of(slim_pod(plain)) is None and "annotations" not in slim_pod(plain)["metadata"]


def test_an_older_version_never_replaces_a_newer_one():
    store = Store(tombstone_seconds=300)
    assert store.put_pod(KEY, pod(version=12))
    assert not store.put_pod(KEY, pod(version=11, phase="Failed"))
    assert store.job_pods(KEY)[0]["status"]["phase"] == "Running"


def test_only_changes_the_decisions_read_count_as_changes():
    store = Store(tombstone_seconds=300)
    store.put_pod(KEY, pod(version=1))
    assert not store.put_pod(KEY, pod(version=2))  # e.g. a new annotation
    assert store.put_pod(KEY, pod(version=3, phase="Failed"))


def test_a_fresh_list_removes_pods_whose_deletion_the_watch_missed_but_keeps_newer_ones():
    store = Store(tombstone_seconds=300)
    store.put_pod(KEY, pod("mnist-worker-0", version=5))
    store.put_pod(KEY, pod("mnist-worker-1", version=30))  # created after the list below was taken
    assert store.replace_pods(KEY, [], list_version=20)
    assert [p["metadata"]["name"] for p in store.job_pods(KEY)] == ["mnist-worker-1"]
    assert not store.replace_pods(KEY, [pod("mnist-worker-1", version=30)], list_version=31)


def test_pruning_by_a_list_of_names_drops_what_it_misses_but_keeps_newer_pods():
    store = Store(tombstone_seconds=300)
    store.put_pod(KEY, pod("mnist-worker-0", version=5))
    store.put_pod(KEY, pod("mnist-worker-1", version=30))  # created after the list below was taken
    assert not store.prune_pods(KEY, {"mnist-worker-0"}, list_version=20)
    assert store.prune_pods(KEY, set(), list_version=20)
    assert [p["metadata"]["name"] for p in store.job_pods(KEY)] == ["mnist-worker-1"]
    assert store.prune_pods(KEY, set(), list_version=31) and store.pod_jobs() == []


def test_a_deleted_pod_never_comes_back_from_a_list_taken_before_its_deletion():
    store = Store(tombstone_seconds=300)
    store.put_pod(KEY, pod(version=5))
    assert store.remove_pod(KEY, "mnist-worker-0", "uid-mnist-worker-0")  # the DELETED event comes first ...
    assert not store.put_pod(KEY, pod(version=5))  # ... then the older list is stored: ignored
    store.replace_pods(KEY, [pod(version=5)], list_version=6)
    assert store.job_pods(KEY) == []


def test_the_cached_pod_count_follows_puts_removals_and_prunes():
    store = Store(tombstone_seconds=300)
    key = ("team-a", "mnist")
    for i in range(3):
        store.put_pod(key, {"metadata": {"name": f"p{i}", "uid": f"u{i}", "resourceVersion": "5"}})
    store.put_pod(key, {"metadata": {"name": "p0", "uid": "u0", "resourceVersion": "6"}})  # an update, not a pod
    assert store.pod_count() == 3
    store.remove_pod(key, "p1", "u1")
    store.remove_pod(key, "p1", "u1")  # a second DELETED changes nothing
    assert store.pod_count() == 2
    store.prune_pods(key, {"p0"}, 10)
    assert store.pod_count() == 1 == sum(len(p) for p in store.pods.values())


def test_a_late_deleted_event_of_an_older_podgroup_never_drops_the_current_one_of_its_name():
    """Issue 46: the cache compared names, not uids: the DELETED event of an earlier incarnation dropped the group."""
    from kubetf.core.scheduling import native

    store = Store(tombstone_seconds=300)
    meta = {"name": "mnist-gang-0", "namespace": "team-a", "resourceVersion": "5",
            "labels": {"kubetf.io/job-name": "mnist"}}  # fmt: skip
    old = {"apiVersion": native.POD_GROUPS.api_version, "kind": "PodGroup", "metadata": {**meta, "uid": "old"}}
    new = {"apiVersion": native.POD_GROUPS.api_version, "kind": "PodGroup",
           "metadata": {**meta, "uid": "new", "resourceVersion": "9"}}  # fmt: skip
    store.put_owned(new)
    assert store.remove_owned(old) is None
    assert [o["metadata"]["uid"] for o in store.owned_of(("team-a", "mnist"))] == ["new"]
    assert store.remove_owned(new) == ("team-a", "mnist") and store.owned_of(("team-a", "mnist")) == []
