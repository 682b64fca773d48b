"""The operator's Prometheus metrics (names are a contract with the Helm chart's dashboards and alerts)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import datetime
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics, start_http_server

disable_created_metrics()

RECONCILES = Counter("eagle3_operator_reconcile_total", "Reconciles by kind and result.", ["kind", "result"])
RECONCILE_SECONDS = Histogram(
    "eagle3_operator_reconcile_duration_seconds",
    "Time of one reconcile (reads, planning, writes).",
    ["kind"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
RECONCILE_ERRORS = Counter("eagle3_operator_reconcile_errors_total", "Reconciles that raised.", ["kind"])
RESOURCES = Gauge(
    "eagle3_operator_resources",
    "Custom resources by kind, namespace and phase.",
    ["kind", "namespace", "phase"],
)
API_REQUESTS = Counter(
    "eagle3_operator_api_requests_total", "Kubernetes API requests the operator made, by verb.", ["verb"]
)
API_REQUEST_SECONDS = Histogram(
    "eagle3_operator_api_request_duration_seconds",
    "Time from sending a Kubernetes API request to reading its whole response, by verb.",
    ["verb"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
LEADER = Gauge("eagle3_operator_leader", "1 while this replica holds the leader Lease and reconciles.")
WORKQUEUE_DEPTH = Gauge(
    "eagle3_operator_workqueue_depth", "Objects waiting to be reconciled (ready, running or scheduled)."
)
WORKQUEUE_WAIT_SECONDS = Histogram(
    "eagle3_operator_workqueue_queue_duration_seconds",
    "Time an object waited in the work queue, from ready (an event, or its requeue time) to a worker.",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
STATUS_CONFLICTS = Counter(
    "eagle3_operator_status_conflicts_total",
    "Status writes refused because the object changed since it was read (then re-read and re-planned).",
    ["kind"],
)
LAST_RECONCILE = Gauge(
    "eagle3_operator_last_reconcile_timestamp_seconds",
    "Unix time of each object's latest successful reconcile (the resync reaches every object once per period).",
    ["kind", "namespace", "name"],
)
TRAINING_LABELS = ["namespace", "name"]
TRAINING_STEP = Gauge("eagle3_draft_training_step", "Latest training step.", TRAINING_LABELS)
TRAINING_TOTAL_STEPS = Gauge("eagle3_draft_training_total_steps", "Training steps planned.", TRAINING_LABELS)
TRAINING_LOSS = Gauge("eagle3_draft_training_loss", "Latest training loss.", TRAINING_LABELS)
TRAINING_BEST_ACCEPTANCE = Gauge(
    "eagle3_draft_training_best_acceptance_length",
    "Best measured mean acceptance length among evaluated checkpoints.",
    TRAINING_LABELS,
)
TRAINING_BEST_ACCEPTANCE_BY_CONTEXT = Gauge(
    "eagle3_draft_training_best_acceptance_length_by_context_length",
    "Mean acceptance length of the selected checkpoint on prompts of context_length tokens "
    "(evaluation.contextLengths).",
    [*TRAINING_LABELS, "context_length"],
)
TRAINING_LAST_PROGRESS = Gauge(
    "eagle3_draft_training_last_progress_timestamp_seconds",
    "Unix time of the latest progress record of a running DraftTraining.",
    TRAINING_LABELS,
)
# kube-state-metrics style (kube_pod_status_phase): 1 on the current phase; a left phase's series
# is removed. Alerts join on it, e.g. "stalled" only while Running.
TRAINING_PHASE = Gauge(
    "eagle3_draft_training_phase", "1 for a DraftTraining's current phase.", [*TRAINING_LABELS, "phase"]
)
_TRAINING_GAUGES = (
    TRAINING_STEP,
    TRAINING_TOTAL_STEPS,
    TRAINING_LOSS,
    TRAINING_BEST_ACCEPTANCE,
    TRAINING_LAST_PROGRESS,
)


# Live speculative decoding of each SpecDecodeDeployment, from its status (label names as the
# chart's rules use for vLLM's own series).
SERVING_LABELS = ["namespace", "specdecodedeployment"]
LIVE_ACCEPTANCE = Gauge(
    "eagle3_specdecode_live_acceptance_length",
    "Live mean acceptance length (1 + accepted/drafts) of a pod-template revision over the live window.",
    [*SERVING_LABELS, "revision"],
)
LIVE_POSITION_ACCEPTANCE = Gauge(
    "eagle3_specdecode_live_position_acceptance",
    "Accepted tokens at a draft position per draft, over the live window.",
    [*SERVING_LABELS, "revision", "position"],
)
LIVE_TOKENS_PER_SECOND = Gauge(
    "eagle3_specdecode_live_generated_tokens_per_second",
    "Output tokens per second of a revision's pods over the live window.",
    [*SERVING_LABELS, "revision"],
)
LIVE_WINDOW = Gauge(
    "eagle3_specdecode_live_window_seconds",
    "Length of the window the live figures of a revision were measured over.",
    [*SERVING_LABELS, "revision"],
)
EVALUATED_ACCEPTANCE = Gauge(
    "eagle3_specdecode_evaluated_acceptance_length",
    "Mean acceptance length the served draft reached when it was evaluated.",
    SERVING_LABELS,
)
DRAFT_DEGRADED = Gauge(
    "eagle3_specdecode_draft_degraded",
    "1 while the DraftDegraded condition is True, 0 while False (absent while Unknown).",
    SERVING_LABELS,
)
_SERVING_GAUGES = (
    LIVE_ACCEPTANCE,
    LIVE_POSITION_ACCEPTANCE,
    LIVE_TOKENS_PER_SECOND,
    LIVE_WINDOW,
    EVALUATED_ACCEPTANCE,
    DRAFT_DEGRADED,
)


class PhaseTracker:
    """Counts objects per (kind, namespace, phase) from the latest phase seen for each object.

    Kept up to date per change (a reconcile of one object costs O(1), not a count of all: at 2000
    objects the recount was 2.5 % of the operator's samples in a profile of a burst). A count that
    falls to 0 stays as a 0 series."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._phases: dict[tuple[str, str, str], str] = {}
        self._counts: dict[tuple[str, str, str], int] = {}

    def set(self, kind: str, namespace: str, name: str, phase: str | None) -> str | None:
        """Record the object's phase (None: it is gone); the phase it had before."""
        with self._lock:
            previous = self._phases.pop((kind, namespace, name), None)
            if phase is not None:
                self._phases[(kind, namespace, name)] = phase
            if previous != phase:
                for labels, delta in (((kind, namespace, previous), -1), ((kind, namespace, phase), 1)):
                    if labels[2] is not None:
                        self._counts[labels] = self._counts.get(labels, 0) + delta
                        RESOURCES.labels(*labels).set(self._counts[labels])
            return previous


PHASES = PhaseTracker()


@contextmanager
def reconcile_timer(kind: str, retried: tuple[type[Exception], ...] = ()) -> Iterator[None]:
    """Time and count one reconcile; an exception of a `retried` type (planned again at once, such
    as a status conflict) counts as result "conflict", not as an error."""
    start = time.perf_counter()
    try:
        yield
    except retried:
        RECONCILES.labels(kind, "conflict").inc()
        raise
    except Exception:
        RECONCILES.labels(kind, "error").inc()
        RECONCILE_ERRORS.labels(kind).inc()
        raise
    else:
        RECONCILES.labels(kind, "success").inc()
    finally:
        RECONCILE_SECONDS.labels(kind).observe(time.perf_counter() - start)


def _timestamp(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def record_training(namespace: str, name: str, status: dict[str, Any]) -> None:
    """Training gauges from a DraftTraining's status."""
    labels = (namespace, name)
    phase = status.get("phase")
    previous = PHASES.set("DraftTraining", namespace, name, phase)
    _set_training_phase(namespace, name, phase, previous)
    train = next((s for s in status.get("stages") or [] if s.get("name") == "train"), {})
    progress = status.get("progress") or {}
    from_progress = progress.get("stage") == "train"
    metrics = train.get("metrics") or {}
    step = metrics.get("step") if train.get("state") == "Succeeded" else None
    step = step if step is not None else (progress.get("step") if from_progress else None)
    total = metrics.get("total_steps") or (progress.get("totalSteps") if from_progress else None)
    loss = (
        metrics.get("loss")
        if train.get("state") == "Succeeded"
        else (progress.get("loss") if from_progress else None)
    )
    lengths = [
        c["acceptanceLength"]
        for c in status.get("checkpoints") or []
        if c.get("acceptanceLength") is not None
    ]
    best = (status.get("bestCheckpoint") or {}).get("acceptanceLength")
    best = best if best is not None else (max(lengths) if lengths else None)
    for gauge, value in (
        (TRAINING_STEP, step),
        (TRAINING_TOTAL_STEPS, total),
        (TRAINING_LOSS, loss),
        (TRAINING_BEST_ACCEPTANCE, best),
        (TRAINING_LAST_PROGRESS, _timestamp(progress.get("updatedAt"))),
    ):
        if value is not None:
            gauge.labels(*labels).set(float(value))
    _forget_context_lengths(namespace, name)
    for bucket in (status.get("bestCheckpoint") or {}).get("acceptanceByContextLength") or []:
        if bucket.get("acceptanceLength") is not None:
            TRAINING_BEST_ACCEPTANCE_BY_CONTEXT.labels(*labels, str(bucket["contextLength"])).set(
                bucket["acceptanceLength"]
            )


def _remove_object_series(gauge: Gauge, namespace: str, name: str) -> None:
    """Remove every series of one object (labels starting namespace, name) from a gauge with more
    labels than those two."""
    for labels in list(gauge._metrics):  # noqa: SLF001 - the client has no removal by label prefix
        if labels[:2] == (namespace, name):
            gauge.remove(*labels)


def _forget_context_lengths(namespace: str, name: str) -> None:
    _remove_object_series(TRAINING_BEST_ACCEPTANCE_BY_CONTEXT, namespace, name)


def _set_training_phase(namespace: str, name: str, phase: str | None, previous: str | None) -> None:
    """The object's one phase series, moved from `previous` (its only other one)."""
    if previous is not None and previous != phase:
        with suppress(KeyError):
            TRAINING_PHASE.remove(namespace, name, previous)
    if phase is not None:
        TRAINING_PHASE.labels(namespace, name, phase).set(1)


def forget_training(namespace: str, name: str) -> None:
    previous = PHASES.set("DraftTraining", namespace, name, None)
    _set_training_phase(namespace, name, None, previous)
    _forget_context_lengths(namespace, name)
    for gauge in _TRAINING_GAUGES:
        with suppress(KeyError):
            gauge.remove(namespace, name)


def forget_serving(namespace: str, name: str) -> None:
    for gauge in _SERVING_GAUGES:
        _remove_object_series(gauge, namespace, name)  # any revision


def record_serving(namespace: str, name: str, status: dict[str, Any]) -> None:
    """Live-acceptance gauges from a SpecDecodeDeployment's status (only its current revisions kept)."""
    forget_serving(namespace, name)
    for figures in status.get("liveAcceptance") or []:
        labels = (namespace, name, figures["revision"])
        if "meanAcceptanceLength" in figures:
            LIVE_ACCEPTANCE.labels(*labels).set(figures["meanAcceptanceLength"])
        for position, rate in enumerate(figures.get("perPositionAcceptance") or []):
            LIVE_POSITION_ACCEPTANCE.labels(*labels, str(position)).set(rate)
        LIVE_TOKENS_PER_SECOND.labels(*labels).set(figures["generatedTokensPerSecond"])
        LIVE_WINDOW.labels(*labels).set(figures["window"]["seconds"])
    evaluated = (status.get("resolvedDraft") or {}).get("acceptanceLength")
    if evaluated is not None:
        EVALUATED_ACCEPTANCE.labels(namespace, name).set(evaluated)
    degraded = next((c for c in status.get("conditions") or [] if c["type"] == "DraftDegraded"), None)
    if degraded and degraded["status"] in ("True", "False"):
        DRAFT_DEGRADED.labels(namespace, name).set(1 if degraded["status"] == "True" else 0)


def serve(port: int, address: str) -> None:
    start_http_server(port, addr=address)
