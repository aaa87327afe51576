"""Registers the session-scoped `kube_cluster` fixture (tests/cluster/fixture.py) and the `k8s_min` marker
(tests/cluster/k8s_version.py) for every test tier, and undoes what the run set up once for all its workers
(tests/cluster/session.py) when it ends."""

from __future__ import annotations

import contextlib

import pytest
from kubernetes import client
from kubernetes import config as kubeconfig
from kubernetes.client.exceptions import ApiException

from tests.cluster.session import undo_steps

pytest_plugins = ["tests.cluster.fixture", "tests.ordering", "tests.cluster.k8s_version"]


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: its controller ends the run
    for step in reversed(undo_steps(session.config)):
        api = kubeconfig.new_client_from_config(config_file=step["kubeconfig"])
        with contextlib.suppress(ApiException):
            if step["step"] == "scale":  # an installed operator paused for the integration tier
                body = {"spec": {"replicas": step["replicas"]}}
                client.AppsV1Api(api).patch_namespaced_deployment_scale(step["name"], step["namespace"], body)
            elif step["step"] == "delete-queue-name-policy":
                from tests.integration.conftest import admission_kind

                admission = client.AdmissionregistrationV1Api(api)
                for kind, name in reversed(step["made"]):  # the bindings first
                    with contextlib.suppress(ApiException):
                        getattr(admission, f"delete_{admission_kind(kind)}")(name)
