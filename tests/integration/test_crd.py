"""`kubetf validate` and the API server agree: every rule the offline validator takes from the CRD is enforced by
the real API server at create time, and what only the operator checks is accepted there and then failed."""

import copy
import uuid

import pytest
from kubernetes.client.exceptions import ApiException

from kubetf.core import api
from tests.unit.jobs import job, replica
from tests.unit.test_validate import BAD_INPUT, broken

from .conftest import UNSCHEDULED


def unscheduled(document):
    for spec in document["spec"]["replicaSpecs"].values():
        spec["template"]["spec"]["schedulerName"] = UNSCHEDULED
    return document


# Every bad TrainingJob of the unit tests (a document of another kind never reaches this endpoint).
JOBS = [b for b in BAD_INPUT if b[0] != "wrong kind"]


@pytest.mark.parametrize("description,mutate,expected", JOBS, ids=[b[0] for b in JOBS])
def test_the_api_server_rejects_what_validate_takes_from_the_crd(cluster, namespace, description, mutate, expected):
    document = unscheduled(broken(mutate))
    document["metadata"].pop("uid")
    document["metadata"]["namespace"] = namespace
    cluster_side = api.cluster_problems(document)
    body = copy.deepcopy(document)
    try:
        cluster.custom.create_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.PLURAL, body, field_validation="Strict"
        )
        created = True
    except ApiException as error:
        assert error.status in (400, 422), error.body  # 400: strict field validation (unknown fields)
        created = False
        message = error.body
    if cluster_side:
        assert not created, f"the API server accepted what validate rejects: {cluster_side}"
        for problem in cluster_side:
            # Same field, and for CEL rules the same words: both come from the CRD.
            assert problem.path in message, (str(problem), message)
            assert any(w in message for w in (problem.message, "Invalid value", "Required value", "unknown field")), (
                str(problem),
                message,
            )
    else:
        assert created, f"the API server rejected what only the operator checks: {message}"
        name = document["metadata"]["name"]
        status = cluster.wait_phase(namespace, name, "Failed")
        assert status["reason"] == "InvalidSpec"
        assert cluster.pods(namespace, name) == {}


def test_a_valid_job_is_accepted_and_defaulted_like_with_defaults(cluster, namespace):
    document = unscheduled(job(name=f"ok-{uuid.uuid4().hex[:4]}", chief=replica(1), worker=replica(2)))
    document["metadata"] = {"name": document["metadata"]["name"], "namespace": namespace}
    created = cluster.custom.create_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, document)
    assert created["spec"] == api.with_defaults(document)["spec"]
