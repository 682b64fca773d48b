"""The SpecDecodeDeployment planner, without a cluster."""

from __future__ import annotations

import json

from eagle3_operator.reconcile.serving import ServingObserved, plan_serving

from tests.operator import fakes


def _deployment(plan) -> dict:
    return next(o for o in plan.sync if o["kind"] == "Deployment")


def _spec_config(deployment: dict) -> dict | None:
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    if "--speculative-config" not in args:
        return None
    return json.loads(args[args.index("--speculative-config") + 1])


def _condition(status: dict, type_: str) -> dict:
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_deployment_serves_target_with_the_eagle3_draft():
    body = fakes.spec_decode(
        numSpeculativeTokens=4, replicas=3, scheduling={"nodeSelector": {"amd.com/gpu.family": "AI"}}
    )
    plan = plan_serving(body, ServingObserved(now=fakes.NOW))
    deployment = _deployment(plan)
    assert deployment["spec"]["replicas"] == 3
    assert _spec_config(deployment) == {"method": "eagle3", "model": "/models/draft/llama-eagle3",
                                        "num_speculative_tokens": 4}  # fmt: skip
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
    assert _condition(plan.status, "DraftResolved")["status"] == "True"


def test_monitors_only_when_the_prometheus_operator_serves_them():
    body = fakes.spec_decode(monitoring={"podMonitor": True, "additionalLabels": {"release": "kps"}})
    kinds = [o["kind"] for o in plan_serving(body, ServingObserved(now=fakes.NOW)).sync]
    assert kinds == ["Deployment", "Service"]
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
    training = {"metadata": {"name": "llama"}, "status": {"phase": "Running", "stage": "train"}}
    plan = plan_serving(body, ServingObserved(now=fakes.NOW, draft_training=training))
    resolved = _condition(plan.status, "DraftResolved")
    assert resolved["status"] == "False" and resolved["reason"] == "WaitingForDraftTraining"
    assert _spec_config(_deployment(plan)) is None, "serves the target alone meanwhile"
    body["status"] = plan.status
    training["status"] = {
        "phase": "Succeeded",
        "bestCheckpoint": {"step": 900, "acceptanceLength": 2.7},
        "export": {"uri": "pvc://llama-workspace/export", "claimName": "llama-workspace", "path": "export"},
    }
    plan = plan_serving(body, ServingObserved(now=fakes.NOW, draft_training=training))
    assert _spec_config(_deployment(plan))["model"] == "/models/draft/export"
    assert plan.status["resolvedDraft"] == {"model": "/models/draft/export", "source": "DraftTraining/llama",
                                            "acceptanceLength": 2.7}  # fmt: skip
    assert [e.reason for e in plan.events] == ["DraftResolved"]
    missing = plan_serving(body, ServingObserved(now=fakes.NOW))
    assert _condition(missing.status, "DraftResolved")["reason"] == "DraftTrainingNotFound"


def test_availability_from_the_deployment():
    body = fakes.spec_decode(replicas=2)
    first = plan_serving(body, ServingObserved(now=fakes.NOW))
    assert _condition(first.status, "Available")["status"] == "False"
    assert _condition(first.status, "Progressing")["status"] == "True"
    body["status"] = first.status
    observed = ServingObserved(now=fakes.NOW, deployment=fakes.ready_deployment(_deployment(first)))
    plan = plan_serving(body, observed)
    assert plan.status["readyReplicas"] == 2 and plan.status["replicas"] == 2
    assert _condition(plan.status, "Available")["status"] == "True"
    assert _condition(plan.status, "Progressing")["reason"] == "RolloutComplete"
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
    assert _condition(plan.status, "Progressing")["reason"] == "RolloutComplete"
    training["status"] = {
        "phase": "Succeeded",
        "bestCheckpoint": {"step": 900, "acceptanceLength": 2.7},
        "export": {"uri": "pvc://llama-workspace/export", "claimName": "llama-workspace", "path": "export"},
    }
    # The draft resolves while the live Deployment, settled, still runs the target alone.
    plan = plan_serving(
        body, ServingObserved(now=fakes.NOW, draft_training=training, deployment=settled_alone)
    )
    with_draft = _deployment(plan)
    assert _spec_config(with_draft) is not None
    progressing = _condition(plan.status, "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", "RollingOut"), progressing
    assert _condition(plan.status, "Available")["status"] == "True", "the old pods still serve"
    done = plan_serving(
        body,
        ServingObserved(
            now=fakes.NOW, draft_training=training, deployment=fakes.ready_deployment(with_draft)
        ),
    )
    assert _condition(done.status, "Progressing")["reason"] == "RolloutComplete"
