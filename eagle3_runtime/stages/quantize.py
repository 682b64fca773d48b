"""`eagle3 quantize`: an exported draft quantised with AMD Quark (docs/contracts.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from eagle3_runtime.layout import StageResult


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, type=Path, help="an exported eagle3 draft directory")
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--scheme", required=True, choices=["fp8", "mxfp4"])


def run(args: argparse.Namespace) -> StageResult:
    from eagle3_runtime.quantize import quantize_draft

    if args.input.resolve() == args.output.resolve():
        raise ValueError("--output must differ from --input (the bf16 draft is kept)")
    out = quantize_draft(args.input, args.output, args.scheme)
    return StageResult(
        stage="quantize",
        message=f"quantised {args.input} with Quark {args.scheme}",
        artifacts={"path": str(out)},
    )
