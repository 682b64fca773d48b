"""vLLM's speculative-decoding counters from its own `/metrics`: read before and after a run,
their difference gives the run's mean acceptance length (`1 + accepted / drafts`) and
per-position acceptance (`accepted_at[i] / drafts`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import aiohttp

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


async def read_spec_counters(session: aiohttp.ClientSession) -> SpecCounters:
    async with session.get("metrics", timeout=aiohttp.ClientTimeout(total=60)) as response:
        response.raise_for_status()
        return parse_spec_counters(await response.text())
