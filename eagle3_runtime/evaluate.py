"""Measure a draft in vLLM: acceptance from the server's own `/metrics`, and speedup over no speculation.

The prompts run domain by domain; the `vllm:spec_decode_*` counters are read before and after
each domain, so the deltas give that domain's mean acceptance length (`1 + accepted / drafts`)
and per-position acceptance (`accepted_at[i] / drafts`). The same prompts on a server without
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
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx

from eagle3_runtime.generate import (
    Prompt,
    RetryPolicy,
    SamplingSettings,
    SourceSpec,
    generate_one,
    load_prompts,
)
from eagle3_runtime.layout import content_hash

log = logging.getLogger(__name__)

SPEC_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted": "vllm:spec_decode_num_accepted_tokens",
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


@dataclass
class SpecCounters:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_position: dict[int, float] = field(default_factory=dict)

    def __sub__(self, other: SpecCounters) -> SpecCounters:
        positions = self.accepted_per_position.keys() | other.accepted_per_position.keys()
        return SpecCounters(
            self.drafts - other.drafts,
            self.draft_tokens - other.draft_tokens,
            self.accepted - other.accepted,
            {
                p: self.accepted_per_position.get(p, 0) - other.accepted_per_position.get(p, 0)
                for p in positions
            },
        )

    def __add__(self, other: SpecCounters) -> SpecCounters:
        positions = self.accepted_per_position.keys() | other.accepted_per_position.keys()
        return SpecCounters(
            self.drafts + other.drafts,
            self.draft_tokens + other.draft_tokens,
            self.accepted + other.accepted,
            {
                p: self.accepted_per_position.get(p, 0) + other.accepted_per_position.get(p, 0)
                for p in positions
            },
        )

    @property
    def acceptance_length(self) -> float | None:
        return 1 + self.accepted / self.drafts if self.drafts else None

    def acceptance_per_position(self, num_speculative_tokens: int) -> list[float]:
        if not self.drafts:
            return []
        return [self.accepted_per_position.get(i, 0) / self.drafts for i in range(num_speculative_tokens)]


def parse_spec_counters(metrics_text: str) -> SpecCounters:
    """Sum the speculative-decoding counters over every engine and model label set."""
    from prometheus_client.parser import text_string_to_metric_families

    counters = SpecCounters()
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            name = sample.name.removesuffix("_total")
            if name == PER_POSITION:
                position = int(sample.labels["position"])
                counters.accepted_per_position[position] = (
                    counters.accepted_per_position.get(position, 0) + sample.value
                )
            for attribute, metric in SPEC_COUNTERS.items():
                if name == metric:
                    setattr(counters, attribute, getattr(counters, attribute) + sample.value)
    return counters


async def read_spec_counters(client: httpx.AsyncClient) -> SpecCounters:
    response = await client.get("/metrics", timeout=60)
    response.raise_for_status()
    return parse_spec_counters(response.text)


@dataclass
class DomainRun:
    prompts: int
    tokens: int
    seconds: float
    counters: SpecCounters


async def _run_domain(
    client: httpx.AsyncClient, prompts: list[Prompt], sampling: SamplingSettings, concurrency: int
) -> DomainRun:
    gate = asyncio.Semaphore(concurrency)
    before = await read_spec_counters(client)
    started = time.monotonic()

    async def one(index: int, prompt: Prompt) -> int:
        async with gate:
            record = await generate_one(client, f"{index:08d}", prompt, sampling, RetryPolicy())
            return record.num_generated_tokens

    tokens = sum(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))
    seconds = time.monotonic() - started
    after = await read_spec_counters(client)
    return DomainRun(len(prompts), tokens, seconds, after - before)


async def run_prompt_set(
    server_url: str, model: str, domains: dict[str, list[Prompt]], *, max_tokens: int, concurrency: int
) -> dict[str, DomainRun]:
    sampling = SamplingSettings(model=model, max_tokens=max_tokens, temperature=0.0)
    async with httpx.AsyncClient(base_url=server_url.rstrip("/")) as client:
        # One warm-up request: the first one after start-up pays for compilation.
        first = next(iter(domains.values()))[0]
        await generate_one(
            client, "00000000", first, SamplingSettings(model=model, max_tokens=8), RetryPolicy()
        )
        return {
            domain: await _run_domain(client, prompts, sampling, concurrency)
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


def prompt_set_key(sources: list[SourceSpec], per_domain: int, max_tokens: int, concurrency: int) -> str:
    """Identifies a prompt set + settings, so a baseline measured once is reused for every checkpoint."""
    return content_hash([[asdict(s) for s in sources], per_domain, max_tokens, concurrency])


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
    server_url: str, model: str, domains: dict[str, list[Prompt]], *, num_speculative_tokens: int, max_tokens: int,
    concurrency: int,
) -> dict:  # fmt: skip
    runs = asyncio.run(
        run_prompt_set(server_url, model, domains, max_tokens=max_tokens, concurrency=concurrency)
    )
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
            "side": self.side, "started_at": self.started_at, "load_average": self.load_average,
            "tokens": tokens, "seconds": round(seconds, 3),
            "tokens_per_second": round(tokens / seconds, 2) if seconds else None,
        }  # fmt: skip


def measure_round(
    side: str, server_url: str, model: str, domains: dict[str, list[Prompt]], *, max_tokens: int, concurrency: int
) -> Round:  # fmt: skip
    started_at, load = utc_now(), load_average()
    runs = asyncio.run(
        run_prompt_set(server_url, model, domains, max_tokens=max_tokens, concurrency=concurrency)
    )
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
                run.prompts, seen.tokens + run.tokens, seen.seconds + run.seconds,
                seen.counters + run.counters,
            )  # fmt: skip
    return total


def speculative_config(draft_dir: str | Path, num_speculative_tokens: int) -> dict:
    return {"method": "eagle3", "model": str(draft_dir), "num_speculative_tokens": num_speculative_tokens}
