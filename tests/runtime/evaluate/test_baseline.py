"""`eagle3 evaluate`'s baseline: measured next to the candidate, rounds in ABBA order, and the
result says when and under what load each side ran (a speedup compares like with like).

The real-vLLM tests have `evaluate` serve the tiny target twice, with an untrained draft
(acceptance does not matter here, only that speculation runs) and without speculation: side by
side, and one after the other. The adjacent run also measures two context lengths on the
candidate's server (`--context-lengths`, its prompt building is tested in test_context_lengths.py):
a vLLM start costs more than all of its measurements.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime

import pytest

from eagle3_api.stage_result import StageResult
from eagle3_runtime.cli import build_parser
from eagle3_runtime.evaluate.rounds import BASELINE, CANDIDATE
from eagle3_runtime.pipeline.prompts import write_prompt_sets
from eagle3_runtime.stages import evaluate
from eagle3_runtime.vllm_server import log_tail
from tests.runtime.test_vllm_acceptance import untrained_draft
from tests.support.vllm_server import EAGER


def _args(*argv: str) -> argparse.Namespace:
    full = ["evaluate", "--workspace", "w", "--target", "t", "--checkpoint", "step-1", "--prompts", "p.jsonl",
            "--result-file", "r.json", *argv]  # fmt: skip
    return build_parser(full).parse_args(full)


def test_rounds_beyond_one_need_both_servers_up():
    with pytest.raises(ValueError, match="--baseline interleaved"):
        evaluate.run(_args("--rounds", "2"))  # adjacent: one server at a time
    with pytest.raises(ValueError, match="--baseline interleaved"):
        evaluate.run(_args("--rounds", "2", "--server", "http://127.0.0.1:1"))
    with pytest.raises(ValueError, match="at least 1"):
        evaluate.run(_args("--rounds", "0", "--baseline", "interleaved"))
    assert _args().baseline == "adjacent"  # the default compares back to back


def _evaluate_tiny(tmp_path, tiny_target, *baseline_args: str) -> tuple[StageResult, dict]:
    """`eagle3 evaluate` of an untrained draft on the tiny target; evaluate starts the servers."""
    draft = untrained_draft(tiny_target, tmp_path / "draft")
    prompts = write_prompt_sets(tmp_path / "prompts", corpus_megabytes=1.0)["eval"]
    argv = ["evaluate", "--workspace", str(tmp_path / "ws"), "--target", str(tiny_target),
            "--checkpoint", str(draft), "--prompts", f"{prompts / 'completion-code.jsonl'},mode=completion",
            *baseline_args, "--prompts-per-domain", "2", "--max-tokens", "16",
            f"--vllm-arg={EAGER}", "--result-file", str(tmp_path / "r.json")]  # fmt: skip
    try:
        result: StageResult = evaluate.run(build_parser(argv).parse_args(argv))
    except BaseException:
        for log in sorted((tmp_path / "ws" / "logs").glob("*.log")):
            print(f"--- tail of {log} ---\n{log_tail(log)}")
        raise
    return result, json.loads((tmp_path / "ws" / result.artifacts["evaluation"]).read_text())


@pytest.mark.slow
def test_interleaved_rounds_record_when_and_under_what_load(tmp_path, tiny_target):
    # Both servers (the draft's and the bare target's) stay up for all rounds.
    result, evaluation = _evaluate_tiny(tmp_path, tiny_target, "--baseline", "interleaved", "--rounds", "2")
    rounds = evaluation["rounds"]
    assert [r["side"] for r in rounds] == [CANDIDATE, BASELINE, BASELINE, CANDIDATE]
    starts = [datetime.fromisoformat(r["started_at"]) for r in rounds]
    assert starts == sorted(starts) and all(s.tzinfo is not None for s in starts)
    assert all(len(r["load_average"]) == 3 and r["tokens"] > 0 for r in rounds)
    assert evaluation["baseline_mode"] == "interleaved"
    assert evaluation["measured_at"] == rounds[0]["started_at"]
    assert evaluation["baseline_measured_at"] == rounds[1]["started_at"]
    assert evaluation["drafts"] > 0 and evaluation["acceptance_length"] >= 1.0

    def pooled_rate(side):
        chosen = [r for r in rounds if r["side"] == side]
        return sum(r["tokens"] for r in chosen) / sum(r["seconds"] for r in chosen)

    assert evaluation["tokens_per_second"] == pytest.approx(pooled_rate(CANDIDATE), rel=0.01)
    assert evaluation["baseline_tokens_per_second"] == pytest.approx(pooled_rate(BASELINE), rel=0.01)
    assert result.metrics["speedup"] == pytest.approx(
        pooled_rate(CANDIDATE) / pooled_rate(BASELINE), rel=0.02
    )


CONTEXT_LENGTHS = [256, 512]


@pytest.fixture(scope="module")
def adjacent(tmp_path_factory, tiny_target):
    """(directory, result, evaluation) of an adjacent evaluation (the default) with context lengths."""
    tmp_path = tmp_path_factory.mktemp("adjacent")
    lengths = ["--context-lengths", *map(str, CONTEXT_LENGTHS), "--context-prompts", "2"]
    return tmp_path, *_evaluate_tiny(tmp_path, tiny_target, *lengths)


@pytest.mark.slow
def test_adjacent_baseline_runs_one_server_at_a_time(adjacent):
    tmp_path, result, evaluation = adjacent
    candidate, baseline = evaluation["rounds"]
    assert (candidate["side"], baseline["side"]) == (CANDIDATE, BASELINE)
    assert evaluation["baseline_mode"] == "adjacent"
    assert evaluation["baseline_measured_at"] == baseline["started_at"] > candidate["started_at"]
    # The draft's server was gone (its log closed with its shutdown) before the baseline round began.
    candidate_log = tmp_path / "ws" / "logs" / "evaluate-draft-vllm.log"  # named after the draft dir
    last_write = datetime.fromtimestamp(candidate_log.stat().st_mtime).astimezone()
    # Both servers were started with the --vllm-arg given (the target's own settings, in a DraftTraining).
    for log in (candidate_log, candidate_log.with_name("evaluate-baseline-vllm.log")):
        assert EAGER in log.read_text().splitlines()[0].split(), log
    assert last_write < datetime.fromisoformat(baseline["started_at"]), (candidate_log, last_write)
    assert evaluation["drafts"] > 0 and baseline["tokens"] > 0
    assert result.metrics["speedup"] == pytest.approx(
        evaluation["tokens_per_second"] / evaluation["baseline_tokens_per_second"], rel=0.02
    )


@pytest.mark.slow
def test_each_context_length_is_measured_on_the_candidate_server(adjacent):
    _, result, evaluation = adjacent
    buckets = evaluation["acceptance_by_context_length"]
    assert [b["context_length"] for b in buckets] == CONTEXT_LENGTHS
    k = evaluation["num_speculative_tokens"]
    for bucket in buckets:
        # The server counted exactly N prompt tokens for every request (checked as they ran).
        assert bucket["prompts"] == 2 and bucket["tokens"] > 0 and bucket["drafts"] > 0, bucket
        assert 1.0 <= bucket["acceptance_length"] <= 1 + k and len(bucket["acceptance_per_position"]) == k
        assert bucket["acceptance_length"] == pytest.approx(
            1 + sum(bucket["acceptance_per_position"]), rel=1e-6
        )
    assert evaluation["settings"]["context_lengths"] == CONTEXT_LENGTHS
    assert result.metrics["context_lengths"] == CONTEXT_LENGTHS
    assert result.metrics["context_acceptance_length"] == [b["acceptance_length"] for b in buckets]
    print(
        "acceptance by context length:",
        {b["context_length"]: round(b["acceptance_length"], 3) for b in buckets},
        "drafts:",
        {b["context_length"]: b["drafts"] for b in buckets},
    )
