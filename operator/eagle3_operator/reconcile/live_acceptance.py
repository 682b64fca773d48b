"""Live acceptance from vLLM's speculative-decoding counters: reads in, per-revision figures out.

vLLM's counters (`vllm:spec_decode_num_drafts_total`, `..._num_accepted_tokens_total`,
`..._num_accepted_tokens_per_pos_total{position}`, `vllm:generation_tokens_total`) only grow, so
the figures of a window are deltas between the first and the last read of each pod in it; one read
alone says nothing about now. A pod whose counters went down restarted: its delta counts from zero.
Pure functions; the reconciler does the reading (pods' /metrics or a Prometheus).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from eagle3_operator.reconcile.plan import iso

DRAFTS = "vllm:spec_decode_num_drafts_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATED = "vllm:generation_tokens_total"
# For the canary's gates: mean inter-token latency (histogram sum / count) and the API server's
# responses by status class ("2xx", "5xx"; prometheus-fastapi-instrumentator, which vLLM mounts).
ITL_SUM = "vllm:inter_token_latency_seconds_sum"
ITL_COUNT = "vllm:inter_token_latency_seconds_count"
HTTP_REQUESTS = "http_requests_total"
COUNTERS = (DRAFTS, ACCEPTED, ACCEPTED_PER_POS, GENERATED, ITL_SUM, ITL_COUNT, HTTP_REQUESTS)
# On the vLLM pod template: the template's own content hash, so each pod tells which revision it runs.
REVISION_ANNOTATION = "eagle3.ai/revision"


@dataclass(frozen=True)
class PodCounters:
    """One read of one pod's counters (summed over vLLM's engine and model labels)."""

    drafts: float = 0.0
    accepted: float = 0.0
    generated: float = 0.0
    accepted_per_position: tuple[float, ...] = ()
    itl_sum: float = 0.0
    itl_count: float = 0.0
    requests: float = 0.0  # OpenAI API responses
    errors: float = 0.0  # of those, 5xx

    def minus(self, earlier: PodCounters) -> PodCounters:
        """The increase since `earlier`; everything since start when a counter went down (a restart)."""
        if (
            self.drafts < earlier.drafts
            or self.accepted < earlier.accepted
            or self.generated < earlier.generated
            or self.requests < earlier.requests
        ):
            return self
        before = earlier.accepted_per_position + (0.0,) * (
            len(self.accepted_per_position) - len(earlier.accepted_per_position)
        )
        return PodCounters(
            self.drafts - earlier.drafts,
            self.accepted - earlier.accepted,
            self.generated - earlier.generated,
            tuple(max(0.0, a - b) for a, b in zip(self.accepted_per_position, before, strict=False)),
            max(0.0, self.itl_sum - earlier.itl_sum),
            max(0.0, self.itl_count - earlier.itl_count),
            self.requests - earlier.requests,
            max(0.0, self.errors - earlier.errors),
        )

    def plus(self, other: PodCounters) -> PodCounters:
        """Two pods' deltas together."""
        width = max(len(self.accepted_per_position), len(other.accepted_per_position))

        def padded(values: tuple[float, ...]) -> tuple[float, ...]:
            return values + (0.0,) * (width - len(values))

        return PodCounters(
            self.drafts + other.drafts,
            self.accepted + other.accepted,
            self.generated + other.generated,
            tuple(
                a + b
                for a, b in zip(
                    padded(self.accepted_per_position), padded(other.accepted_per_position), strict=True
                )
            ),
            self.itl_sum + other.itl_sum,
            self.itl_count + other.itl_count,
            self.requests + other.requests,
            self.errors + other.errors,
        )


def counters_from_samples(samples: list[tuple[str, dict[str, str], float]]) -> PodCounters:
    """(metric name, labels, value) samples of one pod -> its counters."""
    totals = {DRAFTS: 0.0, ACCEPTED: 0.0, GENERATED: 0.0, ITL_SUM: 0.0, ITL_COUNT: 0.0}
    per_position: dict[int, float] = {}
    requests = errors = 0.0
    for name, labels, value in samples:
        if name == ACCEPTED_PER_POS:
            position = int(labels.get("position", "0"))
            per_position[position] = per_position.get(position, 0.0) + value
        elif name == HTTP_REQUESTS:
            if labels.get("handler", "").startswith("/v1/"):
                requests += value
                errors += value if labels.get("status", "").startswith("5") else 0.0
        elif name in totals:
            totals[name] += value
    positions = tuple(per_position.get(i, 0.0) for i in range(max(per_position) + 1)) if per_position else ()
    return PodCounters(
        totals[DRAFTS],
        totals[ACCEPTED],
        totals[GENERATED],
        positions,
        totals[ITL_SUM],
        totals[ITL_COUNT],
        requests,
        errors,
    )


def parse_metrics(text: str) -> PodCounters:
    """A vLLM /metrics page (Prometheus text format) -> the counters."""
    samples = [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in COUNTERS
    ]
    return counters_from_samples(samples)


@dataclass(frozen=True)
class PodRead:
    """A pod's counters at one time, with the revision (and draft) its template carries."""

    at: datetime
    revision: str
    draft: str | None
    counters: PodCounters


@dataclass
class History:
    """The reads of one SpecDecodeDeployment's pods, kept for one window (per pod name)."""

    reads: dict[str, list[PodRead]] = field(default_factory=dict)

    def add(self, pod: str, read: PodRead) -> None:
        self.reads.setdefault(pod, []).append(read)

    def prune(self, now: datetime, window_s: float, pods: set[str]) -> None:
        """Drop gone pods, and reads older than the window except the newest such one (the window's base)."""
        start = now - timedelta(seconds=window_s)
        for pod in list(self.reads):
            reads = self.reads[pod]
            older = [i for i, r in enumerate(reads) if r.at <= start]
            if pod not in pods:
                del self.reads[pod]
            elif older:
                self.reads[pod] = reads[older[-1] :]

    def last_read(self) -> datetime | None:
        return max((reads[-1].at for reads in self.reads.values() if reads), default=None)


@dataclass(frozen=True)
class RevisionDeltas:
    """The counter deltas of one revision's pods over a window."""

    revision: str
    draft: str | None
    deltas: list[PodCounters]
    first: datetime
    last: datetime

    @property
    def seconds(self) -> float:
        return (self.last - self.first).total_seconds()

    def total(self) -> PodCounters:
        total = PodCounters()
        for delta in self.deltas:
            total = total.plus(delta)
        return total


def revision_deltas(history: History, window_s: float, now: datetime) -> dict[str, RevisionDeltas]:
    """Per revision, the counter deltas of its pods over the window.

    A pod's delta runs from its newest read at or before the window's start (or its first read, when
    it is younger) to its latest read; the revision's window spans the earliest and latest of those.
    Revisions whose pods were read only once have no delta yet and are left out.
    """
    start = now - timedelta(seconds=window_s)
    by_revision: dict[str, list[tuple[PodRead, PodRead]]] = {}
    for reads in history.reads.values():
        if len(reads) < 2:
            continue
        base = max((r for r in reads if r.at <= start), key=lambda r: r.at, default=reads[0])
        latest = reads[-1]
        if latest.at > base.at and latest.revision == base.revision:
            by_revision.setdefault(latest.revision, []).append((base, latest))
    return {
        revision: RevisionDeltas(
            revision,
            pairs[0][1].draft,
            [latest.counters.minus(base.counters) for base, latest in pairs],
            min(b.at for b, _ in pairs),
            max(latest.at for _, latest in pairs),
        )
        for revision, pairs in by_revision.items()
    }


def revision_figures(history: History, window_s: float, now: datetime) -> list[dict[str, Any]]:
    """status.liveAcceptance entries: per revision, the counter deltas of its pods over the window."""
    figures = []
    for revision, found in revision_deltas(history, window_s, now).items():
        deltas, first, last, seconds = found.deltas, found.first, found.last, found.seconds
        drafts = sum(d.drafts for d in deltas)
        accepted = sum(d.accepted for d in deltas)
        positions = max((len(d.accepted_per_position) for d in deltas), default=0)
        per_position = [
            sum(d.accepted_per_position[i] for d in deltas if i < len(d.accepted_per_position))
            for i in range(positions)
        ]
        entry: dict[str, Any] = {
            "revision": revision,
            "draft": found.draft,
            "pods": len(deltas),
            "perPositionAcceptance": [round(p / drafts, 4) for p in per_position] if drafts else [],
            "generatedTokensPerSecond": round(sum(d.generated for d in deltas) / seconds, 3),
            "drafts": int(drafts),
            "window": {"start": iso(first), "end": iso(last), "seconds": round(seconds, 3)},
        }
        if drafts:
            entry["meanAcceptanceLength"] = round(1 + accepted / drafts, 4)
        figures.append({k: v for k, v in entry.items() if v is not None})
    return figures


@dataclass(frozen=True)
class Degradation:
    """How the DraftDegraded condition reads."""

    status: str  # "True", "False" or "Unknown"
    reason: str
    message: str


def degradation(
    current: dict[str, Any] | None, evaluated: float | None, *, ratio: float, window_s: float, min_drafts: int
) -> Degradation:
    """DraftDegraded for the current revision's figures against the draft's evaluated acceptance.

    Judged only on a full window (the live figure of a window is what "stays below for a window"
    means here: it aggregates every draft in it) with at least `min_drafts` drafts.
    """
    if evaluated is None:
        return Degradation(
            "Unknown", "NoEvaluatedAcceptance", "the draft has no evaluated acceptance length to compare with"
        )
    if not current or "meanAcceptanceLength" not in current:
        return Degradation("Unknown", "NoLiveData", "no speculative-decoding counters read over a window yet")
    live, drafts, seconds = current["meanAcceptanceLength"], current["drafts"], current["window"]["seconds"]
    # One read interval of slack: reads are not exactly windowSeconds apart.
    if seconds < 0.9 * window_s or drafts < min_drafts:
        return Degradation(
            "Unknown",
            "NotEnoughData",
            f"{drafts} drafts over {seconds:g} s; judged after {min_drafts} drafts over {window_s:g} s",
        )
    floor = ratio * evaluated
    summary = (
        f"live mean acceptance length {live:g} over {seconds:g} s ({drafts} drafts); "
        f"evaluated {evaluated:g}, threshold {floor:.4g} ({ratio:g}x)"
    )
    if live < floor:
        return Degradation("True", "AcceptanceBelowThreshold", summary)
    return Degradation("False", "AcceptanceAsEvaluated", summary)
