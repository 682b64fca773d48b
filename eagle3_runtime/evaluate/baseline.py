"""The no-speculation baseline a speedup divides by (modes in `eagle3 evaluate`'s help and
docs/pipeline.md), and its cache: measured once per prompt set and settings, kept under
evaluations/ and reused by later checkpoints."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from eagle3_api.workspace import Workspace, content_hash
from eagle3_runtime.evaluate.config import SERVED_NAME, EvaluateConfig, target_server
from eagle3_runtime.evaluate.rounds import load_average, measure, prompt_domains, utc_now
from eagle3_runtime.files import write_json_atomic

BASELINE_LOG = "evaluate-baseline-vllm"


def prompt_set_key(config: EvaluateConfig) -> str:
    """Identifies a prompt set + settings (the server's too), so a baseline measured once is reused
    for every checkpoint."""
    return content_hash(
        [
            [asdict(s) for s in config.prompts],
            config.prompts_per_domain,
            config.max_tokens,
            config.concurrency,
            config.vllm_arg,
        ]
    )


def baseline_file(config: EvaluateConfig) -> Path:
    return Workspace(config.workspace).evaluations_dir / f"baseline-{prompt_set_key(config)}.json"


def measure_baseline(config: EvaluateConfig, url: str, model: str) -> dict:
    """Measure the no-speculation baseline on a running target server and cache it for `evaluate`."""
    domains = prompt_domains(config.prompts, config.prompts_per_domain)
    measured_at, load = utc_now(), load_average()
    measured = measure(
        url,
        model,
        domains,
        num_speculative_tokens=config.num_speculative_tokens,
        max_tokens=config.max_tokens,
        concurrency=config.concurrency,
    )
    baseline = {**measured, "measured_at": measured_at, "load_average": load}
    write_json_atomic(baseline_file(config), baseline)
    return baseline


def cached_baseline(config: EvaluateConfig) -> dict | None:
    """The baseline measured once for this prompt set; measured now (and kept) when missing,
    unless the candidate is a server we did not start."""
    cached = baseline_file(config)
    if cached.exists():
        return json.loads(cached.read_text())
    if config.server:
        return None
    with target_server(config, BASELINE_LOG, None) as server:
        return measure_baseline(config, server.url, SERVED_NAME)
