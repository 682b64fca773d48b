"""Write avoidance and write retries, without a cluster."""

from __future__ import annotations

from eagle3_operator import apply
from eagle3_operator.apply import contains, must_replace, status_patch
from eagle3_operator.kube import ApiError
from eagle3_operator.reconcile.plan import Plan


def test_contains_ignores_server_defaults_but_sees_our_changes():
    desired = {
        "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "vllm", "args": ["a", "b"]}]}}}
    }
    live = {
        "metadata": {"resourceVersion": "7"},
        "spec": {
            "replicas": 1,
            "progressDeadlineSeconds": 600,
            "template": {
                "spec": {"containers": [{"name": "vllm", "args": ["a", "b"], "imagePullPolicy": "Always"}]}
            },
        },
    }
    assert contains(live, desired)
    live["spec"]["template"]["spec"]["containers"][0]["args"] = ["a", "b", "--speculative-config", "{}"]
    assert not contains(live, desired), "a list that differs in length is a change"
    assert not contains({"spec": {"replicas": 2}}, {"spec": {"replicas": 1}})


def test_status_patch_holds_only_changed_top_level_keys_and_nulls_removed_ones():
    old = {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}], "progress": {"step": 1}}
    new = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    assert status_patch(old, new) == {"conditions": [{"type": "Ready", "status": "True"}], "progress": None}
    assert status_patch(new, dict(new)) == {}


def test_status_patch_nulls_nested_keys_a_new_object_lacks():
    # A merge patch merges objects: a draft record without draftTraining must say so with null.
    old = {
        "resolvedDraft": {
            "uri": "pvc://w/export",
            "source": "DraftTraining/x",
            "draftTraining": {"name": "x"},
        }
    }
    new = {"resolvedDraft": {"uri": "org/draft", "source": "spec.draft.model"}}
    assert status_patch(old, new) == {
        "resolvedDraft": {"uri": "org/draft", "source": "spec.draft.model", "draftTraining": None}
    }
    moved = {"resolvedDraft": old["resolvedDraft"] | {"draftTraining": {"name": "x", "generation": 2}}}
    assert status_patch(old, moved) == {"resolvedDraft": {"draftTraining": {"generation": 2}}}


def test_a_write_waits_while_the_api_server_has_not_discovered_the_owner_kind():
    """Seen on the test bed (tests/chart/test_install.py): right after the chart installed the CRDs,
    OwnerReferencesPermissionEnforcement refused children with blockOwnerDeletion for seconds. Such a
    write is deferred (tried again soon), not reported as a refusal; any other refusal is."""
    undiscovered = ApiError(
        403,
        "forbidden",
        'deployments.apps "serve" is forbidden: cannot set blockOwnerDeletion '
        "in this case because cannot find RESTMapping for APIVersion eagle3.ai/v1alpha1 Kind "
        'SpecDecodeDeployment: no matches for kind "SpecDecodeDeployment"',
    )
    quota = ApiError(403, "forbidden", 'services "serve" is forbidden: exceeded quota')

    class Refusing:
        def create(self, obj):
            raise undiscovered if obj["kind"] == "Deployment" else quota

    owner = {"metadata": {"name": "serve", "namespace": "ns"}}
    children = [{"kind": kind, "metadata": {"name": "serve"}} for kind in ("Deployment", "Service")]
    refused, written, deferred = apply.apply_children(Refusing(), owner, Plan(create=children), {})
    assert deferred == 1 and written == []
    assert [(r.kind, r.message) for r in refused] == [("Service", quota.detail)]


def test_only_a_change_of_an_immutable_field_replaces_a_child():
    headless = {"kind": "Service", "spec": {"clusterIP": "None", "ports": [{"port": 8000}]}}
    assert must_replace({"kind": "Service", "spec": {"clusterIP": "10.0.0.7"}}, headless)
    assert not must_replace({"kind": "Service", "spec": {"clusterIP": "None"}}, headless)
    # A Service that leaves the address to the API server keeps the one it has.
    assert not must_replace(
        {"kind": "Service", "spec": {"clusterIP": "10.0.0.7"}}, {"kind": "Service", "spec": {}}
    )
    assert not must_replace(
        {"kind": "Deployment", "spec": {"clusterIP": "x"}}, {"kind": "Deployment", "spec": {}}
    )
