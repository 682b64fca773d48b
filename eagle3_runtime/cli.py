"""`eagle3 <stage>`: one command per pipeline stage (docs/contracts.md).

Each stage lives in `eagle3_runtime.stages.<name>` and provides
`add_arguments(parser)` and `run(args) -> StageResult`. The CLI imports a stage
only when it runs, so `eagle3 --help` stays fast and a stage's heavy imports
(torch, vLLM) never load for another.

The rule for a stage module: argparse -> a config -> one library call -> a StageResult.
What the stage does lives in the library (`eagle3_runtime.generate`, `.evaluate`, `.train`,
...), which never imports `stages/`; only `eagle3 pipeline`'s runner comes through this module
(`build_parser`), to run the very commands the operator's pods run.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import traceback

from eagle3_api import stages
from eagle3_api.stage_result import DEFAULT_RESULT_FILE, StageResult
from eagle3_runtime.files import write_result

# name -> one-line help, from the one stage list
STAGES = {stage.name: stage.summary for stage in stages.STAGES}


def _stage_module(name: str):
    return importlib.import_module(f"eagle3_runtime.stages.{name}")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eagle3", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="stage", required=True, metavar="STAGE")
    # Only the chosen stage's module is imported; the rest get a bare help entry.
    chosen = next((a for a in argv if a in STAGES), None)
    for name, help_text in STAGES.items():
        stage_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            stage_parser.add_argument(
                "--result-file",
                default=None,
                help=f"write the stage's JSON result here (in pods: {DEFAULT_RESULT_FILE})",
            )
            _stage_module(name).add_arguments(stage_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        result = _stage_module(args.stage).run(args)
    except (ValueError, FileNotFoundError) as exc:
        # Bad input: one clear line for the user and the termination message, no traceback noise.
        print(f"eagle3 {args.stage}: error: {exc}", file=sys.stderr)
        result = StageResult(stage=args.stage, ok=False, message=str(exc))
    except Exception as exc:  # noqa: BLE001 - report any crash through the result file, then fail
        traceback.print_exc()
        result = StageResult(stage=args.stage, ok=False, message=f"{type(exc).__name__}: {exc}")
    write_result(result, getattr(args, "result_file", None))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
