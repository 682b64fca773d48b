"""`eagle3 generate`: on-policy conversations from a vLLM target server (eagle3_runtime/generate.py)."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from eagle3_runtime.generate import GenerateConfig, RetryPolicy, SamplingSettings, SourceSpec, run_generate
from eagle3_runtime.layout import StageResult, Workspace
from eagle3_runtime.progress import ProgressReporter


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workspace", required=True, help="workspace directory; output goes to data/")
    parser.add_argument("--server", required=True, help="vLLM OpenAI server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", required=True, help="model name the server serves")
    parser.add_argument(
        "--source",
        action="append",
        required=True,
        type=SourceSpec.parse,
        metavar="PATH[,mode=chat|completion][,weight=F][,prompt-field=F][,messages-field=F][,domain=D]",
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
        concurrency=args.concurrency,
        on_bad_row=args.on_bad_row,
        samples_per_shard=args.samples_per_shard,
        retry=RetryPolicy(max_attempts=args.max_attempts, request_timeout_s=args.request_timeout),
    )


def run(args: argparse.Namespace) -> StageResult:
    workspace = Workspace(args.workspace)
    summary = run_generate(
        config_from_args(args), workspace.data_dir, ProgressReporter("generate", workspace.root)
    )
    message = f"{summary.samples} samples, {summary.tokens} tokens"
    if summary.bad_rows or summary.rejected:
        message += f"; skipped {summary.bad_rows} bad input rows and {summary.rejected} refused requests"
    return StageResult(
        stage="generate",
        message=message,
        metrics={
            k: v
            for k, v in asdict(summary).items()
            if k in ("samples", "tokens", "tokens_per_second", "bad_rows")
        },
        artifacts={"data": "data/manifest.json"},
    )
