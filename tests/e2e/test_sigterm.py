"""SIGTERM and MultiWorkerMirrored on a real cluster: TensorFlow swallows it (kubetf/sigterm.py), so a program that
does nothing on SIGTERM is stopped at once. (One that saves on SIGTERM keeps its grace period to save:
test_training.py's evicted job.) Tiny jobs: 2 CPU cores."""

from __future__ import annotations

import time

import pytest

from tests.cluster.fixture import wait_for

from .conftest import create, elapsed
from .test_migration import container, log

# Far below the 120 s grace period the pods have: about 2 s until TensorFlow's line is read, a second to stop the
# chief, 2 s for the evicted worker to fail without it, then the replacements start (the image is on the node).
PROMPT_RESTART_SECONDS = 40


def evict(cluster, namespace: str, pod: str) -> None:
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}}
    cluster.core.create_namespaced_pod_eviction(pod, namespace, body)


def events(cluster, namespace: str, reason: str) -> list[str]:
    found = cluster.core.list_namespaced_event(namespace, field_selector=f"reason={reason}").items
    return [e.message for e in found]


def diagnose(cluster, namespace: str, job: str) -> str:
    lines = []
    for name, pod in sorted(cluster.pods(namespace, job).items()):
        meta, status = pod["metadata"], pod.get("status") or {}
        states = [next(iter((c.get("state") or {"?": 0}).keys())) for c in status.get("containerStatuses") or []]
        deletion = f"deletion={meta.get('deletionTimestamp')} grace={meta.get('deletionGracePeriodSeconds')}"
        lines.append(f"{name} uid={meta['uid'][:8]} phase={status.get('phase')} states={states} {deletion}")
    for event in cluster.core.list_namespaced_event(namespace).items:
        lines.append(f"event {event.involved_object.name} {event.reason}: {event.message}")
    for pod in cluster.core.list_namespaced_pod("kubetf-system").items:
        text = cluster.core.read_namespaced_pod_log(pod.metadata.name, "kubetf-system", tail_lines=400)
        lines += [f"operator {line}" for line in text.splitlines() if namespace in line][-30:]
    return "\n".join(lines)


@pytest.mark.tensorflow
def test_unchanged_mwms_program_restarts_promptly_after_a_member_is_evicted(installed, namespace):
    cluster = installed
    # The guide's custom training loop as the guide writes it: nothing on SIGTERM. Long enough to still be training.
    args = ("/opt/kubetf/examples/mwms_custom_loop.py", "--epochs", "200", "--steps-per-epoch", "10")
    replica = {"replicas": 1, "template": {"spec": {"containers": [container(*args)]}}}
    job = {
        "metadata": {"name": "plain"},
        "spec": {"strategy": "MultiWorkerMirrored", "replicaSpecs": {"chief": replica, "worker": replica}},
    }
    create(cluster, namespace, job)
    wait_for(
        lambda: any(line.startswith("Epoch: 0,") for line in log(cluster, namespace, "plain-chief-0")),
        600,
        "the group training",
        interval=1.0,
    )
    old = {name: pod["metadata"]["uid"] for name, pod in cluster.pods(namespace, "plain").items()}
    assert len(old) == 2 and all(p["spec"]["terminationGracePeriodSeconds"] == 120 for p in cluster.pods(
        namespace, "plain").values())  # fmt: skip
    evicted = time.monotonic()
    evict(cluster, namespace, "plain-worker-0")

    def old_gone_and_new_running():
        pods = cluster.pods(namespace, "plain")
        return (
            len(pods) == 2
            and not {p["metadata"]["uid"] for p in pods.values()} & set(old.values())
            and all(p["status"].get("phase") == "Running" for p in pods.values())
        )

    try:
        wait_for(old_gone_and_new_running, PROMPT_RESTART_SECONDS, "the old group gone and the new one running",
                 interval=0.2)  # fmt: skip
    finally:
        print(f"\nafter {elapsed(evicted)}:\n{diagnose(cluster, namespace, 'plain')}")
    print(f"\nunchanged MWMS program: eviction -> old group gone, new group Running: {elapsed(evicted)}")
    ignored = events(cluster, namespace, "SigtermIgnored")
    assert any(m.startswith("plain-worker-0: TensorFlow took the SIGTERM") for m in ignored), ignored
    status = cluster.status(namespace, "plain")
    assert status["restarts"] == status["restarts"] | {"failures": 0, "disruptions": 1}
    wait_for(
        lambda: (
            any(line.startswith("Resumed from ") for line in log(cluster, namespace, "plain-chief-0"))
            or any(line.startswith("Epoch: 0,") for line in log(cluster, namespace, "plain-chief-0"))
        ),
        300,
        "the new group training",
        interval=1.0,
    )
