"""The operator's own gauges, kept per change."""

from __future__ import annotations

from eagle3_operator import metrics
from prometheus_client import REGISTRY


def _count(namespace: str, phase: str) -> float | None:
    return REGISTRY.get_sample_value(
        "eagle3_operator_resources", {"kind": "DraftTraining", "namespace": namespace, "phase": phase}
    )


def test_phase_counts_follow_each_objects_latest_phase_and_fall_to_zero():
    tracker = metrics.PhaseTracker()
    assert tracker.set("DraftTraining", "counts", "a", "Running") is None
    assert tracker.set("DraftTraining", "counts", "b", "Running") is None
    assert _count("counts", "Running") == 2
    assert tracker.set("DraftTraining", "counts", "a", "Succeeded") == "Running"
    assert tracker.set("DraftTraining", "counts", "a", "Succeeded") == "Succeeded", "no change, no count"
    assert (_count("counts", "Running"), _count("counts", "Succeeded")) == (1, 1)
    tracker.set("DraftTraining", "counts", "b", None)
    tracker.set("DraftTraining", "counts", "a", None)
    assert (_count("counts", "Running"), _count("counts", "Succeeded")) == (0, 0), "gone: a 0 series"
