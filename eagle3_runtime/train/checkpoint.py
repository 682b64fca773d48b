"""Checkpoints: `checkpoints/step-NNNNNNNN/` = a vLLM-loadable draft (fp32 master weights),
the optimizer/scheduler/data position for exact resume, and manifest.json, written last, so
a directory without a manifest is an interrupted save and is ignored."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from eagle3_api.workspace import Workspace
from eagle3_runtime.export import write_eagle3_dir
from eagle3_runtime.files import write_json_atomic

MANIFEST = "manifest.json"
TRAINING_STATE = "training_state.pt"
FORMAT = "eagle3-draft-checkpoint/v1"


def complete_checkpoints(workspace: Workspace) -> list[int]:
    root = workspace.checkpoints_dir
    if not root.exists():
        return []
    steps = []
    for path in root.glob("step-*"):
        if (path / MANIFEST).exists():
            steps.append(int(path.name.removeprefix("step-")))
    return sorted(steps)


def finished_training(workspace: Workspace, steps: int | None, epochs: int | None) -> dict | None:
    """The last checkpoint's manifest when it completes this training, else None.

    Asked in epochs, the total is the one derived when the training started (its manifest's
    settings), so a finished run is recognised without reading the dataset again.
    """
    done = complete_checkpoints(workspace)
    if not done:
        return None
    manifest = json.loads((workspace.checkpoint_dir(done[-1]) / MANIFEST).read_text())
    settings = manifest.get("settings", {})
    total = (
        steps if steps is not None else (settings.get("steps") if settings.get("epochs") == epochs else None)
    )
    if total is None or done[-1] < total:
        return None
    return {**manifest, "settings": {**settings, "steps": total, "epochs": epochs}, "checkpoints": done}


def write_checkpoint(
    workspace: Workspace,
    step: int,
    *,
    model_state: dict[str, torch.Tensor],
    draft_config: Any,
    training_state: dict[str, Any],
    manifest: dict[str, Any],
) -> Path:
    final = workspace.checkpoint_dir(step)
    tmp = final.with_name(f".{final.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    write_eagle3_dir(tmp, model_state, draft_config, dtype=torch.float32)
    torch.save(training_state, tmp / TRAINING_STATE)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    write_json_atomic(final / MANIFEST, {"format": FORMAT, "step": step, **manifest})
    return final


def read_checkpoint(workspace: Workspace, step: int) -> tuple[dict[str, Any], dict[str, Any]]:
    path = workspace.checkpoint_dir(step)
    if not (path / MANIFEST).exists():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {MANIFEST})")
    manifest = json.loads((path / MANIFEST).read_text())
    state = torch.load(path / TRAINING_STATE, map_location="cpu", weights_only=False)
    return manifest, state
