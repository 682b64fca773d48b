"""`eagle3 sweep`: tokens/s of a draft at K = 0 (off) .. Kmax over a ladder of concurrencies, and
the best K per concurrency as vLLM's per-batch-size schedule (eagle3_runtime/evaluate/sweep.py).

It starts vLLM itself: the target without speculation for the whole sweep, and beside it the
target with the draft at one K at a time; at each concurrency the two alternate in `--rounds`
ABBA pairs, as `eagle3 evaluate --baseline interleaved` does. The result (every round, the best K
per concurrency, the schedule) is kept in evaluations/sweep-DRAFT.json; `eagle3 export` copies the
schedule of the draft it exports into eagle3-export.json.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from eagle3_api.stage_result import StageResult
from eagle3_runtime.command_line import config_from_args
from eagle3_runtime.evaluate.config import add_prompts_argument
from eagle3_runtime.evaluate.sweep import SweepConfig, run_sweep
from eagle3_runtime.pinned_target import add_target_arguments, pin_target
from eagle3_runtime.vllm_server import add_vllm_arg_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workspace", required=True, type=Path)
    add_target_arguments(parser)
    parser.add_argument(
        "--checkpoint", default="best", help="best (from selection.json), step-N, or a draft directory"
    )
    add_prompts_argument(parser)
    parser.add_argument(
        "--max-speculative-tokens", type=int, default=4, help="Kmax: K = 1..Kmax are measured"
    )
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="the ladder of concurrencies"
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="candidate/baseline pairs per K and concurrency"
    )
    parser.add_argument("--prompts-per-domain", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-model-len", type=int, default=1024)
    add_vllm_arg_argument(parser, "the vLLM servers it starts (every K and the baseline)")


def run(args: argparse.Namespace) -> StageResult:
    sweep = run_sweep(
        config_from_args(SweepConfig, args, target=pin_target(args.target, args.target_revision).path)
    )
    best = ", ".join(f"c={b['concurrency']}: K={b['num_speculative_tokens']}" for b in sweep["best"])
    return StageResult(
        stage="sweep",
        message=f"best K measured per concurrency {best}; schedule {sweep['schedule']}",
        metrics={
            "schedule": sweep["schedule"],
            "num_speculative_tokens": sweep["num_speculative_tokens"],
            # The best K per concurrency, as parallel lists (metrics hold flat values).
            "best_concurrency": [b["concurrency"] for b in sweep["best"]],
            "best_k": [b["num_speculative_tokens"] for b in sweep["best"]],
            "best_speedup": [b["speedup"] for b in sweep["best"]],
            "scheduled_k": [s["num_speculative_tokens"] for s in sweep["scheduled"]],
        },
        artifacts={"sweep": sweep["file"]},
    )
