"""`eagle3 evaluate`: serve a checkpoint with vLLM speculative decoding and measure it (eagle3_runtime/evaluate/).

Without `--server` the stage starts vLLM itself, with the draft and without speculation for the
baseline. `--baseline` says how the baseline is measured:
- `adjacent` (default): right after the candidate, one server at a time (fits one GPU);
- `interleaved`: both servers up at once, `--rounds` pairs in ABBA order (where both fit,
  e.g. on CPU; the fairest on a machine whose load changes);
- `cached`: once per prompt set and settings, kept under evaluations/ and reused by later
  checkpoints (cheapest; its speedup compares runs made at different times).
With `--server` it measures that running server, which must already serve the target with this
draft; with `--baseline-server` too, the rounds alternate between the two in ABBA order;
without it, the speedup uses the cached baseline if there is one.
The result records when and under what load average each side was measured.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from eagle3_runtime.evaluate.rounds import (
    BASELINE,
    CANDIDATE,
    abba_order,
    load_average,
    measure,
    measure_round,
    pooled,
    prompt_domains,
    prompt_set_key,
    speculative_config,
    summarise,
    utc_now,
)
from eagle3_runtime.export import copy_draft_dir
from eagle3_runtime.generate import SourceSpec
from eagle3_runtime.layout import StageResult, Workspace, write_json_atomic
from eagle3_runtime.train.checkpoint import MANIFEST
from eagle3_runtime.vllm_server import VLLMServer

log = logging.getLogger(__name__)
SERVED_NAME = "target"
BASELINE_MODES = ("adjacent", "interleaved", "cached")


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
    parser.add_argument(
        "--baseline", choices=BASELINE_MODES, default="adjacent",
        help="how the no-speculation baseline is measured (see `eagle3 evaluate` in docs/pipeline.md)",
    )  # fmt: skip
    parser.add_argument(
        "--rounds", type=int, default=1,
        help="candidate/baseline pairs, in ABBA order (needs both servers up: interleaved or --baseline-server)",
    )  # fmt: skip
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


def _server(args, log_name: str, draft: Path | None) -> VLLMServer:
    spec = speculative_config(draft, args.num_speculative_tokens) if draft else None
    log_path = Path(args.workspace) / "logs" / f"{log_name}.log"
    return VLLMServer(
        args.target, log_path=log_path, served_model_name=SERVED_NAME, max_model_len=args.max_model_len,
        speculative_config=spec,
    )  # fmt: skip


def _round(side: str, url: str, model: str, domains: dict, args):
    return measure_round(side, url, model, domains, max_tokens=args.max_tokens, concurrency=args.concurrency)


def _alternate(args, domains: dict, urls: dict[str, str], models: dict[str, str]) -> list:
    return [_round(side, urls[side], models[side], domains, args) for side in abba_order(args.rounds)]


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
    measured_at, load = utc_now(), load_average()
    baseline = {**_measure(url, model, domains, args), "measured_at": measured_at, "load_average": load}
    write_json_atomic(
        baseline_file(workspace, args.prompts, args.prompts_per_domain, args.max_tokens, args.concurrency),
        baseline,
    )
    return baseline


def _cached_baseline(args, workspace: Workspace) -> dict | None:
    """The baseline measured once for this prompt set; measured now (and kept) when missing,
    unless the candidate is a server we did not start."""
    cached = baseline_file(
        workspace, args.prompts, args.prompts_per_domain, args.max_tokens, args.concurrency
    )
    if cached.exists():
        return json.loads(cached.read_text())
    if args.server:
        return None
    with _server(args, "evaluate-baseline-vllm", None) as server:
        return measure_baseline(workspace, server.url, SERVED_NAME, args)


def _measure_rounds(args, domains: dict, served: Path | None, draft_name: str) -> tuple[list, str]:
    """(rounds, baseline mode): the candidate and, unless the baseline is cached, the baseline."""
    candidate_log = f"evaluate-{draft_name}-vllm"
    if args.server:
        urls = {CANDIDATE: args.server}
        if args.baseline_server:
            urls[BASELINE] = args.baseline_server
            models = {side: _served_model(url) for side, url in urls.items()}
            return _alternate(args, domains, urls, models), "interleaved"
        return [_round(CANDIDATE, args.server, _served_model(args.server), domains, args)], "cached"
    if args.baseline == "interleaved":
        with (
            _server(args, candidate_log, served) as candidate,
            _server(args, "evaluate-baseline-vllm", None) as base,
        ):
            urls = {CANDIDATE: candidate.url, BASELINE: base.url}
            return _alternate(args, domains, urls, dict.fromkeys(urls, SERVED_NAME)), "interleaved"
    with _server(args, candidate_log, served) as candidate:
        rounds = [_round(CANDIDATE, candidate.url, SERVED_NAME, domains, args)]
    if args.baseline == "adjacent":
        with _server(args, "evaluate-baseline-vllm", None) as base:
            rounds.append(_round(BASELINE, base.url, SERVED_NAME, domains, args))
    return rounds, args.baseline


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


def _check_rounds(args) -> None:
    if args.rounds < 1:
        raise ValueError(f"--rounds {args.rounds}: must be at least 1")
    both_up = args.baseline_server if args.server else args.baseline == "interleaved"
    if args.rounds > 1 and not both_up:
        raise ValueError(
            f"--rounds {args.rounds} alternates candidate and baseline, so both servers must be up: "
            "use --baseline interleaved (or --server with --baseline-server)"
        )


def run(args: argparse.Namespace) -> StageResult:
    _check_rounds(args)
    workspace = Workspace(args.workspace)
    draft, step, output = _checkpoint(workspace, args.checkpoint)
    if output.exists():
        return evaluation_result(json.loads(output.read_text()))
    domains = prompt_domains(args.prompts, args.prompts_per_domain)
    served = None
    if not args.server:
        # Serve what would be deployed: the checkpoint exported in the serving dtype.
        served = workspace.root / ".evaluate" / draft.name if step is not None else draft
        if step is not None:
            copy_draft_dir(draft, served)
    rounds, baseline_mode = _measure_rounds(args, domains, served, draft.name)
    candidate_rounds = [r for r in rounds if r.side == CANDIDATE]
    measured = summarise(pooled(candidate_rounds), args.num_speculative_tokens)
    if not measured["drafts"]:
        raise RuntimeError(
            "the server made no speculative drafts: is it serving the draft (--speculative-config)?"
        )
    if baseline_rounds := [r for r in rounds if r.side == BASELINE]:
        baseline = summarise(pooled(baseline_rounds), args.num_speculative_tokens)
        baseline["measured_at"] = baseline_rounds[0].started_at
    else:
        baseline = _cached_baseline(args, workspace) if baseline_mode == "cached" else None
    speedup = None
    if baseline and baseline["tokens_per_second"] and measured["tokens_per_second"]:
        speedup = round(measured["tokens_per_second"] / baseline["tokens_per_second"], 3)
    evaluation = {
        **measured,
        "step": step,
        "checkpoint": str(draft),
        "served_draft": str(served) if served else None,
        "num_speculative_tokens": args.num_speculative_tokens,
        "measured_at": candidate_rounds[0].started_at,
        "baseline_tokens_per_second": baseline["tokens_per_second"] if baseline else None,
        # When and how the baseline was measured: a cached one may be from much earlier.
        "baseline_mode": baseline_mode if baseline else None,
        "baseline_measured_at": baseline.get("measured_at") if baseline else None,
        "speedup": speedup,
        "rounds": [r.record() for r in rounds],
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
