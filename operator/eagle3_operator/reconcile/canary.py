"""Canary rollout of a new draft: the statistical rule that judges it, and the state machine of tracks.

With `spec.rollout.strategy: Canary` a new draft (another digest) first serves from
`rollout.canary.replicas` pods (the canary track, Deployment `<name>-canary`) taken from the stable
track (`<name>`, which runs replicas - canary), both behind the one Service. The operator's counter
reads (live_acceptance) give each track's deltas over the analysis window; `analyse` decides:

- Nothing is decided until both tracks have at least `minDrafts` drafts in the window.
- Acceptance: per draft, the accepted count X is the number of positions accepted, and positions
  are nested (position i accepted implies every earlier one), so with p_i = accepted_at_i / drafts
  the mean is E[X] = sum p_i and E[X^2] = sum (2i+1) p_i (i from 0). The mean acceptance length
  1 + E[X] has standard error sqrt(Var X / drafts); the ratio canary/stable gets a delta-method
  standard error, and a one-sided 95 % bound (z = 1.645) on each side.
  Rolled back as soon as the upper bound is below `minAcceptanceRatio` (confidently worse).
- Errors: 5xx responses of the canary's OpenAI API as binomial counts; rolled back as soon as the
  Wilson 95 % lower bound of its error rate is above `maxErrorRate`.
- Once the canary's reads span the window (0.9 x `analysisSeconds`, one read interval of slack),
  the point estimates decide: promoted when the acceptance ratio is at least `minAcceptanceRatio`,
  the error rate at most `maxErrorRate` and the mean inter-token latency ratio at most
  `maxLatencyRatio` (not judged while either track has no latency samples); rolled back otherwise.
- A canary that cannot start is rolled back without data: a canary pod in CrashLoopBackOff (vLLM
  refusing the draft, say), or the canary Deployment past its progress deadline (the start-up
  budget and its slack). It holds one of the stable track's pods, so waiting costs capacity.

Pure functions; serving.py builds the Deployments this decides.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from eagle3_api.spec_decode_deployment import CanarySpec, SpecDecodeDeploymentSpec
from eagle3_api.workspace import content_hash
from eagle3_operator.reconcile import meta
from eagle3_operator.reconcile.live_acceptance import History, PodCounters, revision_deltas
from eagle3_operator.reconcile.plan import Event, iso
from eagle3_operator.reconcile.stuck import Problem, deployment_problem, pod_problem

TRACK_LABEL = "eagle3.ai/track"
# Manual promotion: the user sets this annotation to status.canary.revision.
PROMOTE_ANNOTATION = "eagle3.ai/promote-canary"
CANARY_SUFFIX = "-canary"
Z_ONE_SIDED_95 = 1.645
# One read interval of slack: reads are not exactly analysisSeconds apart.
FULL_WINDOW = 0.9
# A canary pod in one of these states will not serve on its own: judged without waiting for data.
FAILED_START_REASONS = {"CrashLoopBackOff", "ProgressDeadlineExceeded"}


@dataclass(frozen=True)
class TrackSample:
    """One track's counter deltas over the analysis window."""

    revision: str
    pods: int
    seconds: float
    counters: PodCounters


def track_sample(
    history: History | None, revision: str, window_s: float, now: datetime
) -> TrackSample | None:
    if history is None:
        return None
    found = revision_deltas(history, window_s, now).get(revision)
    if found is None:
        return None
    return TrackSample(revision, len(found.deltas), found.seconds, found.total())


def acceptance_length(counters: PodCounters) -> tuple[float, float]:
    """Mean acceptance length and its standard error, from per-position accepted counts."""
    drafts = counters.drafts
    rates = [min(1.0, a / drafts) for a in counters.accepted_per_position]
    mean_accepted = sum(rates)
    second_moment = sum((2 * i + 1) * p for i, p in enumerate(rates))
    variance = max(0.0, second_moment - mean_accepted**2)
    return 1 + mean_accepted, math.sqrt(variance / drafts)


def ratio_with_bounds(canary: PodCounters, stable: PodCounters) -> tuple[float, float, float]:
    """canary / stable mean acceptance length with its one-sided 95 % lower and upper bounds."""
    mean_c, se_c = acceptance_length(canary)
    mean_s, se_s = acceptance_length(stable)
    ratio = mean_c / mean_s
    se = ratio * math.hypot(se_c / mean_c, se_s / mean_s)
    return ratio, ratio - Z_ONE_SIDED_95 * se, ratio + Z_ONE_SIDED_95 * se


def wilson_lower_bound(events: float, trials: float) -> float:
    """One-sided 95 % Wilson lower bound of a binomial rate (0 without trials)."""
    if trials <= 0:
        return 0.0
    z2 = Z_ONE_SIDED_95**2
    rate = events / trials
    centre = rate + z2 / (2 * trials)
    spread = Z_ONE_SIDED_95 * math.sqrt(rate * (1 - rate) / trials + z2 / (4 * trials**2))
    return max(0.0, (centre - spread) / (1 + z2 / trials))


def mean_itl(counters: PodCounters) -> float | None:
    return counters.itl_sum / counters.itl_count if counters.itl_count else None


@dataclass(frozen=True)
class Verdict:
    decision: str  # "Wait", "Pass" or "Fail"
    reason: str
    message: str


def analyse(canary: TrackSample | None, stable: TrackSample | None, spec: CanarySpec) -> Verdict:
    """The rule of the module docstring over the two tracks' samples."""
    gates = spec.gates
    drafts = (canary.counters.drafts if canary else 0, stable.counters.drafts if stable else 0)
    if canary is None or stable is None or min(drafts) < spec.min_drafts:
        return Verdict(
            "Wait",
            "NotEnoughData",
            f"{drafts[0]:.0f} canary and {drafts[1]:.0f} stable drafts; deciding after {spec.min_drafts} each",
        )
    c, s = canary.counters, stable.counters
    ratio, low, high = ratio_with_bounds(c, s)
    itl_c, itl_s = mean_itl(c), mean_itl(s)
    itl_ratio = itl_c / itl_s if itl_c is not None and itl_s else None
    error_rate = c.errors / c.requests if c.requests else 0.0
    summary = (
        f"acceptance length canary {acceptance_length(c)[0]:.3f} / stable {acceptance_length(s)[0]:.3f} "
        f"= {ratio:.3f} (95% bounds {low:.3f}..{high:.3f}, gate >= {gates.min_acceptance_ratio:g}) over "
        f"{canary.seconds:.0f} s, {c.drafts:.0f}/{s.drafts:.0f} drafts; "
        + (
            f"inter-token latency {itl_c * 1000:.1f}/{itl_s * 1000:.1f} ms = {itl_ratio:.3f} "
            f"(gate <= {gates.max_latency_ratio:g}); "
            if itl_ratio is not None
            else "inter-token latency not measured; "
        )
        + f"errors {c.errors:.0f}/{c.requests:.0f} (gate <= {gates.max_error_rate:g})"
    )
    if high < gates.min_acceptance_ratio:
        return Verdict("Fail", "AcceptanceBelowGate", summary)
    if wilson_lower_bound(c.errors, c.requests) > gates.max_error_rate:
        return Verdict("Fail", "ErrorRateAboveGate", summary)
    if canary.seconds < FULL_WINDOW * spec.analysis_seconds:
        return Verdict("Wait", "Analyzing", f"{summary}; window {spec.analysis_seconds} s")
    if ratio < gates.min_acceptance_ratio:
        return Verdict("Fail", "AcceptanceBelowGate", summary)
    if error_rate > gates.max_error_rate:
        return Verdict("Fail", "ErrorRateAboveGate", summary)
    if itl_ratio is not None and itl_ratio > gates.max_latency_ratio:
        return Verdict("Fail", "LatencyAboveGate", summary)
    return Verdict("Pass", "GatesPassed", summary)


def track_figures(sample: TrackSample | None) -> dict[str, Any] | None:
    """status.canary.canary / .stable."""
    if sample is None:
        return None
    c = sample.counters
    figures: dict[str, Any] = {
        "revision": sample.revision,
        "pods": sample.pods,
        "drafts": int(c.drafts),
        "requests": int(c.requests),
        "errors": int(c.errors),
        "windowSeconds": round(sample.seconds, 3),
    }
    if c.drafts:
        figures["meanAcceptanceLength"] = round(acceptance_length(c)[0], 4)
    if (itl := mean_itl(c)) is not None:
        figures["interTokenLatencySeconds"] = round(itl, 6)
    return figures


def same_export(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two resolvedDraft records name the same artifact (not just the same DraftTraining)."""
    if a is None or b is None:
        return a is b

    def identity(record: dict[str, Any]) -> tuple[Any, ...]:
        return record.get("uri"), record.get("digest"), (record.get("draftTraining") or {}).get("uid")

    return identity(a) == identity(b)


@dataclass
class RolloutInputs:
    spec: SpecDecodeDeploymentSpec
    annotations: dict[str, str]
    stable: dict[str, Any] | None  # the draft the stable track serves (status.resolvedDraft)
    candidate: dict[str, Any] | None  # the draft spec.draft resolves to now
    state: dict[str, Any] | None  # status.canary as last written
    stable_deployment: dict[str, Any] | None
    canary_deployment: dict[str, Any] | None
    canary_pods: list[dict[str, Any]]
    history: History | None
    now: datetime
    # The pod-template revision a track's Deployment gets for a draft record: (draft, track) -> hash.
    revision: Callable[[dict[str, Any] | None, str], str]


@dataclass
class RolloutPlan:
    """What each track serves, status.canary, and what to report."""

    stable_draft: dict[str, Any] | None
    stable_replicas: int
    canary_draft: dict[str, Any] | None = None  # None: no canary Deployment wanted
    canary_replicas: int = 0
    delete_canary: bool = False
    state: dict[str, Any] | None = None
    rejected: dict[str, Any] | None = None  # a status.rejectedDrafts entry to append
    events: list[Event] = field(default_factory=list)
    # (type, status, reason, message) of the canary conditions to set.
    conditions: list[tuple[str, str, str, str]] = field(default_factory=list)


def plan_rollout(inputs: RolloutInputs) -> RolloutPlan:
    """The tracks for this reconcile (see the module docstring for the rule)."""
    spec, state, stable, candidate = inputs.spec, inputs.state, inputs.stable, inputs.candidate
    replicas = spec.replicas
    has_canary = inputs.canary_deployment is not None
    canary_possible = (
        spec.rollout.strategy == "Canary"
        and stable is not None
        and candidate is not None
        and inputs.stable_deployment is not None
        and replicas > 1
    )
    if state and state["phase"] == "Promoting" and same_export(state["draft"], stable):
        return _promoting(inputs)
    if not canary_possible or same_export(candidate, stable):
        plan = RolloutPlan(stable_draft=candidate, stable_replicas=replicas, state=state)
        if state and state["phase"] == "RolledBack" and has_canary and spec.rollout.strategy == "Canary":
            # The rolled-back canary stays at zero (its Deployment tells what ran).
            plan.canary_draft, plan.canary_replicas = state["draft"], 0
        else:
            plan.delete_canary = has_canary
        if state and state["phase"] == "Analyzing":
            # spec.draft went back to the stable draft, or the strategy changed: the canary ends here.
            plan.state = None
            plan.conditions.append(
                ("CanaryProgressing", "False", "Canceled", "the canary's draft is no longer wanted")
            )
            plan.events.append(
                Event("Normal", "CanaryCanceled", f"canary of {state['draft']['uri']} canceled")
            )
        return plan
    draft_spec = content_hash(spec.draft.to_json())
    if state and same_export(state["draft"], candidate):
        if state["phase"] == "RolledBack" and state["draftSpec"] == draft_spec:
            # Not retried until spec.draft changes.
            return RolloutPlan(
                stable_draft=stable,
                stable_replicas=replicas,
                canary_draft=candidate,
                canary_replicas=0,
                state=state,
            )
        if state["phase"] == "Analyzing":
            return _analyzing(inputs, state)
    return _start(inputs, draft_spec)


def start_failure(deployment: dict[str, Any] | None, pods: list[dict[str, Any]]) -> Problem | None:
    """Why the canary track cannot start (see the module docstring), None while it may yet."""
    problems = [deployment_problem(deployment), *(pod_problem(p) for p in sorted(pods, key=_name))]
    return next((p for p in problems if p is not None and p.reason in FAILED_START_REASONS), None)


def _name(obj: dict[str, Any]) -> str:
    return obj["metadata"]["name"]


def _canary_replicas(spec: SpecDecodeDeploymentSpec) -> int:
    return min(spec.rollout.canary.replicas, spec.replicas - 1)


def _start(inputs: RolloutInputs, draft_spec: str) -> RolloutPlan:
    spec, candidate = inputs.spec, inputs.candidate
    assert candidate is not None
    canary = _canary_replicas(spec)
    message = (
        f"canary of draft {candidate['uri']} on {canary} of {spec.replicas} pods; "
        f"judged over {spec.rollout.canary.analysis_seconds} s"
    )
    state = {
        "phase": "Analyzing",
        "draft": candidate,
        "draftSpec": draft_spec,
        "revision": inputs.revision(candidate, "canary"),
        "startedAt": iso(inputs.now),
        "reason": "Started",
        "message": message,
    }
    return RolloutPlan(
        stable_draft=inputs.stable,
        stable_replicas=spec.replicas - canary,
        canary_draft=candidate,
        canary_replicas=canary,
        state=state,
        events=[Event("Normal", "CanaryStarted", message)],
        conditions=[
            ("CanaryProgressing", "True", "Analyzing", message),
            ("Promoted", "False", "CanaryInProgress", message),
            ("RolledBack", "False", "CanaryInProgress", message),
        ],
    )


def _analyzing(inputs: RolloutInputs, state: dict[str, Any]) -> RolloutPlan:
    spec, stable, candidate = inputs.spec, inputs.stable, state["draft"]
    canary_spec = spec.rollout.canary
    canary = _canary_replicas(spec)
    window = canary_spec.analysis_seconds
    canary_sample = track_sample(inputs.history, inputs.revision(candidate, "canary"), window, inputs.now)
    stable_sample = track_sample(inputs.history, inputs.revision(stable, "stable"), window, inputs.now)
    failed = start_failure(inputs.canary_deployment, inputs.canary_pods)
    if failed is not None:
        verdict = Verdict("Fail", "CanaryFailedToStart", failed.message)
    else:
        verdict = analyse(canary_sample, stable_sample, canary_spec)
    state = state | {"reason": verdict.reason, "message": verdict.message}
    state["revision"] = inputs.revision(candidate, "canary")
    for key, sample in (("canary", canary_sample), ("stable", stable_sample)):
        if (figures := track_figures(sample)) is not None:
            state[key] = figures
    plan = RolloutPlan(
        stable_draft=stable,
        stable_replicas=spec.replicas - canary,
        canary_draft=candidate,
        canary_replicas=canary,
        state=state,
    )
    now = iso(inputs.now)
    if verdict.decision == "Fail":
        state |= {"phase": "RolledBack", "decidedAt": now}
        message = f"draft {candidate['uri']} rolled back: {verdict.message}"
        plan.stable_replicas, plan.canary_replicas = spec.replicas, 0
        plan.rejected = {
            k: v
            for k, v in {
                "digest": candidate.get("digest"),
                "uri": candidate["uri"],
                "phase": "Canary",
                "reason": verdict.reason,
                "message": verdict.message,
                "rejectedAt": now,
            }.items()
            if v is not None
        }
        plan.events.append(Event("Warning", "CanaryRolledBack", message))
        plan.conditions += [
            ("CanaryProgressing", "False", "RolledBack", message),
            ("Promoted", "False", "RolledBack", message),
            ("RolledBack", "True", verdict.reason, message),
        ]
        return plan
    if verdict.decision == "Pass":
        manual = canary_spec.promotion == "Manual"
        if manual and inputs.annotations.get(PROMOTE_ANNOTATION) != state["revision"]:
            state["reason"] = "AwaitingPromotion"
            message = (
                f"gates passed; promote with the annotation {PROMOTE_ANNOTATION}={state['revision']}: "
                f"{verdict.message}"
            )
            state["message"] = message
            if (inputs.state or {}).get("reason") != "AwaitingPromotion":
                plan.events.append(Event("Normal", "CanaryAwaitingPromotion", message))
            plan.conditions.append(("CanaryProgressing", "True", "AwaitingPromotion", message))
            return plan
        state |= {"phase": "Promoting", "reason": "ManualPromotion" if manual else "GatesPassed"}
        message = f"promoting draft {candidate['uri']} to the stable track: {verdict.message}"
        # The stable track moves to the draft while the canary keeps serving it.
        plan.stable_draft = candidate
        plan.events.append(Event("Normal", "CanaryPromoting", message))
        plan.conditions.append(("CanaryProgressing", "True", "Promoting", message))
        return plan
    plan.conditions.append(("CanaryProgressing", "True", verdict.reason, verdict.message))
    return plan


def _promoting(inputs: RolloutInputs) -> RolloutPlan:
    """The stable track rolls to the promoted draft at replicas - canary; then the canary goes."""
    spec, state, stable = inputs.spec, dict(inputs.state or {}), inputs.stable
    canary = _canary_replicas(spec)
    revision = inputs.revision(stable, "stable")
    deployment = inputs.stable_deployment or {}
    status = deployment.get("status") or {}
    wanted = spec.replicas - canary
    settled = (
        (deployment.get("metadata", {}).get("annotations") or {}).get(meta.TEMPLATE_HASH_ANNOTATION)
        == revision
        and status.get("observedGeneration", 0) >= deployment.get("metadata", {}).get("generation", 0)
        and (status.get("updatedReplicas") or 0) == wanted
        and (status.get("readyReplicas") or 0) == wanted
        and (status.get("replicas") or 0) == wanted
    )
    if not settled:
        return RolloutPlan(
            stable_draft=stable,
            stable_replicas=wanted,
            canary_draft=state["draft"],
            canary_replicas=canary,
            state=state,
        )
    how = "by annotation" if state.get("reason") == "ManualPromotion" else "gates passed"
    message = f"draft {stable['uri']} promoted ({how}): {state.get('message', '')}"
    state |= {"phase": "Promoted", "decidedAt": iso(inputs.now)}
    return RolloutPlan(
        stable_draft=stable,
        stable_replicas=spec.replicas,
        delete_canary=inputs.canary_deployment is not None,
        state=state,
        events=[Event("Normal", "CanaryPromoted", message)],
        conditions=[
            ("CanaryProgressing", "False", "Promoted", message),
            ("Promoted", "True", state.get("reason") or "GatesPassed", message),
            ("RolledBack", "False", "Promoted", message),
        ],
    )
