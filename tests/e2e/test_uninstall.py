"""Runs last in the e2e tier: `helm uninstall` removes the operator, keeps the CRD and retained checkpoints."""

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kubetf import api
from tests.integration.conftest import replica, wait_for

from .conftest import OPERATOR_NAMESPACE, RELEASE, helm


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
    left = [d.metadata.name for d in apps.list_namespaced_deployment(OPERATOR_NAMESPACE).items]
    left += [
        s.metadata.name
        for s in cluster.core.list_namespaced_service_account(OPERATOR_NAMESPACE).items
        if s.metadata.name != "default"
    ]
    left += [r.metadata.name for r in rbac.list_cluster_role().items if "kubetf" in r.metadata.name]
    left += [b.metadata.name for b in rbac.list_cluster_role_binding().items if "kubetf" in b.metadata.name]
    assert left == []
    assert exists(client.ApiextensionsV1Api(cluster.api_client).read_custom_resource_definition, api.CRD_NAME)
    assert exists(cluster.core.read_namespaced_persistent_volume_claim, "keep-checkpoint", namespace)
