"""DraftTraining on the test bed: the operator (a real process) against a real API server, kwok pods.

The tests play the stage pods' part: they end each pod with the StageResult a real stage would
write to its termination message (no container runtime here; see tests/support/cluster.py).
"""

from __future__ import annotations

import json
import time

from eagle3_api.workspace import export_version
from tests.operator import fakes
from tests.operator.harness import (
    STAGE_JOBS,
    WATCHED_RESOURCES,
    all_events,
    apiserver_writes,
    bind_volume,
    complete_stage,
    condition,
    draft_training_path,
    drive_to_success,
    event_writes_between,
    events_of,
    get,
    items,
    jobs_of,
    prepare_training_volumes,
    stage_record,
    training_body,
    wait_for_phase,
    wait_for_quiet_cluster,
    wait_for_stage_pods,
    wait_stage_succeeded,
)
from tests.support.cluster import wait_until

RECONCILES = "eagle3_operator_reconcile_total"
# The kinds a DraftTraining's reconcile writes. The API server counts writes cluster-wide, and an
# earlier test's operator winding down may still patch its own SpecDecodeDeployments (CI, 2026-12-01:
# one `PATCH specdecodedeployments/status` in the window, none by this operator).
TRAINING_RESOURCES = WATCHED_RESOURCES - {"specdecodedeployments", "servicemonitors", "podmonitors"}


def _reconciled_once(operator) -> None:
    wait_until(
        lambda: operator.metric(RECONCILES, kind="DraftTraining", result="success") >= 1,
        timeout=30,
        what="the restarted operator to reconcile the DraftTraining",
    )


def test_pipeline_walks_every_stage_with_an_operator_restart_in_each(crds, manual_namespace, start_operator):
    cluster, ns = crds, manual_namespace
    prepare_training_volumes(cluster, ns)
    operator = start_operator(ns)
    cluster.request("POST", draft_training_path(ns), training_body(ns))

    target = wait_until(
        lambda: get(cluster, f"/apis/apps/v1/namespaces/{ns}/deployments/llama-target"),
        timeout=30,
        what="target",
    )
    assert target["spec"]["replicas"] == 1
    seen_jobs: dict[str, str] = {}
    for stage, suffixes in STAGE_JOBS:
        names = [f"llama-{s}" for s in suffixes]
        wait_for_stage_pods(cluster, ns, names)
        before = {n: j["metadata"]["uid"] for n, j in jobs_of(cluster, ns, "llama").items()}
        assert set(before) == set(seen_jobs) | set(names), (
            f"unexpected Jobs at stage {stage}: {sorted(before)}"
        )

        operator.restart()
        _reconciled_once(operator)
        after = {n: j["metadata"]["uid"] for n, j in jobs_of(cluster, ns, "llama").items()}
        assert after == before, f"restart at {stage} changed the Jobs: {before} -> {after}"
        body = cluster.request("GET", draft_training_path(ns, "llama"))
        for done, _ in STAGE_JOBS[: STAGE_JOBS.index((stage, suffixes))]:
            assert stage_record(body, done)["state"] == "Succeeded", f"{done} lost its result after restart"
        assert stage_record(body, stage)["state"] == "Running"

        if stage == "train":
            _report_progress(cluster, ns, operator)
        complete_stage(cluster, ns, stage, names)
        wait_stage_succeeded(cluster, ns, "llama", stage)
        seen_jobs |= dict.fromkeys(names, "")

    body = wait_for_phase(cluster, ns, "llama", "Succeeded")
    status = body["status"]
    best = status["bestCheckpoint"]
    assert (best["step"], best["acceptanceLength"]) == (100, 2.4)
    # The status schema keeps the per-context-length records (the API server prunes unknown fields).
    assert best["acceptanceByContextLength"] == [
        {"contextLength": 1024, "acceptanceLength": 2.4, "drafts": 300},
        {"contextLength": 2048, "acceptanceLength": 2.35, "drafts": 280},
        {"contextLength": 4096},
    ]
    assert [c["step"] for c in status["checkpoints"]] == [50, 100]
    assert status["checkpoints"][0]["acceptancePerPosition"] == [0.6, 0.4]
    uid = body["metadata"]["uid"]
    assert status["workspacePath"] == f"runs/{uid}"
    assert status["export"]["uri"] == f"pvc://llama-workspace/runs/{uid}/export/" + export_version(
        fakes.EXPORT_DIGEST
    )
    assert condition(body, "Ready")["status"] == "True"
    assert all(
        condition(body, c)["status"] == "True"
        for c in ("Generated", "HiddenStatesExtracted", "Trained", "Evaluated", "Selected", "Exported")
    )
    assert status["startTime"] and status["completionTime"]
    train = stage_record(body, "train")
    assert train["metrics"]["loss"] == 1.25 and [int(s) for s in train["metrics"]["checkpoints"]] == [50, 100]

    # Every Job exists once, none was re-run, and the target is scaled down.
    assert sorted(jobs_of(cluster, ns, "llama")) == sorted(seen_jobs)
    deployments = items(
        cluster, f"/apis/apps/v1/namespaces/{ns}/deployments", "eagle3.ai/draft-training=llama"
    )
    assert [d["spec"]["replicas"] for d in deployments] == [0]
    claims = items(
        cluster, f"/api/v1/namespaces/{ns}/persistentvolumeclaims", "eagle3.ai/draft-training=llama"
    )
    assert [c["metadata"]["name"] for c in claims] == ["llama-workspace"]

    reasons = wait_until(
        lambda: "TrainingSucceeded" in (r := [e["reason"] for e in events_of(cluster, ns, "llama")]) and r,
        timeout=10,
        what="the TrainingSucceeded Event",
    )
    assert reasons.count("StageStarted") == 6 and reasons.count("StageSucceeded") == 6, reasons
    assert reasons.count("TrainingSucceeded") == 1 and "TargetScaledDown" in reasons

    assert operator.metric("eagle3_draft_training_best_acceptance_length", namespace=ns, name="llama") == 2.4
    by_context = {
        n: operator.metric(
            "eagle3_draft_training_best_acceptance_length_by_context_length",
            namespace=ns,
            name="llama",
            context_length=n,
        )
        for n in ("1024", "2048", "4096")
    }
    assert by_context == {"1024": 2.4, "2048": 2.35, "4096": 0}, by_context  # 4096 was unfilled: no series
    assert (
        operator.metric("eagle3_operator_resources", kind="DraftTraining", namespace=ns, phase="Succeeded")
        == 1
    )
    # The phase series moved on: the stall alert joins on phase="Running" and stays quiet now.
    phase = {
        p: operator.metric("eagle3_draft_training_phase", namespace=ns, name="llama", phase=p)
        for p in ("Running", "Succeeded")
    }
    assert phase == {"Running": 0, "Succeeded": 1}, phase


def _report_progress(cluster, ns, operator) -> None:
    """A running stage annotates its pod (docs/contracts.md); the operator copies it into status.progress."""
    pod = wait_for_stage_pods(cluster, ns, ["llama-train"])["llama-train"][0]
    record = {
        "stage": "train",
        "step": 40,
        "totalSteps": 100,
        "loss": 2.5,
        "accuracyPerPosition": [0.5, 0.3],
        "etaSeconds": 60,
        "updatedAt": "2026-11-29T09:00:00Z",
    }
    patch = {"metadata": {"annotations": {"eagle3.ai/progress": json.dumps(record)}}}
    cluster.request("PATCH", f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}", patch)
    body = wait_until(
        lambda: (
            (b := cluster.request("GET", draft_training_path(ns, "llama")))["status"]
            .get("progress", {})
            .get("step")
            == 40
            and b
        ),
        timeout=30,
        what="status.progress from the pod annotation",
    )
    assert body["status"]["progress"]["accuracyPerPosition"] == [0.5, 0.3]
    assert operator.metric("eagle3_draft_training_step", namespace=ns, name="llama") == 40
    assert operator.metric("eagle3_draft_training_loss", namespace=ns, name="llama") == 2.5
    assert operator.metric("eagle3_draft_training_phase", namespace=ns, name="llama", phase="Running") == 1


def test_unchanged_objects_get_zero_writes_on_re_reconcile(crds, manual_namespace, start_operator):
    """Measured on the API server: its own request counter for every resource the operator touches."""
    cluster, ns = crds, manual_namespace
    prepare_training_volumes(cluster, ns)
    operator = start_operator(ns)
    cluster.request("POST", draft_training_path(ns), training_body(ns))
    drive_to_success(cluster, ns, "llama")
    # A second object mid-pipeline (its generate Job running) must stay quiet as well.
    bind_volume(cluster, ns, "busy-workspace", create_claim=False)
    cluster.request("POST", draft_training_path(ns), training_body(ns, "busy"))
    wait_for_stage_pods(cluster, ns, ["busy-generate"])
    wait_for_quiet_cluster(cluster)  # earlier tests' namespaces are deleted in the background
    time.sleep(3)  # let the last status patch and events settle

    # The old process stops first, so that the window holds only the new one's requests.
    operator.stop()
    before, events_before = apiserver_writes(cluster, TRAINING_RESOURCES), all_events(cluster)
    operator.start()  # a fresh process reconciles everything again
    wait_until(
        lambda: operator.metric(RECONCILES, kind="DraftTraining", result="success") >= 2,
        timeout=30,
        what="re-reconcile of both objects",
    )
    time.sleep(5)
    reconciles = operator.metric(RECONCILES, kind="DraftTraining")
    writes = apiserver_writes(cluster, TRAINING_RESOURCES) - before
    posts, patches, events = event_writes_between(events_before, all_events(cluster))
    assert reconciles >= 2
    # The new process's own request counter: it wrote nothing at all.
    own = {
        v: operator.metric("eagle3_operator_api_requests_total", verb=v)
        for v in ("create", "patch", "apply", "delete")
    }
    assert sum(own.values()) == 0, f"operator writes {own} for {reconciles} reconciles of unchanged objects"
    # The API server's counter agrees, except for Events other components wrote (the scheduler, the
    # node controller when a loaded machine delays kwok's heartbeats); those are listed, not assumed.
    writes["POST events"] -= posts
    writes["PATCH events"] -= patches
    assert sum(v for v in writes.values() if v > 0) == 0, (
        f"writes {dict(writes)} for {reconciles} reconciles of unchanged objects; other components' events: "
        + str([(e["involvedObject"]["name"], e["reason"], e.get("reportingComponent")) for e in events])
    )


def test_failed_stage_is_reported_and_retried_after_a_spec_edit(crds, manual_namespace, start_operator):
    cluster, ns = crds, manual_namespace
    prepare_training_volumes(cluster, ns)
    operator = start_operator(ns)
    body = training_body(ns, runtime={"backoffLimit": 0})
    cluster.request("POST", draft_training_path(ns), body)
    pod = wait_for_stage_pods(cluster, ns, ["llama-generate"])["llama-generate"][0]
    failure = '{"stage":"generate","ok":false,"message":"source /sources/prompts/chat.jsonl: no such file"}'
    cluster.fail_pod(ns, pod["metadata"]["name"], message=failure, exit_code=2, reason="Error")
    failed = wait_for_phase(cluster, ns, "llama", "Failed")
    cond = condition(failed, "Failed")
    assert cond["status"] == "True" and cond["reason"] == "Error"
    assert "no such file" in cond["message"] and "exited with code 2" in cond["message"]
    assert condition(failed, "Generated")["reason"] == "Failed"
    # The Event follows the status patch.
    warnings = wait_until(
        lambda: [e for e in events_of(cluster, ns, "llama") if e["type"] == "Warning"],
        timeout=10,
        what="Warning",
    )
    assert [e["reason"] for e in warnings] == ["StageFailed"]
    failed_phase = {
        p: operator.metric("eagle3_draft_training_phase", namespace=ns, name="llama", phase=p)
        for p in ("Running", "Failed")
    }
    assert failed_phase == {"Running": 0, "Failed": 1}, failed_phase

    patch = {"spec": {"data": {"sources": [{"claimName": "prompts", "path": "fixed.jsonl"}]}}}
    cluster.request("PATCH", draft_training_path(ns, "llama"), patch)
    wait_until(lambda: "llama-generate-r1" in jobs_of(cluster, ns, "llama"), timeout=60, what="retry Job")
    wait_until(
        lambda: "llama-generate" not in jobs_of(cluster, ns, "llama"), timeout=60, what="old Job removed"
    )
    complete_stage(cluster, ns, "generate", ["llama-generate-r1"])
    body = wait_stage_succeeded(cluster, ns, "llama", "generate")
    assert body["status"]["phase"] == "Running" and condition(body, "Failed")["status"] == "False"
    assert stage_record(body, "generate")["attempt"] == 1


def test_deleting_a_training_keeps_its_workspace(crds, manual_namespace, start_operator):
    cluster, ns = crds, manual_namespace
    prepare_training_volumes(cluster, ns)
    start_operator(ns)
    cluster.request("POST", draft_training_path(ns), training_body(ns))
    wait_for_stage_pods(cluster, ns, ["llama-generate"])
    cluster.request("DELETE", draft_training_path(ns, "llama"))
    wait_until(lambda: get(cluster, draft_training_path(ns, "llama")) is None, timeout=30, what="CR deleted")
    wait_until(lambda: not jobs_of(cluster, ns, "llama"), timeout=60, what="Jobs garbage-collected")
    wait_until(
        lambda: get(cluster, f"/apis/apps/v1/namespaces/{ns}/deployments/llama-target") is None,
        timeout=60,
        what="target Deployment garbage-collected",
    )
    claim = get(cluster, f"/api/v1/namespaces/{ns}/persistentvolumeclaims/llama-workspace")
    assert claim is not None and not claim["metadata"].get("deletionTimestamp"), "the workspace PVC must stay"
