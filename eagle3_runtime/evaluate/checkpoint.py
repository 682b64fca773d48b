"""The evaluation of one checkpoint: serve it with speculative decoding, measure it and the
baseline (`baseline`), and keep the result under evaluations/ (written once, then reused)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx

from eagle3_api.workspace import Workspace
from eagle3_runtime.evaluate.baseline import BASELINE_LOG, cached_baseline
from eagle3_runtime.evaluate.config import SERVED_NAME, EvaluateConfig, target_server
from eagle3_runtime.evaluate.context_lengths import ContextBucket, evaluation_buckets, measure_buckets
from eagle3_runtime.evaluate.rounds import (
    BASELINE,
    CANDIDATE,
    Round,
    abba_order,
    measure_round,
    pooled,
    prompt_domains,
    summarise,
)
from eagle3_runtime.export import copy_draft_dir
from eagle3_runtime.files import write_json_atomic
from eagle3_runtime.train.checkpoint import MANIFEST

log = logging.getLogger(__name__)


def resolve_checkpoint(workspace: Workspace, name: str) -> tuple[Path, int | None, Path]:
    """(draft directory, training step or None, evaluation file) of `--checkpoint name`."""
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


def served_draft(workspace: Workspace, draft: Path, step: int | None) -> Path:
    """What vLLM serves for a draft: a checkpoint as it would be deployed (exported in the serving
    dtype, under .evaluate/), a draft directory as it is."""
    if step is None:
        return draft
    served = workspace.root / ".evaluate" / draft.name
    copy_draft_dir(draft, served)
    return served


def speedup(candidate: dict, baseline: dict | None) -> float | None:
    """The candidate's output tokens/s over the baseline's, when both were measured."""
    if baseline and baseline["tokens_per_second"] and candidate["tokens_per_second"]:
        return round(candidate["tokens_per_second"] / baseline["tokens_per_second"], 3)
    return None


def _served_model(url: str) -> str:
    return httpx.get(f"{url.rstrip('/')}/v1/models", timeout=30).json()["data"][0]["id"]


def _round(config: EvaluateConfig, side: str, url: str, model: str, domains: dict) -> Round:
    return measure_round(
        side, url, model, domains, max_tokens=config.max_tokens, concurrency=config.concurrency
    )


def _alternate(config: EvaluateConfig, domains: dict, urls: dict[str, str], models: dict[str, str]) -> list:
    return [_round(config, side, urls[side], models[side], domains) for side in abba_order(config.rounds)]


def _contexts(config: EvaluateConfig, buckets: list[ContextBucket], url: str, model: str) -> list[dict]:
    """The context-length buckets measured on the candidate server (none when none were asked for)."""
    if not buckets:
        return []
    return measure_buckets(
        url,
        model,
        buckets,
        max_tokens=config.max_tokens,
        concurrency=config.concurrency,
        num_speculative_tokens=config.num_speculative_tokens,
    )


def _measure_rounds(
    config: EvaluateConfig, domains: dict, served: Path | None, draft_name: str, buckets: list[ContextBucket]
) -> tuple[list[Round], str, list[dict]]:
    """(rounds, baseline mode, context-length buckets): the candidate and, unless the baseline is
    cached, the baseline; the buckets on the candidate's server after its rounds."""
    candidate_log = f"evaluate-{draft_name}-vllm"
    if config.server:
        urls = {CANDIDATE: config.server}
        if config.baseline_server:
            urls[BASELINE] = config.baseline_server
            models = {side: _served_model(url) for side, url in urls.items()}
            rounds = _alternate(config, domains, urls, models)
            return rounds, "interleaved", _contexts(config, buckets, config.server, models[CANDIDATE])
        model = _served_model(config.server)
        rounds = [_round(config, CANDIDATE, config.server, model, domains)]
        return rounds, "cached", _contexts(config, buckets, config.server, model)
    if config.baseline == "interleaved":
        with (
            target_server(config, candidate_log, served) as candidate,
            target_server(config, BASELINE_LOG, None) as base,
        ):
            urls = {CANDIDATE: candidate.url, BASELINE: base.url}
            rounds = _alternate(config, domains, urls, dict.fromkeys(urls, SERVED_NAME))
            return rounds, "interleaved", _contexts(config, buckets, candidate.url, SERVED_NAME)
    with target_server(config, candidate_log, served) as candidate:
        rounds = [_round(config, CANDIDATE, candidate.url, SERVED_NAME, domains)]
        contexts = _contexts(config, buckets, candidate.url, SERVED_NAME)
    if config.baseline == "adjacent":
        with target_server(config, BASELINE_LOG, None) as base:
            rounds.append(_round(config, BASELINE, base.url, SERVED_NAME, domains))
    return rounds, config.baseline, contexts


def evaluate_checkpoint(config: EvaluateConfig) -> dict:
    """The checkpoint's evaluation record (docs/contracts.md), measured now or read back."""
    workspace = Workspace(config.workspace)
    draft, step, output = resolve_checkpoint(workspace, config.checkpoint)
    if output.exists():
        return json.loads(output.read_text())
    domains = prompt_domains(config.prompts, config.prompts_per_domain)
    buckets = evaluation_buckets(config)  # before any server starts: a bad prompt set fails fast
    served = None if config.server else served_draft(workspace, draft, step)
    rounds, baseline_mode, contexts = _measure_rounds(config, domains, served, draft.name, buckets)
    candidate_rounds = [r for r in rounds if r.side == CANDIDATE]
    measured = summarise(pooled(candidate_rounds), config.num_speculative_tokens)
    if not measured["drafts"]:
        raise RuntimeError(
            "the server made no speculative drafts: is it serving the draft (--speculative-config)?"
        )
    if baseline_rounds := [r for r in rounds if r.side == BASELINE]:
        baseline = summarise(pooled(baseline_rounds), config.num_speculative_tokens)
        baseline["measured_at"] = baseline_rounds[0].started_at
    else:
        baseline = cached_baseline(config) if baseline_mode == "cached" else None
    measured_speedup = speedup(measured, baseline)
    settings = {
        "max_tokens": config.max_tokens,
        "concurrency": config.concurrency,
        "temperature": 0.0,
        "prompts_per_domain": config.prompts_per_domain,
        "context_lengths": config.context_lengths,
        "context_prompts": config.context_prompts,
    }
    evaluation = {
        **measured,
        "step": step,
        "checkpoint": str(draft),
        "served_draft": str(served) if served else None,
        "num_speculative_tokens": config.num_speculative_tokens,
        "measured_at": candidate_rounds[0].started_at,
        "baseline_tokens_per_second": baseline["tokens_per_second"] if baseline else None,
        # When and how the baseline was measured: a cached one may be from much earlier.
        "baseline_mode": baseline_mode if baseline else None,
        "baseline_measured_at": baseline.get("measured_at") if baseline else None,
        "speedup": measured_speedup,
        "acceptance_by_context_length": contexts,
        "rounds": [r.record() for r in rounds],
        "settings": settings,
        "file": str(output.relative_to(workspace.root)),
    }
    write_json_atomic(output, evaluation)
    log.info(
        "evaluated %s: acceptance length %.3f, speedup %s",
        draft.name,
        evaluation["acceptance_length"],
        measured_speedup,
    )
    return evaluation
