"""Runs last in the e2e tier: `helm uninstall` removes the operator, keeps the CRD and retained checkpoints."""

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kubetf.core import api
from tests.cluster.fixture import wait_for
from tests.integration.conftest import replica

from .conftest import OPERATOR_NAMESPACE, RELEASE, helm

pytestmark = [pytest.mark.serial, pytest.mark.last]  # the chart goes: no other e2e test may run beside or after it


def exists(read, *args) -> bool:
    try:
        read(*args)
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def test_helm_uninstall_leaves_no_operator_objects_and_keeps_crd_and_retained_checkpoints(installed, namespace):
    cluster = installed
    spec = {"replicaSpecs": {"worker": replica(1)}, "checkpoint": {"size": "1Gi", "accessModes": ["ReadWriteOnce"]}}
    cluster.create_job(namespace, "keep", spec)
    wait_for(
        lambda: exists(cluster.core.read_namespaced_persistent_volume_claim, "keep-checkpoint", namespace),
        30,
        "the checkpoint PVC",
    )
    cluster.custom.delete_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, "keep")
    wait_for(lambda: cluster.job(namespace, "keep") is None, 30, "the job gone")

    helm("uninstall", RELEASE, "--namespace", OPERATOR_NAMESPACE, "--wait")
    apps = client.AppsV1Api(cluster.api_client)
    rbac = client.RbacAuthorizationV1Api(cluster.api_client)
    release = f"app.kubernetes.io/instance={RELEASE}"  # the chart's labels on everything it installs
    left = [
        f"{kind} {o.metadata.name}"
        for kind, items in (
            ("deployment", apps.list_deployment_for_all_namespaces(label_selector=release).items),
            ("service", cluster.core.list_service_for_all_namespaces(label_selector=release).items),
            ("serviceaccount", cluster.core.list_service_account_for_all_namespaces(label_selector=release).items),
            ("clusterrole", rbac.list_cluster_role(label_selector=release).items),
            ("clusterrolebinding", rbac.list_cluster_role_binding(label_selector=release).items),
            ("role", rbac.list_role_for_all_namespaces(label_selector=release).items),
            ("rolebinding", rbac.list_role_binding_for_all_namespaces(label_selector=release).items),
            ("configmap", cluster.core.list_config_map_for_all_namespaces(label_selector=release).items),
        )
        for o in items
    ]
    # what the e2e tier's install turned on for monitoring (tests/e2e/conftest.py): the Prometheus operator's kinds
    left += [
        f"{plural} {o['metadata']['name']}"
        for plural in ("servicemonitors", "prometheusrules")
        for o in cluster.custom.list_cluster_custom_object(
            "monitoring.coreos.com", "v1", plural, label_selector=release
        )["items"]
    ]
    assert left == []
    assert exists(client.ApiextensionsV1Api(cluster.api_client).read_custom_resource_definition, api.CRD_NAME)
    assert exists(cluster.core.read_namespaced_persistent_volume_claim, "keep-checkpoint", namespace)
