"""The evaluations of a training's checkpoints (evaluations/step-N.json), read back, the
choice of the best of them (selection.json), and their per-context-length figures as stage metrics."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from eagle3_api.workspace import Workspace
from eagle3_runtime.files import write_json_atomic


def checkpoint_evaluations(workspace: Workspace) -> list[dict]:
    """Every evaluation of a training checkpoint, by step."""
    evaluations = []
    for path in sorted(workspace.evaluations_dir.glob("step-*.json")):
        evaluation = json.loads(path.read_text())
        if evaluation.get("acceptance_length") is not None:
            evaluations.append(evaluation)
    return sorted(evaluations, key=lambda e: e["step"])


def select_best(workspace: Workspace) -> tuple[dict, int]:
    """(the selection, written to selection.json; how many checkpoints were evaluated)."""
    evaluations = checkpoint_evaluations(workspace)
    if not evaluations:
        raise FileNotFoundError(
            f"no checkpoint evaluations in {workspace.evaluations_dir}: run `eagle3 evaluate` first"
        )
    # Highest measured acceptance wins; on a tie the earlier (less trained, equally good) step.
    best = max(evaluations, key=lambda e: (e["acceptance_length"], -e["step"]))
    selection = {
        "step": best["step"],
        "acceptance_length": best["acceptance_length"],
        "speedup": best.get("speedup"),
        "acceptance_by_context_length": best.get("acceptance_by_context_length") or [],
        "candidates": {str(e["step"]): e["acceptance_length"] for e in evaluations},
    }
    write_json_atomic(workspace.selection_file, selection)
    return selection, len(evaluations)


def context_metrics(contexts: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """The buckets as a StageResult's metrics (a termination message holds flat lists, not records):
    the measured context lengths with their acceptance lengths and drafts, and the unfilled ones."""
    if not contexts:
        return {}
    measured = [c for c in contexts if not c.get("unfilled")]
    return {
        "context_lengths": [c["context_length"] for c in measured],
        "context_acceptance_length": [c["acceptance_length"] for c in measured],
        "context_drafts": [c["drafts"] for c in measured],
        "context_lengths_unfilled": [c["context_length"] for c in contexts if c.get("unfilled")],
    }
