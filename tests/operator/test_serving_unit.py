"""The SpecDecodeDeployment planner, without a cluster."""

from __future__ import annotations

import copy
import json
from datetime import timedelta

from eagle3_operator.reconcile.live_acceptance import (
    History,
    PodCounters,
    PodRead,
    parse_metrics,
    revision_figures,
)
from eagle3_operator.reconcile.plan import Plan
from eagle3_operator.reconcile.serving import ServingObserved, plan_serving

from tests.operator import fakes


def _deployment(plan) -> dict:
    return next(o for o in plan.sync if o["kind"] == "Deployment")


def _spec_config(deployment: dict) -> dict | None:
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    if "--speculative-config" not in args:
        return None
    return json.loads(args[args.index("--speculative-config") + 1])


def _exported(path: str = "export", acceptance: float = 2.7, generation: int = 1) -> dict:
    """A Succeeded DraftTraining's status, its draft exported to the workspace claim."""
    return {
        "phase": "Succeeded",
        "stage": "export",
        "observedGeneration": generation,
        "bestCheckpoint": {"step": 900, "acceptanceLength": acceptance},
        "export": {
            "uri": f"pvc://llama-workspace/{path}",
            "claimName": "llama-workspace",
            "path": path,
            "format": "eagle3",
            "quantization": "none",
        },
    }


def _record(path: str = "export", acceptance: float = 2.7, generation: int = 1) -> dict:
    """status.resolvedDraft for that export of DraftTraining llama (uid-1)."""
    return {
        "model": f"/models/draft/{path}",
        "uri": f"pvc://llama-workspace/{path}",
        "source": "DraftTraining/llama",
        "draftTraining": {"name": "llama", "uid": "uid-1", "generation": generation},
        "acceptanceLength": acceptance,
    }


def test_deployment_serves_target_with_the_eagle3_draft():
    body = fakes.spec_decode(
        numSpeculativeTokens=4, replicas=3, scheduling={"nodeSelector": {"amd.com/gpu.family": "AI"}}
    )
    plan = plan_serving(body, ServingObserved(now=fakes.NOW))
    deployment = _deployment(plan)
    assert deployment["spec"]["replicas"] == 3
    assert _spec_config(deployment) == {
        "method": "eagle3",
        "model": "/models/draft/llama-eagle3",
        "num_speculative_tokens": 4,
    }
    pod = deployment["spec"]["template"]["spec"]
    vllm = pod["containers"][0]
    assert vllm["args"][:2] == ["meta-llama/Llama-3.1-8B-Instruct", "--host"]
    assert vllm["args"][vllm["args"].index("--tensor-parallel-size") + 1] == "2"
    assert vllm["resources"]["requests"]["amd.com/gpu"] == "2"
    assert vllm["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert vllm["startupProbe"]["failureThreshold"] * vllm["startupProbe"]["periodSeconds"] >= 1800
    assert pod["nodeSelector"] == {"amd.com/gpu.family": "AI"}
    draft_volume = next(v for v in pod["volumes"] if v["name"] == "draft-model")
    assert draft_volume["persistentVolumeClaim"] == {"claimName": "drafts", "readOnly": True}
    assert plan.status["selector"] == (
        "app.kubernetes.io/component=server,app.kubernetes.io/instance=chat,eagle3.ai/spec-decode-deployment=chat"
    )
    assert plan.status["endpoint"] == "http://chat.ml.svc:8000/v1"
    assert fakes.condition(plan.status, "DraftResolved")["status"] == "True"


def test_monitors_only_when_the_prometheus_operator_serves_them():
    body = fakes.spec_decode(monitoring={"podMonitor": True, "additionalLabels": {"release": "kps"}})
    kinds = [o["kind"] for o in plan_serving(body, ServingObserved(now=fakes.NOW)).sync]
    assert kinds == ["Deployment", "Service", "PodDisruptionBudget"]
    plan = plan_serving(body, ServingObserved(now=fakes.NOW, monitor_kinds={"ServiceMonitor", "PodMonitor"}))
    monitors = [o for o in plan.sync if o["apiVersion"] == "monitoring.coreos.com/v1"]
    assert [m["kind"] for m in monitors] == ["ServiceMonitor", "PodMonitor"]
    assert monitors[0]["metadata"]["labels"]["release"] == "kps"
    assert monitors[0]["spec"]["endpoints"] == [
        {
            "port": "http",
            "path": "/metrics",
            "interval": "30s",
            "relabelings": [
                {
                    "sourceLabels": ["__meta_kubernetes_service_label_eagle3_ai_spec_decode_deployment"],
                    "targetLabel": "specdecodedeployment",
                }
            ],
        }
    ]


def test_from_draft_training_waits_then_rolls_the_draft_in():
    body = fakes.spec_decode(draft={"fromDraftTraining": "llama"})
    training = {
        "metadata": {"name": "llama", "uid": "uid-1"},
        "status": {"phase": "Running", "stage": "train"},
    }
    plan = plan_serving(body, ServingObserved(now=fakes.NOW, draft_training=training))
    resolved = fakes.condition(plan.status, "DraftResolved")
    assert resolved["status"] == "False" and resolved["reason"] == "WaitingForDraftTraining"
    assert _spec_config(_deployment(plan)) is None, "serves the target alone meanwhile"
    body["status"] = plan.status
    training["status"] = _exported()
    plan = plan_serving(body, ServingObserved(now=fakes.NOW, draft_training=training))
    assert _spec_config(_deployment(plan))["model"] == "/models/draft/export"
    assert plan.status["resolvedDraft"] == _record()
    assert [e.reason for e in plan.events] == ["DraftResolved"]
    missing = plan_serving(body, ServingObserved(now=fakes.NOW))
    assert fakes.condition(missing.status, "DraftResolved")["reason"] == "DraftTrainingNotFound"


def test_availability_from_the_deployment():
    body = fakes.spec_decode(replicas=2)
    first = plan_serving(body, ServingObserved(now=fakes.NOW))
    assert fakes.condition(first.status, "Available")["status"] == "False"
    assert fakes.condition(first.status, "Progressing")["status"] == "True"
    body["status"] = first.status
    observed = ServingObserved(now=fakes.NOW, deployment=fakes.ready_deployment(_deployment(first)))
    plan = plan_serving(body, observed)
    assert plan.status["readyReplicas"] == 2 and plan.status["replicas"] == 2
    assert fakes.condition(plan.status, "Available")["status"] == "True"
    assert fakes.condition(plan.status, "Progressing")["reason"] == "RolloutComplete"
    body["status"] = plan.status
    again = plan_serving(body, observed)
    assert again.status == plan.status and again.events == []


def test_a_new_template_is_progressing_until_the_deployment_has_it():
    body = fakes.spec_decode(draft={"fromDraftTraining": "llama"})
    training = {"metadata": {"name": "llama"}, "status": {"phase": "Running", "stage": "train"}}
    alone = _deployment(plan_serving(body, ServingObserved(now=fakes.NOW, draft_training=training)))
    settled_alone = fakes.ready_deployment(alone)
    plan = plan_serving(
        body, ServingObserved(now=fakes.NOW, draft_training=training, deployment=settled_alone)
    )
    assert fakes.condition(plan.status, "Progressing")["reason"] == "RolloutComplete"
    training["status"] = _exported()
    # The draft resolves while the live Deployment, settled, still runs the target alone.
    plan = plan_serving(
        body, ServingObserved(now=fakes.NOW, draft_training=training, deployment=settled_alone)
    )
    with_draft = _deployment(plan)
    assert _spec_config(with_draft) is not None
    progressing = fakes.condition(plan.status, "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", "RollingOut"), progressing
    assert fakes.condition(plan.status, "Available")["status"] == "True", "the old pods still serve"
    done = plan_serving(
        body,
        ServingObserved(
            now=fakes.NOW, draft_training=training, deployment=fakes.ready_deployment(with_draft)
        ),
    )
    assert fakes.condition(done.status, "Progressing")["reason"] == "RolloutComplete"


# ---- the pinned draft: serving keeps what it resolved -----------------------------------------------


def _serving_the_export() -> tuple[dict, dict, dict]:
    """An SDD whose pods serve DraftTraining llama's export: (body with that status, training, Deployment)."""
    body = fakes.spec_decode(draft={"fromDraftTraining": "llama"})
    training = {"metadata": {"name": "llama", "uid": "uid-1", "generation": 1}, "status": _exported()}
    plan = plan_serving(body, ServingObserved(now=fakes.NOW, draft_training=training))
    deployment = fakes.ready_deployment(_deployment(plan))
    body["status"] = plan.status
    settled = plan_serving(
        body, ServingObserved(now=fakes.NOW, draft_training=training, deployment=deployment)
    )
    body["status"] = settled.status
    return body, training, deployment


def _assert_keeps_the_pinned_draft(body: dict, training: dict | None, deployment: dict, reason: str) -> str:
    """Checks that the pods keep the draft and why, said once; returns the condition's message."""
    observed = ServingObserved(now=fakes.NOW, draft_training=training, deployment=deployment)
    plan = plan_serving(body, observed)
    assert _deployment(plan)["spec"]["template"] == deployment["spec"]["template"], "no rollout"
    assert _spec_config(_deployment(plan))["model"] == "/models/draft/export"
    assert plan.status["resolvedDraft"] == body["status"]["resolvedDraft"]
    resolved = fakes.condition(plan.status, "DraftResolved")
    assert (resolved["status"], resolved["reason"], resolved["observedGeneration"]) == ("False", reason, 1)
    assert (
        "keeps serving the pinned draft pvc://llama-workspace/export (exported by generation 1)"
        in (resolved["message"])
    )
    assert [(e.type, e.reason, e.message) for e in plan.events] == [("Warning", reason, resolved["message"])]
    assert fakes.condition(plan.status, "Progressing")["reason"] == "RolloutComplete"
    again = plan_serving(body | {"status": plan.status}, observed)
    assert again.events == [] and again.status == plan.status, "said once, not on every reconcile"
    return resolved["message"]


def test_a_deleted_draft_training_leaves_its_consumers_the_pinned_draft():
    body, _, deployment = _serving_the_export()
    _assert_keeps_the_pinned_draft(body, None, deployment, "DraftTrainingDeleted")


def test_a_draft_training_being_deleted_counts_as_deleted():
    body, training, deployment = _serving_the_export()
    training["metadata"]["deletionTimestamp"] = "2026-11-29T09:00:00Z"
    _assert_keeps_the_pinned_draft(body, training, deployment, "DraftTrainingDeleted")


def test_a_reopened_draft_training_leaves_the_pinned_draft_until_its_new_export():
    body, training, deployment = _serving_the_export()
    # export.quantize added after success: the quantize stage runs, the old export is still listed.
    training["metadata"]["generation"] = 2
    training["status"] |= {"phase": "Running", "stage": "quantize", "observedGeneration": 2}
    _assert_keeps_the_pinned_draft(body, training, deployment, "DraftTrainingNotExported")


def test_a_failed_retry_leaves_the_pinned_draft():
    body, training, deployment = _serving_the_export()
    training["status"] |= {
        "phase": "Failed",
        "stage": "quantize",
        "conditions": [{"type": "Failed", "status": "True", "message": "stage quantize failed: OOMKilled"}],
    }
    message = _assert_keeps_the_pinned_draft(body, training, deployment, "DraftTrainingFailed")
    assert message.startswith("DraftTraining llama failed: stage quantize failed: OOMKilled; keeps serving")


def test_a_newer_successful_export_replaces_the_pinned_draft():
    body, training, deployment = _serving_the_export()
    training["status"] |= {"phase": "Running", "stage": "quantize", "observedGeneration": 2}
    kept = plan_serving(body, ServingObserved(now=fakes.NOW, draft_training=training, deployment=deployment))
    body["status"] = kept.status
    training["status"] = _exported("export-fp8", acceptance=2.6, generation=2)
    plan = plan_serving(body, ServingObserved(now=fakes.NOW, draft_training=training, deployment=deployment))
    assert _spec_config(_deployment(plan))["model"] == "/models/draft/export-fp8"
    assert plan.status["resolvedDraft"] == _record("export-fp8", acceptance=2.6, generation=2)
    resolved = fakes.condition(plan.status, "DraftResolved")
    assert (resolved["status"], resolved["reason"]) == ("True", "FromDraftTraining")
    assert [(e.type, e.reason) for e in plan.events] == [("Normal", "DraftResolved")]
    assert "replaces pvc://llama-workspace/export" in plan.events[0].message
    assert fakes.condition(plan.status, "Progressing")["reason"] == "RollingOut"


def test_a_recreated_draft_training_exporting_to_the_same_path_is_a_rollout():
    body, training, deployment = _serving_the_export()
    # The retained workspace gets a new export at the same path from a new DraftTraining llama.
    training["metadata"]["uid"] = "uid-9"
    plan = plan_serving(body, ServingObserved(now=fakes.NOW, draft_training=training, deployment=deployment))
    new_template = _deployment(plan)["spec"]["template"]
    assert _spec_config(_deployment(plan)) == _spec_config(deployment), "same path"
    assert new_template != deployment["spec"]["template"], "the new export rolls out, not only onto new pods"
    assert new_template["metadata"]["annotations"]["eagle3.ai/draft-export"] == "uid-9"
    assert plan.status["resolvedDraft"]["draftTraining"]["uid"] == "uid-9"
    assert [e.reason for e in plan.events] == ["DraftResolved"]


def test_the_same_export_keeps_its_record_across_unrelated_draft_training_edits():
    body, training, deployment = _serving_the_export()
    training["status"]["observedGeneration"] = 3  # e.g. a label edit that re-runs nothing
    plan = plan_serving(body, ServingObserved(now=fakes.NOW, draft_training=training, deployment=deployment))
    assert plan.status == body["status"] and plan.events == []
    assert plan.status["resolvedDraft"]["draftTraining"]["generation"] == 1


def test_scaling_keeps_the_pin_but_a_changed_draft_source_resets_it():
    body, _, deployment = _serving_the_export()
    scaled = copy.deepcopy(body)
    scaled["metadata"]["generation"] = 2
    scaled["spec"]["replicas"] = 4
    plan = plan_serving(scaled, ServingObserved(now=fakes.NOW, deployment=deployment))
    assert _spec_config(_deployment(plan))["model"] == "/models/draft/export"
    assert fakes.condition(plan.status, "DraftResolved")["reason"] == "DraftTrainingDeleted"

    renamed = copy.deepcopy(body)
    renamed["metadata"]["generation"] = 2
    renamed["spec"]["draft"] = {"fromDraftTraining": "llama-v2"}
    plan = plan_serving(renamed, ServingObserved(now=fakes.NOW, deployment=deployment))
    assert _spec_config(_deployment(plan)) is None, "the pin belonged to DraftTraining llama"
    assert "resolvedDraft" not in plan.status
    resolved = fakes.condition(plan.status, "DraftResolved")
    assert (resolved["reason"], resolved["observedGeneration"]) == ("DraftTrainingNotFound", 2)
    assert resolved["message"] == (
        "DraftTraining llama-v2 does not exist; serving the target alone until it exists and succeeds"
    )

    direct = copy.deepcopy(body)
    direct["spec"]["draft"] = {"model": "org/llama-eagle3"}
    plan = plan_serving(direct, ServingObserved(now=fakes.NOW, deployment=deployment))
    assert _spec_config(_deployment(plan))["model"] == "org/llama-eagle3"
    assert plan.status["resolvedDraft"] == {
        "model": "org/llama-eagle3",
        "uri": "org/llama-eagle3",
        "source": "spec.draft.model",
    }
    assert "eagle3.ai/draft-export" not in _deployment(plan)["spec"]["template"]["metadata"]["annotations"]
    assert [e.message for e in plan.events] == [
        "rolling in draft org/llama-eagle3 (replaces pvc://llama-workspace/export)"
    ]


def test_an_export_digest_is_pinned_and_names_the_export_on_the_pod_template():
    body = fakes.spec_decode(draft={"fromDraftTraining": "llama"})
    training = {"metadata": {"name": "llama", "uid": "uid-1"}, "status": _exported()}
    training["status"]["export"]["digest"] = "sha256:0123abcd"
    plan = plan_serving(body, ServingObserved(now=fakes.NOW, draft_training=training))
    assert plan.status["resolvedDraft"] == _record() | {"digest": "sha256:0123abcd"}
    template = _deployment(plan)["spec"]["template"]
    assert template["metadata"]["annotations"]["eagle3.ai/draft-export"] == "sha256:0123abcd"
    body["status"] = plan.status
    training["status"]["export"]["digest"] = "sha256:ffff"  # re-published at the same path
    plan = plan_serving(body, ServingObserved(now=fakes.NOW, draft_training=training))
    assert plan.status["resolvedDraft"]["digest"] == "sha256:ffff"
    assert _deployment(plan)["spec"]["template"] != template
    assert [e.reason for e in plan.events] == ["DraftResolved"]


def test_rollout_knobs_disruption_budget_startup_budget_and_requests():
    body = fakes.spec_decode(
        rollout={"maxSurge": "0", "maxUnavailable": "25%", "startupTimeoutSeconds": 3600},
        disruptionBudget={"maxUnavailable": "2"},
        target={"model": "org/llama", "resources": {"requests": {"memory": "64Gi"}}},
    )
    plan = plan_serving(body, ServingObserved(now=fakes.NOW))
    deployment = _deployment(plan)
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": "25%"},
    }
    vllm = deployment["spec"]["template"]["spec"]["containers"][0]
    startup = vllm["startupProbe"]["failureThreshold"] * vllm["startupProbe"]["periodSeconds"]
    assert startup == 3600 and deployment["spec"]["progressDeadlineSeconds"] == 3600 + 600
    # A saturated server answers /health late: a minute of misses before it leaves the Service.
    readiness = vllm["readinessProbe"]
    assert (
        readiness["failureThreshold"] * readiness["periodSeconds"] >= 60 and readiness["timeoutSeconds"] >= 10
    )
    # Not BestEffort: the spec's memory, the default CPU, the GPUs.
    assert vllm["resources"]["requests"] == {"memory": "64Gi", "cpu": "500m", "amd.com/gpu": "1"}
    budget = next(o for o in plan.sync if o["kind"] == "PodDisruptionBudget")
    assert budget["spec"] == {"selector": deployment["spec"]["selector"], "maxUnavailable": 2}
    assert budget["metadata"]["ownerReferences"][0]["uid"] == "uid-2"

    off = plan_serving(fakes.spec_decode(disruptionBudget={"enabled": False}), ServingObserved(now=fakes.NOW))
    assert "PodDisruptionBudget" not in [o["kind"] for o in off.sync]


def _reads(history: History, pod: str, revision: str, rows: list[tuple[int, PodCounters]]) -> None:
    for seconds, counters in rows:
        history.add(pod, PodRead(fakes.NOW + timedelta(seconds=seconds), revision, "sha256:d", counters))


def test_live_acceptance_is_counter_deltas_per_revision_over_the_window():
    history = History()
    # Pod a: 100 drafts, 150 accepted (1.5 per draft) in the window; a read before the window is its base.
    _reads(
        history,
        "a",
        "r2",
        [
            (-400, PodCounters(0, 0, 0)),
            (0, PodCounters(10, 5, 40, (4, 1))),
            (300, PodCounters(110, 155, 440, (94, 61))),
        ],
    )
    # Pod b restarted mid-window (counters went down): its delta counts from zero.
    _reads(
        history,
        "b",
        "r2",
        [(0, PodCounters(500, 900, 2000, (400, 500))), (300, PodCounters(100, 50, 360, (40, 10)))],
    )
    # An old revision's pod, read once: no delta yet.
    _reads(history, "c", "r1", [(290, PodCounters(7, 7, 7))])
    now = fakes.NOW + timedelta(seconds=300)
    history.prune(now, 300, {"a", "b", "c"})
    assert [r.at for r in history.reads["a"]] == [fakes.NOW, now], (
        "reads before the window's base are dropped"
    )
    (figures,) = revision_figures(history, 300, now)
    assert figures == {
        "revision": "r2",
        "draft": "sha256:d",
        "pods": 2,
        "meanAcceptanceLength": 1 + 200 / 200,
        "perPositionAcceptance": [(90 + 40) / 200, (60 + 10) / 200],
        "generatedTokensPerSecond": round((400 + 360) / 300, 3),
        "drafts": 200,
        "window": {"start": "2026-11-29T09:00:00Z", "end": "2026-11-29T09:05:00Z", "seconds": 300.0},
    }
    history.prune(now, 300, {"a"})
    assert set(history.reads) == {"a"}, "gone pods are forgotten"


def _served_with_counters(
    accepted_per_draft: float, seconds: int = 300, drafts: int = 400
) -> tuple[dict, Plan]:
    body = fakes.spec_decode(
        draft={"model": "pvc://drafts/llama-eagle3", "acceptanceLength": 3.0},
        liveAcceptance={"windowSeconds": 300, "minDrafts": 100},
    )
    first = plan_serving(body, ServingObserved(now=fakes.NOW))
    revision = _deployment(first)["spec"]["template"]["metadata"]["annotations"]["eagle3.ai/revision"]
    history = History()
    end = PodCounters(drafts, drafts * accepted_per_draft, 1000)
    _reads(history, "pod-1", revision, [(0, PodCounters()), (seconds, end)])
    body["status"] = first.status
    now = fakes.NOW + timedelta(seconds=seconds)
    return body, plan_serving(body, ServingObserved(now=now, counters=history))


def test_draft_degraded_when_a_full_window_stays_below_the_threshold():
    body, plan = _served_with_counters(accepted_per_draft=1.0)  # live 2.0 < 0.8 * 3.0
    assert plan.status["liveAcceptanceLength"] == 2.0
    assert plan.status["resolvedDraft"]["acceptanceLength"] == 3.0
    degraded = fakes.condition(plan.status, "DraftDegraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "AcceptanceBelowThreshold")
    assert degraded["message"] == (
        "live mean acceptance length 2 over 300 s (400 drafts); evaluated 3, threshold 2.4 (0.8x)"
    )
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "DraftDegraded")]
    assert plan.requeue_after == 30

    _, healthy = _served_with_counters(accepted_per_draft=1.6)  # 2.6 >= 2.4
    assert fakes.condition(healthy.status, "DraftDegraded")["status"] == "False"
    _, short = _served_with_counters(accepted_per_draft=0.1, seconds=60)  # not a full window yet
    assert fakes.condition(short.status, "DraftDegraded")["reason"] == "NotEnoughData"
    _, few = _served_with_counters(accepted_per_draft=0.1, drafts=50)
    assert fakes.condition(few.status, "DraftDegraded")["reason"] == "NotEnoughData"

    no_reference = fakes.spec_decode()
    plan = plan_serving(no_reference, ServingObserved(now=fakes.NOW, counters=History()))
    assert fakes.condition(plan.status, "DraftDegraded")["reason"] == "NoEvaluatedAcceptance"
    assert "liveAcceptanceLength" not in plan.status


def test_parse_metrics_sums_engines_and_reads_positions():
    text = """# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 12.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 8.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 99.0
"""
    assert parse_metrics(text) == PodCounters(15.0, 12.0, 99.0, (8.0, 4.0))
