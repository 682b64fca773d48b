"""Status writes with optimistic concurrency, against the real API server: a reconcile planned from
a stale copy (a lagging cache, another replica's write) writes no status and posts no Event; it
reads the object again and plans once more."""

from __future__ import annotations

from collections import Counter

from eagle3_operator.kube import Kube
from eagle3_operator.reconciler import Reconciler
from prometheus_client import REGISTRY

from eagle3_api import API_VERSION
from tests.operator.harness import draft_training_path, events_of, training_body


def _conflicts() -> float:
    return (
        REGISTRY.get_sample_value("eagle3_operator_status_conflicts_total", {"kind": "DraftTraining"}) or 0.0
    )


def test_a_reconcile_planned_from_a_stale_copy_re_reads_and_re_plans(crds, namespace):
    cluster, ns = crds, namespace
    cluster.request("POST", draft_training_path(ns), training_body(ns))
    reconciler = Reconciler(Kube(cluster.api_client()))  # no watch: its cache holds what we put there
    stale = reconciler.kube.get(API_VERSION, "DraftTraining", ns, "llama")
    reconciler.store.upsert("DraftTraining", API_VERSION, stale)
    # The spec is edited after the cache's copy was taken.
    cluster.request("PATCH", draft_training_path(ns, "llama"), {"spec": {"training": {"steps": 200}}})

    before = _conflicts()
    next_pass = reconciler._process(("DraftTraining", ns, "llama"))

    assert _conflicts() == before + 1, "the status write over the stale copy must be refused once"
    assert next_pass is not None and next_pass > 0
    body = cluster.request("GET", draft_training_path(ns, "llama"))
    assert body["metadata"]["generation"] == 2
    conditions = body["status"]["conditions"]
    assert conditions and {c["observedGeneration"] for c in conditions} == {2}, conditions
    # The refused plan posted nothing: each Event is the re-planned reconcile's, once.
    reasons = Counter(e["reason"] for e in events_of(cluster, ns, "llama"))
    assert all(count == 1 for count in reasons.values()), reasons
    # The cache now holds what was written.
    cached = reconciler.store.get("DraftTraining", ns, "llama")
    assert cached["metadata"]["resourceVersion"] == body["metadata"]["resourceVersion"]
