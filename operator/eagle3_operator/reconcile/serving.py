"""SpecDecodeDeployment: the vLLM Deployment with --speculative-config, Service, monitors, status."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from eagle3_api.spec_decode_deployment import SpecDecodeDeployment
from eagle3_api.workspace import content_hash
from eagle3_operator.reconcile import meta, verification
from eagle3_operator.reconcile.canary import (
    CANARY_SUFFIX,
    TRACK_LABEL,
    RolloutInputs,
    RolloutPlan,
    plan_rollout,
    same_export,
)
from eagle3_operator.reconcile.conditions import get_condition, set_condition
from eagle3_operator.reconcile.live_acceptance import (
    REVISION_ANNOTATION,
    History,
    degradation,
    revision_figures,
)
from eagle3_operator.reconcile.plan import Event, Plan, iso
from eagle3_operator.reconcile.pods import (
    PROBE_PERIOD_S,
    Mounts,
    PodPolicy,
    model_location,
    service,
    vllm_args,
    vllm_pod_spec,
)
from eagle3_operator.reconcile.speculation import applied_speculation, speculative_config
from eagle3_operator.reconcile.stuck import (
    REFUSAL_RETRY_S,
    Problem,
    Refusal,
    deployment_problem,
    first_pod_problem,
)

MONITORING_API = "monitoring.coreos.com/v1"
# The Deployment reports ProgressDeadlineExceeded this long after a pod's start-up budget: a pod
# still within its startup probe's budget is slow, not stuck.
PROGRESS_DEADLINE_SLACK_S = 600
# Requests of a vLLM container whose spec sets none, so GPU pods are Burstable, not BestEffort (the
# first evicted under node memory pressure); target.resources sets the real size.
DEFAULT_REQUESTS = {"cpu": "500m", "memory": "4Gi"}


@dataclass
class ServingObserved:
    now: datetime
    deployment: dict[str, Any] | None = None
    # The canary track's Deployment (<name>-canary), when there is one.
    canary_deployment: dict[str, Any] | None = None
    # The DraftTraining named by spec.draft.fromDraftTraining, when it exists.
    draft_training: dict[str, Any] | None = None
    # Prometheus Operator kinds the cluster serves ("ServiceMonitor", "PodMonitor").
    monitor_kinds: set[str] = field(default_factory=set)
    # The vLLM pods (label eagle3.ai/spec-decode-deployment), for what holds them back.
    pods: list[dict[str, Any]] = field(default_factory=list)
    # Children the API server refused in this reconcile's writes.
    refused: list[Refusal] = field(default_factory=list)
    # Reads of the vLLM pods' speculative-decoding counters (None: live acceptance is off).
    counters: History | None = None
    # The verify Jobs (spec.verification) by name, and their pods.
    verify_jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    verify_pods: list[dict[str, Any]] = field(default_factory=list)


# On the vLLM pod template: which export of a DraftTraining the pods load (its digest when the
# export has one, else the DraftTraining's uid). A re-created DraftTraining may export to the same
# path; the changed annotation makes its draft a rollout instead of a silent swap under new pods only.
DRAFT_EXPORT_ANNOTATION = "eagle3.ai/draft-export"


@dataclass
class DraftResolution:
    """What the pods serve and how the DraftResolved condition reads.

    `draft` is the status.resolvedDraft record (camelCase, without the in-pod `model` path), None
    for the target alone. Unresolved with a draft means the pinned draft is kept.
    """

    resolved: bool
    reason: str
    message: str
    draft: dict[str, Any] | None = None

    @property
    def pinned(self) -> bool:
        return not self.resolved and self.draft is not None


def _export_record(name: str, training: dict[str, Any]) -> dict[str, Any]:
    status = training["status"]
    export = status["export"]
    record = {
        "uri": export["uri"],
        "source": f"DraftTraining/{name}",
        "draftTraining": {
            "name": name,
            "uid": training["metadata"].get("uid"),
            # The generation whose reconcile published the export (metadata.generation may be newer).
            "generation": status.get("observedGeneration") or training["metadata"].get("generation"),
        },
        "acceptanceLength": (status.get("bestCheckpoint") or {}).get("acceptanceLength"),
        "digest": export.get("digest"),
        "speculationSchedule": (status.get("sweep") or {}).get("schedule"),
    }
    record["draftTraining"] = {k: v for k, v in record["draftTraining"].items() if v is not None}
    return {k: v for k, v in record.items() if v is not None}


def resolve_draft(
    sdd: SpecDecodeDeployment, draft_training: dict[str, Any] | None, pinned: dict[str, Any] | None
) -> DraftResolution:
    """The draft to serve, from the spec, the DraftTraining, or the draft resolved before (`pinned`).

    A DraftTraining that is deleted, re-opened (no current export) or failed leaves its consumers
    the draft they last resolved from it; a newer successful export replaces it. The pin belongs
    to `spec.draft`: naming another DraftTraining or a model drops it (other spec edits, such as
    scaling, keep it).
    """
    draft = sdd.spec.draft
    if draft.model:
        record: dict[str, Any] = {"uri": draft.model, "source": "spec.draft.model"}
        if draft.acceptance_length is not None:
            record["acceptanceLength"] = draft.acceptance_length
        if draft.speculation_schedule:
            record["speculationSchedule"] = draft.speculation_schedule
        return DraftResolution(True, "FromSpec", f"draft {draft.model}", record)
    name = draft.from_draft_training
    source = f"DraftTraining/{name}"
    pin = pinned if pinned and pinned.get("source") == source and pinned.get("uri") else None
    status = (draft_training or {}).get("status") or {}
    phase = status.get("phase") or "Pending"
    if draft_training is None or draft_training["metadata"].get("deletionTimestamp"):
        pinned_reason, fresh_reason = "DraftTrainingDeleted", "DraftTrainingNotFound"
        what = f"DraftTraining {name} " + ("was deleted" if pin else "does not exist")
        until = "until it exists and succeeds"
    elif phase == "Failed":
        pinned_reason = fresh_reason = "DraftTrainingFailed"
        failed = get_condition(status.get("conditions") or [], "Failed") or {}
        what = f"DraftTraining {name} failed: {failed.get('message') or 'see its status'}"
        until = "until a spec edit retries it and it succeeds"
    elif phase != "Succeeded" or not status.get("export"):
        pinned_reason, fresh_reason = "DraftTrainingNotExported", "WaitingForDraftTraining"
        what = f"DraftTraining {name} is {phase} (stage {status.get('stage') or 'not started'})"
        until = "until it succeeds"
    else:
        record = _export_record(name, draft_training)
        # The same export keeps its record as first resolved (a later DraftTraining edit that
        # re-runs nothing changes its observedGeneration, not the draft).
        record = pin if same_export(pin, record) else record
        return DraftResolution(True, "FromDraftTraining", f"draft {record['uri']} from {source}", record)
    if pin:
        exported = pin.get("draftTraining", {}).get("generation")
        by = f" (exported by generation {exported})" if exported is not None else ""
        message = f"{what}; keeps serving the pinned draft {pin['uri']}{by} until a newer export succeeds"
        return DraftResolution(False, pinned_reason, message, pin)
    return DraftResolution(False, fresh_reason, f"{what}; serving the target alone {until}")


def int_or_percent(value: str) -> int | str:
    """A Deployment's or PodDisruptionBudget's intOrString from the spec's string form."""
    return value if value.endswith("%") else int(value)


class ServingPlanner:
    def __init__(self, body: dict[str, Any], observed: ServingObserved):
        self.body = body
        self.sdd = SpecDecodeDeployment.model_validate(body)
        self.name = body["metadata"]["name"]
        self.namespace = body["metadata"]["namespace"]
        self.observed = observed
        self.labels = meta.labels(self.name, "server", meta.SPEC_DECODE_LABEL)
        self.selector = meta.selector_labels(self.name, "server", meta.SPEC_DECODE_LABEL)

    def deployment(
        self, draft: dict[str, Any] | None, replicas: int, track: str = "stable"
    ) -> tuple[dict[str, Any], str | None]:
        """The vLLM Deployment of a track serving `draft` (a resolvedDraft record; None: the target
        alone). Both tracks' pods match the Service's selector; the canary's own selector adds its
        track label (the stable Deployment's selector predates tracks and is immutable)."""
        spec = self.sdd.spec
        name = self.name + (CANARY_SUFFIX if track == "canary" else "")
        selector = self.selector | ({TRACK_LABEL: track} if track == "canary" else {})
        target = spec.target
        requests = DEFAULT_REQUESTS | dict(target.resources.requests)
        target = target.model_copy(
            update={"resources": target.resources.model_copy(update={"requests": requests})}
        )
        mounts = Mounts()
        model = model_location(target.model, "target", mounts)
        args = vllm_args(target, model, spec.served_model_name or target.model)
        template_metadata: dict[str, Any] = {"labels": self.labels | {TRACK_LABEL: track}}
        draft_path = None
        if draft:
            draft_path = model_location(draft["uri"], "draft", mounts)
            speculation = applied_speculation(spec, draft.get("speculationSchedule"))
            args += [
                "--speculative-config",
                speculative_config(draft_path, spec.draft.revision, spec, speculation),
            ]
            if "draftTraining" in draft:
                export_id = draft.get("digest") or draft["draftTraining"].get("uid", "")
                template_metadata["annotations"] = {DRAFT_EXPORT_ANNOTATION: export_id}
        startup_s = spec.rollout.startup_timeout_seconds
        startup_failures = -(-startup_s // PROBE_PERIOD_S)
        pod_spec = vllm_pod_spec(target, args, mounts, PodPolicy.of(spec), startup_failures)
        template = {"metadata": template_metadata, "spec": pod_spec}
        revision = content_hash(template)
        template_metadata["annotations"] = template_metadata.get("annotations", {}) | {
            REVISION_ANNOTATION: revision
        }
        metadata = meta.object_meta(self.body, name, self.labels)
        metadata["annotations"] = {meta.TEMPLATE_HASH_ANNOTATION: revision}
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": metadata,
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": selector},
                "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {
                        "maxSurge": int_or_percent(spec.rollout.max_surge),
                        "maxUnavailable": int_or_percent(spec.rollout.max_unavailable),
                    },
                },
                "progressDeadlineSeconds": startup_failures * PROBE_PERIOD_S + PROGRESS_DEADLINE_SLACK_S,
                "template": template,
            },
        }
        return deployment, draft_path

    def disruption_budget(self) -> list[dict[str, Any]]:
        budget = self.sdd.spec.disruption_budget
        if not budget.enabled:
            return []
        return [
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": meta.object_meta(self.body, self.name, self.labels),
                "spec": {
                    "selector": {"matchLabels": self.selector},
                    "maxUnavailable": int_or_percent(budget.max_unavailable),
                },
            }
        ]

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
        old = self.body.get("status") or {}
        # What the pods served so far, as resolve_draft records it (the in-pod path is derived).
        served = {k: v for k, v in (old.get("resolvedDraft") or {}).items() if k != "model"} or None
        draft = resolve_draft(self.sdd, self.observed.draft_training, served)
        # A new draft serves only once verified (spec.verification); until then the pods keep theirs.
        now = iso(self.observed.now)
        checked = verification.gate(
            self.body,
            self.sdd,
            draft.draft,
            served,
            self.observed.verify_jobs,
            self.observed.verify_pods,
            now,
        )
        draft = dataclasses.replace(draft, draft=checked.serve)
        plan.create += checked.jobs
        # Then it rolls out: at once, or first to a canary track (spec.rollout).
        rollout = self._rollout(draft.draft, served, old.get("canary"))
        deployment, draft_path = self.deployment(rollout.stable_draft, rollout.stable_replicas)
        svc_meta = meta.object_meta(self.body, self.name, self.labels)
        if spec.service.annotations:
            svc_meta["annotations"] = dict(spec.service.annotations)
        plan.sync += [
            deployment,
            service(svc_meta, self.selector, spec.service.port, type=spec.service.type),
            *self.disruption_budget(),
            *self.monitors(),
        ]
        if rollout.canary_draft is not None:
            plan.sync.append(self.deployment(rollout.canary_draft, rollout.canary_replicas, "canary")[0])
        if rollout.delete_canary:
            plan.delete.append(
                {"apiVersion": "apps/v1", "kind": "Deployment", "name": self.name + CANARY_SUFFIX}
            )
        status = copy.deepcopy(old)
        tracks = [d for d in (self.observed.deployment, self.observed.canary_deployment) if d]
        ready = sum((d.get("status") or {}).get("readyReplicas") or 0 for d in tracks)
        status |= {
            "observedGeneration": self.body["metadata"].get("generation"),
            "replicas": sum((d.get("status") or {}).get("replicas") or 0 for d in tracks),
            "readyReplicas": ready,
            "selector": ",".join(f"{k}={v}" for k, v in sorted(self.selector.items())),
            "endpoint": f"http://{self.name}.{self.namespace}.svc:{spec.service.port}/v1",
        }
        status.pop("resolvedDraft", None)
        status.pop("speculation", None)
        if rollout.stable_draft:
            status["resolvedDraft"] = {"model": draft_path, **rollout.stable_draft}
            # What the stable track applies (a canary's draft may bring another schedule).
            status["speculation"] = applied_speculation(spec, rollout.stable_draft.get("speculationSchedule"))
        conditions = list(status.get("conditions") or [])
        gen = self.body["metadata"].get("generation")
        verification.apply_gate(checked, status, conditions, gen, now)
        plan.events += checked.events
        previous = get_condition(conditions, "DraftResolved")
        set_condition(conditions, "DraftResolved", draft.resolved, draft.reason, draft.message, gen, now)
        # A canary already under way (or rolled back) for this draft was announced when it started.
        announced = (old.get("canary") or {}).get("draft")
        acknowledged = announced is not None and same_export(announced, draft.draft)
        plan.events += self._draft_events(draft, previous, draft.draft if acknowledged else served)
        self._record_rollout(rollout, status, conditions, plan)
        self._live_acceptance(status, conditions, rollout.stable_draft, deployment, plan)
        available, reason, message = self._availability(ready)
        progressing, progress_reason, progress_message = self._progressing(
            deployment, rollout.stable_replicas
        )
        for type_, status_, problem in self._stuck(available, progressing):
            if (get_condition(conditions, type_) or {}).get("reason") != problem.reason and not any(
                e.reason == problem.reason for e in plan.events
            ):
                plan.events.append(Event("Warning", problem.reason, problem.message))
            if type_ == "Available":
                reason, message = problem.reason, f"{message}: {problem.message}"
            else:
                progressing, progress_reason, progress_message = status_, problem.reason, problem.message
        set_condition(conditions, "Available", available, reason, message, gen, now)
        set_condition(conditions, "Progressing", progressing, progress_reason, progress_message, gen, now)
        if self.observed.refused:
            plan.requeue_after = min(plan.requeue_after or REFUSAL_RETRY_S, REFUSAL_RETRY_S)
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

    def _rollout(
        self, candidate: dict[str, Any] | None, stable: dict[str, Any] | None, state: dict[str, Any] | None
    ) -> RolloutPlan:
        """What each track serves (reconcile/canary.py decides; RollingUpdate is one stable track)."""

        def revision(draft: dict[str, Any] | None, track: str) -> str:
            built, _ = self.deployment(draft, 0, track)
            return built["metadata"]["annotations"][meta.TEMPLATE_HASH_ANNOTATION]

        return plan_rollout(
            RolloutInputs(
                spec=self.sdd.spec,
                annotations=self.body["metadata"].get("annotations") or {},
                stable=stable,
                candidate=candidate,
                state=state,
                stable_deployment=self.observed.deployment,
                canary_deployment=self.observed.canary_deployment,
                canary_pods=[
                    p
                    for p in self.observed.pods
                    if (p["metadata"].get("labels") or {}).get(TRACK_LABEL) == "canary"
                ],
                history=self.observed.counters,
                now=self.observed.now,
                revision=revision,
            )
        )

    def _record_rollout(
        self, rollout: RolloutPlan, status: dict[str, Any], conditions: list[dict[str, Any]], plan: Plan
    ) -> None:
        """status.canary, status.rejectedDrafts, the canary conditions and Events."""
        if rollout.state is None:
            status.pop("canary", None)
        else:
            status["canary"] = rollout.state
        if rollout.rejected:
            status["rejectedDrafts"] = [*(status.get("rejectedDrafts") or []), rollout.rejected]
        gen, now = self.body["metadata"].get("generation"), iso(self.observed.now)
        for type_, status_, reason, message in rollout.conditions:
            set_condition(conditions, type_, status_, reason, message, gen, now)
        plan.events += rollout.events
        if rollout.state and rollout.state["phase"] in ("Analyzing", "Promoting"):
            interval = self.sdd.spec.live_acceptance.interval_seconds
            plan.requeue_after = min(plan.requeue_after or interval, interval)

    def _live_acceptance(
        self,
        status: dict[str, Any],
        conditions: list[dict[str, Any]],
        draft: dict[str, Any] | None,
        deployment: dict[str, Any],
        plan: Plan,
    ) -> None:
        """status.liveAcceptance from the counter reads, and DraftDegraded for the current revision."""
        live = self.sdd.spec.live_acceptance
        history = self.observed.counters
        if not live.enabled or history is None or draft is None:
            status.pop("liveAcceptance", None)
            status.pop("liveAcceptanceLength", None)
            conditions[:] = [c for c in conditions if c["type"] != "DraftDegraded"]
            return
        current = deployment["metadata"]["annotations"][meta.TEMPLATE_HASH_ANNOTATION]
        figures = revision_figures(history, live.window_seconds, self.observed.now)
        figures.sort(key=lambda f: (f["revision"] != current, f["revision"]))
        if figures:
            status["liveAcceptance"] = figures
        else:
            status.pop("liveAcceptance", None)
        mine = next((f for f in figures if f["revision"] == current), None)
        if mine and "meanAcceptanceLength" in mine:
            status["liveAcceptanceLength"] = mine["meanAcceptanceLength"]
        else:
            status.pop("liveAcceptanceLength", None)
        verdict = degradation(
            mine,
            draft.get("acceptanceLength"),
            ratio=live.degraded_ratio,
            window_s=live.window_seconds,
            min_drafts=live.min_drafts,
        )
        was_degraded = (get_condition(conditions, "DraftDegraded") or {}).get("status") == "True"
        set_condition(
            conditions,
            "DraftDegraded",
            verdict.status,
            verdict.reason,
            verdict.message,
            self.body["metadata"].get("generation"),
            iso(self.observed.now),
        )
        if verdict.status == "True" and not was_degraded:
            plan.events.append(Event("Warning", "DraftDegraded", verdict.message))
        elif verdict.status == "False" and was_degraded:
            plan.events.append(Event("Normal", "DraftRecovered", verdict.message))
        if self.sdd.spec.replicas:
            plan.requeue_after = min(plan.requeue_after or live.interval_seconds, live.interval_seconds)

    @staticmethod
    def _draft_events(
        draft: DraftResolution, previous: dict[str, Any] | None, served: dict[str, Any] | None
    ) -> list[Event]:
        """An Event when the draft changes or stops resolving; none on the first reconcile's success."""
        if draft.resolved:
            if previous is None:
                return []
            if not same_export(served, draft.draft):
                replaced = f" (replaces {served['uri']})" if served and "uri" in served else ""
                return [Event("Normal", "DraftResolved", f"rolling in {draft.message}{replaced}")]
            if previous.get("status") != "True":
                return [
                    Event("Normal", "DraftResolved", f"{draft.message} resolves again; nothing to roll out")
                ]
            return []
        if (previous or {}).get("reason") == draft.reason:
            return []
        # Losing a source is a Warning whether or not a pinned draft covers for it; waiting is not.
        warning = draft.pinned or draft.reason == "DraftTrainingFailed"
        return [Event("Warning" if warning else "Normal", draft.reason, draft.message)]

    def _stuck(self, available: bool, progressing: bool) -> list[tuple[str, bool, Problem]]:
        """(condition, its status, problem) for what holds the vLLM pods back: a refused write or a
        deadline stops Progressing; a stuck pod explains why replicas are not Available, or why a
        rollout is still Progressing."""
        found = []
        pods = first_pod_problem(self.observed.pods)
        deployment = deployment_problem(self.observed.deployment)
        if self.observed.refused:
            found.append(("Progressing", False, self.observed.refused[0].problem()))
        elif deployment and deployment.reason == "ProgressDeadlineExceeded":
            found.append(("Progressing", False, deployment))
        elif progressing and (pods or deployment):
            found.append(("Progressing", True, pods or deployment))
        if not available and self.sdd.spec.replicas and (pods or deployment):
            found.append(("Available", False, pods or deployment))
        return found

    def _availability(self, ready: int) -> tuple[bool, str, str]:
        wanted = self.sdd.spec.replicas
        if wanted == 0:
            return False, "ScaledToZero", "replicas is 0"
        if ready >= 1:
            return True, "ReplicasReady", f"{ready}/{wanted} vLLM replicas ready"
        return False, "NoReadyReplicas", f"0/{wanted} vLLM replicas ready"

    def _progressing(self, desired: dict[str, Any], wanted: int) -> tuple[bool, str, str]:
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
