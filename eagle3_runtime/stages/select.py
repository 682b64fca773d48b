"""`eagle3 select`: the best checkpoint by acceptance length measured in vLLM -> selection.json."""

from __future__ import annotations

import argparse
from pathlib import Path

from eagle3_api.stage_result import StageResult
from eagle3_api.workspace import Workspace
from eagle3_runtime.evaluate.evaluations import context_metrics, select_best


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workspace", required=True, type=Path)


def run(args: argparse.Namespace) -> StageResult:
    selection, evaluated = select_best(Workspace(args.workspace))
    return StageResult(
        stage="select",
        message=f"step {selection['step']} of {evaluated} evaluated checkpoints",
        metrics={
            "step": selection["step"],
            "acceptance_length": selection["acceptance_length"],
            **context_metrics(selection.get("acceptance_by_context_length") or []),
        },
        artifacts={"selection": "selection.json"},
    )
