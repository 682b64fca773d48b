"""`eagle3 evaluate`: serve a checkpoint with vLLM speculative decoding and measure it (eagle3_runtime/evaluate.py).

Without `--server` the stage starts vLLM itself, twice: with the draft, then (once per prompt
set, cached under evaluations/) without speculation for the baseline. With `--server` it
measures that running server, which must already serve the target with this draft; the
speedup then needs `--baseline-server`.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from eagle3_runtime.evaluate import measure, prompt_domains, prompt_set_key, speculative_config
from eagle3_runtime.export import copy_draft_dir
from eagle3_runtime.generate import SourceSpec
from eagle3_runtime.layout import StageResult, Workspace, write_json_atomic
from eagle3_runtime.train.checkpoint import MANIFEST
from eagle3_runtime.vllm_server import VLLMServer

log = logging.getLogger(__name__)
SERVED_NAME = "target"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workspace", required=True, type=Path)
    parser.add_argument("--target", required=True, help="target model: Hugging Face id or local directory")
    parser.add_argument(
        "--checkpoint", required=True, help="step-N (a training checkpoint) or a draft directory"
    )
    parser.add_argument(
        "--prompts",
        action="append",
        required=True,
        type=SourceSpec.parse,
        metavar="PATH[,mode=chat|completion][,prompt-field=F][,domain=D]",
        help="evaluation prompts (JSONL/Parquet/directory), grouped by their `domain` field or file name",
    )
    parser.add_argument("--num-speculative-tokens", type=int, default=3)
    parser.add_argument("--server", help="a running vLLM server that serves the target with this draft")
    parser.add_argument(
        "--baseline-server", help="a running vLLM server with the same target and no speculation"
    )
    parser.add_argument("--prompts-per-domain", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--max-model-len", type=int, default=1024)


def _checkpoint(workspace: Workspace, name: str) -> tuple[Path, int | None, Path]:
    """(draft directory, training step or None, evaluation file)."""
    if name.startswith("step-") and name.removeprefix("step-").isdigit():
        step = int(name.removeprefix("step-"))
        path = workspace.checkpoint_dir(step)
        if not (path / MANIFEST).exists():
            raise FileNotFoundError(f"checkpoint {path} does not exist or is incomplete")
        return path, step, workspace.evaluation_file(step)
    path = Path(name)
    if not (path / "config.json").exists():
        raise FileNotFoundError(
            f"--checkpoint {name!r} is neither step-N nor a draft directory with config.json"
        )
    return path, None, workspace.evaluations_dir / f"{path.resolve().name}.json"


def _serve_and_measure(args, domains: dict, log_name: str, draft: Path | None) -> dict:
    spec = speculative_config(draft, args.num_speculative_tokens) if draft else None
    log_path = Path(args.workspace) / "logs" / f"{log_name}.log"
    with VLLMServer(
        args.target, log_path=log_path, served_model_name=SERVED_NAME, max_model_len=args.max_model_len,
        speculative_config=spec,
    ) as server:  # fmt: skip
        return _measure(server.url, SERVED_NAME, domains, args)


def _measure(url: str, model: str, domains: dict, args) -> dict:
    return measure(
        url, model, domains, num_speculative_tokens=args.num_speculative_tokens, max_tokens=args.max_tokens,
        concurrency=args.concurrency,
    )  # fmt: skip


def _served_model(url: str) -> str:
    import httpx

    return httpx.get(f"{url.rstrip('/')}/v1/models", timeout=30).json()["data"][0]["id"]


def baseline_file(workspace: Workspace, prompts: list[SourceSpec], per_domain: int, max_tokens: int,
                  concurrency: int) -> Path:  # fmt: skip
    key = prompt_set_key(prompts, per_domain, max_tokens, concurrency)
    return workspace.evaluations_dir / f"baseline-{key}.json"


def measure_baseline(workspace: Workspace, url: str, model: str, args: argparse.Namespace) -> dict:
    """Measure the no-speculation baseline on a running target server and cache it for `evaluate`."""
    domains = prompt_domains(args.prompts, args.prompts_per_domain)
    baseline = _measure(url, model, domains, args)
    write_json_atomic(
        baseline_file(workspace, args.prompts, args.prompts_per_domain, args.max_tokens, args.concurrency),
        baseline,
    )
    return baseline


def _baseline(args, workspace: Workspace, domains: dict) -> dict | None:
    cached = baseline_file(
        workspace, args.prompts, args.prompts_per_domain, args.max_tokens, args.concurrency
    )
    if cached.exists():
        return json.loads(cached.read_text())
    if args.baseline_server:
        return measure_baseline(workspace, args.baseline_server, _served_model(args.baseline_server), args)
    if args.server:
        return None  # a server we did not start: no baseline unless one is given
    baseline = _serve_and_measure(args, domains, "evaluate-baseline-vllm", None)
    write_json_atomic(cached, baseline)
    return baseline


def evaluation_result(evaluation: dict) -> StageResult:
    return StageResult(
        stage="evaluate",
        message=f"acceptance length {evaluation['acceptance_length']:.3f} over {evaluation['drafts']:.0f} drafts",
        metrics={
            "step": evaluation["step"],
            "acceptance_length": evaluation["acceptance_length"],
            "acceptance_per_position": evaluation["acceptance_per_position"],
            "tokens_per_second": evaluation["tokens_per_second"],
            "speedup": evaluation["speedup"],
        },
        artifacts={"evaluation": evaluation["file"]},
    )


def run(args: argparse.Namespace) -> StageResult:
    workspace = Workspace(args.workspace)
    draft, step, output = _checkpoint(workspace, args.checkpoint)
    if output.exists():
        return evaluation_result(json.loads(output.read_text()))
    domains = prompt_domains(args.prompts, args.prompts_per_domain)
    if args.server:
        measured = _measure(args.server, _served_model(args.server), domains, args)
        served = None
    else:
        # Serve what would be deployed: the checkpoint exported in the serving dtype.
        served = workspace.root / ".evaluate" / draft.name if step is not None else draft
        if step is not None:
            copy_draft_dir(draft, served)
        measured = _serve_and_measure(args, domains, f"evaluate-{draft.name}-vllm", served)
    if not measured["drafts"]:
        raise RuntimeError(
            "the server made no speculative drafts: is it serving the draft (--speculative-config)?"
        )
    baseline = _baseline(args, workspace, domains)
    speedup = None
    if baseline and baseline["tokens_per_second"] and measured["tokens_per_second"]:
        speedup = round(measured["tokens_per_second"] / baseline["tokens_per_second"], 3)
    evaluation = {
        **measured,
        "step": step,
        "checkpoint": str(draft),
        "served_draft": str(served) if served else None,
        "num_speculative_tokens": args.num_speculative_tokens,
        "baseline_tokens_per_second": baseline["tokens_per_second"] if baseline else None,
        "speedup": speedup,
        "settings": {"max_tokens": args.max_tokens, "concurrency": args.concurrency, "temperature": 0.0,
                     "prompts_per_domain": args.prompts_per_domain},
        "file": str(output.relative_to(workspace.root)),
    }  # fmt: skip
    write_json_atomic(output, evaluation)
    log.info(
        "evaluated %s: acceptance length %.3f, speedup %s",
        draft.name,
        evaluation["acceptance_length"],
        speedup,
    )
    return evaluation_result(evaluation)
