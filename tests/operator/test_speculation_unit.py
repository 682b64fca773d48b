"""numSpeculativeTokens (an integer or auto) and spec.speculativeConfig as the planner renders them."""

from __future__ import annotations

import json

from eagle3_operator.reconcile.serving import ServingObserved, plan_serving

from tests.operator import fakes

SCHEDULE = [[1, 2, 4], [3, 5, 3], [6, 16, 0]]


def _served(body: dict, training: dict | None = None) -> tuple[dict, dict]:
    """(--speculative-config, status.speculation) of the planned Deployment."""
    plan = plan_serving(body, ServingObserved(now=fakes.NOW, draft_training=training))
    deployment = next(o for o in plan.sync if o["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return json.loads(args[args.index("--speculative-config") + 1]), plan.status["speculation"]


def test_an_integer_is_served_as_it_is_with_extra_keys_merged_as_json():
    extra = {
        "draft_tensor_parallel_size": "1",
        "disable_padded_drafter_batch": "true",
        "quantization": "fp8",
        "note": "not json {",
    }
    config, applied = _served(fakes.spec_decode(numSpeculativeTokens=5, speculativeConfig=extra))
    assert config == {
        "method": "eagle3",
        "model": "/models/draft/llama-eagle3",
        "num_speculative_tokens": 5,
        "draft_tensor_parallel_size": 1,
        "disable_padded_drafter_batch": True,
        "quantization": "fp8",
        "note": "not json {",
    }
    assert applied["mode"] == "Static" and applied["numSpeculativeTokens"] == 5


def test_auto_serves_the_draft_training_sweep_schedule_per_batch_size():
    body = fakes.spec_decode(numSpeculativeTokens="auto", draft={"fromDraftTraining": "llama"})
    training = {
        "metadata": {"name": "llama", "uid": "uid-1"},
        "status": {
            "phase": "Succeeded",
            "stage": "export",
            "observedGeneration": 1,
            "export": {
                "uri": "pvc://llama-workspace/export/sha256-ab",
                "claimName": "llama-workspace",
                "path": "export/sha256-ab",
                "digest": "ab",
                "format": "eagle3",
                "quantization": "none",
            },
            "sweep": {"schedule": SCHEDULE, "numSpeculativeTokens": 4, "best": []},
        },
    }
    config, applied = _served(body, training)
    # vLLM caps each range's K at num_speculative_tokens, so that is the schedule's largest K.
    assert config["num_speculative_tokens"] == 4
    assert config["num_speculative_tokens_per_batch_size"] == SCHEDULE
    assert applied == {
        "mode": "Schedule",
        "numSpeculativeTokens": 4,
        "schedule": SCHEDULE,
        "message": "vLLM's per-batch-size schedule from the draft's sweep",
    }
    # The schedule belongs to the pinned draft: it stays with it in status.resolvedDraft.
    plan = plan_serving(body, ServingObserved(now=fakes.NOW, draft_training=training))
    assert plan.status["resolvedDraft"]["speculationSchedule"] == SCHEDULE


def test_auto_serves_a_schedule_with_one_k_everywhere_as_that_static_k():
    # The same K at every batch size, through vLLM's static path (it keeps decode steps padded to K).
    draft = {"model": "pvc://drafts/llama-eagle3", "speculationSchedule": [[1, 16, 4]]}
    config, applied = _served(fakes.spec_decode(numSpeculativeTokens="auto", draft=draft))
    assert config["num_speculative_tokens"] == 4 and "num_speculative_tokens_per_batch_size" not in config
    assert applied["mode"] == "Schedule" and "schedule" not in applied
    assert applied["message"].endswith("K = 4 at every batch size: served as a static K")
    # Off everywhere is no static K: vLLM gets the schedule, which turns every step's speculation off.
    draft["speculationSchedule"] = [[1, 16, 0]]
    config, applied = _served(fakes.spec_decode(numSpeculativeTokens="auto", draft=draft))
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 16, 0]] == applied["schedule"]


def test_auto_with_expected_concurrency_serves_that_k_statically():
    draft = {"model": "pvc://drafts/llama-eagle3", "speculationSchedule": SCHEDULE}
    config, applied = _served(
        fakes.spec_decode(numSpeculativeTokens="auto", expectedConcurrency=4, draft=draft)
    )
    assert config["num_speculative_tokens"] == 3 and "num_speculative_tokens_per_batch_size" not in config
    assert applied["mode"] == "ScheduleAtExpectedConcurrency"
    # Where the schedule turns speculation off, a served draft still proposes one token, and status says why.
    config, applied = _served(
        fakes.spec_decode(numSpeculativeTokens="auto", expectedConcurrency=64, draft=draft)
    )
    assert config["num_speculative_tokens"] == 1 and "turns speculation off" in applied["message"]


def test_auto_without_a_schedule_serves_the_default_and_says_so():
    config, applied = _served(fakes.spec_decode(numSpeculativeTokens="auto"))
    assert config["num_speculative_tokens"] == 3 and "num_speculative_tokens_per_batch_size" not in config
    assert applied["mode"] == "NoSchedule" and "no sweep schedule" in applied["message"]


def test_the_verification_gate_checks_the_k_that_auto_serves():
    draft = {"model": "pvc://drafts/llama-eagle3", "speculationSchedule": SCHEDULE}
    body = fakes.spec_decode(numSpeculativeTokens="auto", draft=draft, verification={"enabled": True})
    (job,) = plan_serving(body, ServingObserved(now=fakes.NOW)).create
    command = fakes.command(job)
    assert command[command.index("--num-speculative-tokens") + 1] == "4", "the schedule's largest K"
