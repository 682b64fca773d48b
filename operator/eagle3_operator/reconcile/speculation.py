"""numSpeculativeTokens as the vLLM pods serve it, and the --speculative-config that says so.

An integer is served as it is. `auto` applies the draft's sweep schedule (`eagle3 sweep`: the
best K per batch size, vLLM's `num_speculative_tokens_per_batch_size`, K = 0 off), which the
pinned vLLM applies per scheduling step with `num_speculative_tokens` = the schedule's largest K
(docs/benchmarks.md, "Speculation that follows the load", has what was checked on its CPU build).
With `expectedConcurrency` the schedule's K at that concurrency is served as a static K instead, and
so is a schedule with one K at every batch size: vLLM's per-batch-size path skips the padding of
decode steps to a uniform K that keeps them in full CUDA/HIP graphs, for no change of K.
A draft without a schedule is served with the field's default K, and status says so.
"""

from __future__ import annotations

import json
from typing import Any

from eagle3_api.spec_decode_deployment import SpecDecodeDeploymentSpec
from eagle3_api.sweep_schedule import k_at, max_k, validate_schedule

DEFAULT_NUM_SPECULATIVE_TOKENS = SpecDecodeDeploymentSpec.model_fields["num_speculative_tokens"].default


def applied_speculation(spec: SpecDecodeDeploymentSpec, schedule: list[list[int]] | None) -> dict[str, Any]:
    """status.speculation for `spec` serving a draft whose sweep schedule is `schedule` (or None)."""
    requested = spec.num_speculative_tokens
    if requested != "auto":
        return {
            "mode": "Static",
            "numSpeculativeTokens": requested,
            "message": f"numSpeculativeTokens {requested}",
        }
    if not schedule:
        return {
            "mode": "NoSchedule",
            "numSpeculativeTokens": DEFAULT_NUM_SPECULATIVE_TOKENS,
            "message": f"numSpeculativeTokens auto, but the draft has no sweep schedule (evaluation.sweep of "
            f"its DraftTraining, or draft.speculationSchedule): serving K = {DEFAULT_NUM_SPECULATIVE_TOKENS}",
        }
    schedule = validate_schedule(schedule)
    if spec.expected_concurrency is not None:
        k = k_at(schedule, spec.expected_concurrency)
        # vLLM has no K = 0 for a whole server short of serving no draft; 1 is the least speculation.
        served = max(1, k)
        note = "" if k else " (the schedule turns speculation off there; 1 is the least a draft serves)"
        return {
            "mode": "ScheduleAtExpectedConcurrency",
            "numSpeculativeTokens": served,
            "message": f"the schedule's K at expectedConcurrency {spec.expected_concurrency}: {served}{note}",
        }
    uniform_k, *other_ks = {k for _, _, k in schedule}
    if not other_ks and uniform_k > 0:
        return {
            "mode": "Schedule",
            "numSpeculativeTokens": uniform_k,
            "message": f"the draft's sweep schedule has K = {uniform_k} at every batch size: served as a static K",
        }
    return {
        "mode": "Schedule",
        "numSpeculativeTokens": max_k(schedule),
        "schedule": schedule,
        "message": "vLLM's per-batch-size schedule from the draft's sweep",
    }


def speculative_config(
    model: str, revision: str | None, spec: SpecDecodeDeploymentSpec, applied: dict
) -> str:
    """vLLM's --speculative-config: the draft, the applied K (or schedule), then spec.speculativeConfig."""
    config: dict[str, Any] = {
        "method": "eagle3",
        "model": model,
        "num_speculative_tokens": applied["numSpeculativeTokens"],
    }
    if applied.get("schedule"):
        config["num_speculative_tokens_per_batch_size"] = applied["schedule"]
    if revision:
        config["revision"] = revision
    # The API server refuses the keys set above in spec.speculativeConfig (a CEL rule).
    config |= {key: _json_or_text(value) for key, value in spec.speculative_config.items()}
    return json.dumps(config, separators=(",", ":"))


def _json_or_text(value: str) -> Any:
    """A speculativeConfig value: its JSON value where it parses ("1" -> 1), else the text itself."""
    try:
        return json.loads(value)
    except ValueError:
        return value
