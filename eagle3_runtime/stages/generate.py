"""`eagle3 generate`: on-policy conversations from a vLLM target server (eagle3_runtime/generate.py)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from eagle3_api.stage_result import StageResult
from eagle3_api.workspace import Workspace
from eagle3_runtime.conversations import DEFAULT_MAX_LENGTH
from eagle3_runtime.generate import GenerateConfig, run_generate
from eagle3_runtime.progress import ProgressReporter
from eagle3_runtime.prompt_sources import SourceSpec
from eagle3_runtime.vllm_client import ChatSettings, RetryPolicy, SamplingSettings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workspace", required=True, help="workspace directory; output goes to data/")
    parser.add_argument("--server", required=True, help="vLLM OpenAI server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", required=True, help="model name the server serves")
    parser.add_argument(
        "--target-revision",
        default=None,
        help="the revision of the target the server serves (recorded, so that a resumed run checks it)",
    )
    parser.add_argument(
        "--source",
        action="append",
        required=True,
        type=SourceSpec.parse,
        metavar="PATH[,mode=chat|completion][,weight=F][,prompt-field=F][,messages-field=F][,tools-field=F][,domain=D]",
        help="prompt source (JSONL, Parquet or a dataset directory); repeat to mix sources by weight",
    )
    parser.add_argument("--num-samples", type=int, required=True)
    # Defaults are the DraftTraining CRD's (spec.data).
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight at most")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--on-bad-row", choices=["skip", "fail"], default="skip", help="what to do with a malformed input row"
    )
    parser.add_argument("--samples-per-shard", type=int, default=256)
    parser.add_argument("--max-attempts", type=int, default=8, help="tries per request on 429/5xx/timeouts")
    parser.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request attempt")
    parser.add_argument(
        "--regenerate-turns",
        choices=["all", "last"],
        default="all",
        help="chat: regenerate every assistant turn in order, each conditioned on the ones generated "
        "before (all), or only the reply to the last user or tool message (last)",
    )
    parser.add_argument(
        "--chat-template-kwargs",
        type=_json_object,
        default=None,
        metavar="JSON",
        help="passed to the chat template with every chat request, e.g. '{\"enable_thinking\": true}'",
    )
    parser.add_argument(
        "--max-length",
        type=int,
        default=DEFAULT_MAX_LENGTH,
        help="tokens per training sequence at most (prompt and generated turns)",
    )
    parser.add_argument(
        "--long-samples",
        choices=["truncate", "skip"],
        default="truncate",
        help="a sample over --max-length: keep it cut there (truncate) or leave it out (skip); "
        "either way it is listed in data/long-samples.jsonl and counted",
    )


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def config_from_args(args: argparse.Namespace) -> GenerateConfig:
    return GenerateConfig(
        server=args.server,
        sources=args.source,
        sampling=SamplingSettings(
            model=args.model,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            seed=args.seed,
        ),
        num_samples=args.num_samples,
        chat=ChatSettings(
            regenerate_turns=args.regenerate_turns,
            chat_template_kwargs=args.chat_template_kwargs,
            max_length=args.max_length,
            long_samples=args.long_samples,
        ),
        concurrency=args.concurrency,
        on_bad_row=args.on_bad_row,
        samples_per_shard=args.samples_per_shard,
        retry=RetryPolicy(max_attempts=args.max_attempts, request_timeout_s=args.request_timeout),
        target_revision=args.target_revision,
    )


def run(args: argparse.Namespace) -> StageResult:
    workspace = Workspace(args.workspace)
    summary = run_generate(
        config_from_args(args), workspace.data_dir, ProgressReporter("generate", workspace.root)
    )
    message = f"{summary.samples} samples ({summary.assistant_turns} chat turns), {summary.tokens} tokens"
    if summary.bad_rows or summary.rejected or summary.long_samples_skipped:
        message += (
            f"; skipped {summary.bad_rows} bad input rows, {summary.rejected} refused requests "
            f"and {summary.long_samples_skipped} long samples"
        )
    if summary.long_samples_truncated:
        message += f"; cut {summary.long_samples_truncated} long samples"
    if summary.stopped_early:
        message += (
            f"; {summary.stopped_early} conversations end where the target's tool calls left the source's"
        )
    return StageResult(
        stage="generate",
        message=message,
        metrics={k: v for k, v in asdict(summary).items() if k not in ("resumed", "seconds")},
        artifacts={"data": "data/manifest.json"},
    )
