"""A disrupted trainer rank on the real control plane (kwok nodes): a rank evicted through the real
Eviction subresource, as a node drain does, restarts the trainer group without spending
training.groupRestarts; a crashed rank still spends it."""

from __future__ import annotations

from typing import Any

from tests.operator.harness import (
    admit_like_kueue,
    draft_training_path,
    events_of,
    jobs_of,
    stage_record,
    start_two_rank_training,
    trainer_ranks,
)
from tests.support.cluster import LocalCluster, wait_until


def _train_record_once(cluster: LocalCluster, ns: str, jobs: list[str]) -> dict[str, Any]:
    def restarted() -> dict[str, Any] | None:
        record = stage_record(cluster.request("GET", draft_training_path(ns, "llama")), "train")
        return record if record.get("jobs") == jobs else None

    return wait_until(restarted, timeout=60, what=f"the trainer group restarted as {jobs}")


def test_an_evicted_rank_restarts_the_group_unspent_and_a_crashed_rank_spends_group_restarts(
    crds, manual_namespace, start_operator
):
    cluster, ns = crds, manual_namespace
    start_operator(ns)
    evicted = start_two_rank_training(cluster, ns)["1"]["metadata"]["name"]

    # A node drain: the API server gives the pod DisruptionTarget and deletes it gracefully.
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": evicted, "namespace": ns}}
    cluster.request("POST", f"/api/v1/namespaces/{ns}/pods/{evicted}/eviction", eviction)
    # kwok plays no kubelet for a deleted pod; a real one ends it once its container stopped on SIGTERM.
    cluster.fail_pod(ns, evicted, message="", exit_code=143)
    wait_until(
        lambda: "llama-train-r1" in jobs_of(cluster, ns, "llama"), timeout=60, what="the group's new Job"
    )
    record = _train_record_once(cluster, ns, ["llama-train-r1"])
    assert (record.get("disruptionRestarts"), record.get("groupRestarts", 0)) == (1, 0), record
    (event,) = [e for e in events_of(cluster, ns, "llama") if e["reason"] == "RankDisrupted"]
    # The real Job controller's FailJob rule failed the Job; its Failed condition says why.
    assert f"{evicted} has condition DisruptionTarget matching FailJob" in event["message"], event["message"]
    assert "(groupRestarts unspent)" in event["message"]

    # A crash of the new group's rank 1 spends groupRestarts as before.
    admit_like_kueue(cluster, ns, "llama-train-r1")
    crashed = trainer_ranks(cluster, ns, "llama-train-r1")["1"]["metadata"]["name"]
    cluster.fail_pod(ns, crashed, message="Traceback: ValueError: bad batch")
    record = _train_record_once(cluster, ns, ["llama-train-r2"])
    assert (record.get("disruptionRestarts"), record.get("groupRestarts")) == (1, 1), record
    restarted = [e for e in events_of(cluster, ns, "llama") if e["reason"] == "TrainerGroupRestarted"]
    assert len(restarted) == 1 and "ValueError: bad batch" in restarted[0]["message"]
