"""SpecDecodeDeployment: a vLLM service of a target model with an EAGLE-3 draft."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from eagle3_api.base import FREE_FORM_OBJECT, ApiModel, DnsName, StringMap, cel, section
from eagle3_api.common import (
    CONDITIONS_FIELD,
    Condition,
    ImagePullSecrets,
    ModelRef,
    NetworkPolicySpec,
    PodSecuritySpec,
    SchedulingSpec,
    TargetSpec,
    image_pull_secrets_field,
)
from eagle3_api.draft_training import DEFAULT_RUNTIME_IMAGE, PromptSource

KIND = "SpecDecodeDeployment"
PLURAL = "specdecodedeployments"


# An integer 1..16 or "auto" (x-kubernetes-int-or-string; the CEL rule checks either form).
NumSpeculativeTokens = Annotated[int, Field(ge=1, le=16)] | Literal["auto"]
NUM_SPECULATIVE_TOKENS_SCHEMA = {
    "x-kubernetes-int-or-string": True,
    "x-kubernetes-validations": [
        cel(
            "type(self) == int ? (self >= 1 && self <= 16) : self == 'auto'",
            'numSpeculativeTokens must be an integer from 1 to 16, or "auto"',
        )
    ],
}
# vLLM's --speculative-config keys that the operator sets itself.
RESERVED_SPECULATIVE_KEYS = (
    "method",
    "model",
    "revision",
    "num_speculative_tokens",
    "num_speculative_tokens_per_batch_size",
)
# Values are strings, each read as JSON where it parses ("1" -> 1, "true" -> true): a map of strings,
# unlike a free-form object, lets CEL look its keys up.
SPECULATIVE_CONFIG_SCHEMA = {
    "x-kubernetes-validations": [
        cel(
            " && ".join(f"!('{key}' in self)" for key in RESERVED_SPECULATIVE_KEYS),
            "speculativeConfig must not set " + ", ".join(RESERVED_SPECULATIVE_KEYS) + ": the operator sets "
            "them from spec.draft and spec.numSpeculativeTokens",
        )
    ],
}


# K per batch size, vLLM's num_speculative_tokens_per_batch_size as `eagle3 sweep` writes it.
SpeculationScheduleRanges = Annotated[
    list[Annotated[list[Annotated[int, Field(ge=0, le=1_000_000)]], Field(min_length=3, max_length=3)]],
    Field(min_length=1, max_length=64),
]
SPECULATION_SCHEDULE_SCHEMA = {
    "x-kubernetes-validations": [
        cel(
            "self.all(r, r[0] >= 1 && r[0] <= r[1])",
            "each speculationSchedule range is [first batch size, last batch size, K] with 1 <= first <= last",
        ),
        cel("self[0][0] == 1", "the first speculationSchedule range must start at batch size 1"),
    ]
}


class AppliedSpeculation(ApiModel):
    """numSpeculativeTokens as the pods serve it."""

    mode: Literal["Static", "Schedule", "ScheduleAtExpectedConcurrency", "NoSchedule"] = Field(
        description="Static: the spec's K. Schedule: vLLM's per-batch-size schedule. "
        "ScheduleAtExpectedConcurrency: the schedule's K at expectedConcurrency. NoSchedule: auto, "
        "but the draft has no sweep schedule, so the default K is served."
    )
    num_speculative_tokens: int = Field(
        description="vLLM num_speculative_tokens (the largest K of a schedule)."
    )
    schedule: list[list[int]] | None = Field(
        None,
        description="num_speculative_tokens_per_batch_size, when vLLM serves the schedule per batch size "
        "(a schedule with one K everywhere is served as that static K).",
    )
    message: str = Field(description="Where the K came from.")


class DraftSource(ApiModel):
    """The draft: a model id/path, or the exported draft of a DraftTraining (exactly one)."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel(
                    "has(self.model) != has(self.fromDraftTraining)",
                    "set exactly one of draft.model or draft.fromDraftTraining",
                )
            ]
        }
    }

    model: ModelRef | None = Field(
        None, description="Draft checkpoint: Hugging Face id or pvc://CLAIM/PATH (vLLM eagle3 format)."
    )
    revision: Annotated[str, Field(max_length=128)] | None = Field(
        None, description="Draft revision for Hugging Face ids."
    )
    from_draft_training: DnsName | None = Field(
        None,
        description="Name of a DraftTraining in this namespace; its exported draft is used once it succeeds, "
        "and kept (status.resolvedDraft) when it is later deleted, re-opened or fails.",
    )
    acceptance_length: Annotated[float, Field(ge=1, le=65)] | None = Field(
        None,
        description="Mean acceptance length the draft reached when it was evaluated, for a draft.model "
        "(a DraftTraining's export carries its own); liveAcceptance.degradedRatio compares against it.",
    )
    speculation_schedule: SpeculationScheduleRanges | None = Field(
        None,
        description="The draft's K per batch size, [first batch size, last batch size, K] ranges as "
        "`eagle3 sweep` measured them (speculation_schedule in its eagle3-export.json), for a draft.model "
        "with numSpeculativeTokens: auto (a DraftTraining's export carries its own).",
        json_schema_extra=SPECULATION_SCHEDULE_SCHEMA,
    )


class ServiceSpec(ApiModel):
    """The Service in front of the vLLM pods."""

    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field("ClusterIP", description="Service type.")
    port: Annotated[int, Field(ge=1, le=65535)] = Field(8000, description="Service port (OpenAI API).")
    annotations: StringMap = Field(default_factory=dict, description="Annotations of the Service.")


class MonitoringSpec(ApiModel):
    """Prometheus Operator objects for vLLM's /metrics (made only when their CRDs exist)."""

    service_monitor: bool = Field(True, description="Create a ServiceMonitor.")
    pod_monitor: bool = Field(False, description="Create a PodMonitor.")
    interval: Annotated[str, Field(max_length=16, pattern=r"^[0-9]+(ms|s|m|h)$")] = Field(
        "30s", description="Scrape interval."
    )
    additional_labels: StringMap = Field(
        default_factory=dict, description="Labels for the monitors (e.g. release: kube-prometheus-stack)."
    )


# An integer or a percentage, as Deployments and PodDisruptionBudgets take them ("1", "25%").
IntOrPercent = Annotated[str, Field(max_length=8, pattern=r"^[0-9]+%?$")]


class CanaryGates(ApiModel):
    """What the canary must measure against the stable track over its analysis window."""

    min_acceptance_ratio: Annotated[float, Field(gt=0, le=2)] = Field(
        0.9,
        description="Rolled back when canary / stable mean acceptance length is below this (early, once the "
        "95% upper confidence bound of the ratio is below it).",
    )
    max_latency_ratio: Annotated[float, Field(ge=1, le=100)] = Field(
        1.25,
        description="Rolled back when canary / stable mean inter-token latency (vLLM's "
        "inter_token_latency_seconds) is above this.",
    )
    max_error_rate: Annotated[float, Field(ge=0, le=1)] = Field(
        0.01,
        description="Rolled back when the canary's share of 5xx responses (vLLM's http_requests_total) is "
        "above this.",
    )


class CanarySpec(ApiModel):
    """A new draft first serves from a few pods beside the stable ones, and is judged on live counters."""

    replicas: Annotated[int, Field(ge=1, le=1000)] = Field(
        1,
        description="Pods taken from the stable track to serve the new draft (stable runs replicas - this): "
        "no spare GPU is needed.",
    )
    analysis_seconds: Annotated[int, Field(ge=20, le=86_400)] = Field(
        300,
        description="The window the canary is judged over; promotion waits for a full one (rollback may "
        "come earlier).",
    )
    min_drafts: Annotated[int, Field(ge=1, le=100_000_000)] = Field(
        200, description="Drafts each track needs in the window before anything is decided."
    )
    gates: CanaryGates = section(CanaryGates, "What the canary must measure against the stable track.")
    promotion: Literal["Auto", "Manual"] = Field(
        "Auto",
        description="Auto: promote once the gates hold over a full window. Manual: then wait for the "
        "annotation eagle3.ai/promote-canary set to status.canary.revision (a failed gate still rolls back).",
    )


class RolloutSpec(ApiModel):
    """How a new pod template (a new draft, a changed spec) replaces the running vLLM pods."""

    strategy: Literal["RollingUpdate", "Canary"] = Field(
        "RollingUpdate",
        description="RollingUpdate: a new draft replaces the pods at once. Canary: a new draft first serves "
        "from rollout.canary.replicas pods and is promoted or rolled back on its live counters.",
    )
    canary: CanarySpec = section(CanarySpec, "The canary analysis (strategy Canary).")
    max_surge: IntOrPercent = Field(
        "25%",
        description="Pods above replicas during a rollout (a count or a percentage; 0 needs no spare GPU).",
    )
    max_unavailable: IntOrPercent = Field(
        "0", description="Pods below replicas during a rollout (a count or a percentage)."
    )
    startup_timeout_seconds: Annotated[int, Field(ge=60, le=86_400)] = Field(
        1800,
        description="How long a vLLM pod may take to download and load its models before its startup probe "
        "fails; the Deployment reports ProgressDeadlineExceeded 600 s after that.",
    )


class DisruptionBudgetSpec(ApiModel):
    """The PodDisruptionBudget that limits voluntary evictions (node drains) of the vLLM pods."""

    enabled: bool = Field(True, description="Create the PodDisruptionBudget.")
    max_unavailable: IntOrPercent = Field(
        "1", description="vLLM pods a drain may evict at once (a count or a percentage)."
    )


class LiveAcceptanceSpec(ApiModel):
    """Live acceptance: the operator reads the vLLM pods' speculative-decoding counters."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                # The section's `default: {}` is checked before its fields are defaulted.
                cel(
                    "(has(self.windowSeconds) ? self.windowSeconds : 300)"
                    " >= 2 * (has(self.intervalSeconds) ? self.intervalSeconds : 30)",
                    "liveAcceptance.windowSeconds must be at least twice intervalSeconds",
                )
            ]
        }
    }

    enabled: bool = Field(True, description="Read the counters and report live acceptance in status.")
    prometheus_url: Annotated[str, Field(max_length=512, pattern=r"^https?://")] | None = Field(
        None,
        description="Query this Prometheus (its base URL) for the counters instead of reading each pod's "
        "/metrics; its series must carry the namespace and specdecodedeployment labels (the monitors' "
        "relabelling) and the pod label.",
    )
    interval_seconds: Annotated[int, Field(ge=5, le=3600)] = Field(
        30, description="How often the counters are read."
    )
    window_seconds: Annotated[int, Field(ge=10, le=86_400)] = Field(
        300, description="The window that live figures (and DraftDegraded) are computed over."
    )
    degraded_ratio: Annotated[float, Field(gt=0, le=1)] = Field(
        0.8,
        description="DraftDegraded turns True when the live mean acceptance length over a full window is "
        "below this fraction of the draft's evaluated acceptance length.",
    )
    min_drafts: Annotated[int, Field(ge=1, le=100_000_000)] = Field(
        100, description="Drafts a window needs before DraftDegraded is judged."
    )


class VerificationSpec(ApiModel):
    """The correctness check a new draft passes before it serves (`eagle3 verify` in a Job)."""

    enabled: bool = Field(
        False,
        description="Verify every newly resolved draft before it rolls out; the check's Job needs the "
        "target's GPUs for a while, so it is opted into.",
    )
    image: Annotated[str, Field(min_length=1, max_length=512)] = Field(
        DEFAULT_RUNTIME_IMAGE, description="eagle3 runtime image (with vLLM) that runs the check."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Image pull policy of the check's pod."
    )
    prompts: Annotated[list[PromptSource], Field(max_length=8)] = Field(
        default_factory=list,
        description="Prompts on PVCs (chat prompts are asked their first turn); a built-in set of short "
        "completions when empty.",
    )
    num_prompts: Annotated[int, Field(ge=1, le=10_000)] = Field(16, description="Prompts compared.")
    max_tokens: Annotated[int, Field(ge=1, le=32_768)] = Field(64, description="Tokens generated per prompt.")
    max_flips: Annotated[int, Field(ge=0, le=10_000)] = Field(
        1,
        description="Prompts whose outputs may differ at a near tie (the target's top-2 logprobs within "
        "flipTolerance at the first difference); any other difference fails the check.",
    )
    flip_tolerance: Annotated[float, Field(ge=0, le=10)] = Field(
        0.1, description="Largest top-1 minus top-2 logprob difference that counts as a near tie."
    )
    min_acceptance_length: Annotated[float, Field(ge=1, le=65)] = Field(
        1.0,
        description="Floor of the mean acceptance length from vLLM's spec-decode counters during the check.",
    )
    deadline_seconds: Annotated[int, Field(ge=60, le=86_400)] = Field(
        3600, description="The check's Job fails (and the draft with it) when still running after this long."
    )


class VerificationStatus(ApiModel):
    """The check of the newest resolved draft."""

    digest: str | None = Field(None, description="Content digest of the draft checked, when known.")
    uri: str = Field(description="The draft checked (see resolvedDraft.uri).")
    result: Literal["Running", "Passed", "Failed"] = Field(description="Where the check stands.")
    job: str = Field(description="The Job that runs the check.")
    identical: int | None = Field(None, description="Prompts whose outputs were identical with the draft.")
    flips: int | None = Field(None, description="Prompts that differed at a near tie.")
    mismatches: int | None = Field(None, description="Prompts that differed otherwise.")
    acceptance_length: float | None = Field(None, description="Mean acceptance length during the check.")
    message: str = Field("", description="The check's one-line verdict.")
    draft_spec: str = Field(
        description="Hash of spec.draft when checked: a change of it retries rejected drafts."
    )


class SpecDecodeDeploymentSpec(ApiModel):
    """A vLLM Deployment that serves the target with speculative decoding by an EAGLE-3 draft."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel(
                    "!has(self.rollout) || !has(self.rollout.strategy) || self.rollout.strategy != 'Canary'"
                    " || (has(self.replicas) ? self.replicas : 1)"
                    " > (has(self.rollout.canary) && has(self.rollout.canary.replicas)"
                    " ? self.rollout.canary.replicas : 1)",
                    "rollout.strategy Canary needs replicas above rollout.canary.replicas (the canary takes "
                    "its pods from the stable ones)",
                    field_path=".replicas",
                )
            ]
        }
    }

    target: TargetSpec = Field(description="The target model and its vLLM pods.")
    draft: DraftSource = Field(description="The EAGLE-3 draft.")
    num_speculative_tokens: NumSpeculativeTokens = Field(
        3,
        description="Tokens the draft proposes per step (vLLM num_speculative_tokens), or auto: the draft's "
        "sweep schedule (K per batch size, K = 0 off), served through vLLM's "
        "num_speculative_tokens_per_batch_size, or as the schedule's K at expectedConcurrency.",
        json_schema_extra=NUM_SPECULATIVE_TOKENS_SCHEMA,
    )
    expected_concurrency: Annotated[int, Field(ge=1, le=4096)] | None = Field(
        None,
        description="With numSpeculativeTokens: auto, serve the schedule's K at this many concurrent "
        "requests as a static K instead of vLLM's per-batch-size schedule (for vLLM builds without it, "
        "or data-parallel serving, which turns it off).",
    )
    speculative_config: StringMap = Field(
        default_factory=dict,
        description='More keys of vLLM\'s --speculative-config (e.g. draft_tensor_parallel_size: "1"), '
        'merged into what the operator sets; each value is read as JSON where it parses ("1" is a '
        'number, "true" a boolean, "[1, 2]" a list), else passed as a string. method, model, revision, '
        "num_speculative_tokens and num_speculative_tokens_per_batch_size come from spec.draft and "
        "spec.numSpeculativeTokens.",
        json_schema_extra=SPECULATIVE_CONFIG_SCHEMA,
    )
    replicas: Annotated[int, Field(ge=0, le=1000)] = Field(
        1, description="vLLM pods; the scale subresource (HPA, KEDA, kubectl scale) sets this."
    )
    served_model_name: Annotated[str, Field(max_length=256)] | None = Field(
        None, description="Model name in the OpenAI API; the target model when unset."
    )
    service: ServiceSpec = section(ServiceSpec, "The Service.")
    scheduling: SchedulingSpec = section(SchedulingSpec, "Scheduling of the vLLM pods.")
    pod_security: PodSecuritySpec = section(PodSecuritySpec, "Security settings of the pods.")
    image_pull_secrets: ImagePullSecrets = image_pull_secrets_field()
    monitoring: MonitoringSpec = section(MonitoringSpec, "ServiceMonitor / PodMonitor toggles.")
    rollout: RolloutSpec = section(
        RolloutSpec, "Rolling update or canary, and start-up budget of the vLLM pods."
    )
    disruption_budget: DisruptionBudgetSpec = section(
        DisruptionBudgetSpec, "PodDisruptionBudget of the vLLM pods."
    )
    live_acceptance: LiveAcceptanceSpec = section(
        LiveAcceptanceSpec, "Live acceptance from vLLM's counters and the DraftDegraded condition."
    )
    verification: VerificationSpec = section(
        VerificationSpec, "The correctness check (greedy outputs, acceptance floor) before a draft serves."
    )
    network_policy: NetworkPolicySpec = section(
        NetworkPolicySpec,
        "A NetworkPolicy that admits to the vLLM pods only allowedClients (and each other).",
    )


class DraftTrainingRef(ApiModel):
    """The DraftTraining whose export the pods serve."""

    name: str = Field(description="Its name.")
    uid: str | None = Field(
        None, description="Its uid (a re-created DraftTraining of the same name has another)."
    )
    generation: int | None = Field(
        None,
        description="Its observedGeneration when the export was first resolved (the spec that exported it).",
    )


class ResolvedDraft(ApiModel):
    """The draft the vLLM pods load, pinned: kept while its DraftTraining is deleted, re-opened or failed."""

    model: str = Field(description="What vLLM loads: a Hugging Face id or a path inside the pod.")
    uri: str = Field(
        description="The draft as resolved: pvc://CLAIM/PATH (claim and path of the export) or a Hugging Face id."
    )
    source: str = Field(description="Where it came from (spec.draft.model, or DraftTraining/NAME).")
    draft_training: DraftTrainingRef | None = Field(
        None, description="The DraftTraining that exported it (drafts from spec.draft.fromDraftTraining)."
    )
    acceptance_length: float | None = Field(
        None, description="Acceptance length measured for this draft when it was evaluated, when known."
    )
    digest: str | None = Field(
        None, description="Content digest of the exported draft, when its DraftTraining's export records one."
    )
    speculation_schedule: list[list[int]] | None = Field(
        None, description="The draft's sweep schedule ([first batch size, last batch size, K]), when known."
    )


class MeasurementWindow(ApiModel):
    """The interval the live figures were measured over (counter deltas between two reads)."""

    start: str = Field(description="First read of the window (RFC 3339).")
    end: str = Field(description="Last read of the window (RFC 3339).")
    seconds: float = Field(description="end - start.")


class RevisionAcceptance(ApiModel):
    """Live speculative-decoding figures of the pods of one pod-template revision."""

    revision: str = Field(description="The pod template's revision (annotation eagle3.ai/revision).")
    draft: str | None = Field(None, description="The draft those pods serve (digest, or what identifies it).")
    pods: int = Field(description="Pods whose counters were read.")
    mean_acceptance_length: float | None = Field(
        None, description="1 + accepted / drafts over the window (vLLM's definition); none without drafts."
    )
    per_position_acceptance: list[float] = Field(
        default_factory=list, description="Accepted tokens at draft position i per draft, over the window."
    )
    generated_tokens_per_second: float = Field(description="Output tokens per second over the window.")
    drafts: int = Field(description="Drafts proposed in the window.")
    window: MeasurementWindow = Field(description="What the figures were measured over.")


class RejectedDraft(ApiModel):
    """A draft the operator refused to serve, and why (it is not tried again until spec.draft changes)."""

    digest: str | None = Field(None, description="Content digest of the rejected draft, when known.")
    uri: str = Field(description="The draft as resolved (see resolvedDraft.uri).")
    phase: Literal["Verification", "Canary"] = Field(
        description="What rejected it: the correctness check before rollout, or the canary analysis."
    )
    reason: str = Field(description="CamelCase reason, as in the condition that reported it.")
    message: str = Field(description="What was measured against which gate.")
    rejected_at: str = Field(description="When (RFC 3339).")


class TrackFigures(ApiModel):
    """What one track measured over the canary's analysis window."""

    revision: str = Field(description="The track's pod-template revision.")
    pods: int = Field(description="Pods whose counters were read.")
    drafts: int = Field(description="Drafts proposed in the window.")
    mean_acceptance_length: float | None = Field(None, description="1 + accepted / drafts.")
    inter_token_latency_seconds: float | None = Field(
        None, description="Mean inter-token latency (vLLM's histogram sum / count)."
    )
    requests: int = Field(description="HTTP API requests answered.")
    errors: int = Field(description="Of those, 5xx responses.")
    window_seconds: float = Field(description="Seconds of reads the figures span.")


class CanaryStatus(ApiModel):
    """The latest canary: the draft it serves, where its analysis stands, and how it ended."""

    phase: Literal["Analyzing", "Promoting", "Promoted", "RolledBack"] = Field(
        description="Analyzing: canary and stable serve side by side; Promoting: the stable track moves to "
        "the draft; Promoted or RolledBack: done."
    )
    draft: dict[str, Any] = Field(
        description="The canary's draft, as status.resolvedDraft records one.",
        json_schema_extra=FREE_FORM_OBJECT,
    )
    draft_spec: str = Field(
        description="Hash of spec.draft when it started (a rolled-back draft waits for a change)."
    )
    revision: str | None = Field(
        None, description="The canary's pod-template revision (what Manual promotion names)."
    )
    started_at: str = Field(description="When the canary started (RFC 3339).")
    decided_at: str | None = Field(None, description="When it was promoted or rolled back.")
    reason: str = Field(description="CamelCase reason of the latest verdict.")
    message: str = Field(description="The latest verdict with the measured numbers.")
    canary: TrackFigures | None = Field(None, description="The canary track's figures.")
    stable: TrackFigures | None = Field(None, description="The stable track's figures over the same window.")


class SpecDecodeDeploymentStatus(ApiModel):
    """Observed state of the service."""

    observed_generation: int | None = Field(None, description="Latest metadata.generation acted upon.")
    replicas: int | None = Field(None, description="vLLM pods (scale subresource statusReplicasPath).")
    ready_replicas: int | None = Field(None, description="vLLM pods ready to serve.")
    selector: str | None = Field(None, description="Label selector of the pods (scale subresource).")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Available, Progressing, DraftResolved, DraftDegraded, DraftVerified, and with a canary "
        "CanaryProgressing, Promoted and RolledBack.",
        json_schema_extra=CONDITIONS_FIELD,
    )
    resolved_draft: ResolvedDraft | None = Field(
        None,
        description="The draft the pods serve; absent while the target is served alone. A change of spec.draft "
        "resets it; a newer successful export of the DraftTraining replaces it.",
    )
    endpoint: str | None = Field(None, description="OpenAI-compatible base URL inside the cluster.")
    live_acceptance: list[RevisionAcceptance] = Field(
        default_factory=list,
        description="Live figures per pod-template revision with pods in the window, the current one first.",
    )
    live_acceptance_length: float | None = Field(
        None, description="Live mean acceptance length of the current revision (the printer column)."
    )
    verification: VerificationStatus | None = Field(
        None, description="The check of the newest resolved draft (spec.verification)."
    )
    rejected_drafts: list[RejectedDraft] = Field(
        default_factory=list,
        description="Drafts refused by verification or rolled back by the canary analysis, newest last.",
    )
    speculation: AppliedSpeculation | None = Field(
        None, description="How many tokens the draft proposes, as served (numSpeculativeTokens applied)."
    )
    canary: CanaryStatus | None = Field(
        None, description="The latest canary rollout (spec.rollout.strategy Canary)."
    )


class SpecDecodeDeployment(ApiModel):
    """Serves a target model with vLLM and an EAGLE-3 draft on AMD GPUs."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel(
                    "size(self.metadata.name) <= 50",
                    "metadata.name must be at most 50 characters (child names derive from it)",
                    reason="FieldValueInvalid",
                ),
            ]
        }
    }

    api_version: str = Field(description="eagle3.ai/v1alpha1")
    kind: str = Field(description="SpecDecodeDeployment")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: SpecDecodeDeploymentSpec = Field(description="Desired service.")
    status: SpecDecodeDeploymentStatus = Field(
        default_factory=SpecDecodeDeploymentStatus, description="Observed service."
    )
