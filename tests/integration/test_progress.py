"""Progress reports against the real API server: the operator process checks real pod-bound tokens with
TokenReview, accepts a running pod's report for its own job only, and refuses the rest without writing."""

import json

import pytest

from kubetf.core.progress.identity import AUDIENCE
from kubetf.core.progress.protocol import MAX_BODY
from tests.cluster.fixture import wait_for

from .conftest import mwms_spec

pytestmark = pytest.mark.integration


def running_job(cluster, namespace, name):
    cluster.create_job(namespace, name, mwms_spec())
    cluster.run_all(namespace, name, 3)
    cluster.wait_phase(namespace, name, "Running")
    return cluster.live_pods(namespace, name)


def token_for(cluster, namespace, pod, audience=AUDIENCE):
    """What the kubelet mounts in the pod's projected volume: a token of `audience` bound to the pod."""
    request = {
        "spec": {
            "audiences": [audience],
            "expirationSeconds": 600,
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod["metadata"]["name"],
                               "uid": pod["metadata"]["uid"]},
        }
    }  # fmt: skip
    return cluster.core.create_namespaced_service_account_token("default", namespace, request).status.token


def progress(cluster, namespace, name):
    return cluster.status(namespace, name).get("progress")


def test_a_pod_reports_for_its_own_job_and_cannot_report_for_another(cluster, namespace, operator):
    pods_a = running_job(cluster, namespace, "a")
    running_job(cluster, namespace, "b")
    token = token_for(cluster, namespace, pods_a["a-chief-0"])
    report = {"epoch": 2, "epochs": 8, "step": 20, "steps": 80, "metrics": {"loss": 0.7}}
    assert operator.report(token, json.dumps(report).encode()) == (204, "")
    written = wait_for(lambda: progress(cluster, namespace, "a"), 10, "job a's status.progress")
    assert (written["summary"], written["metrics"]) == ("25%", {"loss": 0.7})
    # The body cannot name another job: an unknown field is refused, and the pod's identity decides the job.
    status, body = operator.report(token, json.dumps({"epoch": 3, "job": "b"}).encode())
    assert status == 400 and "job" in json.loads(body)["error"]
    assert progress(cluster, namespace, "b") is None
    table = cluster.kubectl("get", "tj", "-n", namespace).stdout
    assert any(line.split()[:1] == ["a"] and "25%" in line.split() for line in table.splitlines()), table


def test_reports_without_a_valid_token_or_too_large_are_refused_and_nothing_is_written(cluster, namespace, operator):
    pods = running_job(cluster, namespace, "j")
    chief = pods["j-chief-0"]
    good = json.dumps({"epoch": 1, "epochs": 2}).encode()
    assert operator.report(None, good)[0] == 401
    assert operator.report("not-a-token", good)[0] == 401
    wrong_audience = token_for(cluster, namespace, chief, audience="https://kubernetes.default.svc")
    assert operator.report(wrong_audience, good)[0] == 401
    unbound = cluster.core.create_namespaced_service_account_token(
        "default", namespace, {"spec": {"audiences": [AUDIENCE], "expirationSeconds": 600}}
    ).status.token  # the audience, but no pod: anyone holding the account's token could report for any job
    assert operator.report(unbound, good)[0] == 401
    token = token_for(cluster, namespace, chief)
    status, body = operator.report(token, b'{"epoch": 1, "metrics": {"loss": "' + b"x" * MAX_BODY + b'"}}')
    assert status == 413 and "at most 16384 bytes" in json.loads(body)["error"]
    status, body = operator.report(token, b'{"epoch": -1}')
    assert status == 400 and json.loads(body)["error"].startswith("epoch")
    # The first report accepted shows nothing of the refused ones: they were never folded in.
    assert operator.report(token, good) == (204, "")
    written = wait_for(lambda: progress(cluster, namespace, "j"), 10, "status.progress")
    assert (written["summary"], len(written["history"]), written.get("metrics")) == ("50%", 1, None)
    # A deleted pod's token is refused: the report must come from a live pod of the job. The operator knows the pod
    # is gone once its watch shows it (its token's review is kept until the token expires), so the test waits for
    # the refusal; a report accepted meanwhile is the pod's last word before it went.
    cluster.delete_pod(chief)
    late = json.dumps({"epoch": 2, "epochs": 2}).encode()
    wait_for(lambda: operator.report(token, late)[0] in (401, 403), 10, "the deleted chief's reports refused")
