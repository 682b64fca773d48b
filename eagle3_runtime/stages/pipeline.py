"""`eagle3 pipeline`: generate -> extract -> train -> evaluate -> select -> export on this machine.

See eagle3_runtime/pipeline/ (config, presets, runner, report) and docs/pipeline.md.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from eagle3_api.stage_result import StageResult
from eagle3_runtime.pipeline.presets import PRESETS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", type=Path, help="a DraftTraining manifest (or its spec) in YAML")
    source.add_argument("--preset", choices=PRESETS, help="a built-in configuration")
    parser.add_argument("--workspace", type=Path, default=None, help="default: ./eagle3-workspace")
    parser.add_argument(
        "--volume",
        action="append",
        default=[],
        metavar="CLAIM=DIR",
        help="where a PVC named in --config lives",
    )


def run(args: argparse.Namespace) -> StageResult:
    from eagle3_runtime.pipeline.config import load_config, parse_volumes
    from eagle3_runtime.pipeline.presets import preset
    from eagle3_runtime.pipeline.runner import PipelineRunner, StageFailed

    # SIGTERM ends the run like Ctrl-C, so the vLLM servers it started are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workspace = args.workspace or Path("eagle3-workspace")
    workspace.mkdir(parents=True, exist_ok=True)
    config = (
        preset(args.preset, workspace)
        if args.preset
        else load_config(args.config, parse_volumes(args.volume))
    )
    try:
        return PipelineRunner(config, workspace).run()
    except StageFailed as failed:
        return StageResult(stage="pipeline", ok=False, message=str(failed))
