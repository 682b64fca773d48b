"""`eagle3 train`: train the draft on the target's hidden states (eagle3_runtime/train/run.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from eagle3_api.stage_result import StageResult
from eagle3_api.workspace import Workspace
from eagle3_runtime.command_line import config_from_args
from eagle3_runtime.model.config import MAX_DRAFT_LAYERS
from eagle3_runtime.pinned_target import add_target_arguments
from eagle3_runtime.train.run import TrainConfig, TrainingOutcome, run_training


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workspace", required=True, type=Path)
    add_target_arguments(parser)
    parser.add_argument("--hidden-states", required=True, choices=["offline", "online", "streaming"])
    parser.add_argument("--server", help="vLLM extraction server URL (streaming mode)")
    parser.add_argument("--layer-ids", default="auto", help="auto or three target layer ids, e.g. 2,16,29")
    parser.add_argument("--draft-vocab-size", type=int, default=32000)
    parser.add_argument(
        "--draft-layers", type=int, default=1, help=f"decoder layers of the draft (1..{MAX_DRAFT_LAYERS})"
    )
    parser.add_argument(
        "--init-checkpoint",
        default=None,
        help="warm start from this EAGLE-3 draft (directory or Hugging Face id); default: from scratch",
    )
    length = parser.add_mutually_exclusive_group(required=True)
    length.add_argument("--steps", type=int, help="optimizer steps")
    length.add_argument(
        "--epochs", type=int, help="passes over the dataset; the step count is derived from its size"
    )
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument(
        "--batch-tokens", type=int, default=16384, help="tokens per optimizer step, all ranks"
    )
    parser.add_argument("--ttt-steps", type=int, default=3, help="training-time-test unroll depth")
    parser.add_argument("--loss-decay", type=float, default=0.8)
    parser.add_argument(
        "--checkpoint-every", type=int, default=500, help="and always at the end; 0: only at the end"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seq-len", type=int, default=2048, help="packed row length")
    parser.add_argument(
        "--loss-chunk-rows",
        type=int,
        default=None,
        help="target head and loss over this many rows at a time (less peak memory on long rows)",
    )
    parser.add_argument("--warmup-steps", type=int, default=None)
    parser.add_argument("--attention", choices=["auto", "eager", "flex"], default="auto")
    parser.add_argument(
        "--compile",
        choices=["auto", "on", "off"],
        default="auto",
        help="torch.compile the TTT loss; auto: on GPU, and on CPU for runs of 100+ steps (it pays back there)",
    )


def _result(workspace: Workspace, outcome: TrainingOutcome) -> StageResult:
    step, settings, summary = outcome.step, outcome.settings, outcome.summary
    total, epochs = settings["steps"], settings.get("epochs")
    metrics = {"step": step, "total_steps": total}
    if epochs is not None:
        metrics["epochs"] = epochs
    metrics.update(
        loss=summary.get("loss"),
        accuracy_per_position=summary.get("accuracy_per_position", []),
        simulated_acceptance_length=summary.get("simulated_acceptance_length"),
        checkpoints=[str(s) for s in outcome.checkpoints],
        initialized_from=settings.get("init_checkpoint") or "scratch",
    )
    return StageResult(
        stage="train",
        message=f"trained {step}/{total} steps" + (f" ({epochs} epochs)" if epochs is not None else ""),
        metrics=metrics,
        artifacts={"checkpoint": str(workspace.checkpoint_dir(step).relative_to(workspace.root))},
    )


def run(args: argparse.Namespace) -> StageResult:
    return _result(Workspace(args.workspace), run_training(config_from_args(TrainConfig, args)))
