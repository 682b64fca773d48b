"""A prompt set run against a vLLM server, domain by domain, and rounds of such runs.

The `vllm:spec_decode_*` counters (`counters`) are read before and after each domain, so the
deltas give that domain's acceptance. The same prompts on a server without
speculation give the baseline throughput; both runs use greedy decoding and one concurrency.

A speedup compares like with like only when both sides run under the same machine load, so a
measurement is a list of rounds, each one side over the whole prompt set, stamped with its start
time and the load average; with both servers up, the rounds alternate candidate and baseline in
ABBA order (candidate, baseline, baseline, candidate, ...) so a drifting load favours neither.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import aiohttp

from eagle3_runtime.evaluate.counters import SpecCounters, read_spec_counters
from eagle3_runtime.prompt_sources import Prompt, SourceSpec, load_prompts
from eagle3_runtime.vllm_client import (
    RetryPolicy,
    SamplingSettings,
    collector_frozen,
    generate_one,
    open_session,
)

log = logging.getLogger(__name__)


@dataclass
class DomainRun:
    prompts: int
    tokens: int
    seconds: float
    counters: SpecCounters


async def _run_domain(
    session: aiohttp.ClientSession, prompts: list[Prompt], sampling: SamplingSettings, concurrency: int
) -> DomainRun:
    gate = asyncio.Semaphore(concurrency)
    before = await read_spec_counters(session)
    started = time.monotonic()

    async def one(index: int, prompt: Prompt) -> int:
        async with gate:
            record = await generate_one(session, f"{index:08d}", prompt, sampling, RetryPolicy())
            return record.num_generated_tokens

    tokens = sum(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))
    seconds = time.monotonic() - started
    after = await read_spec_counters(session)
    return DomainRun(len(prompts), tokens, seconds, after - before)


def run_prompt_set(
    server_url: str, model: str, domains: dict[str, list[Prompt]], *, max_tokens: int, concurrency: int
) -> dict[str, DomainRun]:
    """Every domain's prompts against the server, one domain after another."""
    with collector_frozen():
        return asyncio.run(
            _run_prompt_set(server_url, model, domains, max_tokens=max_tokens, concurrency=concurrency)
        )


async def _run_prompt_set(
    server_url: str, model: str, domains: dict[str, list[Prompt]], *, max_tokens: int, concurrency: int
) -> dict[str, DomainRun]:
    sampling = SamplingSettings(model=model, max_tokens=max_tokens, temperature=0.0)
    async with open_session(server_url, concurrency) as session:
        # One warm-up request: the first one after start-up pays for compilation.
        first = next(iter(domains.values()))[0]
        await generate_one(
            session, "00000000", first, SamplingSettings(model=model, max_tokens=8), RetryPolicy()
        )
        return {
            domain: await _run_domain(session, prompts, sampling, concurrency)
            for domain, prompts in domains.items()
        }


def prompt_domains(sources: list[SourceSpec], per_domain: int) -> dict[str, list[Prompt]]:
    """The first `per_domain` prompts of every domain of the sources, domains in name order."""
    per_source, _ = load_prompts(sources, on_bad_row="fail")
    domains: dict[str, list[Prompt]] = {}
    for prompts in per_source:
        for prompt in prompts:
            bucket = domains.setdefault(prompt.domain, [])
            if len(bucket) < per_domain:
                bucket.append(prompt)
    return dict(sorted(domains.items()))


def summarise(runs: dict[str, DomainRun], num_speculative_tokens: int) -> dict:
    total = sum((r.counters for r in runs.values()), SpecCounters())
    tokens = sum(r.tokens for r in runs.values())
    seconds = sum(r.seconds for r in runs.values())
    return {
        "acceptance_length": total.acceptance_length,
        "acceptance_per_position": total.acceptance_per_position(num_speculative_tokens),
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_second": round(tokens / seconds, 2) if seconds else None,
        "drafts": total.drafts,
        "per_domain": {
            domain: {
                "acceptance_length": run.counters.acceptance_length,
                "acceptance_per_position": run.counters.acceptance_per_position(num_speculative_tokens),
                "prompts": run.prompts,
                "tokens": run.tokens,
                "tokens_per_second": round(run.tokens / run.seconds, 2) if run.seconds else None,
            }
            for domain, run in runs.items()
        },
    }


def measure(
    server_url: str,
    model: str,
    domains: dict[str, list[Prompt]],
    *,
    num_speculative_tokens: int,
    max_tokens: int,
    concurrency: int,
) -> dict:
    runs = run_prompt_set(server_url, model, domains, max_tokens=max_tokens, concurrency=concurrency)
    return summarise(runs, num_speculative_tokens)


CANDIDATE, BASELINE = "candidate", "baseline"


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


@dataclass
class Round:
    """One side (candidate: with the draft; baseline: without) over the whole prompt set."""

    side: str
    started_at: str
    load_average: list[float]  # 1, 5 and 15 minutes, when the round started
    runs: dict[str, DomainRun]

    def record(self) -> dict:
        tokens = sum(r.tokens for r in self.runs.values())
        seconds = sum(r.seconds for r in self.runs.values())
        return {
            "side": self.side,
            "started_at": self.started_at,
            "load_average": self.load_average,
            "tokens": tokens,
            "seconds": round(seconds, 3),
            "tokens_per_second": round(tokens / seconds, 2) if seconds else None,
        }


def measure_round(
    side: str,
    server_url: str,
    model: str,
    domains: dict[str, list[Prompt]],
    *,
    max_tokens: int,
    concurrency: int,
) -> Round:
    started_at, load = utc_now(), load_average()
    runs = run_prompt_set(server_url, model, domains, max_tokens=max_tokens, concurrency=concurrency)
    measured = Round(side, started_at, load, runs)
    log.info("%s round: %s", side, measured.record())
    return measured


def abba_order(pairs: int) -> list[str]:
    """Sides of `pairs` candidate/baseline pairs in ABBA order: C B, B C, C B, ..."""
    order = []
    for pair in range(pairs):
        order += [CANDIDATE, BASELINE] if pair % 2 == 0 else [BASELINE, CANDIDATE]
    return order


def pooled(rounds: list[Round]) -> dict[str, DomainRun]:
    """The rounds of one side added up per domain: tokens, seconds and counters (the prompts are the same)."""
    total: dict[str, DomainRun] = {}
    for round_ in rounds:
        for domain, run in round_.runs.items():
            seen = total.get(domain, DomainRun(0, 0, 0.0, SpecCounters()))
            total[domain] = DomainRun(
                run.prompts,
                seen.tokens + run.tokens,
                seen.seconds + run.seconds,
                seen.counters + run.counters,
            )
    return total
