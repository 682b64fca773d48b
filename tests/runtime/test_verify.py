"""`eagle3 verify` against real vLLM (CPU build): the tiny target served with and without a real
EAGLE-3 draft (tests/monitoring/constant_draft.py: accepted at a steady, modest rate).

The two servers are started once for the module and given to the stage as --server and
--baseline-server (the stage starts them itself the same way, through verify._server, when they
are not given; the real-node operator test runs that path). Checked: the real draft passes (no
output differs beyond a near tie, acceptance from vLLM's counters above 1); the same draft fails
with a clear reason when the acceptance floor is above what it reaches, and when the "draft"
server does not speculate at all. The verdict's logic (flip vs mismatch) has unit tests below.
"""

from __future__ import annotations

import json

import pytest

from eagle3_api.stage_result import StageResult
from eagle3_runtime.cli import main as eagle3
from eagle3_runtime.prompt_sources import Prompt
from eagle3_runtime.tiny_target import ensure_tiny_target
from eagle3_runtime.verify import BUILTIN_PROMPTS, SERVED_NAME, VerifyConfig, compare, judge
from tests.monitoring.constant_draft import build_constant_draft, most_frequent_output_token
from tests.support.vllm_server import running_vllm

NUM_PROMPTS, MAX_TOKENS, SPEC_TOKENS = 8, 32, 3
# The same settings on both sides (both eager: running_vllm's default).
SERVER = {"served_model_name": SERVED_NAME, "max_model_len": 1024}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    target = ensure_tiny_target()
    work = tmp_path_factory.mktemp("verify")
    token = most_frequent_output_token(target, list(BUILTIN_PROMPTS[:NUM_PROMPTS]), MAX_TOKENS)
    draft = build_constant_draft(target, work / "draft", token)
    spec = {"method": "eagle3", "model": str(draft), "num_speculative_tokens": SPEC_TOKENS}
    with (
        running_vllm(target, work, name="baseline", **SERVER) as baseline,
        running_vllm(target, work, name="candidate", speculative_config=spec, **SERVER) as candidate,
    ):
        yield target, draft, candidate.url, baseline.url


def _verify(tmp_path, servers, *extra: str) -> tuple[int, StageResult, dict]:
    target, draft, candidate, baseline = servers
    result_file = tmp_path / "result.json"
    code = eagle3(
        ["verify", "--target", str(target), "--draft", str(draft), "--server", candidate,
         "--baseline-server", baseline, "--num-prompts", str(NUM_PROMPTS), "--max-tokens", str(MAX_TOKENS),
         "--num-speculative-tokens", str(SPEC_TOKENS), "--output", str(tmp_path),
         "--result-file", str(result_file), *extra]
    )  # fmt: skip
    report = json.loads((tmp_path / "verification.json").read_text())
    return code, StageResult.parse_message(result_file.read_text()), report


@pytest.mark.slow
def test_a_real_draft_passes(tmp_path, servers):
    code, result, report = _verify(tmp_path, servers)
    print(result.message)
    assert code == 0 and result.ok, result.message
    assert report["passed"] and report["prompts"] == NUM_PROMPTS
    assert report["mismatches"] == 0 and report["flips"] <= 1
    assert report["identical"] + report["flips"] == NUM_PROMPTS
    assert all(c["tokens"] > 0 for c in report["comparisons"])
    assert 1 < result.metrics["acceptance_length"] <= 1 + SPEC_TOKENS
    assert result.metrics["drafts"] > 0


@pytest.mark.slow
def test_an_acceptance_floor_above_the_draft_fails(tmp_path, servers):
    code, result, report = _verify(tmp_path, servers, "--min-acceptance-length", "3.9")
    assert code == 1 and not result.ok
    assert "is below the floor 3.9" in result.message
    assert report["mismatches"] == 0, "the outputs still agree; only the floor fails"


@pytest.mark.slow
def test_a_server_that_does_not_speculate_fails(tmp_path, servers):
    target, draft, _, baseline = servers
    code, result, _ = _verify(tmp_path, (target, draft, baseline, baseline))
    assert code == 1 and "made no speculative drafts" in result.message


# ---- the verdict (pure) ----------------------------------------------------------------------


def _config(**overrides) -> VerifyConfig:
    fields = dict(
        target="t",
        draft="d",
        prompts=[],
        num_prompts=2,
        max_tokens=4,
        num_speculative_tokens=3,
        max_flips=1,
        flip_tolerance=0.1,
        min_acceptance_length=1.5,
        attention_backend=None,
        max_model_len=1024,
        vllm_arg=[],
        server=None,
        baseline_server=None,
        output=None,
    )
    return VerifyConfig(**fields | overrides)


def _completion(ids: list[int], top: list[list[float]] | None = None) -> dict:
    """A /v1/completions choice as vLLM writes it (top_logprobs: {token text: logprob})."""
    choice: dict = {"token_ids": ids}
    if top is not None:
        choice["logprobs"] = {"top_logprobs": [{f"t{i}": v for i, v in enumerate(t)} for t in top]}
    return choice


PROMPT = Prompt(source=0, domain="builtin", location="builtin:0", text="x")


def test_a_divergence_at_a_near_tie_is_a_flip_and_any_other_a_mismatch():
    baseline = _completion([5, 6, 7], [[-0.1, -3.0], [-0.70, -0.72], [-0.2, -2.0]])
    flip = compare(0, PROMPT, baseline, _completion([5, 9, 9]), tolerance=0.1)
    assert (flip.verdict, flip.diverged_at, flip.top2_gap) == ("flip", 1, pytest.approx(0.02))
    mismatch = compare(0, PROMPT, baseline, _completion([8, 6, 7]), tolerance=0.1)
    assert (mismatch.verdict, mismatch.diverged_at) == ("mismatch", 0)
    shorter = compare(0, PROMPT, baseline, _completion([5, 6, 7, 1]), tolerance=0.1)
    assert (shorter.verdict, shorter.diverged_at, shorter.top2_gap) == ("mismatch", 3, None)
    assert compare(0, PROMPT, baseline, _completion([5, 6, 7]), tolerance=0.1).verdict == "identical"


def test_the_verdict_names_the_first_failed_gate():
    baseline = _completion([5, 6], [[-0.1, -0.15], [-0.1, -3.0]])
    flip = compare(0, PROMPT, baseline, _completion([9, 9]), tolerance=0.1)
    same = compare(1, PROMPT, baseline, _completion([5, 6]), tolerance=0.1)
    assert judge(_config(), [flip, same], 2.0, 10).passed
    too_many = judge(_config(max_flips=0), [flip, same], 2.0, 10)
    assert not too_many.passed and "1/2 prompts flip on a near tie, more than maxFlips 0" in too_many.reason
    low = judge(_config(), [same, same], 1.2, 10)
    assert not low.passed and low.reason.startswith(
        "acceptance length 1.200 over 10 drafts is below the floor 1.5"
    )
    mismatch = compare(0, PROMPT, baseline, _completion([5, 7]), tolerance=0.1)
    wrong = judge(_config(), [same, mismatch], 2.0, 10)
    assert not wrong.passed and "1/2 prompts differ with the draft beyond a near tie" in wrong.reason
