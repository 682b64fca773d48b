"""The test bed is a real control plane: the scheduler, controllers, RBAC and CRD validation all act.

Every object here goes through the real kube-apiserver and etcd; only the kubelet is played by kwok.
"""

from __future__ import annotations

import json
import re
import uuid

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.support.cluster import REPO_ROOT, LocalCluster, wait_until
from tests.support.testbed_kwok import GPU_PRODUCT, GPU_RESOURCE, STORAGE_CLASS, VOLUME_PROVISIONER


@pytest.fixture
def api(cluster: LocalCluster):
    with cluster.api_client() as api_client:
        yield api_client


def gpu_pod(name: str, gpus: int) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "rocm/vllm:latest",
                    "resources": {"limits": {GPU_RESOURCE: str(gpus)}},
                }
            ]
        },
    }


def condition(obj, kind: str):
    return next((c for c in (obj.status.conditions or []) if c.type == kind), None)


def test_gpu_pod_is_bound_by_the_scheduler_to_a_gpu_node_and_runs(cluster, namespace, api):
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(namespace, gpu_pod("four-gpus", 4))

    pod = wait_until(
        lambda: (p := core.read_namespaced_pod("four-gpus", namespace)).status.phase == "Running" and p,
        timeout=30,
        what="the 4-GPU pod to run",
    )

    assert pod.spec.node_name in cluster.gpu_nodes
    node = core.read_node(pod.spec.node_name)
    assert node.metadata.labels["amd.com/gpu.product-name"] == GPU_PRODUCT
    assert node.status.allocatable[GPU_RESOURCE] == "8"
    assert condition(pod, "PodScheduled").status == "True"
    assert pod.status.pod_ip, "kwok assigns a pod IP like a CNI would"
    # The binding came from kube-scheduler, which records a Scheduled event.
    scheduled = wait_until(
        lambda: [
            e
            for e in core.list_namespaced_event(
                namespace, field_selector="involvedObject.name=four-gpus"
            ).items
            if e.reason == "Scheduled"
        ],
        timeout=10,
        what="the Scheduled event",
    )
    assert scheduled[0].reporting_component == "default-scheduler"
    assert pod.spec.node_name in scheduled[0].message


def test_pod_asking_for_more_gpus_than_any_node_has_stays_unschedulable(namespace, api):
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(namespace, gpu_pod("sixteen-gpus", 16))

    scheduled = wait_until(
        lambda: condition(core.read_namespaced_pod("sixteen-gpus", namespace), "PodScheduled"),
        timeout=30,
        what="the scheduler's verdict",
    )

    assert scheduled.status == "False"
    assert scheduled.reason == "Unschedulable"
    assert f"Insufficient {GPU_RESOURCE}" in scheduled.message
    pod = core.read_namespaced_pod("sixteen-gpus", namespace)
    assert pod.status.phase == "Pending"
    assert pod.spec.node_name is None


def test_job_pod_completes_and_the_job_reports_complete(namespace, api):
    batch = client.BatchV1Api(api)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "one-shot"},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox", "command": ["true"]}],
                }
            },
        },
    }
    batch.create_namespaced_job(namespace, job)

    done = wait_until(
        lambda: (
            (j := batch.read_namespaced_job("one-shot", namespace)).status.conditions
            and condition(j, "Complete")
            and j
        ),
        timeout=30,
        what="the Job to complete",
    )

    assert condition(done, "Complete").status == "True"
    assert done.status.succeeded == 1
    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector="job-name=one-shot").items
    assert [p.status.phase for p in pods] == ["Succeeded"]
    assert pods[0].status.container_statuses[0].state.terminated.exit_code == 0


def test_deployment_rolls_out_ready_replicas(namespace, api):
    apps = client.AppsV1Api(api)
    labels = {"app": "web"}
    apps.create_namespaced_deployment(
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "web", "image": "nginx"}]},
                },
            },
        },
    )

    rolled_out = wait_until(
        lambda: (d := apps.read_namespaced_deployment("web", namespace)).status.ready_replicas == 2 and d,
        timeout=30,
        what="2 ready replicas",
    )

    assert condition(rolled_out, "Available").status == "True"
    assert len(apps.list_namespaced_replica_set(namespace).items) == 1


def test_child_is_garbage_collected_after_its_owner_is_deleted(namespace, api):
    core = client.CoreV1Api(api)
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    reference = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "child", "ownerReferences": [reference]}}
    )
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "bystander"}})

    core.delete_namespaced_config_map("owner", namespace)

    def child_gone() -> bool:
        try:
            core.read_namespaced_config_map("child", namespace)
        except ApiException as error:
            return error.status == 404
        return False

    wait_until(child_gone, timeout=30, what="the garbage collector to delete the child")
    assert core.read_namespaced_config_map("bystander", namespace).metadata.name == "bystander"


def test_service_account_bound_to_a_narrow_role_is_refused_what_the_role_lacks(cluster, namespace, api):
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "pod-reader"}})
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "pod-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "pod-reader", "namespace": namespace}],
        },
    )
    token = cluster.service_account_token(namespace, "pod-reader")

    with cluster.api_client(token=token) as as_reader:
        reader = client.CoreV1Api(as_reader)
        review = client.AuthenticationV1Api(as_reader).create_self_subject_review({})
        assert review.status.user_info.username == f"system:serviceaccount:{namespace}:pod-reader"
        assert reader.list_namespaced_pod(namespace).items == []

        with pytest.raises(ApiException) as secrets:
            reader.list_namespaced_secret(namespace)
        with pytest.raises(ApiException) as create:
            reader.create_namespaced_pod(namespace, gpu_pod("not-allowed", 1))
        with pytest.raises(ApiException) as other_namespace:
            reader.list_namespaced_pod("kube-system")

    for refused in (secrets, create, other_namespace):
        assert refused.value.status == 403
    assert 'cannot list resource "secrets"' in json.loads(secrets.value.body)["message"]


def crd(plural: str, schema: dict) -> dict:
    group = "testbed.eagle3.dev"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": plural[:-1], "kind": plural.capitalize()[:-1]},
            "versions": [
                {"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}
            ],
        },
    }


@pytest.fixture
def crd_plural(api):
    plural = f"widgets{uuid.uuid4().hex[:6]}s"
    yield plural
    extensions = client.ApiextensionsV1Api(api)
    try:
        extensions.delete_custom_resource_definition(f"{plural}.testbed.eagle3.dev")
    except ApiException as error:
        if error.status != 404:
            raise


def test_crd_with_a_non_structural_schema_is_rejected(api, crd_plural):
    # The root is typed, but nested properties are not: apiextensions.k8s.io/v1 demands a type everywhere.
    non_structural = {"type": "object", "properties": {"spec": {"properties": {"size": {"minimum": 1}}}}}

    with pytest.raises(ApiException) as refused:
        client.ApiextensionsV1Api(api).create_custom_resource_definition(crd(crd_plural, non_structural))

    assert refused.value.status == 422
    causes = json.loads(refused.value.body)["details"]["causes"]
    assert {(c["field"], c["reason"]) for c in causes} == {
        ("spec.validation.openAPIV3Schema.properties[spec].type", "FieldValueRequired"),
        ("spec.validation.openAPIV3Schema.properties[spec].properties[size].type", "FieldValueRequired"),
    }


def test_structural_crd_with_a_cel_rule_rejects_a_bad_object_with_the_rule_message(
    namespace, api, crd_plural
):
    message = "replicas must not exceed maxReplicas"
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {"replicas": {"type": "integer"}, "maxReplicas": {"type": "integer"}},
                "x-kubernetes-validations": [
                    {"rule": "self.replicas <= self.maxReplicas", "message": message}
                ],
            }
        },
    }
    extensions = client.ApiextensionsV1Api(api)
    extensions.create_custom_resource_definition(crd(crd_plural, schema))
    wait_until(
        lambda: any(
            c.type == "Established" and c.status == "True"
            for c in extensions.read_custom_resource_definition(
                f"{crd_plural}.testbed.eagle3.dev"
            ).status.conditions
            or []
        ),
        timeout=30,
        what="the CRD to be established",
    )
    custom = client.CustomObjectsApi(api)

    def widget(name: str, replicas: int) -> dict:
        return {
            "apiVersion": "testbed.eagle3.dev/v1",
            "kind": crd_plural.capitalize()[:-1],
            "metadata": {"name": name},
            "spec": {"replicas": replicas, "maxReplicas": 3},
        }

    # The new CRD is served a moment after Established; retry only "not found yet".
    def create_good() -> bool:
        try:
            custom.create_namespaced_custom_object(
                "testbed.eagle3.dev", "v1", namespace, crd_plural, widget("ok", 2)
            )
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    wait_until(create_good, timeout=30, what="the custom resource to be served")
    with pytest.raises(ApiException) as refused:
        custom.create_namespaced_custom_object(
            "testbed.eagle3.dev", "v1", namespace, crd_plural, widget("bad", 5)
        )

    assert refused.value.status == 422
    assert message in refused.value.body
    stored = custom.get_namespaced_custom_object("testbed.eagle3.dev", "v1", namespace, crd_plural, "ok")
    assert stored["spec"] == {"replicas": 2, "maxReplicas": 3}


def test_api_server_reports_the_pinned_kubernetes_release(cluster):
    go_mod = (REPO_ROOT / "hack" / "testbed" / "kube" / "go.mod").read_text()
    pinned = re.search(r"^require k8s\.io/kubernetes (v\S+)$", go_mod, re.MULTILINE).group(1)

    version = cluster.request("GET", "/version")

    assert version["gitVersion"] == pinned
    assert f"v{version['major']}.{version['minor']}." in pinned


def test_claim_of_the_fake_storage_class_is_provisioned_bound_and_reclaimed(namespace, api):
    core = client.CoreV1Api(api)
    claim = {
        "metadata": {"name": "workspace"},
        "spec": {
            "storageClassName": STORAGE_CLASS,
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "50Gi"}},
        },
    }
    core.create_namespaced_persistent_volume_claim(namespace, claim)

    bound = wait_until(
        lambda: (
            (c := core.read_namespaced_persistent_volume_claim("workspace", namespace)).status.phase
            == "Bound"
            and c
        ),
        timeout=30,
        what="the claim to be bound",
    )

    volume = core.read_persistent_volume(bound.spec.volume_name)
    assert volume.metadata.annotations["pv.kubernetes.io/provisioned-by"] == VOLUME_PROVISIONER
    assert volume.spec.claim_ref.uid == bound.metadata.uid
    assert volume.spec.capacity["storage"] == bound.status.capacity["storage"] == "50Gi"
    # The real PV controller did the binding (kwok only created the volume).
    assert bound.metadata.annotations["pv.kubernetes.io/bind-completed"] == "yes"

    core.delete_namespaced_persistent_volume_claim("workspace", namespace)

    def volume_gone() -> bool:
        try:
            core.read_persistent_volume(volume.metadata.name)
        except ApiException as error:
            return error.status == 404
        return False

    wait_until(volume_gone, timeout=30, what="the released volume to be deleted")


def test_every_fake_node_heartbeats_through_a_renewed_lease(cluster):
    # Without lease renewals the node-lifecycle controller marks the nodes unreachable after its
    # grace period and taints them NoExecute, which would evict pods in a long test session.
    def renew_times() -> dict[str, str]:
        leases = cluster.request("GET", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases")
        return {lease["metadata"]["name"]: lease["spec"].get("renewTime") for lease in leases["items"]}

    nodes = set(cluster.gpu_nodes + cluster.cpu_nodes)
    first = wait_until(
        lambda: (times := renew_times()).keys() >= nodes and times, timeout=30, what="node leases"
    )

    renewed = wait_until(
        lambda: all(renew_times()[node] != first[node] for node in nodes), timeout=30, what="lease renewals"
    )

    assert renewed
    for node in cluster.request("GET", "/api/v1/nodes")["items"]:
        if node["metadata"]["name"] in nodes:  # the real node carries its own taint (test_real_node.py)
            assert not node["spec"].get("taints"), node["metadata"]["name"]
