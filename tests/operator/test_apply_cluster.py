"""How the operator writes a child, on the real API server: created by POST, then updated by
server-side apply that owns, changes and removes what the create set (eagle3_operator.kube)."""

from __future__ import annotations

import copy

from eagle3_operator.apply import apply_children, key
from eagle3_operator.kube import FIELD_MANAGER, Kube
from eagle3_operator.reconcile.plan import Plan

from tests.support.cluster import LocalCluster


def _deployment(namespace: str, env: dict[str, str], replicas: int) -> dict:
    labels = {"app": "apply-test"}
    container = {
        "name": "vllm",
        "image": "registry.invalid/vllm:1",
        "env": [{"name": k, "value": v} for k, v in env.items()],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "apply-test", "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
        },
    }


def _managers(obj: dict) -> list[tuple[str, str]]:
    return sorted((e["manager"], e["operation"]) for e in obj["metadata"]["managedFields"])


def test_a_created_child_is_then_updated_by_apply_that_removes_what_it_drops(
    cluster: LocalCluster, manual_namespace: str
):
    kube = Kube(cluster.api_client())
    owner = {"metadata": {"name": "apply-test", "namespace": manual_namespace}}
    first = _deployment(manual_namespace, {"KEEP": "1", "DROP": "1"}, replicas=0)
    _, (created,), _ = apply_children(kube, owner, Plan(sync=[first]), live={})
    assert kube.requests["create"] == 1 and kube.requests["apply"] == 0, "a new child is POSTed"
    assert _managers(created) == [(FIELD_MANAGER, "Update")]

    # Another client's field on the same object: the operator's writes must leave it alone.
    cluster.request(
        "PATCH",
        f"/apis/apps/v1/namespaces/{manual_namespace}/deployments/apply-test?fieldManager=someone-else",
        {"metadata": {"annotations": {"team": "serving"}}},
    )
    live = cluster.request("GET", f"/apis/apps/v1/namespaces/{manual_namespace}/deployments/apply-test")

    second = _deployment(manual_namespace, {"KEEP": "2"}, replicas=1)
    _, (updated,), _ = apply_children(
        kube, owner, Plan(sync=[copy.deepcopy(second)]), live={key(second): live}
    )
    assert kube.requests["apply"] == 1
    container = updated["spec"]["template"]["spec"]["containers"][0]
    assert container["env"] == [{"name": "KEEP", "value": "2"}], "the dropped variable is removed"
    assert updated["spec"]["replicas"] == 1
    assert updated["metadata"]["annotations"]["team"] == "serving"
    assert [m for m in _managers(updated) if m[0] in (FIELD_MANAGER, "someone-else")] == [
        (FIELD_MANAGER, "Apply"),
        ("someone-else", "Update"),
    ]

    # Once the fields are the apply's, an update is one apply and nothing else.
    patches = kube.requests["patch"]
    third = _deployment(manual_namespace, {}, replicas=2)
    _, (again,), _ = apply_children(kube, owner, Plan(sync=[third]), live={key(third): updated})
    assert kube.requests["patch"] == patches and kube.requests["apply"] == 2
    assert "env" not in again["spec"]["template"]["spec"]["containers"][0]
