"""SpecDecodeDeployment: the vLLM Deployment with --speculative-config, Service, monitors, status."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from eagle3_operator.api.spec_decode_deployment import SpecDecodeDeployment
from eagle3_operator.reconcile import meta
from eagle3_operator.reconcile.conditions import get_condition, set_condition
from eagle3_operator.reconcile.plan import Event, Plan, iso
from eagle3_operator.reconcile.pods import Mounts, model_location, service, vllm_args, vllm_pod_spec

MONITORING_API = "monitoring.coreos.com/v1"


@dataclass
class ServingObserved:
    now: datetime
    deployment: dict[str, Any] | None = None
    # The DraftTraining named by spec.draft.fromDraftTraining, when it exists.
    draft_training: dict[str, Any] | None = None
    # Prometheus Operator kinds the cluster serves ("ServiceMonitor", "PodMonitor").
    monitor_kinds: set[str] = field(default_factory=set)


@dataclass
class DraftResolution:
    resolved: bool
    reason: str
    message: str
    model_ref: str | None = None  # model id or pvc:// uri
    source: str = ""
    acceptance_length: float | None = None


def resolve_draft(sdd: SpecDecodeDeployment, draft_training: dict[str, Any] | None) -> DraftResolution:
    draft = sdd.spec.draft
    if draft.model:
        return DraftResolution(True, "FromSpec", f"draft {draft.model}", draft.model, "spec.draft.model")
    name = draft.from_draft_training
    source = f"DraftTraining/{name}"
    if draft_training is None:
        return DraftResolution(
            False, "DraftTrainingNotFound", f"DraftTraining {name} does not exist", source=source
        )
    status = draft_training.get("status") or {}
    phase = status.get("phase") or "Pending"
    export = status.get("export")
    if phase == "Failed":
        failed = get_condition(status.get("conditions") or [], "Failed") or {}
        detail = failed.get("message") or "see its status"
        return DraftResolution(
            False, "DraftTrainingFailed", f"DraftTraining {name} failed: {detail}", source=source
        )
    if phase != "Succeeded" or not export:
        stage = status.get("stage") or "not started"
        return DraftResolution(
            False,
            "WaitingForDraftTraining",
            f"DraftTraining {name} is {phase} (stage {stage}); serving the target alone until it succeeds",
            source=source,
        )
    acceptance = (status.get("bestCheckpoint") or {}).get("acceptanceLength")
    return DraftResolution(
        True, "FromDraftTraining", f"draft {export['uri']} from {source}", export["uri"], source, acceptance
    )


def speculative_config(model: str, num_tokens: int, revision: str | None) -> str:
    config: dict[str, Any] = {"method": "eagle3", "model": model, "num_speculative_tokens": num_tokens}
    if revision:
        config["revision"] = revision
    return json.dumps(config, separators=(",", ":"))


class ServingPlanner:
    def __init__(self, body: dict[str, Any], observed: ServingObserved):
        self.body = body
        self.sdd = SpecDecodeDeployment.model_validate(body)
        self.name = body["metadata"]["name"]
        self.namespace = body["metadata"]["namespace"]
        self.observed = observed
        self.labels = meta.labels(self.name, "server", meta.SPEC_DECODE_LABEL)
        self.selector = meta.selector_labels(self.name, "server", meta.SPEC_DECODE_LABEL)

    def deployment(self, draft: DraftResolution) -> tuple[dict[str, Any], str | None]:
        spec = self.sdd.spec
        target = spec.target
        mounts = Mounts()
        model = model_location(target.model, "target", mounts)
        args = vllm_args(target, model, spec.served_model_name or target.model)
        draft_path = None
        if draft.resolved and draft.model_ref:
            draft_path = model_location(draft.model_ref, "draft", mounts)
            config = speculative_config(draft_path, spec.num_speculative_tokens, spec.draft.revision)
            args += ["--speculative-config", config]
        pod_spec = vllm_pod_spec(target, args, mounts, spec.scheduling)
        template = {"metadata": {"labels": self.labels}, "spec": pod_spec}
        metadata = meta.object_meta(self.body, self.name, self.labels)
        metadata["annotations"] = {meta.TEMPLATE_HASH_ANNOTATION: meta.content_hash(template)}
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": metadata,
            "spec": {
                "replicas": spec.replicas,
                "selector": {"matchLabels": self.selector},
                "template": template,
            },
        }
        return deployment, draft_path

    def monitors(self) -> list[dict[str, Any]]:
        monitoring = self.sdd.spec.monitoring
        labels = self.labels | dict(monitoring.additional_labels)

        def endpoint(source_prefix: str) -> dict[str, Any]:
            # The chart's rules and dashboards group by `specdecodedeployment`, taken from our label.
            source = source_prefix + meta.SPEC_DECODE_LABEL.replace(".", "_").replace("/", "_").replace(
                "-", "_"
            )
            return {
                "port": "http",
                "path": "/metrics",
                "interval": monitoring.interval,
                "relabelings": [{"sourceLabels": [source], "targetLabel": "specdecodedeployment"}],
            }

        out = []
        if monitoring.service_monitor and "ServiceMonitor" in self.observed.monitor_kinds:
            out.append(
                {
                    "apiVersion": MONITORING_API,
                    "kind": "ServiceMonitor",
                    "metadata": meta.object_meta(self.body, self.name, labels),
                    "spec": {
                        "selector": {"matchLabels": self.selector},
                        "endpoints": [endpoint("__meta_kubernetes_service_label_")],
                    },
                }
            )
        if monitoring.pod_monitor and "PodMonitor" in self.observed.monitor_kinds:
            out.append(
                {
                    "apiVersion": MONITORING_API,
                    "kind": "PodMonitor",
                    "metadata": meta.object_meta(self.body, self.name, labels),
                    "spec": {
                        "selector": {"matchLabels": self.selector},
                        "podMetricsEndpoints": [endpoint("__meta_kubernetes_pod_label_")],
                    },
                }
            )
        return out

    def build(self) -> Plan:
        spec = self.sdd.spec
        plan = Plan()
        draft = resolve_draft(self.sdd, self.observed.draft_training)
        deployment, draft_path = self.deployment(draft)
        svc_meta = meta.object_meta(self.body, self.name, self.labels)
        if spec.service.annotations:
            svc_meta["annotations"] = dict(spec.service.annotations)
        plan.sync += [
            deployment,
            service(svc_meta, self.selector, spec.service.port, type=spec.service.type),
            *self.monitors(),
        ]
        old = self.body.get("status") or {}
        status = copy.deepcopy(old)
        observed_status = (self.observed.deployment or {}).get("status") or {}
        ready = observed_status.get("readyReplicas") or 0
        status |= {
            "observedGeneration": self.body["metadata"].get("generation"),
            "replicas": observed_status.get("replicas") or 0,
            "readyReplicas": ready,
            "selector": ",".join(f"{k}={v}" for k, v in sorted(self.selector.items())),
            "endpoint": f"http://{self.name}.{self.namespace}.svc:{spec.service.port}/v1",
        }
        if draft.resolved:
            resolved = {
                "model": draft_path,
                "source": draft.source,
                "acceptanceLength": draft.acceptance_length,
            }
            status["resolvedDraft"] = {k: v for k, v in resolved.items() if v is not None}
        else:
            status.pop("resolvedDraft", None)
        conditions = list(status.get("conditions") or [])
        gen, now = self.body["metadata"].get("generation"), iso(self.observed.now)
        previous_draft = get_condition(conditions, "DraftResolved")
        set_condition(conditions, "DraftResolved", draft.resolved, draft.reason, draft.message, gen, now)
        if draft.resolved and previous_draft and previous_draft.get("status") == "False":
            plan.events.append(Event("Normal", "DraftResolved", f"rolling in {draft.message}"))
        elif not draft.resolved and (previous_draft or {}).get("reason") != draft.reason:
            plan.events.append(Event("Normal", draft.reason, draft.message))
        available, reason, message = self._availability(ready)
        set_condition(conditions, "Available", available, reason, message, gen, now)
        progressing, reason, message = self._progressing(deployment)
        set_condition(conditions, "Progressing", progressing, reason, message, gen, now)
        previous_available = get_condition(old.get("conditions") or [], "Available")
        if previous_available and previous_available.get("status") != ("True" if available else "False"):
            plan.events.append(
                Event(
                    "Normal" if available else "Warning", "Available" if available else "Unavailable", message
                )
            )
        status["conditions"] = conditions
        plan.status = status
        return plan

    def _availability(self, ready: int) -> tuple[bool, str, str]:
        wanted = self.sdd.spec.replicas
        if wanted == 0:
            return False, "ScaledToZero", "replicas is 0"
        if ready >= 1:
            return True, "ReplicasReady", f"{ready}/{wanted} vLLM replicas ready"
        return False, "NoReadyReplicas", f"0/{wanted} vLLM replicas ready"

    def _progressing(self, desired: dict[str, Any]) -> tuple[bool, str, str]:
        deployment = self.observed.deployment
        if deployment is None:
            return True, "Creating", "creating the vLLM Deployment"
        annotations = deployment["metadata"].get("annotations") or {}
        if (
            annotations.get(meta.TEMPLATE_HASH_ANNOTATION)
            != desired["metadata"]["annotations"][meta.TEMPLATE_HASH_ANNOTATION]
        ):
            # This reconcile applies a new template (a draft rolling in, a changed spec): the live
            # status still describes the old one.
            return True, "RollingOut", "applying a new vLLM pod template"
        status = deployment.get("status") or {}
        wanted = self.sdd.spec.replicas
        settled = (
            status.get("observedGeneration", 0) >= deployment["metadata"].get("generation", 0)
            and (status.get("updatedReplicas") or 0) == wanted
            and (status.get("readyReplicas") or 0) == wanted
            and (status.get("replicas") or 0) == wanted
        )
        if settled:
            return False, "RolloutComplete", f"{wanted} replicas up to date and ready"
        return True, "RollingOut", "vLLM pods are being created or updated"


def plan_serving(body: dict[str, Any], observed: ServingObserved) -> Plan:
    return ServingPlanner(body, observed).build()
