"""`eagle3 export`: a checkpoint as a vLLM-loadable draft directory (docs/contracts.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eagle3_api.stage_result import StageResult
from eagle3_api.workspace import Workspace
from eagle3_runtime.evaluate.sweep import sweep_file
from eagle3_runtime.export import copy_draft_dir, publish_draft, staging_dir, write_speculators_dir
from eagle3_runtime.train.checkpoint import MANIFEST


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workspace", required=True, type=Path)
    parser.add_argument("--checkpoint", default="best", help="best (from selection.json) or step-N")
    parser.add_argument("--format", choices=["eagle3", "speculators"], default="eagle3")
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="destination (default: WORKSPACE/export); the draft goes to OUTPUT/sha256-<digest>, OUTPUT/latest links it",
    )
    parser.add_argument("--target", default=None, help="verifier recorded in the speculators format")
    parser.add_argument("--num-speculative-tokens", type=int, default=3, help="speculators format default")


def checkpoint_dir(workspace: Workspace, name: str) -> Path:
    if name == "best":
        if not workspace.selection_file.exists():
            raise FileNotFoundError(f"{workspace.selection_file} is missing: run `eagle3 select` first")
        step = int(json.loads(workspace.selection_file.read_text())["step"])
    elif name.startswith("step-") and name.removeprefix("step-").isdigit():
        step = int(name.removeprefix("step-"))
    else:
        raise ValueError(f"--checkpoint must be 'best' or step-N, got {name!r}")
    path = workspace.checkpoint_dir(step)
    if not (path / MANIFEST).exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist or is incomplete")
    return path


def run(args: argparse.Namespace) -> StageResult:
    workspace = Workspace(args.workspace)
    source = checkpoint_dir(workspace, args.checkpoint)
    destination = args.output or workspace.export_dir
    staged = staging_dir(destination)
    if args.format == "eagle3":
        copy_draft_dir(source, staged)
    else:
        verifier = args.target or json.loads((source / MANIFEST).read_text()).get("target")
        if not verifier:
            raise ValueError("the speculators format records its verifier: pass --target")
        write_speculators_dir(
            staged, source, verifier=verifier, speculative_tokens=args.num_speculative_tokens
        )
    step = int(source.name.removeprefix("step-"))
    record: dict = {"format": args.format, "checkpoint_step": step}
    if (swept := sweep_file(workspace, source.name)).exists():
        # `eagle3 sweep`'s K per batch size, for SpecDecodeDeployments with numSpeculativeTokens: auto.
        record["speculation_schedule"] = json.loads(swept.read_text())["schedule"]
    output, digest = publish_draft(staged, destination, record)
    return StageResult(
        stage="export",
        message=f"exported {source.name} as {args.format} to {output}",
        metrics={"step": step, "digest": digest},
        artifacts={"path": str(output)},
    )
