"""`eagle3 verify`: the correctness gate before a draft serves (eagle3_runtime/verify.py).

Serves the target with the draft and without it (same settings, same attention backend), sends
the same prompts to both with greedy decoding and compares the token ids. It passes when the
outputs are identical but for at most --max-flips near-tie flips (a first divergence where the
target alone ranked its top two tokens within --flip-tolerance) and the acceptance length from
vLLM's counters reaches --min-acceptance-length. Exit code 0: passed; 1: failed, with the reason
in the result's message. Without --server/--baseline-server it starts the two servers one after
the other.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from eagle3_api.stage_result import StageResult
from eagle3_runtime.command_line import config_from_args
from eagle3_runtime.prompt_sources import SourceSpec
from eagle3_runtime.verify import REPORT_FILE, VerifyConfig, verify_draft
from eagle3_runtime.vllm_server import add_vllm_arg_argument

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, help="target model: Hugging Face id or local directory")
    parser.add_argument("--draft", required=True, help="the EAGLE-3 draft vLLM loads (directory or id)")
    parser.add_argument(
        "--prompts",
        action="append",
        default=[],
        type=SourceSpec.parse,
        metavar="PATH[,mode=chat|completion][,prompt-field=F]",
        help="prompts (JSONL/Parquet/directory; chat prompts are asked their first turn); "
        "default: a built-in set of short completions",
    )
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--num-speculative-tokens", type=int, default=3)
    parser.add_argument("--max-flips", type=int, default=1, help="near-tie flips allowed")
    parser.add_argument(
        "--flip-tolerance",
        type=float,
        default=0.1,
        help="a divergence is a near-tie flip when the target's top-2 logprobs there differ by at most this",
    )
    parser.add_argument(
        "--min-acceptance-length",
        type=float,
        default=1.0,
        help="floor of the mean acceptance length from vLLM's spec-decode counters",
    )
    parser.add_argument(
        "--attention-backend", default=None, help="vLLM --attention-backend of both servers (the target's)"
    )
    parser.add_argument("--max-model-len", type=int, default=1024)
    add_vllm_arg_argument(parser, "both vLLM servers")
    parser.add_argument("--server", help="a running vLLM server with the target and this draft")
    parser.add_argument(
        "--baseline-server", help="a running vLLM server with the same target, no speculation"
    )
    parser.add_argument(
        "--output", type=Path, default=None, help=f"folder for {REPORT_FILE} and the servers' logs"
    )


def run(args: argparse.Namespace) -> StageResult:
    verification = verify_draft(config_from_args(VerifyConfig, args))
    if not verification.passed:
        log.error("verification failed: %s", verification.reason)
    return StageResult(
        stage="verify",
        ok=verification.passed,
        message=verification.reason,
        metrics={
            "prompts": len(verification.comparisons),
            "identical": verification.count("identical"),
            "flips": verification.count("flip"),
            "mismatches": verification.count("mismatch"),
            "acceptance_length": verification.acceptance_length,
            "drafts": verification.drafts,
        },
        artifacts={"report": str(args.output / REPORT_FILE)} if args.output else {},
    )
