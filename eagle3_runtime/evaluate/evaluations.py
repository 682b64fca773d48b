"""The evaluations of a training's checkpoints (evaluations/step-N.json), read back, and the
choice of the best of them (selection.json)."""

from __future__ import annotations

import json

from eagle3_runtime.layout import Workspace, write_json_atomic


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
        "candidates": {str(e["step"]): e["acceptance_length"] for e in evaluations},
    }
    write_json_atomic(workspace.selection_file, selection)
    return selection, len(evaluations)
