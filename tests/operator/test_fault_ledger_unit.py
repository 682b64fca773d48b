"""The fault counters count: each kind of damage, shown to a ChildLedger as the API server would list
it, raises its count (the cluster tests and the chaos benchmark only ever expect zeros)."""

from __future__ import annotations

import copy
from typing import Any

from tests.operator.fault_ledger import ChildLedger

NS = "ml"
RESOURCES = (
    "jobs",
    "deployments",
    "services",
    "persistentvolumeclaims",
    "pods",
    "replicasets",
    "drafttrainings",
    "specdecodedeployments",
)


class Listings:
    """What each list call returns, by resource: the API server as one look of the ledger sees it."""

    def __init__(self) -> None:
        self.items: dict[str, list[dict[str, Any]]] = {r: [] for r in RESOURCES}

    def request(self, method: str, path: str) -> dict[str, Any]:
        resource = path.split("?")[0].rsplit("/", 1)[-1]
        return {"items": copy.deepcopy(self.items[resource])}


def _child(name: str, uid: str, owner_label: str, owner: str, **labels: str) -> dict[str, Any]:
    all_labels = {"app.kubernetes.io/managed-by": "eagle3-operator", owner_label: owner, **labels}
    return {
        "metadata": {
            "name": name,
            "uid": uid,
            "labels": all_labels,
            "creationTimestamp": "2026-12-02T01:00:00Z",
        }
    }


def _job(name: str, uid: str, stage: str, created: str = "2026-12-02T01:00:00Z") -> dict[str, Any]:
    job = _child(name, uid, "eagle3.ai/draft-training", "llama", **{"eagle3.ai/stage": stage})
    job["metadata"]["creationTimestamp"] = created
    return job


def _training(*records: dict[str, Any], **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "llama"}, "status": {"phase": "Running", "stages": list(records), **status}}


def _succeeded(stage: str, at: str = "2026-12-02T01:05:00Z", **extra: Any) -> dict[str, Any]:
    return {"name": stage, "state": "Succeeded", "attempt": 0, "completionTime": at, "metrics": {}, **extra}


def _ledger(api: Listings) -> ChildLedger:
    ledger = ChildLedger(api, [NS])  # type: ignore[arg-type]  # only .request is used
    assert ledger.observe()
    return ledger


def _counts(ledger: ChildLedger) -> dict[str, int]:
    counts = ledger.training_counts(NS, "llama")
    return {k: counts[k] for k in ("duplicated_children", "stages_run_twice", "lost_results")}


ZERO = {"duplicated_children": 0, "stages_run_twice": 0, "lost_results": 0}


def test_a_clean_history_counts_nothing() -> None:
    api = Listings()
    api.items["jobs"] = [_job("llama-generate", "j1", "generate")]
    api.items["drafttrainings"] = [_training(_succeeded("generate"))]
    ledger = _ledger(api)
    assert ledger.observe()
    assert _counts(ledger) == ZERO


def test_a_job_created_again_is_a_duplicate_and_a_second_run() -> None:
    api = Listings()
    api.items["jobs"] = [_job("llama-generate", "j1", "generate")]
    api.items["drafttrainings"] = [_training(_succeeded("generate"))]
    ledger = _ledger(api)
    api.items["jobs"] = [_job("llama-generate", "j2", "generate", created="2026-12-02T01:06:00Z")]
    assert ledger.observe()
    assert _counts(ledger) == {"duplicated_children": 1, "stages_run_twice": 1, "lost_results": 0}


def test_a_second_attempt_or_a_second_succeeded_pod_is_a_second_run() -> None:
    api = Listings()
    api.items["jobs"] = [_job("llama-generate", "j1", "generate"), _job("llama-train", "j3", "train")]
    pod_labels = {"batch.kubernetes.io/job-name": "llama-generate", "eagle3.ai/draft-training": "llama"}
    api.items["pods"] = [
        {
            "metadata": {"name": f"p{i}", "uid": f"p{i}", "labels": pod_labels},
            "status": {"phase": "Succeeded"},
        }
        for i in range(2)
    ]
    api.items["drafttrainings"] = [_training(_succeeded("generate"), _succeeded("train", attempt=1))]
    assert _counts(_ledger(api)) == {"duplicated_children": 0, "stages_run_twice": 2, "lost_results": 0}


def test_a_changed_or_vanished_result_is_lost() -> None:
    api = Listings()
    api.items["drafttrainings"] = [
        _training(_succeeded("generate"), _succeeded("extract"), export={"uri": "pvc://drafts/v1"})
    ]
    ledger = _ledger(api)
    api.items["drafttrainings"] = [
        _training(_succeeded("generate", at="2026-12-02T01:09:00Z"), export={"uri": "pvc://drafts/v1"})
    ]
    assert ledger.observe()
    assert _counts(ledger) == {"duplicated_children": 0, "stages_run_twice": 0, "lost_results": 2}


def test_serving_counts_extra_revisions_and_a_changed_draft() -> None:
    api = Listings()
    label = "eagle3.ai/spec-decode-deployment"
    api.items["deployments"] = [_child("chat", "d1", label, "chat")]
    owner = [{"kind": "Deployment", "name": "chat"}]
    api.items["replicasets"] = [{"metadata": {"name": "chat-a", "uid": "r1", "ownerReferences": owner}}]
    api.items["specdecodedeployments"] = [
        {"metadata": {"name": "chat"}, "status": {"resolvedDraft": {"model": "a"}}}
    ]
    ledger = _ledger(api)
    assert ledger.serving_counts(NS, "chat") == {
        "duplicated_children": 0,
        "extra_revisions": 0,
        "lost_results": 0,
    }
    api.items["replicasets"].append({"metadata": {"name": "chat-b", "uid": "r2", "ownerReferences": owner}})
    api.items["specdecodedeployments"][0]["status"]["resolvedDraft"] = {"model": "b"}
    api.items["deployments"] = [_child("chat", "d2", label, "chat")]
    assert ledger.observe()
    assert ledger.serving_counts(NS, "chat") == {
        "duplicated_children": 1,
        "extra_revisions": 1,
        "lost_results": 1,
    }
