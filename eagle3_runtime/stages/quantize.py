"""`eagle3 quantize`: an exported draft quantised with AMD Quark (docs/contracts.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from eagle3_api.stage_result import StageResult
from eagle3_runtime.export import publish_draft, staging_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, type=Path, help="an exported eagle3 draft directory")
    parser.add_argument(
        "--output",
        required=True,
        type=Path,
        help="destination: OUTPUT/sha256-<digest>, OUTPUT/latest links it",
    )
    parser.add_argument("--scheme", required=True, choices=["fp8", "mxfp4"])


def run(args: argparse.Namespace) -> StageResult:
    from eagle3_runtime.quantize import quantize_draft

    if args.input.resolve() == args.output.resolve():
        raise ValueError("--output must differ from --input (the bf16 draft is kept)")
    staged = quantize_draft(args.input.resolve(), staging_dir(args.output), args.scheme)
    out, digest = publish_draft(staged, args.output, {"quantization": args.scheme, "input": str(args.input)})
    return StageResult(
        stage="quantize",
        message=f"quantised {args.input} with Quark {args.scheme} to {out}",
        metrics={"digest": digest},
        artifacts={"path": str(out)},
    )
