"""Two operator replicas with Lease leader election on the test bed: the standby reconciles nothing,
and takes over when the leader is killed in the middle of a pipeline, with no duplicated child and
no stage run twice."""

from __future__ import annotations

from collections import Counter

from tests.operator.harness import (
    SHORT_LEASE,
    STAGE_JOBS,
    complete_stage,
    draft_training_path,
    events_of,
    items,
    jobs_of,
    prepare_training_volumes,
    stage_record,
    training_body,
    wait_for_stage_pods,
    wait_stage_succeeded,
)
from tests.support.cluster import wait_until

WRITES = ("create", "patch", "apply", "delete")


def _writes(operator) -> float:
    return sum(operator.metric("eagle3_operator_api_requests_total", verb=v) for v in WRITES)


def _lease(cluster, ns) -> dict:
    return cluster.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/eagle3-operator")


def test_standby_takes_over_when_the_leader_is_killed_mid_pipeline(crds, manual_namespace, start_operator):
    cluster, ns = crds, manual_namespace
    prepare_training_volumes(cluster, ns)
    args = ("--leader-elect", "--leader-elect-resource-namespace", ns, *SHORT_LEASE)
    leader = start_operator(ns, args=args)
    wait_until(
        lambda: leader.metric("eagle3_operator_leader") == 1, timeout=30, what="the first replica to lead"
    )
    standby = start_operator(ns, args=args)
    cluster.request("POST", draft_training_path(ns), training_body(ns))

    # The leader walks the first two stages; the standby watches (its cache and queue fill) but
    # neither reconciles nor writes.
    stages = dict(STAGE_JOBS)
    for stage in ("generate", "extract"):
        complete_stage(cluster, ns, stage, [f"llama-{s}" for s in stages[stage]])
        wait_stage_succeeded(cluster, ns, "llama", stage)
    wait_for_stage_pods(cluster, ns, ["llama-train"])
    assert standby.metric("eagle3_operator_leader") == 0
    assert standby.metric("eagle3_operator_reconcile_total") == 0, "the standby reconciled"
    assert _writes(standby) == 0, "the standby wrote"
    assert standby.metric("eagle3_operator_workqueue_depth") >= 1, "the standby queues what it sees"
    holder = _lease(cluster, ns)["spec"]["holderIdentity"]
    jobs_before = {n: j["metadata"]["uid"] for n, j in jobs_of(cluster, ns, "llama").items()}

    leader.kill()  # mid-pipeline: the train stage's pod is running
    wait_until(
        lambda: standby.metric("eagle3_operator_leader") == 1, timeout=30, what="the standby to take over"
    )
    lease = _lease(cluster, ns)["spec"]
    assert lease["holderIdentity"] != holder and lease["leaseTransitions"] >= 1, lease

    # The new leader carries on from the status the old one wrote: no stage starts again.
    wait_until(
        lambda: (
            standby.metric("eagle3_operator_reconcile_total", kind="DraftTraining", result="success") >= 1
        ),
        timeout=30,
        what="the new leader's first reconcile",
    )
    assert {n: j["metadata"]["uid"] for n, j in jobs_of(cluster, ns, "llama").items()} == jobs_before
    for stage, suffixes in STAGE_JOBS[2:]:
        complete_stage(cluster, ns, stage, [f"llama-{s}" for s in suffixes])
        body = wait_stage_succeeded(cluster, ns, "llama", stage)
    assert body["status"]["phase"] == "Succeeded", body["status"]

    # Every Job once, the ones from before the takeover unchanged, one pod each (no stage re-ran).
    jobs = jobs_of(cluster, ns, "llama")
    expected = sorted(f"llama-{s}" for _, suffixes in STAGE_JOBS for s in suffixes)
    assert sorted(jobs) == expected
    assert all(jobs[n]["metadata"]["uid"] == uid for n, uid in jobs_before.items())
    pods = items(cluster, f"/api/v1/namespaces/{ns}/pods", "eagle3.ai/draft-training=llama,eagle3.ai/stage")
    per_job = Counter(p["metadata"]["labels"]["batch.kubernetes.io/job-name"] for p in pods)
    assert per_job == Counter(expected), per_job
    assert all(stage_record(body, stage)["attempt"] == 0 for stage, _ in STAGE_JOBS)
    for kind, path in (("Deployment", "/apis/apps/v1"), ("Service", "/api/v1")):
        children = items(cluster, f"{path}/namespaces/{ns}/{kind.lower()}s", "eagle3.ai/draft-training=llama")
        assert [c["metadata"]["name"] for c in children] == ["llama-target"], (kind, children)
    reasons = Counter(e["reason"] for e in events_of(cluster, ns, "llama"))
    assert reasons["StageStarted"] == 6 and reasons["StageSucceeded"] == 6, reasons
