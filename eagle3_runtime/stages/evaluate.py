"""`eagle3 evaluate`: serve a checkpoint with vLLM speculative decoding and measure it (eagle3_runtime/evaluate/).

Without `--server` the stage starts vLLM itself, with the draft and without speculation for the
baseline. `--baseline` says how the baseline is measured:
- `adjacent` (default): right after the candidate, one server at a time (fits one GPU);
- `interleaved`: both servers up at once, `--rounds` pairs in ABBA order (where both fit,
  e.g. on CPU; the fairest on a machine whose load changes);
- `cached`: once per prompt set and settings, kept under evaluations/ and reused by later
  checkpoints (cheapest; its speedup compares runs made at different times).
With `--server` it measures that running server, which must already serve the target with this
draft; with `--baseline-server` too, the rounds alternate between the two in ABBA order;
without it, the speedup uses the cached baseline if there is one.
The result records when and under what load average each side was measured.
`--context-lengths` also measures acceptance on prompts of exactly those many tokens, bucket by
bucket on the candidate's server (eagle3_runtime/evaluate/context_lengths.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from eagle3_api.stage_result import StageResult
from eagle3_runtime.command_line import config_from_args
from eagle3_runtime.evaluate.checkpoint import evaluate_checkpoint
from eagle3_runtime.evaluate.config import BASELINE_MODES, EvaluateConfig, add_prompts_argument
from eagle3_runtime.evaluate.evaluations import context_metrics
from eagle3_runtime.pinned_target import add_target_arguments, pin_target
from eagle3_runtime.vllm_server import add_vllm_arg_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workspace", required=True, type=Path)
    add_target_arguments(parser)
    parser.add_argument(
        "--checkpoint", required=True, help="step-N (a training checkpoint) or a draft directory"
    )
    add_prompts_argument(parser)
    parser.add_argument("--num-speculative-tokens", type=int, default=3)
    parser.add_argument("--server", help="a running vLLM server that serves the target with this draft")
    parser.add_argument(
        "--baseline-server", help="a running vLLM server with the same target and no speculation"
    )
    parser.add_argument(
        "--baseline",
        choices=BASELINE_MODES,
        default="adjacent",
        help="how the no-speculation baseline is measured (see `eagle3 evaluate` in docs/pipeline.md)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="candidate/baseline pairs, in ABBA order (needs both servers up: interleaved or --baseline-server)",
    )
    parser.add_argument("--prompts-per-domain", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument(
        "--context-lengths",
        type=int,
        nargs="+",
        default=[],
        metavar="TOKENS",
        help="also measure acceptance on prompts of exactly these many tokens (ascending; each plus "
        "--max-tokens within --max-model-len), built from the evaluation prompts",
    )
    parser.add_argument("--context-prompts", type=int, default=4, help="prompts per context length")
    add_vllm_arg_argument(parser, "the vLLM servers it starts (candidate and baseline)")


def evaluation_result(evaluation: dict) -> StageResult:
    return StageResult(
        stage="evaluate",
        message=f"acceptance length {evaluation['acceptance_length']:.3f} over {evaluation['drafts']:.0f} drafts",
        metrics={
            "step": evaluation["step"],
            "acceptance_length": evaluation["acceptance_length"],
            "acceptance_per_position": evaluation["acceptance_per_position"],
            "tokens_per_second": evaluation["tokens_per_second"],
            "speedup": evaluation["speedup"],
            **context_metrics(evaluation.get("acceptance_by_context_length") or []),
        },
        artifacts={"evaluation": evaluation["file"]},
    )


def run(args: argparse.Namespace) -> StageResult:
    return evaluation_result(
        evaluate_checkpoint(
            config_from_args(EvaluateConfig, args, target=pin_target(args.target, args.target_revision).path)
        )
    )
