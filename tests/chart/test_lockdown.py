"""A locked-down install on the test bed: the chart's admission policies and RBAC, checked by the
real API server (its OwnerReferencesPermissionEnforcement plugin on, as on OpenShift).

One install (namespaced, with allow-lists) serves every test here: the API server refuses what the
allow-lists leave out with their message and stores what they allow; the operator, with the chart's
rights, creates children whose owner references block owner deletion; the runtime ServiceAccount
may change only the progress annotation of the pod its token is bound to.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.chart.installed import (
    RUNTIME_ACCOUNT,
    AsServiceAccount,
    Installation,
    installed,
    serving_manifest,
    training_manifest,
)
from tests.operator.harness import draft_training_path, get, spec_decode_path
from tests.support.cluster import ApiError, LocalCluster, wait_until

IMAGE_PREFIXES = ["vllm/vllm-openai-rocm:", "ghcr.io/eagle3-ai/"]
LOCKED = {
    "admissionPolicies": {
        "allowedImages": IMAGE_PREFIXES,
        "allowedServiceAccounts": [RUNTIME_ACCOUNT],
        "allowedServiceTypes": ["ClusterIP"],
    }
}
PROGRESS = "eagle3.ai/progress"


@pytest.fixture(scope="module")
def locked(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installation]:
    tmp_path = tmp_path_factory.mktemp("lockdown")
    with installed(
        cluster, tmp_path, mode="namespaced", release="e3lock", values=LOCKED, monitoring=False
    ) as inst:
        yield inst


def _refusal(cluster: LocalCluster, path: str, body: dict[str, Any]) -> str:
    """The API server's message refusing to create body (a policy binding takes effect within moments
    of its creation, so a first acceptance is undone and retried)."""

    def refused() -> str | None:
        try:
            cluster.request("POST", path, body)
        except ApiError as error:
            assert error.status in (403, 422), error
            return str(error)
        cluster.request("DELETE", f"{path}/{body['metadata']['name']}")
        return None

    return wait_until(refused, timeout=30, interval=0.5, what=f"the API server to refuse {body['metadata']}")


def test_allow_lists_refuse_other_images_accounts_and_service_types(locked):
    cluster, work = locked.as_operator.cluster, locked.work
    trainings = draft_training_path(work)
    bad_image = training_manifest("bad-image")
    bad_image["spec"]["runtime"]["image"] = "registry.example.com/miner:1"
    message = _refusal(cluster, trainings, bad_image)
    assert (
        "spec.runtime.image registry.example.com/miner:1 is not allowed here: images must start with one of "
        "vllm/vllm-openai-rocm:, ghcr.io/eagle3-ai/" in message
    ), message

    bad_target = training_manifest("bad-target")
    bad_target["spec"]["target"]["image"] = "vllm/vllm-openai:latest"  # CUDA image: not an allowed prefix
    assert "spec.target.image vllm/vllm-openai:latest is not allowed here" in _refusal(
        cluster, trainings, bad_target
    )

    no_account = training_manifest("no-account")
    del no_account["spec"]["runtime"]["serviceAccountName"]
    message = _refusal(cluster, trainings, no_account)
    assert (
        "spec.runtime.serviceAccountName (unset: default) is not allowed here: use one of eagle3-runtime"
        in message
    )

    other_account = training_manifest("other-account")
    other_account["spec"]["runtime"]["serviceAccountName"] = "builder"
    assert "spec.runtime.serviceAccountName builder is not allowed here" in _refusal(
        cluster, trainings, other_account
    )

    exposed = serving_manifest("exposed", "train")
    exposed["spec"]["service"] = {"type": "LoadBalancer"}
    message = _refusal(cluster, spec_decode_path(work), exposed)
    assert "spec.service.type LoadBalancer is not allowed here: use one of ClusterIP" in message

    # What the lists allow is stored, defaults included (the default images are allowed prefixes).
    cluster.request("POST", trainings, training_manifest("allowed"))
    cluster.request("POST", spec_decode_path(work), serving_manifest("allowed", "allowed"))
    assert get(cluster, draft_training_path(work, "allowed")) and get(
        cluster, spec_decode_path(work, "allowed")
    )
    for name in ("bad-image", "bad-target", "no-account", "other-account"):
        assert get(cluster, draft_training_path(work, name)) is None, f"{name} was stored"


def test_children_block_owner_deletion_under_owner_reference_enforcement(locked):
    """The chart grants `update` on the custom resources' finalizers, which the admission plugin asks
    of whoever sets blockOwnerDeletion; without it the same child is refused."""
    cluster, work = locked.as_operator.cluster, locked.work
    training = get(cluster, draft_training_path(work, "owner")) or cluster.request(
        "POST", draft_training_path(work), training_manifest("owner")
    )
    serving = cluster.request("POST", spec_decode_path(work), serving_manifest("owned", "owner"))

    def owned(path: str, owner: dict[str, Any]) -> dict[str, Any] | None:
        child = get(cluster, path)
        if not child:
            return None
        (ref,) = child["metadata"]["ownerReferences"]
        assert ref["uid"] == owner["metadata"]["uid"] and ref["blockOwnerDeletion"] is True, ref
        return child

    apps = f"/apis/apps/v1/namespaces/{work}/deployments"
    wait_until(
        lambda: owned(f"{apps}/owner-target", training), timeout=60, what="the operator's target Deployment"
    )
    wait_until(lambda: owned(f"{apps}/owned", serving), timeout=60, what="the operator's serving Deployment")
    # The target's pod runs (kwok), so the operator goes on to the first stage Job, owned alike.
    jobs = f"/apis/batch/v1/namespaces/{work}/jobs"
    wait_until(lambda: owned(f"{jobs}/owner-generate", training), timeout=90, what="the generate Job")

    # The plugin is on: an account that may create ConfigMaps but not update the finalizers of
    # DraftTrainings may not make one the blocking owner of its ConfigMap.
    cluster.apply(
        [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "plain", "namespace": work}},
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "plain", "namespace": work},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "plain", "namespace": work},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "plain"},
                "subjects": [{"kind": "ServiceAccount", "name": "plain", "namespace": work}],
            },
        ]
    )
    plain = AsServiceAccount(cluster, work, "plain", locked.as_operator.workdir)
    reference = {
        "apiVersion": "eagle3.ai/v1alpha1",
        "kind": "DraftTraining",
        "name": "owner",
        "uid": training["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "child", "namespace": work, "ownerReferences": [reference]},
    }
    result = plain.kubectl("create", "-f", "-", input=json.dumps(configmap))
    assert result.returncode != 0 and "cannot set blockOwnerDeletion" in result.stderr, result.stderr
    configmap["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] = False
    result = plain.kubectl("create", "-f", "-", input=json.dumps(configmap))
    assert result.returncode == 0, result.stderr


def _runtime_pod(cluster: LocalCluster, namespace: str, name: str) -> None:
    cluster.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "metadata": {"name": name, "labels": {"app": "runtime-probe"}},
            "spec": {
                "serviceAccountName": RUNTIME_ACCOUNT,
                "containers": [{"name": "stage", "image": "ghcr.io/eagle3-ai/eagle3-runtime:0.1.0"}],
            },
        },
    )


def test_runtime_account_changes_only_the_progress_annotation_of_its_own_pod(locked):
    cluster, work = locked.as_runtime.cluster, locked.work
    for pod in ("stage-a", "stage-b"):
        _runtime_pod(cluster, work, pod)
    in_a = locked.as_runtime.in_pod("stage-a")

    def annotate(who: AsServiceAccount, pod: str, *change: str):
        return who.kubectl("annotate", "--overwrite", "-n", work, f"pod/{pod}", *change)

    record = '{"stage":"train","step":3}'
    ok = wait_until(
        lambda: annotate(in_a, "stage-a", f"{PROGRESS}={record}").returncode == 0,
        timeout=30,
        interval=0.5,
        what="the runtime account to annotate its own pod",
    )
    assert ok
    pods = f"/api/v1/namespaces/{work}/pods"
    assert cluster.request("GET", f"{pods}/stage-a")["metadata"]["annotations"][PROGRESS] == record

    def refused(result, words: str) -> None:
        assert result.returncode != 0, f"allowed: {result.stdout}"
        assert words in result.stderr, result.stderr

    refused(
        annotate(in_a, "stage-a", "other=1"), "may change only the eagle3.ai/progress annotation of its pod"
    )
    refused(
        in_a.kubectl("label", "--overwrite", "-n", work, "pod/stage-a", "app=other"),
        "may change only the eagle3.ai/progress annotation of its pod",
    )
    refused(
        annotate(in_a, "stage-b", f"{PROGRESS}={record}"), "its token is bound to pod stage-a, not stage-b"
    )
    # A token bound to no pod (a legacy or hand-made one) changes no pod at all.
    refused(annotate(locked.as_runtime, "stage-a", f"{PROGRESS}={record}"), "its token is bound to no pod")
    # Other users are not concerned: the admin still may.
    cluster.kubectl("annotate", "-n", work, "pod/stage-b", "note=admin")
    assert cluster.request("GET", f"{pods}/stage-b")["metadata"]["annotations"]["note"] == "admin"
