"""Write avoidance, without a cluster."""

from __future__ import annotations

from eagle3_operator.apply import contains, status_patch


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
