"""The sweep: output tokens/s of a draft at every K in 0 (off) .. Kmax over a ladder of
concurrencies, on the target's own hardware, and from them a schedule of K per batch size.

The no-speculation server stays up for the whole sweep; the draft is served at one K at a time
next to it. At each concurrency the two alternate in evaluate's ABBA rounds (`rounds`), so every
K is compared with baseline rounds measured right beside its own. K = 0 is the baseline itself,
so the best K of a concurrency is 0 when no K beats it. The schedule (`sweep_schedule`, vLLM's
`num_speculative_tokens_per_batch_size`) takes the K of each concurrency from speedups smoothed
over its neighbours on the ladder (`scheduled_per_concurrency`); the result JSON keeps every round.
"""

from __future__ import annotations

import json
import logging
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from eagle3_api.sweep_schedule import max_k, schedule_from_best
from eagle3_api.workspace import Workspace
from eagle3_runtime.evaluate.checkpoint import resolve_checkpoint, served_draft, speedup
from eagle3_runtime.evaluate.config import SERVED_NAME, EvaluateConfig, target_server
from eagle3_runtime.evaluate.rounds import (
    BASELINE,
    CANDIDATE,
    Round,
    abba_order,
    measure_round,
    pooled,
    prompt_domains,
    summarise,
    utc_now,
)
from eagle3_runtime.files import write_json_atomic
from eagle3_runtime.prompt_sources import SourceSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepConfig:
    workspace: Path
    target: str  # Hugging Face id or local directory
    checkpoint: str  # best (selection.json), step-N, or a draft directory
    prompts: list[SourceSpec]
    max_speculative_tokens: int  # Kmax: K = 1 .. Kmax are measured, K = 0 is the baseline
    concurrency: list[int]  # the ladder
    rounds: int  # candidate/baseline pairs per K and concurrency, in ABBA order
    prompts_per_domain: int
    max_tokens: int
    max_model_len: int
    vllm_arg: list[str] = field(default_factory=list)  # appended to every vLLM server it starts

    def __post_init__(self) -> None:
        if not 1 <= self.max_speculative_tokens <= 16:
            raise ValueError(f"--max-speculative-tokens {self.max_speculative_tokens}: must be 1..16")
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError(f"--concurrency {self.concurrency}: give one or more concurrencies >= 1")
        if self.rounds < 1:
            raise ValueError(f"--rounds {self.rounds}: must be at least 1")

    def evaluate_config(self, k: int) -> EvaluateConfig:
        """evaluate's settings for the draft served at K = `k` (its servers and rounds)."""
        return EvaluateConfig(
            workspace=self.workspace,
            target=self.target,
            checkpoint=self.checkpoint,
            prompts=self.prompts,
            num_speculative_tokens=k,
            server=None,
            baseline_server=None,
            baseline="interleaved",
            rounds=self.rounds,
            prompts_per_domain=self.prompts_per_domain,
            max_tokens=self.max_tokens,
            concurrency=max(self.concurrency),
            max_model_len=self.max_model_len,
            vllm_arg=self.vllm_arg,
        )


def sweep_file(workspace: Workspace, draft_name: str) -> Path:
    """Where the sweep of a draft (a checkpoint's directory name) is kept; export reads it from here."""
    return workspace.evaluations_dir / f"sweep-{draft_name}.json"


def _draft(config: SweepConfig) -> tuple[Path, Path]:
    """(the draft as named, the copy vLLM serves): a checkpoint is served as it would be exported."""
    workspace = Workspace(config.workspace)
    name = config.checkpoint
    if name == "best":
        if not workspace.selection_file.exists():
            raise FileNotFoundError(f"{workspace.selection_file} is missing: run `eagle3 select` first")
        name = f"step-{int(json.loads(workspace.selection_file.read_text())['step'])}"
    draft, step, _ = resolve_checkpoint(workspace, name)
    return draft, served_draft(workspace, draft, step)


def measure_ladder(config: SweepConfig, k: int, urls: dict[str, str], domains: dict) -> list[dict]:
    """Every concurrency's ABBA rounds of the candidate (the draft at K = `k`, or at most `k` under
    a schedule) against the baseline; `urls` has both sides' servers."""
    measured = []
    for concurrency in config.concurrency:
        rounds: list[Round] = [
            measure_round(
                side, urls[side], SERVED_NAME, domains, max_tokens=config.max_tokens, concurrency=concurrency
            )
            for side in abba_order(config.rounds)
        ]
        candidate = summarise(pooled([r for r in rounds if r.side == CANDIDATE]), k)
        baseline = summarise(pooled([r for r in rounds if r.side == BASELINE]), k)
        speedup_at_k = speedup(candidate, baseline)
        measured.append(
            {
                "num_speculative_tokens": k,
                "concurrency": concurrency,
                "tokens_per_second": candidate["tokens_per_second"],
                "baseline_tokens_per_second": baseline["tokens_per_second"],
                "speedup": speedup_at_k,
                "acceptance_length": candidate["acceptance_length"],
                "acceptance_per_position": candidate["acceptance_per_position"],
                "drafts": candidate["drafts"],
                "rounds": [r.record() for r in rounds],
            }
        )
        log.info("sweep K=%d concurrency %d: speedup %s", k, concurrency, speedup_at_k)
    return measured


def best_per_concurrency(measurements: list[dict]) -> list[dict]:
    """At each concurrency, the K with the highest tokens/s relative to its own baseline rounds
    (K = 0, speedup 1.0, when none is faster): what one concurrency's windows measured."""
    best = []
    for concurrency in sorted({m["concurrency"] for m in measurements}):
        at_c = [m for m in measurements if m["concurrency"] == concurrency and m["speedup"] is not None]
        winner = max(at_c, key=lambda m: m["speedup"], default=None)
        if winner is None or winner["speedup"] <= 1.0:
            best.append({"concurrency": concurrency, "num_speculative_tokens": 0, "speedup": 1.0})
        else:
            best.append(
                {
                    "concurrency": concurrency,
                    "num_speculative_tokens": winner["num_speculative_tokens"],
                    "speedup": winner["speedup"],
                }
            )
    return best


# The scheduled K's score at a concurrency weighs its own speedup twice and each neighbour's on the
# ladder once (ladders are geometric, so neighbours are a factor of about 2 away in batch size).
NEIGHBOUR_WEIGHTS = (1.0, 2.0, 1.0)
SCHEDULE_RULE = (
    "at each concurrency, the K (0 = off, speedup 1) with the highest speedup averaged with weights "
    "1-2-1 over the concurrency and its neighbours on the ladder, no larger than the K of the "
    "concurrency below; a smaller K on a tie"
)


def scheduled_per_concurrency(measurements: list[dict]) -> list[dict]:
    """The K the schedule uses at each concurrency: the best on speedups smoothed over neighbouring
    concurrencies, never growing with the concurrency (SCHEDULE_RULE).

    Each K's cost and acceptance change slowly with the batch size, while one window's tokens/s on
    a shared machine moves by up to a quarter: one concurrency's argmax (`best_per_concurrency`)
    flips between K's that are equal within that noise (3, 5, 3 at 4, 8, 16 in the deep target's
    sweep). Borrowing the neighbours' windows cuts the variance of a score to 6/16 of one row's.
    Acceptance does not depend on the batch while verifying K more tokens per request costs more
    as the batch grows, so a larger batch never gets a larger K than a smaller one. A K that a
    concurrency did not measure (or whose speedup is unknown) is not chosen there.
    """
    ladder = sorted({m["concurrency"] for m in measurements})
    speedups = {
        (m["concurrency"], m["num_speculative_tokens"]): m["speedup"]
        for m in measurements
        if m["speedup"] is not None
    }
    ks = sorted({k for _, k in speedups})
    scheduled, ceiling = [], max(ks, default=0)
    for i, concurrency in enumerate(ladder):
        around = [
            (ladder[j], w)
            for j, w in zip(range(i - 1, i + 2), NEIGHBOUR_WEIGHTS, strict=True)
            if 0 <= j < len(ladder)
        ]
        scores = {0: 1.0}
        for k in ks:
            if k > ceiling or (concurrency, k) not in speedups:
                continue
            weighted = [(speedups[(c, k)], w) for c, w in around if (c, k) in speedups]
            scores[k] = sum(s * w for s, w in weighted) / sum(w for _, w in weighted)
        # max keeps the first of equal scores: the smallest K of a tie.
        k = ceiling = max(sorted(scores), key=lambda k: scores[k])
        scheduled.append(
            {"concurrency": concurrency, "num_speculative_tokens": k, "smoothed_speedup": round(scores[k], 4)}
        )
    return scheduled


def decide(measurements: list[dict]) -> dict:
    """What the measurements decide: the best K per concurrency as measured, the K the schedule
    uses there, and the schedule (recomputed from kept measurements when the rule changes)."""
    scheduled = scheduled_per_concurrency(measurements)
    schedule = schedule_from_best({s["concurrency"]: s["num_speculative_tokens"] for s in scheduled})
    return {
        "best": best_per_concurrency(measurements),
        "scheduled": scheduled,
        "schedule_rule": SCHEDULE_RULE,
        # vLLM's --speculative-config keys that apply the schedule.
        "schedule": schedule,
        "num_speculative_tokens": max_k(schedule),
    }


def run_sweep(config: SweepConfig) -> dict:
    """The sweep record of the draft (measured now, or read back when it was measured before)."""
    workspace = Workspace(config.workspace)
    draft, served = _draft(config)
    output = sweep_file(workspace, draft.name)
    if output.exists():
        # The measurements are what is kept; the decision follows the rule of this version, and the
        # file says what was decided last (export reads its schedule).
        kept = json.loads(output.read_text())
        record = kept | decide(kept["measurements"])
        if record != kept:
            write_json_atomic(output, record)
        return record
    domains = prompt_domains(config.prompts, config.prompts_per_domain)
    # A domain's prompts run together (rounds go domain by domain), so a domain with fewer prompts
    # than a concurrency never reaches that batch size: its K would be measured at a smaller one.
    top = max(config.concurrency)
    if short := {domain: len(prompts) for domain, prompts in domains.items() if len(prompts) < top}:
        raise ValueError(
            f"prompt domains {short} have fewer prompts than the largest concurrency {top}: a domain's "
            "prompts run together, so its batch would never reach it; give more prompts per domain "
            "(evaluation.promptsPerDomain, --prompts-per-domain) or a shorter ladder"
        )
    started_at = utc_now()
    measurements: list[dict] = []
    ks = range(1, config.max_speculative_tokens + 1)
    with ExitStack() as stack:
        servers = {0: target_server(config.evaluate_config(1), f"sweep-{draft.name}-baseline-vllm", None)}
        servers |= {
            k: target_server(config.evaluate_config(k), f"sweep-{draft.name}-k{k}-vllm", served) for k in ks
        }
        for server in servers.values():
            stack.callback(server.stop)
        # The baseline and K = 1 start together (nothing is measured yet); each later K starts
        # once the one before it is stopped, so at most two servers share the machine.
        for server in (servers[0], servers[1]):
            server.start(wait=False)
        for server in (servers[0], servers[1]):
            server.wait_ready()
        for k in ks:
            if k > 1:
                servers[k].start()
            urls = {CANDIDATE: servers[k].url, BASELINE: servers[0].url}
            measurements += measure_ladder(config, k, urls, domains)
            servers[k].stop()
    record = {
        "checkpoint": str(draft),
        "served_draft": str(served),
        "measured_at": started_at,
        "settings": {
            "max_speculative_tokens": config.max_speculative_tokens,
            "concurrency": list(config.concurrency),
            "rounds": config.rounds,
            "prompts_per_domain": config.prompts_per_domain,
            "max_tokens": config.max_tokens,
            "temperature": 0.0,
        },
        "measurements": measurements,
        **decide(measurements),
        "file": str(output.relative_to(workspace.root)),
    }
    write_json_atomic(output, record)
    return record
